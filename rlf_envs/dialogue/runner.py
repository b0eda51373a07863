"""One simulated user turn that never raises: the simulator under a timeout, then the checks.

:class:`SimulatorRunner` wraps a :class:`~rlf_envs.dialogue.simulator.UserSimulator` with a time
limit and the :mod:`rlf_envs.dialogue.flags` rules. :meth:`SimulatorRunner.next_turn` returns a
:class:`UserTurn`: the user's message (stop marker removed) and whether it ends the
conversation, or a flag (``endpoint_error``, ``timeout``, ``simulator_error`` or a rule's kind).
All simulator calls of a vector step are awaited together on the env's loop, so they are in
flight at once (bounded by the LLM client's ``max_concurrency``).

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
from rlf_envs.dialogue.simulator import UserSimulator, UserTurnRequest
from rlf_envs.llm_client import ChatCompletionError

__all__ = ["SimulatorRunner", "UserTurn"]


@dataclass(frozen=True)
class UserTurn:
    """A simulated user turn: ``text`` (stop marker removed), ``stop``, the ``raw`` reply, or a ``flag``."""

    text: str
    stop: bool
    raw: str
    flag: SimFlag | None = None


class SimulatorRunner:
    """A simulator with a time limit and failure checks; shared by every episode of an env."""

    def __init__(
        self, simulator: UserSimulator, checks: SimChecks | None = None, *, timeout_s: float = 120.0
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.simulator = simulator
        self.checks = checks or SimChecks()
        self.timeout_s = float(timeout_s)
        self.stop_marker = str(getattr(simulator, "stop_marker", "") or "###STOP###")

    async def next_turn(self, request: UserTurnRequest) -> UserTurn:
        """The user's next message, or a flagged failure; never raises (but for cancellation)."""
        try:
            raw = await asyncio.wait_for(self.simulator.reply(request), self.timeout_s)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return _failed(SimErrorKind.TIMEOUT, f"no reply within {self.timeout_s:g} s")
        except ChatCompletionError as error:
            return _failed(SimErrorKind.ENDPOINT_ERROR, f"{error.kind.value}: {error}")
        except Exception as error:  # a scripted simulator's bug is a flag, never a crash of the batch
            return _failed(SimErrorKind.SIMULATOR_ERROR, f"{type(error).__name__}: {error}")
        if not isinstance(raw, str):
            return _failed(SimErrorKind.SIMULATOR_ERROR, f"reply is {type(raw).__name__}, not str")
        flag = check_reply(
            raw, request.instructions, turn=request.turn, stop_marker=self.stop_marker, checks=self.checks
        )
        text = raw.replace(self.stop_marker, " ").strip()
        return UserTurn(text=text, stop=self.stop_marker in raw, raw=raw, flag=flag)

    async def aclose(self) -> None:
        """Close the simulator's client sessions, if it has any."""
        close = getattr(self.simulator, "aclose", None)
        if callable(close):
            await close()


def _failed(kind: SimErrorKind, message: str) -> UserTurn:
    return UserTurn(text="", stop=False, raw="", flag=SimFlag(kind, message[:500]))
