"""Simulator-failure flagging: is a user simulator's reply one the episode can be trained on?

tau2-bench found that a large share of failed agent runs were the simulator's fault (it left its
persona, leaked its instructions, answered as the agent, stopped early). :func:`check_reply` runs
the rules of :mod:`rlf_envs.dialogue.rules` on one raw simulator reply and returns a
:class:`SimFlag` (its :class:`SimErrorKind` and why) or None. The env puts the kind in
``info["sim_error"]`` and ends the episode; the trainer drops such episodes instead of training on
a reward nobody earned.

====================  =======================================================================
kind                  caught when the raw reply ...
====================  =======================================================================
``broke_format``      is empty, longer than ``max_chars``, holds another chat template's
                      special tokens (``<|im_start|>``, ``[INST]``, ``<|eot_id|>``,
                      ``<start_of_turn>`` ...), the agent's markup (``<tool_call>``,
                      ``<answer>`` ...), a tool call as JSON or ``fn(arg=...)``, control
                      characters or U+FFFD (undecodable bytes)
``revealed_goal``     quotes its instructions (``min_leak_words`` consecutive words of the
                      task's, ``prompt_leak_words`` of the rest of its system prompt, "you"
                      read as "I"), talks about them ("my instructions", "stop marker", "I'm
                      playing a customer"), or quotes/talks about the stop marker instead of
                      ending with it: such a reply is never a genuine stop
``role_labels``       starts with a speaker label (``User:``, ``Agent:``, ``**Customer**:``) or
                      holds a whole dialogue with role prefixes
``left_persona``      speaks as a model: "as an AI", "I'm a language model", "roleplay" ...
``parroted_agent``    mostly repeats the agent's last message
``role_flip``         speaks as the agent: "Sure! I can help you with that", "How can I assist
                      you today?", "Could you provide your email?", "Your order has been
                      cancelled" ...
``premature_stop``    emits the stop marker on its first reply (before the agent could act)
====================  =======================================================================

Endpoint failures (``endpoint_error``, ``timeout``), a scripted simulator that raises
(``simulator_error``) and the optional model check (``out_of_character``, ``judge_error``,
``judge_timeout``) are flagged by :mod:`rlf_envs.dialogue.runner`.

Example:
    >>> check_reply("How can I help you today?", "You are Ann. Cancel order #W1.", turn=1)
    SimFlag(kind=<SimErrorKind.ROLE_FLIP: 'role_flip'>, message="service line: 'how can i help you'")
    >>> check_reply("Hi, my email is ann@example.com.", "You are Ann. Cancel order #W1.", turn=1) is None
    True
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from rlf_envs.dialogue.rules import (
    agent_voice,
    leaked_run,
    parroted,
    prompt_talk,
    role_labels,
    self_identification,
    special_tokens,
    stop_marker_misuse,
    tool_call_json,
)

__all__ = ["DEFAULT_STOP_MARKER", "JudgeSettings", "SimChecks", "SimErrorKind", "SimFlag", "check_reply"]

DEFAULT_STOP_MARKER = "###STOP###"


class SimErrorKind(enum.StrEnum):
    """Why a simulated user turn cannot be trusted. The values appear in ``info["sim_error"]``."""

    ENDPOINT_ERROR = "endpoint_error"  # the simulator's endpoint failed (HTTP error, refused, bad body)
    TIMEOUT = "timeout"  # no reply within the simulator's time limit (or its HTTP client's)
    SIMULATOR_ERROR = "simulator_error"  # a scripted simulator raised or returned a non-string
    BROKE_FORMAT = "broke_format"  # empty, too long, template tokens, agent markup, tool-call JSON
    ROLE_FLIP = "role_flip"  # answered in the agent's voice
    ROLE_LABELS = "role_labels"  # a speaker label at the start, or a whole dialogue in one reply
    PARROTED_AGENT = "parroted_agent"  # repeated the agent's last message
    LEFT_PERSONA = "left_persona"  # spoke as an AI model instead of the user
    REVEALED_GOAL = "revealed_goal"  # quoted or discussed its instructions (the stop rule included)
    PREMATURE_STOP = "premature_stop"  # stopped before the agent could do anything
    OUT_OF_CHARACTER = "out_of_character"  # the judge model found the turn out of character
    JUDGE_ERROR = "judge_error"  # the judge's endpoint failed or its verdict was unreadable
    JUDGE_TIMEOUT = "judge_timeout"  # no verdict within the judge's time limit


@dataclass(frozen=True)
class SimFlag:
    """One flagged reply: the rule that caught it and a short reason."""

    kind: SimErrorKind
    message: str


@dataclass(frozen=True)
class JudgeSettings:
    """The optional model check: a second OpenAI-compatible endpoint judges each user turn.

    ``timeout_s`` bounds one verdict (retries included); a verdict that does not come in time is
    ``judge_timeout``, a failed or unreadable one ``judge_error``: the turn is flagged, never passed.
    """

    base_url: str
    model: str = "default"
    timeout_s: float = 20.0
    retries: int = 1
    max_tokens: int = 16
    max_concurrency: int = 64
    api_key: str | None = None
    prompt: str | None = None  # None: rlf_envs.dialogue.judge.DEFAULT_JUDGE_PROMPT


@dataclass(frozen=True)
class SimChecks:
    """Which checks run, and their thresholds. ``SimChecks(enabled=False)`` flags nothing.

    ``min_leak_words``: a run of this many consecutive words of the task's hidden instructions in
    the reply is a leak (facts a user may tell, like an order id, are shorter than that);
    ``prompt_leak_words`` the same for the rest of the simulator's system prompt (its generic
    sentences are nothing a customer says). ``min_replies_before_stop``: a stop marker on an
    earlier reply (0-based count of the simulator's replies so far) is ``premature_stop``.
    ``judge``: :class:`JudgeSettings` (or a dict of them) to add the model check; None: rules only.

    Example:
        >>> SimChecks(judge={"base_url": "http://127.0.0.1:9/v1"}).judge.timeout_s
        20.0
    """

    enabled: bool = True
    max_chars: int = 2000
    min_leak_words: int = 8
    prompt_leak_words: int = 6
    min_replies_before_stop: int = 1
    format: bool = True
    role_flip: bool = True
    role_labels: bool = True
    parrot: bool = True
    persona: bool = True
    goal_leak: bool = True
    premature_stop: bool = True
    judge: JudgeSettings | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if isinstance(self.judge, Mapping):
            object.__setattr__(self, "judge", JudgeSettings(**dict(self.judge)))


_GARBLED = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


def _format_flag(raw: str, checks: SimChecks) -> SimFlag | None:
    if not raw.strip():
        return SimFlag(SimErrorKind.BROKE_FORMAT, "empty reply")
    if len(raw) > checks.max_chars:
        return SimFlag(SimErrorKind.BROKE_FORMAT, f"reply of {len(raw)} chars > {checks.max_chars}")
    why = special_tokens(raw) or tool_call_json(raw)
    if why is not None:
        return SimFlag(SimErrorKind.BROKE_FORMAT, why)
    garbled = _GARBLED.search(raw)
    if garbled is not None:
        return SimFlag(SimErrorKind.BROKE_FORMAT, f"reply holds the non-text character {garbled.group()!r}")
    return None


def _leak_flag(raw: str, body: str, lower: str, context: _Context, checks: SimChecks) -> SimFlag | None:
    why = stop_marker_misuse(raw, context.stop_marker) or prompt_talk(lower)
    if why is None:
        run = leaked_run(body, context.instructions, checks.min_leak_words)
        why = None if run is None else f"quotes its instructions: {run!r}"
    if why is None and context.prompt_rest:
        run = leaked_run(body, context.prompt_rest, checks.prompt_leak_words, fold_person=True)
        why = None if run is None else f"quotes its system prompt: {run!r}"
    return None if why is None else SimFlag(SimErrorKind.REVEALED_GOAL, why)


@dataclass(frozen=True)
class _Context:
    instructions: str
    prompt_rest: str  # the system prompt without the task's instructions
    agent_message: str
    stop_marker: str


def check_reply(
    raw: str,
    instructions: str,
    *,
    turn: int,
    stop_marker: str = DEFAULT_STOP_MARKER,
    checks: SimChecks | None = None,
    agent_message: str = "",
    system_prompt: str = "",
) -> SimFlag | None:
    """The first rule ``raw`` (one simulator reply, stop marker included) breaks, or None.

    ``turn`` is how many replies the simulator gave before this one in the episode;
    ``agent_message`` the agent's last message (for parroting); ``system_prompt`` the simulator's
    whole system prompt (its leaks are checked as well as those of ``instructions``).

    Example:
        >>> check_reply("###STOP###", "Cancel order #W1.", turn=0).kind.value
        'premature_stop'
        >>> check_reply("Thanks, that is all. ###STOP###", "Cancel order #W1.", turn=2) is None
        True
        >>> check_reply("I must end with ###STOP### when done.", "Cancel order #W1.", turn=2).kind.value
        'revealed_goal'
    """
    checks = checks or SimChecks()
    if not checks.enabled:
        return None
    stopped = stop_marker in raw
    body = raw.replace(stop_marker, " ").strip()
    lower = " ".join(body.lower().replace("’", "'").split())
    if checks.format and (flag := _format_flag(body or "-" if stopped else raw, checks)):
        return flag  # a bare stop marker is a fine last line
    prompt_rest = system_prompt.replace(instructions, " ") if instructions else system_prompt
    context = _Context(instructions, prompt_rest, agent_message, stop_marker)
    if checks.goal_leak and (flag := _leak_flag(raw, body, lower, context, checks)):
        return flag
    if checks.role_labels and (why := role_labels(body)):
        return SimFlag(SimErrorKind.ROLE_LABELS, why)
    if checks.persona and (why := self_identification(lower)):
        return SimFlag(SimErrorKind.LEFT_PERSONA, why)
    if checks.parrot and (why := parroted(body, agent_message)):
        return SimFlag(SimErrorKind.PARROTED_AGENT, why)
    if checks.role_flip and (why := agent_voice(lower)):
        return SimFlag(SimErrorKind.ROLE_FLIP, why)
    if checks.premature_stop and stopped and turn < checks.min_replies_before_stop:
        return SimFlag(SimErrorKind.PREMATURE_STOP, f"stop marker on reply {turn + 1}")
    return None
