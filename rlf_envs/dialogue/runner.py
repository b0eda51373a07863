"""One simulated user turn that never raises: the simulator under a timeout, then the checks.

:class:`SimulatorRunner` wraps a :class:`~rlf_envs.dialogue.simulator.UserSimulator` with a time
limit and the :mod:`rlf_envs.dialogue.flags` rules. :meth:`SimulatorRunner.next_turn` returns a
:class:`UserTurn`: the user's message (stop marker removed) and whether it ends the
conversation, or a flag (``endpoint_error``, ``timeout``, ``simulator_error``, a rule's kind, or
the judge's). All simulator calls of a vector step, and the judge's verdicts on them, are awaited
together on the env's loop, so they are in flight at once (bounded by the clients'
``max_concurrency``); the async API (``astep_one``) awaits one env's turn alone.

Example:
    >>> import asyncio
    >>> from rlf_envs.dialogue.simulator import ScriptedUserSimulator, UserTurnRequest
    >>> from rlf_envs.types import TaskInstance
    >>> runner = SimulatorRunner(ScriptedUserSimulator(lambda r: "Order #W1, thanks. ###STOP###"))
    >>> request = UserTurnRequest(TaskInstance("0", "Hi"), "You are Ann.", [], turn=1)
    >>> asyncio.run(runner.next_turn(request))
    UserTurn(text='Order #W1, thanks.', stop=True, raw='Order #W1, thanks. ###STOP###', flag=None)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rlf_envs.dialogue.flags import SimChecks, SimErrorKind, SimFlag, check_reply
from rlf_envs.dialogue.judge import JudgeItem, SimulatorJudge
from rlf_envs.dialogue.simulator import DEFAULT_SIMULATOR_PROMPT, UserSimulator, UserTurnRequest
from rlf_envs.llm_client import ChatCompletionError

__all__ = ["DEFAULT_SIM_TIMEOUT_S", "SimulatorRunner", "UserTurn", "last_agent_message"]

# A sync vector step waits for its slowest user turn, so this bounds how long one hung simulator
# can hold the whole batch. 30 s is several times a 200-token reply on a loaded server (a few s),
# and LLMUserSimulator's HTTP attempts (14 s, one retry) fit inside it.
DEFAULT_SIM_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class UserTurn:
    """A simulated user turn: ``text`` (stop marker removed), ``stop``, the ``raw`` reply, or a ``flag``."""

    text: str
    stop: bool
    raw: str
    flag: SimFlag | None = None


def last_agent_message(messages: list[dict]) -> str:
    """The text of the last assistant message in ``messages`` ("" if none).

    Example:
        >>> last_agent_message([{"role": "assistant", "content": "Email?"}, {"role": "tool", "content": "x"}])
        'Email?'
    """
    for message in reversed(messages):
        if message.get("role") == "assistant" and (message.get("content") or "").strip():
            return str(message["content"])
    return ""


class SimulatorRunner:
    """A simulator with a time limit and failure checks (rules, optionally the judge); one per env.

    ``timeout_s`` bounds the simulator's reply; the judge (``checks.judge``) has its own limit.
    """

    def __init__(
        self, simulator: UserSimulator, checks: SimChecks | None = None, *,
        timeout_s: float = DEFAULT_SIM_TIMEOUT_S,
    ) -> None:  # fmt: skip
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.simulator = simulator
        self.checks = checks or SimChecks()
        self.timeout_s = float(timeout_s)
        self.stop_marker = str(getattr(simulator, "stop_marker", "") or "###STOP###")
        use_judge = self.checks.enabled and self.checks.judge is not None
        self.judge = SimulatorJudge(self.checks.judge) if use_judge else None  # type: ignore[arg-type]

    def system_text(self, request: UserTurnRequest) -> str:
        """The simulator's system prompt for ``request`` (the default one for scripted simulators)."""
        own = getattr(self.simulator, "system_text", None)
        if callable(own):
            return str(own(request))
        return DEFAULT_SIMULATOR_PROMPT.format(
            instructions=request.instructions, stop_marker=self.stop_marker
        )

    async def next_turn(self, request: UserTurnRequest) -> UserTurn:
        """The user's next message, or a flagged failure; never raises (but for cancellation)."""
        try:
            raw = await asyncio.wait_for(self.simulator.reply(request), self.timeout_s)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return _failed(SimErrorKind.TIMEOUT, f"no reply within {self.timeout_s:g} s")
        except ChatCompletionError as error:
            kind = SimErrorKind.TIMEOUT if error.timed_out else SimErrorKind.ENDPOINT_ERROR
            return _failed(kind, f"{error.kind.value}: {error}")
        except Exception as error:  # a scripted simulator's bug is a flag, never a crash of the batch
            return _failed(SimErrorKind.SIMULATOR_ERROR, f"{type(error).__name__}: {error}")
        if not isinstance(raw, str):
            return _failed(SimErrorKind.SIMULATOR_ERROR, f"reply is {type(raw).__name__}, not str")
        agent_message = last_agent_message(request.messages)
        flag = check_reply(
            raw, request.instructions, turn=request.turn, stop_marker=self.stop_marker, checks=self.checks,
            agent_message=agent_message, system_prompt=self.system_text(request),
        )  # fmt: skip
        text = raw.replace(self.stop_marker, " ").strip()
        if flag is None and self.judge is not None and text:  # the rules vouched for the marker's use
            flag = await self.judge.judge(JudgeItem(text, agent_message, request.instructions))
        return UserTurn(text=text, stop=self.stop_marker in raw, raw=raw, flag=flag)

    async def aclose(self) -> None:
        """Close the simulator's and the judge's client sessions, if they have any."""
        close = getattr(self.simulator, "aclose", None)
        if callable(close):
            await close()
        if self.judge is not None:
            await self.judge.aclose()


def _failed(kind: SimErrorKind, message: str) -> UserTurn:
    return UserTurn(text="", stop=False, raw="", flag=SimFlag(kind, message[:500]))
