"""Training-health checks: each step's metrics against the failure shapes RL runs are known for.

:class:`HealthMonitor` is pure: fed one step's metrics dict at a time (the keys of
:func:`rlf_trainer.observe.metrics.rollout_metrics` and :func:`rlf_trainer.algorithms.grpo.train_step`), it returns
a ``health/<check>`` flag per check (1.0 tripped, 0.0 fine) and the trips, each with a message
that gives the numbers and a hint that names the config key to change. :class:`HealthLog` does
the I/O: one line per new trip in ``<run dir>/health.jsonl`` (``{"step", "check", "message",
"hint"}``), a one-line warning the first time a check trips, and :class:`HealthCheckFailed` for
the checks in ``health.fail_on``. The checks, their metrics and default thresholds are tabled in
docs/trainer.md.

Example:
    >>> from rlf_trainer.config_sections import HealthConfig
    >>> monitor = HealthMonitor(HealthConfig(patience=2))
    >>> [monitor.update(step, {"groups/zero_variance": 1.0, "reward/mean": 0.0}).flags["health/no_learning_signal"]
    ...  for step in (1, 2)]
    [0.0, 1.0]
    >>> monitor.update(3, {"groups/zero_variance": 1.0, "reward/mean": 0.0}).trips[0].hint
    'raise algorithm.group_size or rollout.temperature, make the reward less all-or-nothing, or set algorithm.dynamic_sampling=true'
"""

from __future__ import annotations

import json
import sys
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlf_trainer.config_sections import HealthCheckName, HealthConfig

CHECK_NAMES: tuple[str, ...] = typing.get_args(HealthCheckName)
HEALTH_FILE = "health.jsonl"  # in the run dir: one Trip a line (RLF Studio reads it)
# Tool-call errors that mean the model wrote a bad call (not that a tool or server failed).
INVALID_CALL_KINDS = ("bad_json", "bad_format", "unknown_tool", "bad_arguments")

HINTS: dict[str, str] = {
    "over_budget": "raise rollout.max_total_tokens, or shorten the system prompt / connect fewer tools",
    "history_over_budget": "raise rollout.max_total_tokens, lower rollout.max_turns, "
    "or cap tool output with env.kwargs.max_result_chars",
    "no_learning_signal": "raise algorithm.group_size or rollout.temperature, make the reward less "
    "all-or-nothing, or set algorithm.dynamic_sampling=true",
    "entropy_collapse": "raise rollout.temperature, lower optim.lr, or use algorithm.loss=dapo "
    "(its clip_eps_high 0.28 keeps exploring)",
    "entropy_blowup": "lower optim.lr or optim.max_grad_norm; check the reward for outliers",
    "length_collapse": "check that the reward does not pay short or empty answers; lower optim.lr",
    "length_runaway": "lower rollout.max_new_tokens, check that the model ends its turns, "
    "or penalise overlong answers in the reward",
    "turn_truncation": "raise rollout.max_new_tokens: turns are cut before they end",
    "turn_limit": "read the samples: the policy keeps calling tools instead of answering; raise "
    "rollout.max_turns if the task needs more calls, or make the reward pay only answered episodes",
    "tool_call_errors": "lower optim.lr or raise algorithm.beta (KL to the reference); check that "
    "env.kwargs.parser matches the model's tool-call format",
    "repeated_tool_calls": "lower rollout.max_turns, or make the reward stop paying for repeated calls",
    "reward_vs_goal": "the reward may be gamed: read the samples, tighten the reward, or set "
    "health.goal_metric to the metric that says the task is solved",
    "reward_off_goal": "lower the shaping parts of the reward (format, tool use; env.kwargs.reward or the "
    "task's format_reward), or set health.goal_metric to the component that is the real goal",
    "sampler_mismatch": "the generator runs other weights than the trainer: check the weight sync "
    "(policy.backend, algorithm.tis_cap under rollout.overlap) and policy.vllm.dtype",
    "sim_errors": "check the user simulator (env.kwargs.user_simulator); rollout.drop_sim_errors "
    "keeps those episodes out of the update",
}


class HealthCheckFailed(RuntimeError):
    """A check named in ``health.fail_on`` tripped; ``trip`` says which, when and why."""

    def __init__(self, trip: Trip) -> None:
        super().__init__(
            f"health check {trip.check!r} failed at step {trip.step} (it is in health.fail_on): "
            f"{trip.message}. Try: {trip.hint}"
        )
        self.trip = trip


@dataclass(frozen=True)
class Trip:
    """One tripped check: the line ``health.jsonl`` holds."""

    step: int
    check: str
    message: str
    hint: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


@dataclass
class HealthReport:
    """One step's verdict: a flag per check, the checks tripped now, and those that were fine before."""

    flags: dict[str, float]
    trips: list[Trip] = field(default_factory=list)
    new: list[Trip] = field(default_factory=list)


class HealthMonitor:
    """Feed it each step's metrics (:meth:`update`); it remembers what the trend checks need.

    ``tool_schema_tokens`` and ``max_total_tokens`` (from
    :func:`rlf_trainer.observe.budget.check_prompt_budget`) only make the over-budget message precise.
    """

    def __init__(
        self,
        config: HealthConfig,
        *,
        max_total_tokens: int | None = None,
        tool_schema_tokens: int | None = None,
    ) -> None:
        self.config = config
        self.max_total_tokens = max_total_tokens
        self.tool_schema_tokens = tool_schema_tokens
        self.history: list[tuple[int, dict[str, float]]] = []
        self.tripped: set[str] = set()
        self.checks: dict[str, Callable[[dict[str, float]], str | None]] = {
            name: getattr(self, f"_{name}") for name in CHECK_NAMES
        }

    def update(self, step: int, metrics: dict[str, float]) -> HealthReport:
        """Check step ``step``'s ``metrics`` (eval metrics included when the step had an eval)."""
        current = {k: float(v) for k, v in metrics.items() if v is not None}
        if current.get("tool_calls_per_episode", 0.0) > 0:  # invalid calls per call (0 when none failed)
            current["tool_errors/invalid"] = sum(
                current.get(f"tool_errors/{k}", 0.0) for k in INVALID_CALL_KINDS
            )
        self.history.append((step, current))
        report = HealthReport(flags={})
        for name, check in self.checks.items():
            message = check(self.history[-1][1]) if self.config.enabled else None
            report.flags[f"health/{name}"] = float(message is not None)
            if message is None:
                self.tripped.discard(name)
                continue
            trip = Trip(step, name, message, HINTS[name])
            report.trips.append(trip)
            if name not in self.tripped:
                report.new.append(trip)
                self.tripped.add(name)
        return report

    def replay(self, records: list[dict[str, float]]) -> None:
        """Feed a resumed run's history back in, so the trend checks go on where the run stopped
        (nothing is reported again)."""
        for record in records:
            metrics = {k: v for k, v in record.items() if k != "step" and not k.startswith("health/")}
            self.update(int(record["step"]), metrics)

    # --------------------------------------------------------------------------- series helpers
    def _series(self, key: str) -> list[float]:
        return [m[key] for _, m in self.history if key in m]

    def _held(self, key: str, condition: Callable[[float], bool]) -> list[float] | None:
        """The last ``patience`` values of ``key`` when each of them meets ``condition`` (this step's included)."""
        n = self.config.patience
        recent = [m.get(key) for _, m in self.history[-n:]]
        if len(recent) < n or any(v is None or not condition(v) for v in recent):
            return None
        return typing.cast(list[float], recent)

    def _baseline(self, key: str) -> float | None:
        """Mean of ``key`` over its first ``baseline_steps`` values, once that many exist (and one more)."""
        values = self._series(key)
        n = self.config.baseline_steps
        return float(np.mean(values[:n])) if len(values) > n else None

    # --------------------------------------------------------------------------- the checks
    def _over_budget(self, m: dict[str, float]) -> str | None:
        share = m.get("silent_at_budget", 0.0)
        if share <= self.config.over_budget_share:
            return None
        budget = f"={self.max_total_tokens}" if self.max_total_tokens else ""
        tools = f" ({self.tool_schema_tokens} of them the tool schemas)" if self.tool_schema_tokens else ""
        prompt = m.get("prompt_length/max", float("nan"))
        return (
            f"{share:.0%} of episodes hit rollout.max_total_tokens{budget} before the model said "
            f"anything: the prompt takes up to {prompt:.0f} tokens{tools}"
        )

    def _history_over_budget(self, m: dict[str, float]) -> str | None:
        share = m.get("finish/max_total_tokens", 0.0) - m.get("silent_at_budget", 0.0)
        if share <= self.config.history_over_budget_share:
            return None
        return f"{share:.0%} of episodes ran out of rollout.max_total_tokens in mid-conversation"

    def _no_learning_signal(self, m: dict[str, float]) -> str | None:
        held = self._held("groups/zero_variance", lambda v: v >= self.config.zero_variance_share)
        if held is None or self._saturated(m):
            return None
        return (
            f"{held[-1]:.0%} of groups had all-equal rewards for {len(held)} steps: their advantages "
            "are 0, so the update learns nothing from them"
        )

    def _saturated(self, m: dict[str, float]) -> bool:
        """Every episode got the best reward of the run, after the run improved to it: solved, not stuck."""
        maxima, means = self._series("reward/max"), self._series("reward/mean")
        if "reward/min" not in m or not maxima or not means:
            return False
        return m["reward/min"] >= max(maxima) - 1e-9 and max(maxima) > means[0] + 1e-9

    def _entropy_collapse(self, m: dict[str, float]) -> str | None:
        held = self._held("entropy", lambda v: v < self.config.entropy_min)
        if held is None:
            return None
        return (
            f"token entropy {held[-1]:.3g} < health.entropy_min={self.config.entropy_min:g} for "
            f"{len(held)} steps: the policy has stopped exploring"
        )

    def _entropy_blowup(self, m: dict[str, float]) -> str | None:
        return self._relative("entropy", "token entropy", self.config.entropy_blowup_factor, above=True)

    def _length_collapse(self, m: dict[str, float]) -> str | None:
        return self._relative(
            "response_length", "response length", self.config.length_collapse_ratio, above=False
        )

    def _length_runaway(self, m: dict[str, float]) -> str | None:
        return self._relative(
            "response_length", "response length", self.config.length_runaway_ratio, above=True
        )

    def _relative(self, key: str, what: str, factor: float, *, above: bool) -> str | None:
        base = self._baseline(key)
        if base is None or base <= 0:
            return None
        held = self._held(key, lambda v: v > factor * base if above else v < factor * base)
        if held is None:
            return None
        direction = "above" if above else "below"
        return (
            f"{what} {held[-1]:.3g} is {direction} {factor:g}x its first steps' {base:.3g} "
            f"for {len(held)} steps"
        )

    def _turn_truncation(self, m: dict[str, float]) -> str | None:
        held = self._held("truncated_turns", lambda v: v > self.config.turn_truncation_share)
        if held is None:
            return None
        return f"{held[-1]:.0%} of turns were cut at rollout.max_new_tokens for {len(held)} steps"

    def _turn_limit(self, m: dict[str, float]) -> str | None:
        held = self._held("finish/max_turns", lambda v: v > self.config.turn_limit_share)
        if held is None:
            return None
        trend = ", ".join(f"{v:.0%}" for v in held)
        return (
            f"{held[-1]:.0%} of episodes reached rollout.max_turns without a final answer "
            f"for {len(held)} steps ({trend})"
        )

    def _tool_call_errors(self, m: dict[str, float]) -> str | None:
        base = self._baseline("tool_errors/invalid")
        limit = min(
            self.config.tool_error_max, (base if base is not None else 1.0) + self.config.tool_error_rise
        )
        held = self._held("tool_errors/invalid", lambda v: v > limit)
        if held is None:
            return None
        kinds = ", ".join(
            f"{k} {m[f'tool_errors/{k}']:.0%}" for k in INVALID_CALL_KINDS if f"tool_errors/{k}" in m
        )
        return (
            f"{held[-1]:.0%} of tool calls were invalid ({kinds}) for {len(held)} steps (limit {limit:.0%})"
        )

    def _repeated_tool_calls(self, m: dict[str, float]) -> str | None:
        held = self._held("repeated_tool_calls", lambda v: v > self.config.repeated_call_share)
        if held is None:
            return None
        return (
            f"{held[-1]:.0%} of tool calls repeated an identical call of the same episode for "
            f"{len(held)} steps"
        )

    def _reward_vs_goal(self, m: dict[str, float]) -> str | None:
        key = self.config.goal_metric or next(
            (k for k in ("eval/accuracy", "eval/reward") if self._series(k)), None
        )
        if key is None or key not in m:  # judged when a new goal value arrives
            return None
        points = [(step, metrics[key]) for step, metrics in self.history if key in metrics]
        window = points[-self.config.goal_window :]
        if len(window) < self.config.goal_window:
            return None
        (first_step, first_goal), (_, last_goal) = window[0], window[-1]
        rewards = [
            (step, metrics["reward/mean"]) for step, metrics in self.history if "reward/mean" in metrics
        ]
        before = [r for step, r in rewards if step <= first_step][-self.config.patience :]
        after = [r for _, r in rewards][-self.config.patience :]
        if not before or not after:
            return None
        rise = float(np.mean(after) - np.mean(before))
        if rise < self.config.goal_reward_rise or last_goal > first_goal:
            return None
        return (
            f"the training reward rose by {rise:.3g} since step {first_step} while {key} went "
            f"{first_goal:.3g} -> {last_goal:.3g}"
        )

    def _reward_off_goal(self, m: dict[str, float]) -> str | None:
        held = self._held("reward/off_goal_share", lambda v: v >= self.config.off_goal_reward_share)
        if held is None:
            return None
        parts = sorted(((k.removeprefix("reward_info/"), v) for k, v in m.items() if k.startswith("reward_info/")),
                       key=lambda kv: -abs(kv[1]))[:4]  # fmt: skip
        components = ", ".join(f"{k} {v:.2f}" for k, v in parts)
        return (
            f"{held[-1]:.0%} of the training reward went to episodes that missed the goal (em/acc) for "
            f"{len(held)} steps; mean reward components: {components or 'none reported'}"
        )

    def _sampler_mismatch(self, m: dict[str, float]) -> str | None:
        kl = m.get("sampler_kl")
        if kl is None or kl <= self.config.sampler_kl_max:
            return None
        return f"sampler_kl {kl:.3g} > health.sampler_kl_max={self.config.sampler_kl_max:g}"

    def _sim_errors(self, m: dict[str, float]) -> str | None:
        share = m.get("sim_error_rate", 0.0)
        if share <= self.config.sim_error_share:
            return None
        return f"the user simulator failed in {share:.0%} of episodes"


class HealthLog:
    """The I/O of the checks: ``health.jsonl`` lines, one warning per check, ``fail_on``.

    Call :meth:`write` on the main process only (``run_dir`` None writes nothing) and
    :meth:`raise_on_failure` on every process, so all ranks stop together.
    """

    def __init__(
        self, run_dir: str | Path | None, fail_on: list[str], *, echo: Callable[[str], Any] | None = None
    ):
        self.path = Path(run_dir) / HEALTH_FILE if run_dir is not None else None
        self.fail_on = set(fail_on)
        self.warned: set[str] = set()
        self.echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))

    def write(self, report: HealthReport) -> None:
        for trip in report.new:
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(trip.to_json() + "\n")
            if trip.check not in self.warned:
                self.warned.add(trip.check)
                self.echo(f"health warning [step {trip.step}] {trip.check}: {trip.message}. Try: {trip.hint}")

    def raise_on_failure(self, report: HealthReport) -> None:
        failing = [t for t in report.trips if t.check in self.fail_on]
        if failing:
            raise HealthCheckFailed(failing[0])
