"""Simulator-failure flagging: is a user simulator's reply one the episode can be trained on?

tau2-bench found that a large share of failed agent runs were the simulator's fault (it left its
persona, leaked its instructions, answered as the agent, stopped early). :func:`check_reply` runs
the rules below on one raw simulator reply and returns a :class:`SimFlag` (its
:class:`SimErrorKind` and why) or None. The env puts the kind in ``info["sim_error"]`` and ends
the episode; the trainer can drop such episodes instead of training on a reward nobody earned.

=================  ==========================================================================
kind               caught when the raw reply ...
=================  ==========================================================================
``broke_format``   is empty, longer than ``max_chars``, holds chat-template tokens or the
                   agent's markup (``<tool_call>``, ``<tool_response>``, ``<answer>``, ...),
                   or control characters / U+FFFD (undecodable bytes)
``role_flip``      speaks as the agent: an ``Assistant:`` / ``Agent:`` prefix, or a service
                   line such as "How can I help you?"
``left_persona``   speaks as a model: "as an AI", "language model", "user simulator", ...
``revealed_goal``  quotes ``min_leak_words`` consecutive words of its hidden instructions, or
                   talks about them ("my instructions", "hidden goal")
``premature_stop`` emits the stop marker on its first reply (before the agent could act)
=================  ==========================================================================

Endpoint failures (``endpoint_error``, ``timeout``) and a scripted simulator that raises
(``simulator_error``) are flagged by :mod:`rlf_envs.dialogue.runner`.

Example:
    >>> check_reply("How can I help you today?", "You are Ann. Cancel order #W1.", turn=1)
    SimFlag(kind=<SimErrorKind.ROLE_FLIP: 'role_flip'>, message="reads as the agent: 'how can i help you'")
    >>> check_reply("Hi, my email is ann@example.com.", "You are Ann. Cancel order #W1.", turn=1) is None
    True
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = ["DEFAULT_STOP_MARKER", "SimChecks", "SimErrorKind", "SimFlag", "check_reply"]

DEFAULT_STOP_MARKER = "###STOP###"


class SimErrorKind(enum.StrEnum):
    """Why a simulated user turn cannot be trusted. The values appear in ``info["sim_error"]``."""

    ENDPOINT_ERROR = "endpoint_error"  # the simulator's endpoint failed (HTTP error, refused, bad body)
    TIMEOUT = "timeout"  # no reply within the simulator's time limit
    SIMULATOR_ERROR = "simulator_error"  # a scripted simulator raised or returned a non-string
    BROKE_FORMAT = "broke_format"  # empty, too long, template tokens or agent markup
    ROLE_FLIP = "role_flip"  # answered as the agent
    LEFT_PERSONA = "left_persona"  # spoke as an AI model instead of the user
    REVEALED_GOAL = "revealed_goal"  # quoted or discussed its hidden instructions
    PREMATURE_STOP = "premature_stop"  # stopped before the agent could do anything


@dataclass(frozen=True)
class SimFlag:
    """One flagged reply: the rule that caught it and a short reason."""

    kind: SimErrorKind
    message: str


_MARKUP = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
           "<tool_response>", "</tool_response>", "<answer>", "</answer>", "<think>", "</think>")  # fmt: skip
_AGENT_PREFIX = re.compile(
    r"^\s*\**\s*(assistant|agent|customer (service|support)|support agent)\s*\**\s*:", re.I
)
_AGENT_LINES = (
    "how can i help you",
    "how may i help you",
    "how can i assist you",
    "how may i assist you",
    "is there anything else i can help",
    "is there anything else i can do for you",
    "anything else i can assist",
    "thank you for contacting",
    "i have processed your request",
)
_MODEL_LINES = (
    "as an ai",
    "i am an ai",
    "i'm an ai",
    "language model",
    "user simulator",
    "simulated user",
    "as a simulator",
    "i cannot roleplay",
    "i can't roleplay",
    "i'm not able to roleplay",
)
_GOAL_TALK = ("my instructions", "hidden goal", "user instructions", "my goal is to", "i was instructed")
_WORD = re.compile(r"[a-z0-9#@.$'-]+")
# control characters (but tab and newlines) and U+FFFD: bytes that decode to no text, not a user's words
_GARBLED = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


@dataclass(frozen=True)
class SimChecks:
    """Which rules run, and their thresholds. ``SimChecks(enabled=False)`` flags nothing.

    ``min_leak_words``: a run of this many consecutive words of the hidden instructions in the
    reply counts as a leak (facts the user may tell, like an order id, are shorter than that).
    ``min_replies_before_stop``: a stop marker on an earlier reply (0-based count of the
    simulator's replies so far) is ``premature_stop``.
    """

    enabled: bool = True
    max_chars: int = 2000
    min_leak_words: int = 8
    min_replies_before_stop: int = 1
    format: bool = True
    role_flip: bool = True
    persona: bool = True
    goal_leak: bool = True
    premature_stop: bool = True


def _leaked_run(reply: str, instructions: str, n: int) -> str | None:
    """The first run of ``n`` consecutive instruction words that the reply repeats, or None."""
    words = _WORD.findall(instructions.lower())
    if n < 1 or len(words) < n:
        return None
    said = " " + " ".join(_WORD.findall(reply.lower())) + " "
    for start in range(len(words) - n + 1):
        run = " ".join(words[start : start + n])
        if f" {run} " in said:
            return run
    return None


def _format_flag(raw: str, checks: SimChecks) -> SimFlag | None:
    if not raw.strip():
        return SimFlag(SimErrorKind.BROKE_FORMAT, "empty reply")
    if len(raw) > checks.max_chars:
        return SimFlag(SimErrorKind.BROKE_FORMAT, f"reply of {len(raw)} chars > {checks.max_chars}")
    markup = next((m for m in _MARKUP if m in raw), None)
    if markup is not None:
        return SimFlag(SimErrorKind.BROKE_FORMAT, f"reply holds {markup!r}")
    garbled = _GARBLED.search(raw)
    if garbled is not None:
        return SimFlag(SimErrorKind.BROKE_FORMAT, f"reply holds the non-text character {garbled.group()!r}")
    return None


def check_reply(
    raw: str,
    instructions: str,
    *,
    turn: int,
    stop_marker: str = DEFAULT_STOP_MARKER,
    checks: SimChecks | None = None,
) -> SimFlag | None:
    """The first rule ``raw`` (one simulator reply, stop marker included) breaks, or None.

    ``turn`` is how many replies the simulator gave before this one in the episode.

    Example:
        >>> check_reply("###STOP###", "Cancel order #W1.", turn=0).kind.value
        'premature_stop'
        >>> check_reply("Thanks, that is all. ###STOP###", "Cancel order #W1.", turn=2) is None
        True
    """
    checks = checks or SimChecks()
    if not checks.enabled:
        return None
    stopped = stop_marker in raw
    body = raw.replace(stop_marker, " ").strip()
    lower = " ".join(body.lower().split())
    if checks.format and not stopped and (flag := _format_flag(raw, checks)):
        return flag
    if checks.format and stopped and (flag := _format_flag(body or "-", checks)):
        return flag  # a bare stop marker is a fine last line
    if checks.role_flip:
        if _AGENT_PREFIX.match(body):
            return SimFlag(SimErrorKind.ROLE_FLIP, "starts with an agent's speaker tag")
        line = next((p for p in _AGENT_LINES if p in lower), None)
        if line is not None:
            return SimFlag(SimErrorKind.ROLE_FLIP, f"reads as the agent: {line!r}")
    if checks.persona and (line := next((p for p in _MODEL_LINES if p in lower), None)):
        return SimFlag(SimErrorKind.LEFT_PERSONA, f"speaks as a model: {line!r}")
    if checks.goal_leak:
        talk = next((p for p in _GOAL_TALK if p in lower), None)
        if talk is not None:
            return SimFlag(SimErrorKind.REVEALED_GOAL, f"talks about its instructions: {talk!r}")
        run = _leaked_run(body, instructions, checks.min_leak_words)
        if run is not None:
            return SimFlag(SimErrorKind.REVEALED_GOAL, f"quotes its instructions: {run!r}")
    if checks.premature_stop and stopped and turn < checks.min_replies_before_stop:
        return SimFlag(SimErrorKind.PREMATURE_STOP, f"stop marker on reply {turn + 1}")
    return None
