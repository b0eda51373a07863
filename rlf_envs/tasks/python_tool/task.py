"""RLF/PythonTool-v0: math problems with large numbers, a sandboxed ``run_python`` tool and ``<answer>``.

The problems are generated (see :mod:`rlf_envs.tasks.python_tool.problems`), so the task needs no
download; the tool is our sandbox MCP server (``python -m rlf_envs.tasks.python_tool.server``),
started by the env over stdio. The reward is 1.0 when the final ``<answer>`` is exactly the integer
answer, else 0.0. The task decides the sandbox's isolation when it is built (``"auto"`` probes
bubblewrap once), passes that mode to the server, logs it once and reports it in every reset
``info["sandbox"]``.

Example:
    >>> task = PythonToolTask(seed=0, kind="word", num_train=10, num_test=5)
    >>> instance = task.instances("test")[0]
    >>> instance.answer.lstrip("-").isdigit(), instance.metadata["kind"]
    (True, 'word')
"""

from __future__ import annotations

import functools
from typing import Any

from rlf_envs.answers import extract_answer
from rlf_envs.core.task import Task
from rlf_envs.isolation import (
    DEFAULT_BWRAP,
    IsolationMode,
    IsolationSettingError,
    IsolationUnavailableError,
    probe_bubblewrap,
    resolve_isolation,
)
from rlf_envs.rewards.rules import episode_prediction, math_equal
from rlf_envs.servers.launch import stdio_server_entry
from rlf_envs.tasks.python_tool.problems import KINDS, generate_problems
from rlf_envs.tasks.python_tool.sandbox import SandboxConfigError, SandboxStartError
from rlf_envs.types import Episode, RewardValue, TaskInstance

PYTHON_SERVER_MODULE = "rlf_envs.tasks.python_tool.server"  # this task's MCP server, run as `python -m`

SYSTEM_PROMPT = """\
You solve math problems whose numbers are too large to work out reliably in your head.
Call the `run_python` tool with a short Python program that computes the result and prints it, \
for example: print((48213 * 379 - 1204557) // 7). The tool returns what the program printed. \
Each call starts a fresh interpreter with only the standard library, so print everything you need \
and repeat any definitions in later calls.
When you know the answer, reply with only the final integer inside <answer> and </answer>, \
for example: <answer> 18272727 </answer>."""

TOOL_NAME = "run_python"


class PythonToolTask(Task):
    """Generated integer-answer math problems solved with a sandboxed python tool.

    Args:
        seed: generation seed; the same seed gives the same problems in both splits.
        max_turns: assistant turns before the episode is truncated.
        kind: "arithmetic" (operation chains), "word" (word problems) or "mixed".
        num_train, num_test: problems per split (the test split does not depend on num_train).
        cpu_s, memory_mb, output_chars, wall_s, disk_mb: per-call limits of the sandbox server
            (``disk_mb``: the private tmpfs of a call under bwrap).
        sandbox_concurrency: programs the sandbox server runs at once (more calls wait).
        isolation: ``"auto"`` (bubblewrap when it works here, else the in-process guards, with a
            warning), ``"bwrap"`` (:class:`SandboxStartError` now when it does not work) or
            ``"guards"``. The resolved mode is in :attr:`isolation` and ``info["sandbox"]``.
        bwrap_path: the bubblewrap binary (a name on PATH or a path).
    """

    name = "python_tool"
    system_prompt = SYSTEM_PROMPT
    answer_tag = "answer"

    def __init__(
        self,
        *,
        seed: int = 0,
        max_turns: int = 4,
        kind: str = "arithmetic",
        num_train: int = 1000,
        num_test: int = 200,
        cpu_s: float = 5.0,
        memory_mb: int = 256,
        output_chars: int = 3000,
        wall_s: float = 10.0,
        disk_mb: int = 64,
        sandbox_concurrency: int = 16,
        isolation: str = "auto",
        bwrap_path: str = DEFAULT_BWRAP,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; choose one of {list(KINDS)}")
        if num_train < 1 or num_test < 1:
            raise ValueError(f"both splits need problems, got num_train={num_train}, num_test={num_test}")
        self.seed = seed
        self.max_turns = max_turns
        self.kind = kind
        self.num_train = num_train
        self.num_test = num_test
        self.cpu_s = cpu_s
        self.memory_mb = memory_mb
        self.output_chars = output_chars
        self.wall_s = wall_s
        self.disk_mb = disk_mb
        self.sandbox_concurrency = sandbox_concurrency
        self.bwrap_path = bwrap_path
        self.isolation = _resolve_isolation(isolation, bwrap_path)
        # "auto" that fell back to guards stays "auto" for the server, which then warns every
        # client in its MCP instructions and sandbox_stats (a resolved "guards" would not)
        self.fell_back = isolation == "auto" and self.isolation is IsolationMode.GUARDS

    @functools.cached_property
    def split_instances(self) -> dict[str, list[TaskInstance]]:
        problems = generate_problems(self.seed, self.kind, self.num_test + self.num_train)
        splits: dict[str, list[TaskInstance]] = {"test": [], "train": []}
        for index, problem in enumerate(problems):
            split = "test" if index < self.num_test else "train"
            position = len(splits[split])
            splits[split].append(
                TaskInstance(
                    id=f"{self.kind}-{self.seed}-{split}-{position}",
                    question=problem.question,
                    answer=str(problem.answer),
                    metadata={
                        "kind": self.kind,
                        "template": problem.template,
                        "solution_code": problem.solution_code,
                    },
                )
            )
        return splits

    def mcp_config(self) -> dict[str, Any]:
        """``{"mcpServers": {"python": ...}}`` running the sandbox server with this task's limits."""
        args = [
            *("--cpu-s", str(self.cpu_s), "--memory-mb", str(self.memory_mb)),
            *("--output-chars", str(self.output_chars), "--wall-s", str(self.wall_s)),
            *("--max-concurrency", str(self.sandbox_concurrency), "--disk-mb", str(self.disk_mb)),
            # the mode resolved here, so the server runs in the mode this task reports
            *("--isolation", "auto" if self.fell_back else self.isolation.value, "--bwrap", self.bwrap_path),
        ]
        # calls may queue behind the sandbox's concurrency limit before their wall clock starts
        entry = stdio_server_entry(PYTHON_SERVER_MODULE, args, timeout_s=3 * self.wall_s + 30)
        return {"mcpServers": {"python": entry}}

    def env_info(self) -> dict[str, Any]:
        """``{"sandbox": {"isolation": "bwrap" | "guards", ...}}``: how ``run_python`` is isolated."""
        bwrap = probe_bubblewrap(self.bwrap_path).bubblewrap
        if self.isolation is IsolationMode.BWRAP and bwrap is not None:
            return {"sandbox": bwrap.info()}
        info: dict[str, Any] = {"isolation": self.isolation.value}
        if self.fell_back:
            info["warning"] = "bubblewrap did not work here: guards mode is not a security boundary"
        return {"sandbox": info}

    async def reward(self, episode: Episode) -> RewardValue:
        """1.0 when the answer is exactly the gold integer, else 0.0, with ``format`` and ``used_tool``.

        Example:
            >>> # {"reward": 1.0, "correct": 1.0, "format": 1.0, "used_tool": 1.0}
        """
        prediction = episode_prediction(episode, self.answer_tag)
        # exact: the default relative tolerance would accept 18272728 for 18272727
        correct = float(math_equal(prediction, str(episode.instance.answer), rel_tol=0.0, abs_tol=0.0))
        well_formed = extract_answer(episode.final_response, self.answer_tag) not in (None, "")
        used_tool = any(call["name"] == TOOL_NAME and call["ok"] for call in episode.tool_calls)
        return {
            "reward": correct,
            "correct": correct,
            "format": float(well_formed),
            "used_tool": float(used_tool),
        }


def _resolve_isolation(setting: str, bwrap_path: str) -> IsolationMode:
    """The mode ``setting`` resolves to here (logged once per process and mode), or a sandbox error."""
    try:
        return resolve_isolation(setting, bwrap_path=bwrap_path, purpose="RLF/PythonTool-v0 run_python")
    except IsolationSettingError as error:
        raise SandboxConfigError(str(error)) from error
    except IsolationUnavailableError as error:
        raise SandboxStartError(str(error)) from error
