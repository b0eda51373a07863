"""``rlf-eval``: a model folder or an OpenAI-compatible endpoint on any env id, n prompts x k samples.

Examples::

    rlf-eval --env RLF/DeepSearch-v0 --env-kwargs '{"world_seed": 0, "max_turns": 4}' \\
        --model-path runs/deepsearch/seed0/grpo/model --group-by hops \\
        --num-prompts 100 --samples 4 --temperature 0.7 --pass-k 1 4 --out evals/grpo.json
    rlf-eval --config examples/configs/deepsearch_smollm2_sft_cpu.yaml --out base_eval.json seed=1
    rlf-eval --env RLF/SQL-v0 --base-url https://api.openai.com/v1 --model gpt-4o-mini \\
        --api-key-env OPENAI_API_KEY --num-prompts 50 --out evals/sql_gpt.json

The eval is the trainer's (:mod:`rlf_trainer.observe.evaluation`): the same fixed sample of test
prompts, the same seeds, the same ``eval/*`` metrics. With ``--config`` (and no other flag) it is
the eval the trainer runs on that config's model before training (the seeds of step 0); dotted
overrides follow as for ``rlf-train``, and each flag sets the config key it stands for.
``--samples`` k > 1 adds avg@k and unbiased pass@k (``--pass-k``). Writes the JSON report
(``--out``) and one JSONL line per episode (``--samples-out``); a progress bar goes to stderr.
Exit codes: 0 done; 2 a bad argument or config, a missing model folder, an unreachable endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlf_trainer.config import Config, ConfigError, load_config
from rlf_trainer.run.allocator import relaunch_with_fast_allocator

if TYPE_CHECKING:  # torch loads only once the arguments are known to be good
    from rlf_trainer.observe.evaluation import EvalEpisode, EvalSpec


class EvalCliError(Exception):
    """A problem the user can fix, said in one line (exit code 2)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlf-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    env = p.add_argument_group("what to evaluate on (--env, or a trainer config)")
    env.add_argument("--config", help="a trainer YAML config: its env, model and eval.* settings")
    env.add_argument("--env", help="a registered env id, e.g. RLF/DeepSearch-v0")
    env.add_argument(
        "--env-kwargs", help='JSON object of env kwargs (merged over the config\'s), e.g. {"max_turns": 4}'
    )
    env.add_argument("--split", help="the task split to play (default: env.test_split, test)")
    env.add_argument("overrides", nargs="*", help="dotted.key=value config overrides, as for rlf-train")
    policy = p.add_argument_group("the policy (a model folder, or an endpoint; default: the config's model)")
    policy.add_argument("--model-path", help="a Hugging Face model folder")
    policy.add_argument(
        "--backend", choices=["hf", "vllm"], help="how a model folder generates (default: policy.backend)"
    )
    policy.add_argument("--base-url", help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    policy.add_argument("--model", help="the endpoint's model name (with --base-url)")
    policy.add_argument("--api-key-env", help="the environment variable holding the endpoint's API key "
                        "(default: OPENAI_API_KEY when it is set; none otherwise)")  # fmt: skip
    policy.add_argument(
        "--request-timeout-s", type=float, default=120.0, help="seconds for one endpoint request"
    )
    sampling = p.add_argument_group("sampling (defaults: the config's eval.*)")
    sampling.add_argument("--num-prompts", type=int, help="n: prompts, a fixed seeded sample of the split")
    sampling.add_argument("--samples", type=int, default=1, help="k: samples of each prompt (default 1)")
    sampling.add_argument("--temperature", type=float)
    sampling.add_argument("--top-p", type=float)
    sampling.add_argument("--max-new-tokens", type=int, help="tokens per assistant turn")
    sampling.add_argument("--seed", type=int, help="the run seed: every request's seed derives from it")
    sampling.add_argument("--batch-size", type=int,
                          help="episodes played at once (default: the trainer's, prompts_per_step x group_size)")  # fmt: skip
    report = p.add_argument_group("the report")
    report.add_argument("--pass-k", type=int, nargs="+", help="the k of pass@k (default: 1 and --samples)")
    report.add_argument("--group-by", help="a task metadata key with metrics per value, e.g. hops")
    report.add_argument("--success-reward", type=float, default=1.0,
                        help="for an env without em/acc: the reward that counts as correct (default 1.0)")  # fmt: skip
    report.add_argument("--out", required=True, help="the JSON report")
    report.add_argument(
        "--samples-out", help="the samples JSONL (default: the report's name + .samples.jsonl)"
    )
    report.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``rlf-eval``; 0 when the report is written, 2 (with one line on stderr) on a problem the
    user can fix."""
    args = _parser().parse_intermixed_args(argv)
    if argv is None:  # a command: a caching malloc (rlf_trainer.run.allocator)
        relaunch_with_fast_allocator()
    try:
        return run(args)
    except EvalCliError as exc:
        print(f"rlf-eval: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    """Check the arguments, build the policy and the envs, play, write the report and the samples."""
    endpoint = _check_policy_args(args)
    config = eval_config(args)
    spec = eval_spec(args, config)
    started = time.perf_counter()
    from rlf_envs.tools.mcp_errors import MCPServerStartError

    try:
        if endpoint:
            episodes, main_process = _play_endpoint(args, config, spec), True
        else:
            episodes, main_process = _play_model(args, config, spec)
    except MCPServerStartError as exc:  # the message holds each server's reason and stderr tail
        raise EvalCliError(f"the env's tools did not start: {exc}") from None
    if not main_process:
        return 0
    from rlf_trainer.observe.evaluation import episode_counts, episode_records, eval_metrics

    out, samples_out = Path(args.out), Path(args.samples_out or samples_path_for(args.out))
    report = {
        "metrics": dict(sorted(eval_metrics(episodes, spec).items())),
        "counts": episode_counts(episodes),
        "eval": {**dataclasses.asdict(spec), "pass_k": list(spec.pass_k), "prompts": _prompts(episodes)},
        "env": {"id": config.env.id, "kwargs": config.env.kwargs, "import_kwargs": config.env.import_kwargs},
        "policy": _policy_summary(args, config),
        "samples_file": str(samples_out),
        "wall_s": time.perf_counter() - started,
    }
    for path in (out, samples_out):
        path.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    lines = (json.dumps(r, ensure_ascii=False, default=str) for r in episode_records(episodes, spec))
    samples_out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    print(summary_line(report["metrics"], len(report["eval"]["prompts"]), spec.samples, out, samples_out))
    return 0


# --------------------------------------------------------------------------------------------- arguments
def _check_policy_args(args: argparse.Namespace) -> bool:
    """Whether the policy is an endpoint; one policy named, and a model folder that exists."""
    if not args.config and not args.env:
        raise EvalCliError("name what to evaluate on: --env ID (with --env-kwargs) or --config X.yaml")
    if args.base_url and args.model_path:
        raise EvalCliError("name one policy: --model-path DIR or --base-url URL with --model NAME")
    if args.base_url:
        if not args.model:
            raise EvalCliError("--base-url needs --model (the endpoint's model name)")
        if args.backend:
            raise EvalCliError("--backend is for a model folder, not an endpoint")
        return True
    if args.model:
        raise EvalCliError("--model names an endpoint's model: add --base-url, or use --model-path DIR")
    if args.model_path and not Path(args.model_path).is_dir():
        raise EvalCliError(f"--model-path {args.model_path}: no such model folder")
    if not args.model_path and not args.config:
        raise EvalCliError("name a policy: --model-path DIR, or --base-url URL with --model NAME")
    return False


def eval_config(args: argparse.Namespace) -> Config:
    """The trainer config the eval runs from: ``--config`` (or the defaults), its overrides, then the
    flags (each sets the config key it stands for, so the trainer's eval reads them)."""
    values: dict[str, Any] = {}
    if args.env:
        values["env.id"] = args.env
    for key, value in _env_kwargs(args.env_kwargs).items():
        values[f"env.kwargs.{key}"] = value
    if args.model_path:
        values |= {"model.path": args.model_path, "model.prepare": None}
    elif args.base_url:  # the config needs a model; an endpoint's is its name, and nothing loads it
        values |= {"model.path": args.model, "model.prepare": None}
    flags = {"policy.backend": args.backend, "env.test_split": args.split, "eval.num_prompts": args.num_prompts,
             "eval.temperature": args.temperature, "eval.top_p": args.top_p, "eval.group_by": args.group_by,
             "rollout.max_new_tokens": args.max_new_tokens, "seed": args.seed}  # fmt: skip
    values |= {key: value for key, value in flags.items() if value is not None}
    try:
        return load_config(args.config, args.overrides, values)
    except ConfigError as exc:
        raise EvalCliError(f"config error: {exc}") from None
    except OSError as exc:
        raise EvalCliError(f"--config {args.config}: {exc.strerror or exc}") from None


def _env_kwargs(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvalCliError(f"--env-kwargs is not JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise EvalCliError(f"--env-kwargs must be a JSON object, got {type(kwargs).__name__}")
    return kwargs


def eval_spec(args: argparse.Namespace, config: Config) -> EvalSpec:
    """The trainer's eval of ``config`` with ``--samples`` per prompt and the asked pass@k."""
    from rlf_trainer.observe.evaluation import EvalSpec

    pass_k = tuple(args.pass_k) if args.pass_k else tuple(sorted({1, args.samples}))
    try:
        spec = dataclasses.replace(
            EvalSpec.of_config(config),
            samples=args.samples,
            pass_k=pass_k,
            success_reward=args.success_reward,
        )
    except ValueError as exc:
        raise EvalCliError(str(exc)) from None
    if spec.samples > 1 and spec.temperature == 0:
        print(f"rlf-eval: note: {spec.samples} samples at temperature 0 are greedy: a deterministic "
              "policy gives every sample the same answer (set --temperature)", file=sys.stderr)  # fmt: skip
    return spec


def samples_path_for(out: str) -> str:
    """The default samples file beside a report.

    Example:
        >>> samples_path_for("evals/grpo.json"), samples_path_for("report")
        ('evals/grpo.samples.jsonl', 'report.samples.jsonl')
    """
    path = Path(out)
    return str(path.with_name(f"{path.stem if path.suffix == '.json' else path.name}.samples.jsonl"))


def _api_key(name: str | None) -> str | None:
    """The key from the named variable (which must be set), else OPENAI_API_KEY when set; never printed."""
    if name is None:
        return os.environ.get("OPENAI_API_KEY") or None
    key = os.environ.get(name)
    if not key:
        raise EvalCliError(f"--api-key-env {name}: the environment variable {name} is not set")
    return key


# --------------------------------------------------------------------------------------------- playing
def _make_envs(config: Config, num_envs: int) -> Any:
    import gymnasium as gym

    from rlf_trainer import build

    try:
        return build.make_envs(config, num_envs)
    except gym.error.Error as exc:
        known = sorted(k for k in gym.registry if k.startswith("RLF/"))
        raise EvalCliError(f"env {config.env.id!r}: {exc}; registered RLF ids: {', '.join(known)}") from None


def _planned(envs: Any, spec: EvalSpec, share: slice = slice(None)) -> int:
    """How many episodes this process plays (a split the task lacks is the user's to fix)."""
    from rlf_trainer.observe.evaluation import eval_plan

    try:
        return len(eval_plan(envs.num_tasks(spec.split), spec)[share])
    except KeyError as exc:
        raise EvalCliError(str(exc.args[0]) if exc.args else str(exc)) from None


def _play_endpoint(args: argparse.Namespace, config: Config, spec: EvalSpec) -> list[EvalEpisode]:
    from rlf_envs.llm_client import ChatCompletionError
    from rlf_trainer.data.demonstrations import CollectError, EndpointAgent
    from rlf_trainer.observe.evaluation import aplay_eval_text
    from rlf_trainer.observe.progress import episode_progress

    batch = args.batch_size or config.rollout.prompts_per_step * config.algorithm.group_size
    agent = EndpointAgent(args.base_url, args.model, temperature=spec.temperature, top_p=spec.top_p,
                          max_tokens=spec.max_new_tokens, timeout_s=args.request_timeout_s,
                          api_key=_api_key(args.api_key_env), max_concurrency=batch)  # fmt: skip
    try:
        asyncio.run(agent.check())
    except CollectError as exc:
        raise EvalCliError(_one_line(exc)) from None
    envs = _make_envs(config, batch)
    try:
        total = _planned(envs, spec)
        with episode_progress("rlf-eval", total, enabled=not args.no_progress) as advance:
            return asyncio.run(aplay_eval_text(envs, agent.turn, spec, advance))
    except ChatCompletionError as exc:
        raise EvalCliError(
            f"the endpoint {agent.client.url} failed during the eval: {_one_line(exc)}"
        ) from None
    finally:
        envs.close()


def _play_model(args: argparse.Namespace, config: Config, spec: EvalSpec) -> tuple[list[EvalEpisode], bool]:
    """This process's share played with the model folder, gathered: (every episode, main process?)."""
    if config.policy.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise EvalCliError("--backend vllm needs vLLM installed (pip install -e '.[vllm]')")
    from accelerate.utils import set_seed

    from rlf_trainer import build
    from rlf_trainer.observe.evaluation import gather_episodes, play_eval
    from rlf_trainer.observe.progress import episode_progress
    from rlf_trainer.rollout.collect import RolloutState, episodes_per_process
    from rlf_trainer.run.distributed import make_accelerator, stop_rank_watch
    from rlf_trainer.run.precision import resolve_mixed_precision

    config.mixed_precision = resolve_mixed_precision(config.mixed_precision)
    accelerator = make_accelerator(config.distributed.timeout_s, mixed_precision=config.mixed_precision)
    set_seed(config.seed)
    policy = envs = None
    try:
        model_path = build.prepared_model_path(config, accelerator)
        try:
            tokenizer = build.load_tokenizer(config, model_path)
            model = None
            if config.policy.backend == "hf":
                model = build.load_inference_model(config, model_path).to(accelerator.device)
        except OSError as exc:
            folder = Path(model_path).is_absolute() or model_path.startswith(".")  # not a hub id
            if folder and not Path(model_path).is_dir():
                raise EvalCliError(f"model.path {model_path}: no such model folder") from None
            raise EvalCliError(f"cannot load the model {model_path!r}: {_one_line(exc)}") from None
        envs = _make_envs(config, args.batch_size or episodes_per_process(config, accelerator.num_processes))
        share = slice(accelerator.process_index, None, accelerator.num_processes)
        total = _planned(envs, spec, share)
        policy = build.make_policy(config, accelerator, model, tokenizer, model_path)
        showing = accelerator.is_main_process and not args.no_progress
        with episode_progress("rlf-eval", total, enabled=showing) as advance:
            episodes = play_eval(RolloutState(config, accelerator, policy, envs), spec, advance)
        return gather_episodes(accelerator, episodes), accelerator.is_main_process
    finally:
        if policy is not None:
            policy.close()
        stop_rank_watch(accelerator)
        if envs is not None:
            envs.close()


# --------------------------------------------------------------------------------------------- output
def _prompts(episodes: list[EvalEpisode]) -> list[int]:
    """The split's task index of each eval prompt, in eval order."""
    return [e.planned.task_index for e in episodes if e.planned.sample == 0]


def _policy_summary(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    if args.base_url:
        return {"base_url": args.base_url, "model": args.model}
    return {
        "model_path": config.model.path,
        "prepare": config.model.prepare,
        "backend": config.policy.backend,
    }


def summary_line(metrics: dict[str, float], prompts: int, samples: int, out: Path, samples_out: Path) -> str:
    """What ``rlf-eval`` prints when done.

    Example:
        >>> m = {"eval/reward": 0.5, "eval/accuracy": 0.25, "eval/pass@1": 0.25, "eval/pass@4": 0.5, "eval/avg@4": 0.25}
        >>> summary_line(m, 8, 4, Path("r.json"), Path("r.samples.jsonl"))
        'rlf-eval: 32 episodes (8 prompts x 4): reward 0.500  accuracy 0.250  avg@4 0.250  pass@1 0.250  pass@4 0.500 -> r.json, r.samples.jsonl'
    """
    shown = [("reward", metrics.get("eval/reward")), ("accuracy", metrics.get("eval/accuracy"))]
    shown += sorted(
        (k.removeprefix("eval/"), v) for k, v in metrics.items() if k.startswith(("eval/pass@", "eval/avg@"))
    )
    figures = "  ".join(f"{name} {value:.3f}" for name, value in shown if value is not None)
    return f"rlf-eval: {prompts * samples} episodes ({prompts} prompts x {samples}): {figures} -> {out}, {samples_out}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
