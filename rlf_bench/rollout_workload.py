"""The rollout bench's workload: settings, the always-call-the-tool parser, the latency-server env.

Shared by ``rlf-bench rollout`` (:mod:`rlf_bench.rollout_bench`) and its train-step part
(:mod:`rlf_bench.overlap_bench`), so both measure the same episodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LATENCY_MODULE = "rlf_envs.servers.latency"


@dataclass(frozen=True)
class RolloutBenchSettings:
    episodes: int = 64
    tool_turns: int = 3
    latency_dist: str = "lognormal"
    latency_ms: float = 500.0
    sigma: float = 1.0
    max_new_tokens: int = 32
    repeats: int = 3
    backend: str = "vllm"
    model: str | None = None
    seed: int = 0


class AlwaysSleepParser:
    """Every assistant turn is one ``sleep`` call: the tool load does not depend on the model's skill."""

    def parse(self, text: str) -> Any:
        from rlf_envs.tools.parsers import ParsedTurn
        from rlf_envs.types import ToolCall

        return ParsedTurn(calls=[ToolCall("sleep", {})], content=text)


def bench_tasks() -> list[dict[str, str]]:
    """16 prompts; the bench's parser makes every turn a tool call whatever the model writes."""
    return [{"id": f"e{i}", "question": f"Task {i}: wait for the tool, then answer."} for i in range(16)]


def latency_server(settings: RolloutBenchSettings, seed: int) -> dict[str, Any]:
    """The ``mcpServers`` entry of the heavy-tailed latency server (one stdio process, async inside)."""
    from rlf_envs.servers.launch import stdio_server_entry

    args = ["--latency-dist", settings.latency_dist, "--latency-ms", str(settings.latency_ms)]
    args += ["--sigma", str(settings.sigma), "--seed", str(seed)]
    return stdio_server_entry(LATENCY_MODULE, args, timeout_s=300)


def make_bench_envs(settings: RolloutBenchSettings, seed: int) -> Any:
    """A ToolUse-v0 vector env of ``settings.episodes`` episodes over the latency server."""
    import gymnasium as gym

    import rlf_envs  # noqa: F401  (registers the ids)

    return gym.make_vec(
        "RLF/ToolUse-v0",
        num_envs=settings.episodes,
        mcp_servers={"mcpServers": {"latency": latency_server(settings, seed)}},
        tasks=bench_tasks(),
        reward="exact_match",
        parser=AlwaysSleepParser(),
        max_turns=settings.tool_turns,
        autoreset_mode="Disabled",
    )


def tool_latency_bound(settings: RolloutBenchSettings, draws: int = 2000, seed: int = 0) -> float:
    """The best speed-up any scheduler can get over lockstep on the tool latencies alone.

    Lockstep waits, every turn, for the slowest call of the batch: ``sum_t max_i x_it``; no
    schedule can finish before the slowest episode's own calls: ``max_i sum_t x_it``. This is the
    ratio of their means over ``draws`` batches drawn from the latency server's own sampler
    (generation time left out: it adds barrier time to lockstep and compute to both).

    Example:
        >>> flat = RolloutBenchSettings(latency_dist="uniform", latency_ms=100.0)
        >>> tool_latency_bound(flat, draws=10)    # equal latencies: nothing to gain
        1.0
    """
    from rlf_envs.servers.latency import latency_sampler

    draw = latency_sampler(settings.latency_ms, dist=settings.latency_dist, sigma=settings.sigma, seed=seed)
    lockstep = ideal = 0.0
    for _ in range(draws):
        batch = [[draw() for _ in range(settings.tool_turns)] for _ in range(settings.episodes)]
        lockstep += sum(max(episode[t] for episode in batch) for t in range(settings.tool_turns))
        ideal += max(sum(episode) for episode in batch)
    return round(lockstep / ideal, 3) if ideal > 0 else 1.0
