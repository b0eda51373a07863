"""The env contract's ``info`` keys: one name per key, with its type, when it is set and what it means.

``reset`` and ``step`` return an ``info`` dict (Gymnasium's API). These constants are its keys;
the env writes them and the trainer, the studio and the benchmarks read them through these names.
:data:`INFO_KEYS` describes each one and docs/env_contract.md shows the same table (a test keeps
the two equal). A vector env batches every key as Gymnasium does: ``infos[key]`` is an array over
the envs and ``infos["_" + key]`` the mask of envs that set it.

Example:
    >>> import gymnasium as gym, rlf_envs
    >>> env = gym.make("RLF/ToolUse-v0", tasks=[{"question": "2+2?", "answer": "4"}])
    >>> _, info = env.reset(seed=0)
    >>> [m["role"] for m in info[MESSAGES]], info[TASK_ID]
    (['system', 'user'], '0')
    >>> info = env.step("<answer>4</answer>")[-1]
    >>> info[ANSWER], info[REWARD_INFO]["em"]
    ('4', 1.0)
    >>> env.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

# --- reset (and every step: the chat so far) -------------------------------------------------
MESSAGES: Final = "messages"
TOOLS: Final = "tools"
TASK_ID: Final = "task_id"
TASK_METADATA: Final = "task_metadata"
# --- an ongoing step --------------------------------------------------------------------------
TOOL_MESSAGES: Final = "tool_messages"
TOOL_CALLS: Final = "tool_calls"
ERRORS: Final = "errors"
TURN_REWARD: Final = "turn_reward"
USER_MESSAGE: Final = "user_message"
# --- the step that ends an episode ------------------------------------------------------------
ANSWER: Final = "answer"
REWARD_INFO: Final = "reward_info"
USER_STOP: Final = "user_stop"
SIM_ERROR: Final = "sim_error"
SIM_ERROR_MESSAGE: Final = "sim_error_message"
SIM_RAW: Final = "sim_raw"
# --- vector env only --------------------------------------------------------------------------
INACTIVE: Final = "inactive"
FINAL_OBS: Final = "final_obs"
FINAL_INFO: Final = "final_info"


@dataclass(frozen=True)
class InfoKey:
    """One ``info`` key: its ``name``, the ``type`` of its value, ``when`` it is set, its ``meaning``."""

    name: str
    type: str
    when: str
    meaning: str


INFO_KEYS: tuple[InfoKey, ...] = (
    InfoKey(MESSAGES, "list[dict]", "reset, step",
            "the whole chat so far (system, user, assistant with `tool_calls`, tool and user messages)"),
    InfoKey(TOOLS, "list[dict]", "reset",
            "the tools' schemas in OpenAI function format, without the task's hidden arguments"),
    InfoKey(TASK_ID, "str", "reset", "the id of the task instance the episode runs"),
    InfoKey(TASK_METADATA, "dict", "reset",
            "the instance's metadata (e.g. DeepSearch's `hops`): the trainer's `eval.group_by` reads it"),
    InfoKey(TOOL_MESSAGES, "list[dict]", "step",
            "this turn's tool results as `{role: tool, name, tool_call_id, content}` messages"),
    InfoKey(TOOL_CALLS, "list[dict]", "step",
            "a record per call: `id, name, arguments, ok, error, latency_s, truncated, cached`"),
    InfoKey(ERRORS, "list[str]", "step",
            "the error kinds of this turn's calls (`rlf_envs.types.ErrorKind` values)"),
    InfoKey(TURN_REWARD, "float", "tool or user turn",
            "the task's process reward of this turn (`Task.turn_reward`), already in `reward`"),
    InfoKey(USER_MESSAGE, "dict", "user turn",
            "the simulated user's reply `{role: user, content}`, also the last entry of `messages`"),
    InfoKey(ANSWER, "str or None", "episode end",
            "the extracted `<answer>` (None when the episode ended without one)"),
    InfoKey(REWARD_INFO, "dict", "episode end",
            "the reward function's dict (`reward` plus its parts, e.g. `em`, `f1`; `reward_error` on a bug)"),
    InfoKey(USER_STOP, "bool", "episode end", "True when the simulated user's stop marker ended the episode"),
    InfoKey(SIM_ERROR, "str", "episode end",
            "the user simulator failed or was flagged: a `rlf_envs.dialogue.SimErrorKind` value"),
    InfoKey(SIM_ERROR_MESSAGE, "str", "episode end", "why the simulator's reply was flagged"),
    InfoKey(SIM_RAW, "str", "episode end", "the flagged reply as the simulator wrote it"),
    InfoKey(INACTIVE, "bool", "vector step",
            "True: the env had already finished (autoreset Disabled), the step did nothing"),
    InfoKey(FINAL_OBS, "str", "vector step", "autoreset SameStep: the last observation of the finished episode"),
    InfoKey(FINAL_INFO, "dict", "vector step", "autoreset SameStep: the last info of the finished episode"),
)  # fmt: skip

# Why a trainer's trajectory ended (its ``finish_reason``): one place for every value.
EpisodeFinishReason = Literal["answer", "max_turns", "max_total_tokens", "sim_error"]
FINISH_ANSWER: Final = "answer"  # the env terminated the episode (an answer, a turn without tool call)
FINISH_MAX_TURNS: Final = "max_turns"  # the env truncated it (max_turns or its own budget)
FINISH_MAX_TOKENS: Final = "max_total_tokens"  # the trainer's token budget ran out
FINISH_SIM_ERROR: Final = "sim_error"  # the env ended it because the user simulator failed (SIM_ERROR)
FINISH_REASONS: tuple[str, ...] = get_args(EpisodeFinishReason)

__all__ = [
    "ANSWER",
    "ERRORS",
    "FINAL_INFO",
    "FINAL_OBS",
    "FINISH_ANSWER",
    "FINISH_MAX_TOKENS",
    "FINISH_MAX_TURNS",
    "FINISH_REASONS",
    "FINISH_SIM_ERROR",
    "INACTIVE",
    "INFO_KEYS",
    "MESSAGES",
    "REWARD_INFO",
    "SIM_ERROR",
    "SIM_ERROR_MESSAGE",
    "SIM_RAW",
    "TASK_ID",
    "TASK_METADATA",
    "TOOLS",
    "TOOL_CALLS",
    "TOOL_MESSAGES",
    "TURN_REWARD",
    "USER_MESSAGE",
    "USER_STOP",
    "EpisodeFinishReason",
    "InfoKey",
]
