"""Demonstrations from env rollouts: play an agent through any registered env id, keep the good episodes.

This is rejection sampling: every episode is played through the real env (its MCP tools, its
reward), and those whose reward reaches ``threshold`` are written as one JSONL line each, in the
chat-messages form that TRL's SFT trainer and LLaMA-Factory read::

    {"messages": [{"role": "system", ...}, {"role": "user", ...},
                  {"role": "assistant", "content": "...", "tool_calls": [...]},
                  {"role": "tool", "name": "search", "tool_call_id": "...", "content": "..."}, ...],
     "tools": [<OpenAI function schemas>],
     "env_id": "RLF/DeepSearch-v0", "task_id": "q0042", "task_index": 17, "split": "train",
     "seed": 3, "reward": 1.0, "reward_info": {...}}

An agent is ``agent(messages, tools, info) -> str`` (sync or async): the next assistant turn as
text, tool calls in the ``<tool_call>`` form the env parses. Three kinds are built in
(:func:`build_agent`): a scripted one (``deepsearch-oracle``, or any ``module:callable``), an
OpenAI-compatible endpoint (:class:`EndpointAgent`), and a local model through the trainer's
Hugging Face policy (:class:`LocalModelAgent`). The SFT stage (:mod:`rlf_trainer.algorithms.sft_data`) turns
these lines into the very token ids and loss masks the RL rollout builds.

Example:
    >>> from rlf_envs.tasks.deepsearch.oracle import DeepSearchOracle
    >>> oracle = DeepSearchOracle(world_seed=0)
    >>> report = collect_demonstrations("RLF/DeepSearch-v0", ScriptedAgent(oracle), out=path,
    ...                                 task_indices=range(8), threshold=1.0)   # doctest: +SKIP
    >>> report.kept, report.played                                              # doctest: +SKIP
    (8, 8)
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym

if TYPE_CHECKING:  # the module loads no torch: the rollout's types are imported where used
    from rlf_trainer.rollout.text_rollout import TextTurn

Message = dict[str, Any]
AgentFn = Callable[[list[Message], list[dict[str, Any]], dict[str, Any]], "str | Awaitable[str]"]


class CollectError(ValueError):
    """Bad input to the collector: an unknown env id, an unreachable endpoint, no task to play."""


class NoDemonstrationsError(CollectError):
    """No episode reached the reward threshold: nothing was written."""


@dataclass
class CollectReport:
    """What a collection did: episodes played, kept (written), skipped as already in the file."""

    out: Path
    played: int = 0
    kept: int = 0
    already_done: int = 0
    rewards: list[float] = field(default_factory=list)

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    def summary(self) -> str:
        return (
            f"kept {self.kept} of {self.played} episodes played (mean reward {self.mean_reward:.3f}); "
            f"{self.already_done} already in {self.out}"
        )


# --------------------------------------------------------------------------------------------- agents
class ScriptedAgent:
    """Wraps a plain callable ``fn(messages, info) -> str`` (e.g. the DeepSearch oracle)."""

    def __init__(self, fn: Callable[[list[Message], dict[str, Any]], str]) -> None:
        self.fn = fn

    def __call__(self, messages: list[Message], tools: list[dict[str, Any]], info: dict[str, Any]) -> str:
        return self.fn(messages, info)


class EndpointAgent:
    """Any OpenAI-compatible chat endpoint. The chat is sent as plain text turns (tools described in
    the system message, calls as ``<tool_call>`` blocks, results as ``<tool_response>`` blocks), so
    any chat model works, with or without native tool calling. ``rlf-eval`` plays its evals with
    :meth:`turn` (seeded requests, the endpoint's finish reason and token counts)."""

    def __init__(self, base_url: str, model: str, *, temperature: float = 0.0, max_tokens: int = 256,
                 timeout_s: float = 60.0, top_p: float = 1.0, api_key: str | None = None,
                 max_concurrency: int = 16) -> None:  # fmt: skip
        from rlf_envs.llm_client import OpenAIChatClient

        self.client = OpenAIChatClient(base_url, model, timeout_s=timeout_s, retries=1, api_key=api_key,
                                       max_concurrency=max_concurrency)  # fmt: skip
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens

    async def check(self) -> None:
        """One tiny request: an unreachable endpoint fails here, with its URL, not mid-run."""
        from rlf_envs.llm_client import ChatCompletionError

        try:
            await self.client.complete([{"role": "user", "content": "ping"}], max_tokens=1)
        except ChatCompletionError as exc:
            raise CollectError(f"the endpoint {self.client.url} did not answer: {exc}") from exc

    async def turn(
        self, messages: list[Message], tools: list[dict[str, Any]], seed: int | None = None
    ) -> TextTurn:
        """The next assistant turn, sent with ``seed`` (for endpoints that sample reproducibly), and
        what the endpoint says about it: finish reason and token usage."""
        from rlf_trainer.rollout.chat import plain_messages
        from rlf_trainer.rollout.text_rollout import TextTurn

        extra: dict[str, Any] = {} if seed is None else {"seed": seed}
        if self.top_p != 1.0:
            extra["top_p"] = self.top_p
        reply = await self.client.complete(
            plain_messages(messages, tools), max_tokens=self.max_tokens, temperature=self.temperature, **extra
        )
        usage = reply.usage
        return TextTurn(reply.text, reply.finish_reason or "stop", int(usage.get("prompt_tokens") or 0),
                        int(usage.get("completion_tokens") or 0))  # fmt: skip

    async def __call__(
        self, messages: list[Message], tools: list[dict[str, Any]], info: dict[str, Any]
    ) -> str:
        return (await self.turn(messages, tools)).text


class LocalModelAgent:
    """A local Hugging Face model folder, sampled through :class:`~rlf_trainer.policy.HFPolicy`.

    Turns are rendered with the model's chat template (:func:`rlf_trainer.rollout.chat.prompt_ids`), as the
    trainer renders them; generation runs one turn at a time on a worker thread.
    """

    def __init__(self, model_path: str | Path, *, temperature: float = 0.0, max_new_tokens: int = 256,
                 seed: int = 0) -> None:  # fmt: skip
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rlf_trainer.policy import HFPolicy
        from rlf_trainer.run.grouped_attention import use_grouped_sdpa

        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        model = AutoModelForCausalLM.from_pretrained(str(model_path))
        use_grouped_sdpa(model)
        self.policy = HFPolicy(model, tokenizer)
        self.temperature, self.max_new_tokens, self.seed = temperature, max_new_tokens, seed
        self._lock = threading.Lock()
        self._calls = 0

    def _generate(self, messages: list[Message], tools: list[dict[str, Any]]) -> str:
        from rlf_trainer.policy import SamplingParams
        from rlf_trainer.rollout import chat
        from rlf_trainer.rollout.trajectory import turn_end_id

        tokenizer = self.policy.tokenizer
        with self._lock:
            self._calls += 1
            params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                    seed=self.seed + self._calls, stop_token_ids=(turn_end_id(tokenizer),))  # fmt: skip
            completion = self.policy.generate([chat.prompt_ids(tokenizer, messages, tools)], params)[0]
        return completion.text

    async def __call__(
        self, messages: list[Message], tools: list[dict[str, Any]], info: dict[str, Any]
    ) -> str:
        return await asyncio.to_thread(self._generate, messages, tools)


def build_agent(spec: str | None = None, *, base_url: str | None = None, model: str | None = None,
                model_path: str | None = None, env_kwargs: dict[str, Any] | None = None,
                temperature: float = 0.0, max_tokens: int = 256, max_hops: int | None = None) -> AgentFn:  # fmt: skip
    """The agent the command line names: ``--agent`` (scripted), ``--base-url``/``--model``, or ``--model-path``.

    ``spec`` is ``deepsearch-oracle`` (the generated world's oracle, for ``world_seed`` in
    ``env_kwargs``, searching at most ``max_hops`` times), ``deepsearch-oracle-kinds`` (the same
    searches, saying what kind of thing the question asks for and each search found:
    :func:`~rlf_envs.tasks.deepsearch.oracle.oracle_turns`) or ``module:callable`` naming a scripted
    ``fn(messages, info) -> str``. GRPO guidance (``algorithm.guidance``) builds its demonstrator here too.

    Example:
        >>> agent = build_agent("deepsearch-oracle", env_kwargs={"world_seed": 0})
        >>> type(agent).__name__
        'ScriptedAgent'
        >>> build_agent()
        Traceback (most recent call last):
        ...
        rlf_trainer.data.demonstrations.CollectError: name one agent: --agent, --base-url with --model, or --model-path
    """
    chosen = [x for x in (spec, base_url, model_path) if x]
    if len(chosen) != 1:
        raise CollectError("name one agent: --agent, --base-url with --model, or --model-path")
    from rlf_envs.tasks.deepsearch.oracle import ORACLE_AGENTS, DeepSearchOracle

    if max_hops is not None and spec not in ORACLE_AGENTS:
        raise CollectError(
            f"--max-hops limits the scripted DeepSearch oracle: use it with --agent {' or '.join(ORACLE_AGENTS)}"
        )
    if base_url:
        if not model:
            raise CollectError("--base-url needs --model (the endpoint's model name)")
        return EndpointAgent(base_url, model, temperature=temperature, max_tokens=max_tokens)
    if model_path:
        if not Path(model_path).is_dir():
            raise CollectError(f"--model-path {model_path} is not a model folder")
        return LocalModelAgent(model_path, temperature=temperature, max_new_tokens=max_tokens)
    assert spec is not None
    if spec in ORACLE_AGENTS:
        if max_hops is not None and max_hops < 1:
            raise CollectError(f"--max-hops must be >= 1, got {max_hops}")
        world_seed = int((env_kwargs or {}).get("world_seed", 0))
        oracle = DeepSearchOracle(world_seed=world_seed, max_hops=max_hops, style=ORACLE_AGENTS[spec])
        return ScriptedAgent(oracle)
    module, _, attr = spec.partition(":")
    if not attr:
        names = " or ".join(repr(name) for name in ORACLE_AGENTS)
        raise CollectError(f"--agent {spec!r}: use {names}, or 'module:callable'")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise CollectError(f"--agent {spec!r}: cannot import it ({exc})") from exc
    return ScriptedAgent(fn)


# --------------------------------------------------------------------------------------------- files
def episode_key(task_id: Any, seed: int) -> tuple[str, int]:
    return (str(task_id), int(seed))


def read_done(path: Path) -> set[tuple[str, int]]:
    """The ``(task_id, seed)`` pairs already written to ``path`` (for ``--resume``)."""
    done: set[tuple[str, int]] = set()
    if not path.exists():
        return done
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            done.add(episode_key(record["task_id"], record["seed"]))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CollectError(f"{path}:{number} is not a demonstration line ({exc}); cannot resume") from exc
    return done


def _make_envs(env_id: str, num_envs: int, env_kwargs: dict[str, Any]) -> Any:
    try:
        return gym.make_vec(env_id, num_envs=num_envs, autoreset_mode="Disabled", **env_kwargs)
    except gym.error.Error as exc:
        known = sorted(k for k in gym.registry if k.startswith("RLF/"))
        raise CollectError(
            f"unknown env id {env_id!r} ({exc}); registered RLF ids: {', '.join(known)}"
        ) from exc


# --------------------------------------------------------------------------------------------- play
async def _play_episode(envs: Any, slot: int, agent: AgentFn, task_index: int, split: str,
                        seed: int) -> tuple[float, dict[str, Any], list[Message], list[dict[str, Any]]]:  # fmt: skip
    _, info = await envs.areset_one(slot, seed=seed, options={"task_index": task_index, "split": split})
    messages, tools = list(info["messages"]), list(info.get("tools") or [])
    first_info, reward = dict(info), 0.0
    while True:
        action = agent(messages, tools, first_info)
        if inspect.isawaitable(action):
            action = await action
        _, step_reward, terminated, truncated, info = await envs.astep_one(slot, str(action))
        reward += float(step_reward)  # the return, as the trainer counts it
        messages = list(info.get("messages") or messages)
        if terminated or truncated:
            return reward, info, messages, tools


async def acollect(
    env_id: str,
    agent: AgentFn,
    *,
    out: str | Path,
    task_indices: Iterable[int],
    split: str = "train",
    samples_per_task: int = 1,
    seed: int = 0,
    threshold: float = 1.0,
    concurrency: int = 8,
    env_kwargs: dict[str, Any] | None = None,
    resume: bool = False,
    progress: Callable[[CollectReport, int], None] | None = None,
) -> CollectReport:
    """:func:`collect_demonstrations` on the running event loop."""
    out = Path(out)
    if out.exists() and not resume:
        raise CollectError(f"{out} exists: pass resume=True (--resume) to append, or choose another file")
    done = read_done(out) if resume else set()
    jobs = [(int(t), seed + k) for t in task_indices for k in range(samples_per_task)]
    if not jobs:
        raise CollectError("no task to play: the task selection is empty")
    check = getattr(agent, "check", None)
    if check is not None:
        await check()
    envs = _make_envs(env_id, max(1, min(concurrency, len(jobs))), dict(env_kwargs or {}))
    report = CollectReport(out)
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with out.open("a") as sink:

            async def worker(slot: int) -> None:
                while not queue.empty():
                    job = queue.get_nowait()
                    await _play_job(envs, slot, agent, job, env_id, split, threshold, done, report, sink)
                    if progress is not None:
                        progress(report, len(jobs))

            await asyncio.gather(*(worker(slot) for slot in range(int(envs.num_envs))))
    finally:
        await asyncio.to_thread(envs.close)
    if report.kept == 0 and report.played > 0:
        best = max(report.rewards)
        raise NoDemonstrationsError(
            f"no episode reached the threshold {threshold} ({report.played} played, best reward {best:.3f}); "
            "lower --threshold or use a stronger agent"
        )
    return report


async def _play_job(
    envs: Any, slot: int, agent: AgentFn, job: tuple[int, int], env_id: str, split: str,
    threshold: float, done: set[tuple[str, int]], report: CollectReport, sink: Any,
) -> None:  # fmt: skip
    """One (task, seed): skipped when already in the file, else played and, above the threshold, written."""
    task_index, episode_seed = job
    task_id = envs_task_id(envs, split, task_index)
    if episode_key(task_id, episode_seed) in done:
        report.already_done += 1
        return
    reward, info, messages, tools = await _play_episode(envs, slot, agent, task_index, split, episode_seed)
    report.played += 1
    report.rewards.append(reward)
    if reward >= threshold:
        report.kept += 1
        record = {"messages": messages, "tools": tools, "env_id": env_id, "task_id": task_id,
                  "task_index": task_index, "split": split, "seed": episode_seed, "reward": reward,
                  "reward_info": info.get("reward_info") or {}}  # fmt: skip
        sink.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        sink.flush()


def envs_task_id(envs: Any, split: str, task_index: int) -> str:
    """The id of ``split``'s ``task_index``-th instance (for envs whose step info omits ``task_id``)."""
    instances = envs.task.instances(split)
    return str(instances[task_index % len(instances)].id)


def collect_demonstrations(env_id: str, agent: AgentFn, **kwargs: Any) -> CollectReport:
    """Play ``agent`` through ``env_id`` on ``task_indices`` x ``samples_per_task`` episodes; keep the
    ones whose return reaches ``threshold`` (see :func:`acollect` for the arguments, the module
    docs for the file format). Raises :class:`CollectError` on bad input and
    :class:`NoDemonstrationsError` when no episode passed."""
    return asyncio.run(acollect(env_id, agent, **kwargs))


def select_tasks(envs_task: Any, split: str, where: dict[str, Sequence[str]] | None = None,
                 limit: int | None = None) -> list[int]:  # fmt: skip
    """Indices of ``split``'s instances whose ``metadata[key]`` is one of ``where[key]`` (as text).

    Example:
        >>> from rlf_envs.tasks.deepsearch.task import DeepSearchTask
        >>> task = DeepSearchTask(world_seed=0)
        >>> picked = select_tasks(task, "train", {"hops": ["1"]}, limit=5)
        >>> len(picked), all(task.instances("train")[i].metadata["hops"] == 1 for i in picked)
        (5, True)
    """
    picked = []
    for index, instance in enumerate(envs_task.instances(split)):
        meta = instance.metadata or {}
        if all(str(meta.get(key)) in values for key, values in (where or {}).items()):
            picked.append(index)
    return picked[:limit] if limit is not None else picked


__all__ = [
    "CollectError",
    "CollectReport",
    "EndpointAgent",
    "LocalModelAgent",
    "NoDemonstrationsError",
    "ScriptedAgent",
    "acollect",
    "build_agent",
    "collect_demonstrations",
    "read_done",
    "select_tasks",
]
