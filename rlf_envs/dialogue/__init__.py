"""Multi-turn dialogue: user simulators in the env, and the rules that flag their failures.

Any tool env takes ``user_simulator=...``: then an assistant turn with neither a tool call nor a
final answer is answered by the simulated user (the observation is that user message) and the
episode ends when the simulator writes its stop marker. See docs/dialogue.md.

Example:
    >>> from rlf_envs.dialogue import SimErrorKind, check_reply
    >>> check_reply("As an AI, I cannot shop.", "You are Ann.", turn=1).kind is SimErrorKind.LEFT_PERSONA
    True
"""

from rlf_envs.dialogue.flags import (
    DEFAULT_STOP_MARKER,
    JudgeSettings,
    SimChecks,
    SimErrorKind,
    SimFlag,
    check_reply,
)
from rlf_envs.dialogue.judge import SimulatorJudge
from rlf_envs.dialogue.runner import DEFAULT_SIM_TIMEOUT_S, SimulatorRunner, UserTurn
from rlf_envs.dialogue.simulator import (
    DEFAULT_SIMULATOR_PROMPT,
    LLMUserSimulator,
    ScriptedUserSimulator,
    UserSimulator,
    UserTurnRequest,
    resolve_user_simulator,
    simulator_view,
)

__all__ = [
    "DEFAULT_SIMULATOR_PROMPT",
    "DEFAULT_SIM_TIMEOUT_S",
    "DEFAULT_STOP_MARKER",
    "JudgeSettings",
    "LLMUserSimulator",
    "ScriptedUserSimulator",
    "SimChecks",
    "SimErrorKind",
    "SimFlag",
    "SimulatorJudge",
    "SimulatorRunner",
    "UserSimulator",
    "UserTurn",
    "UserTurnRequest",
    "check_reply",
    "resolve_user_simulator",
    "simulator_view",
]
