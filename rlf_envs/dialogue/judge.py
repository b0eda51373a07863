"""The optional model check of simulated user turns: a second endpoint says "in character" or not.

:class:`SimulatorJudge` asks an OpenAI-compatible endpoint (through
:class:`~rlf_envs.llm_client.OpenAIChatClient`) whether one simulated customer line is something
the customer would write. It runs after the rules (:func:`rlf_envs.dialogue.flags.check_reply`),
only on replies they pass. It never raises: the verdict is None (in character) or a
:class:`~rlf_envs.dialogue.flags.SimFlag` of kind ``out_of_character``, or, when no verdict could
be had, ``judge_timeout`` / ``judge_error``, so an unjudged turn is flagged, never passed. In an
env each episode's turn is judged inside its own step, so a vector step's turns are judged
concurrently on the env's loop; :meth:`SimulatorJudge.judge_many` does the same for a list.

Example:
    >>> judge = SimulatorJudge(JudgeSettings("http://127.0.0.1:8000/v1", "judge"))
    >>> parse_verdict("OUT"), parse_verdict("in character."), parse_verdict("maybe")
    (False, True, None)
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from rlf_envs.dialogue.flags import JudgeSettings, SimErrorKind, SimFlag
from rlf_envs.llm_client import ChatCompletionError, OpenAIChatClient

__all__ = ["DEFAULT_JUDGE_PROMPT", "JudgeItem", "SimulatorJudge", "parse_verdict"]

DEFAULT_JUDGE_PROMPT = """\
A language model plays a customer who writes to a shop's support agent. Check ONE line the \
customer model wrote. The line is OUT of character if it does any of these: speaks as the \
agent or offers help to the customer; repeats the agent's message; contains a dialogue with \
speaker labels; says it is an AI, a model, an assistant or a simulation; quotes or talks about \
its hidden instructions, its role or a stop marker; holds template tokens, code or a tool call. \
Otherwise (an ordinary customer message, even a terse, rude or confused one) it is IN character.

The customer's hidden instructions: {instructions}
The agent's last message: {agent_message}
The customer's line: {reply}

Answer with one word: IN or OUT."""

_VERDICT = re.compile(r"\b(out(?:[ _-]of[ _-]character)?|in(?:[ _-]character)?)\b", re.I)


def parse_verdict(text: str) -> bool | None:
    """True (in character), False (out) or None (no verdict) from the judge's reply.

    Example:
        >>> parse_verdict('{"verdict": "OUT"}'), parse_verdict("IN - an ordinary request")
        (False, True)
    """
    found = _VERDICT.search(text.strip())
    if found is None:
        return None
    return not found.group(1).lower().startswith("out")


class JudgeItem:
    """One turn to judge: the simulator's reply, the agent's last message, the hidden instructions."""

    __slots__ = ("agent_message", "instructions", "reply")

    def __init__(self, reply: str, agent_message: str = "", instructions: str = "") -> None:
        self.reply = reply
        self.agent_message = agent_message
        self.instructions = instructions


class SimulatorJudge:
    """Judges simulated user turns with a model behind an OpenAI-compatible endpoint."""

    def __init__(self, settings: JudgeSettings, client: OpenAIChatClient | None = None) -> None:
        self.settings = settings
        self.prompt = settings.prompt or DEFAULT_JUDGE_PROMPT
        # the client's own per-attempt limit stays inside the judge's, so it is the judge's that fires
        attempt_s = settings.timeout_s / (settings.retries + 1)
        self.client = client or OpenAIChatClient(
            settings.base_url, settings.model, max_concurrency=settings.max_concurrency,
            timeout_s=attempt_s, retries=settings.retries, backoff_s=0.0, api_key=settings.api_key,
        )  # fmt: skip

    async def judge(self, item: JudgeItem) -> SimFlag | None:
        """None when the turn is in character, else the flag (never raises but for cancellation)."""
        prompt = self.prompt.format(
            instructions=item.instructions or "-", agent_message=item.agent_message or "-", reply=item.reply
        )
        messages = [{"role": "user", "content": prompt}]
        limit = self.settings.timeout_s
        try:
            completion = await asyncio.wait_for(
                self.client.complete(messages, max_tokens=self.settings.max_tokens, temperature=0.0), limit
            )
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return SimFlag(SimErrorKind.JUDGE_TIMEOUT, f"no verdict within {limit:g} s")
        except ChatCompletionError as error:
            kind = SimErrorKind.JUDGE_TIMEOUT if error.timed_out else SimErrorKind.JUDGE_ERROR
            return SimFlag(kind, f"{error.kind.value}: {error}"[:500])
        except Exception as error:  # anything unforeseen is still a flag, never a crash of the batch
            return SimFlag(SimErrorKind.JUDGE_ERROR, f"{type(error).__name__}: {error}"[:500])
        verdict = parse_verdict(completion.text)
        if verdict is None:
            return SimFlag(
                SimErrorKind.JUDGE_ERROR, f"no verdict in the judge's reply {completion.text[:200]!r}"
            )
        if verdict:
            return None
        return SimFlag(
            SimErrorKind.OUT_OF_CHARACTER, f"the judge says out of character: {completion.text[:200]!r}"
        )

    async def judge_many(self, items: Sequence[JudgeItem]) -> list[SimFlag | None]:
        """Every item judged at once (bounded by the client's ``max_concurrency``)."""
        return list(await asyncio.gather(*(self.judge(item) for item in items)))

    async def aclose(self) -> None:
        await self.client.aclose()
