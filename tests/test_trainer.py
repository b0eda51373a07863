"""Trainer end to end on the tiny Qwen3 and RLF/ToolUse-v0 with a real MCP server (stdio).

One 2-step run (module fixture) is checked for its TensorBoard tags, checkpoints, learning-curve
PNG, samples and metrics (and, where wandb is installed, its offline wandb run: ``logging.report_to``
with two trackers); then a fresh trainer resumed from its step-1 checkpoint must reproduce step 2
exactly (prompts, samples, loss, parameters).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rlf_trainer.config import ConfigError
from rlf_trainer.observe.trackers import builtin_trackers, installed_trackers
from rlf_trainer.prompts import PromptSampler
from rlf_trainer.run.checkpoint import list_checkpoints, read_state
from rlf_trainer.trainer import Trainer, eval_due
from tests.helpers import REPO, TINY_CONFIG, model_params, text_reward, tiny_config, train_py_command

EXPECTED_TAGS = {
    "reward/mean",
    "reward/std",
    "accuracy",
    "tool_calls_per_episode",
    "tool_error_rate",
    "turns",
    "response_length",
    "kl",
    "entropy",
    "loss",
    "lr",
    "grad_norm",
    "time/generate",
    "time/tools",
    "time/train",
    "time/step",
    "time/rollout",
    "time/sync",
    "samples/s",
    "kept_episodes",
    "groups/zero_variance",
    "eval/reward",
    "eval/accuracy",
    "time/eval",
}


HAS_WANDB = importlib.util.find_spec("wandb") is not None


@pytest.fixture(scope="module")
def straight_run(tiny_model_dir, tmp_path_factory):
    """Two steps in one go, a checkpoint after each, eval at step 2; logged to TensorBoard and, where
    wandb is installed, to an offline wandb run as well."""
    run_root = tmp_path_factory.mktemp("runs")
    report_to = "[tensorboard, wandb]" if HAS_WANDB else "[tensorboard]"
    config = tiny_config(
        tiny_model_dir, run_root, "logging.run_name=straight", "checkpoint.keep_last=0",
        f"logging.report_to={report_to}",
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")  # wandb writes its run files and reaches no server
        env.setenv("WANDB_SILENT", "true")
        trainer = Trainer(config)
        history = trainer.train()
    return trainer, history, model_params(trainer)


def test_two_steps_write_tensorboard_checkpoints_curve_and_samples(straight_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, history, _ = straight_run
    run_dir = trainer.run_dir
    assert trainer.step == 2 and [r["step"] for r in history.records] == [1, 2]

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags >= EXPECTED_TAGS, EXPECTED_TAGS - tags
    # old_logprobs=recompute: the ratio is 1 by construction, so its statistics are not logged
    assert not tags & {"clip_fraction", "ratio_mean", "approx_kl_old"}
    assert [e.step for e in events.Scalars("reward/mean")] == [1, 2]
    assert [e.step for e in events.Scalars("eval/reward")] == [2]
    assert events.Scalars("lr")[0].value == pytest.approx(1e-3)

    last = history.records[-1]
    assert last["grad_norm"] > 0 and last["reward/std"] > 0  # the test reward gives the update a signal
    # k3 KL to the reference (beta > 0): zero before the first update, positive once the policy moved
    assert history.records[0]["kl"] == pytest.approx(0.0, abs=1e-5) and last["kl"] > 1e-6
    assert last["entropy"] > 0 and last["kept_episodes"] == 4
    # In fp32 the HF policy samples with the trained module itself: sampler KL and staleness are 0 by
    # construction, so they are not logged (under bf16 it samples with a bf16 copy: see below)
    assert not {"sampler_kl", "rollout/staleness"} & set(last)
    assert last["response_length"] > 0 and last["turns"] >= 1

    checkpoints = list_checkpoints(trainer.config.checkpoint_dir)
    assert [p.name for p in checkpoints] == ["step_00000001", "step_00000002"]
    state = read_state(checkpoints[0])
    assert state["step"] == 1 and state["sampler"] == {"seed": 0, "num_tasks": 4, "position": 2, "epoch": 0}
    assert (checkpoints[0] / "model.safetensors").is_file() and (checkpoints[0] / "optimizer.bin").is_file()

    png = run_dir / "learning_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and "eval/reward" in metrics[1]

    eval_samples = [json.loads(line) for line in (run_dir / "eval_samples.jsonl").read_text().splitlines()]
    assert len(eval_samples) == 4 and {s["step"] for s in eval_samples} == {2}
    assert eval_samples[0]["prompt"] == "Echo the word ping."
    assert eval_samples[0]["transcript"][1] == {"role": "user", "content": "Echo the word ping."}
    assert all(isinstance(s["reward"], float) for s in eval_samples)
    train_samples = (run_dir / "train_samples.jsonl").read_text().splitlines()
    assert len(train_samples) == 4  # 2 a step
    assert (run_dir / "config.yaml").is_file()


def wandb_history(run_file: Path, key: str) -> list[float]:
    """The values of ``key`` in the history records of an offline wandb run file, in logged order.

    wandb 0.31 ships no Python reader for its ``.wandb`` files (its core is a Go binary); the format
    is LevelDB's log: a 7-byte file header, then 32 KiB blocks of chunks, each a 7-byte header
    (checksum, little-endian length, type: 1 full, 2 first, 3 middle, 4 last) and a piece of one
    serialized ``Record`` protobuf, whose message classes wandb does ship.
    """
    from wandb.proto.wandb_internal_pb2 import Record

    data, pos, block, pieces, values = run_file.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a record is complete
            record = Record.FromString(pieces)
            pieces = b""
            if record.WhichOneof("record_type") == "history":
                values += [
                    json.loads(item.value_json)
                    for item in record.history.item
                    if (item.key or "/".join(item.nested_key)) == key
                ]
    return values


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install wandb; the dev extra has it)")
def test_report_to_tensorboard_and_wandb_writes_both(straight_run):
    trainer, history, _ = straight_run
    assert list((trainer.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    [run_file] = (trainer.run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    logged = [r["reward/mean"] for r in history.records]
    assert wandb_history(run_file, "reward/mean") == pytest.approx(logged)
    assert wandb_history(run_file, "eval/reward") == pytest.approx([history.records[-1]["eval/reward"]])


def test_a_tracker_that_is_unknown_or_not_installed_stops_the_run_before_the_model_loads(tmp_path):
    # the model folder does not exist: a run that got as far as loading it would fail on that instead
    missing_model = tmp_path / "no-such-model"
    with pytest.raises(
        ConfigError, match=r"'wandbb', which is not one of Accelerate's trackers \(did you mean 'wandb'\?\)"
    ):
        Trainer(tiny_config(missing_model, tmp_path, "logging.report_to=[tensorboard, wandbb]"))
    absent = sorted(set(builtin_trackers()) - {"all", *installed_trackers()})
    if not absent:
        pytest.skip("every tracker Accelerate knows is installed here")
    with pytest.raises(
        ConfigError, match=rf"names {absent[0]}, but it is not installed here: pip install {absent[0]}"
    ):
        Trainer(tiny_config(missing_model, tmp_path, f"logging.report_to=[{absent[0]}]"))
    assert not (tmp_path / "tiny_test").exists()  # nothing written either


def test_resume_from_step_one_reproduces_step_two_exactly(straight_run, tiny_model_dir, tmp_path):
    straight, straight_history, straight_params = straight_run
    first = list_checkpoints(straight.config.checkpoint_dir)[0]
    with torch.no_grad():
        changed = any(not torch.equal(straight_params[k], v) for k, v in _checkpoint_params(first).items())
    assert changed, "step 2 must change the parameters, or the comparison below proves nothing"

    config = tiny_config(
        tiny_model_dir,
        tmp_path,
        "logging.run_name=resumed",
        f"checkpoint.resume={first}",
        "checkpoint.every=0",
    )
    resumed = Trainer(config)
    assert resumed.step == 1
    history = resumed.train()
    assert resumed.step == 2

    a, b = straight.last_batch, resumed.last_batch
    assert [s.task_id for s in a.stats] == [s.task_id for s in b.stats]
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    assert torch.allclose(a.old_logprobs, b.old_logprobs, atol=1e-6)
    step2_a, step2_b = straight_history.records[-1], history.records[-1]
    for key in ("loss", "grad_norm", "reward/mean", "kl", "entropy", "eval/reward", "lr"):
        assert step2_b[key] == pytest.approx(step2_a[key], abs=1e-6), key
    resumed_params = model_params(resumed)
    assert resumed_params.keys() == straight_params.keys()
    for name, value in straight_params.items():
        assert torch.allclose(resumed_params[name], value, atol=1e-6, rtol=0), name
    assert [r["step"] for r in history.records] == [1, 2]  # the history came back with the checkpoint


def test_resume_in_the_same_run_folder_keeps_one_version_of_each_step(straight_run, tiny_model_dir, tmp_path):
    """A stopped run logged steps past its last checkpoint, the last line cut short: after the
    resume each step is there once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    straight = straight_run[0]
    shutil.copytree(straight.run_dir, tmp_path / "straight")
    first = list_checkpoints(tmp_path / "straight" / "checkpoints")[0]
    with open(tmp_path / "straight" / "train_samples.jsonl", "a") as f:
        f.write('{"step": 3, "transcript": [{"role": "assi')  # died mid-write (a full disk did it)
    config = tiny_config(
        tiny_model_dir,
        tmp_path,
        "logging.run_name=straight",
        f"checkpoint.resume={first}",
        "checkpoint.every=0",
    )
    resumed = Trainer(config)
    resumed.train()
    run_dir = tmp_path / "straight"

    def steps(name: str) -> list[int]:
        return [json.loads(line)["step"] for line in (run_dir / name).read_text().splitlines()]

    assert steps("train_samples.jsonl") == [1, 1, 2, 2]  # not [1, 1, 2, 2, 2, 2]
    assert steps("eval_samples.jsonl") == [2, 2, 2, 2]
    assert steps("metrics.jsonl") == [1, 2]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward/mean")] == [1, 2]
    assert [e.step for e in events.Scalars("eval/reward")] == [2]


def test_the_final_model_folder_loads_with_the_trained_weights(straight_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer, _, trained = straight_run
    folder = trainer.config.model_dir
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert loaded.state_dict().keys() == trained.keys()
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, trained[name]), name
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == trainer.tokenizer.chat_template and len(tokenizer) == len(
        trainer.tokenizer
    )


def test_lora_trains_only_the_adapters_and_the_saved_model_has_them_merged(
    tiny_model_dir, tmp_path, tiny_model
):
    """LoRA: the reference model is the base with adapters disabled, so KL is exactly 0 until B moves."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(
        tiny_model_dir,
        tmp_path,
        "logging.run_name=lora",
        "lora.enabled=true",
        "lora.r=4",
        "lora.alpha=8",
        "lora.target_modules=[q_proj, v_proj]",
        "checkpoint.every=0",
        "eval.every=0",
    )
    trainer = Trainer(config)
    history = trainer.train()
    first, second = history.records
    assert first["kl"] == 0.0 and second["kl"] > 0  # lora_B starts at zero: policy == reference at step 1
    assert first["grad_norm"] > 0

    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    state = peft_model.state_dict()
    lora_b = [v for k, v in state.items() if "lora_B" in k]
    assert lora_b and all(float(v.abs().max()) > 0 for v in lora_b)
    initial = tiny_model.state_dict()
    for name, value in state.items():
        if "lora_" not in name:
            base = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(value, initial[base]), f"{name}: a frozen base weight moved"

    merged = AutoModelForCausalLM.from_pretrained(trainer.config.model_dir, dtype=torch.float32).eval()
    assert merged.state_dict().keys() == initial.keys()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        expected = peft_model.eval()(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        untrained = tiny_model(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-5)
    assert float((got - untrained).abs().max()) > 1e-3  # the merge carried the adapters' change


# one train step, nothing else: no eval, no checkpoint
ONE_STEP = ("max_steps=1", "eval.every=0", "checkpoint.every=0", "checkpoint.save_final=false")


def one_step(tiny_model_dir: Path, run_root: Path, *overrides: str) -> tuple[Any, dict[str, float], dict[str, torch.Tensor]]:  # fmt: skip
    """(rollout batch, metrics, parameters) after one train step of a fresh trainer."""
    config = tiny_config(tiny_model_dir, run_root, *ONE_STEP, "checkpoint.save_model=false", *overrides)
    trainer = Trainer(config)
    try:
        metrics = trainer.train_step()
        return trainer.last_batch, metrics, model_params(trainer)
    finally:
        trainer.close()


@pytest.mark.parametrize(
    "lora",
    [(), ("lora.enabled=true", "lora.r=4", "lora.target_modules=[q_proj, v_proj]", "optim.lr=0.02")],
    ids=["full", "lora"],
)
def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir, tmp_path, lora):
    """Same rollout, same loss, same new weights; with LoRA too (where frozen inputs need grads enabled).
    Both forward whole rows: a checkpointed model cannot share a prefix, and the shared pass's
    rounding alone moves Adam's first step by more than the 1e-6 compared here."""
    whole_rows = ("shared_prefix=false", *lora)
    batch, plain, plain_params = one_step(tiny_model_dir, tmp_path / "plain", *whole_rows)
    batch_gc, checkpointed, gc_params = one_step(
        tiny_model_dir, tmp_path / "gc", "gradient_checkpointing=true", *whole_rows
    )
    assert torch.equal(batch.input_ids, batch_gc.input_ids)  # the comparison below is of the update alone
    assert plain["grad_norm"] > 0
    assert checkpointed["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
    assert checkpointed["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    assert gc_params.keys() == plain_params.keys()
    for name, value in plain_params.items():
        assert torch.allclose(gc_params[name], value, atol=1e-6, rtol=0), name


def test_compiled_layers_give_the_same_rollout_and_update(tiny_model_dir, tmp_path):
    """`compile: true`: the policy and the reference run compiled layers in the update, the HF
    policy samples with the same (shared, fp32) module eagerly: same episodes, same step."""
    from transformers import AutoModelForCausalLM

    kl = ("algorithm.beta=0.1",)
    batch, plain, plain_params = one_step(tiny_model_dir, tmp_path / "plain", *kl)
    config = tiny_config(tiny_model_dir, tmp_path / "compiled", *ONE_STEP, "compile=true", *kl)
    trainer = Trainer(config)
    try:
        compiled = trainer.train_step()
        layers = [
            trainer.accelerator.unwrap_model(trainer.model).model.layers,
            trainer.learner.ref_model.model.layers,
        ]
        assert all(layer._compiled_call_impl is not None for stack in layers for layer in stack)
        assert torch.equal(trainer.last_batch.input_ids, batch.input_ids)
        assert compiled["loss"] == pytest.approx(plain["loss"], abs=1e-6)
        assert compiled["kl"] == pytest.approx(plain["kl"], abs=1e-6)  # the reference's compiled forward
        assert compiled["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
        # Adam's first step moves a weight by ~lr x sign(grad): a grad within rounding of 0 may flip
        lr, moved = config.optim.lr, []
        for name, value in model_params(trainer).items():
            assert torch.allclose(plain_params[name], value, atol=2.5 * lr, rtol=0), name
            moved.append((plain_params[name] - value).abs().flatten() > 1e-6)
        assert float(torch.cat(moved).float().mean()) < 1e-3
        saved = AutoModelForCausalLM.from_pretrained(trainer.save_model(), dtype=torch.float32)
        assert {n: p.shape for n, p in saved.named_parameters()} == {
            n: p.shape for n, p in trainer.model.named_parameters()
        }
    finally:
        trainer.close()


def test_compile_without_a_compiler_or_decoder_layers_says_so(tiny_model_dir, tmp_path, monkeypatch):
    from rlf_trainer.run.compile import CompileError, decoder_layers

    monkeypatch.setenv("CXX", "no-such-c++")
    with pytest.raises(
        CompileError, match=r"found no \$CXX \(no-such-c\+\+\) on the PATH.*set compile: false"
    ):
        Trainer(tiny_config(tiny_model_dir, tmp_path, "compile=true"))
    with pytest.raises(CompileError, match="Linear has none: set compile: false"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_bf16_keeps_float32_weights_and_samples_with_a_synced_bf16_copy(
    tiny_model_dir, tmp_path, monkeypatch, caplog
):
    """Also: bf16 named on a CPU without native bf16 (its flags replaced by none) is run, with a warning."""
    from rlf_trainer.run import precision

    config = tiny_config(
        tiny_model_dir, tmp_path, "max_steps=2", "eval.every=0", "checkpoint.every=0", "mixed_precision=bf16"
    )
    monkeypatch.setattr(precision, "read_cpu_flags", lambda: set())
    with caplog.at_level(logging.WARNING, logger="rlf_trainer.trainer"):
        trainer = Trainer(config)
    assert "torch emulates it here" in caplog.text
    try:
        first = trainer.train_step()
        trainer.train_step()
        trained = trainer.accelerator.unwrap_model(trainer.model)
        params = model_params(trainer)
        sampler = trainer.policy.model
        assert all(v.dtype == torch.float32 for v in params.values())  # autocast, float32 master weights
        assert sampler is not trained and next(sampler.parameters()).dtype == torch.bfloat16
        for name, value in trained.state_dict().items():  # the copy got the step's weights
            assert torch.equal(sampler.state_dict()[name], value.to(torch.bfloat16)), name
    finally:
        trainer.close()
    assert first["grad_norm"] > 0 and 0 <= first["sampler_kl"] < 1e-2


def test_bf16_with_stochastic_rounding_keeps_the_cast_weights_on_bf16_values(tiny_model_dir, tmp_path):
    """``optim.stochastic_rounding``: after each step the weights that autocast casts (the linear
    layers) are bf16 values, so the bf16 sampling copy holds exactly those trained weights; the
    ones the update uses in fp32 (norms, embeddings) keep their fp32 updates; fp32 runs round nothing."""
    from rlf_trainer.algorithms.optimize import rounds_stochastically
    from rlf_trainer.run.bf16_rounding import autocast_matmul_parameters, is_bf16_valued

    overrides = ("max_steps=2", "eval.every=0", "checkpoint.every=0", "optim.stochastic_rounding=true")
    trainer = Trainer(tiny_config(tiny_model_dir, tmp_path, *overrides, "mixed_precision=bf16"))
    try:
        trained = trainer.accelerator.unwrap_model(trainer.model)
        cast = {id(p) for p in autocast_matmul_parameters(trainer.model)}
        names = {name for name, p in trained.named_parameters() if id(p) in cast}
        assert names and all(".mlp." in n or ".self_attn." in n for n in names)
        start = {k: v.clone() for k, v in model_params(trainer).items()}
        assert not all(is_bf16_valued(start[n]) for n in names)  # the tiny model is initialised in fp32
        trainer.train_step()
        trainer.train_step()
        params, sampler = model_params(trainer), trainer.policy.model.state_dict()
        assert all(params[n].dtype == torch.float32 and is_bf16_valued(params[n]) for n in names)
        assert all(torch.equal(sampler[n].float(), params[n]) for n in names)
        assert any(not torch.equal(params[n], start[n]) for n in names)
        norms = [n for n in params if "norm" in n]
        assert any(not is_bf16_valued(params[n]) for n in norms)  # updated in fp32, not rounded
    finally:
        trainer.close()
    config = trainer.config.model_copy(deep=True)
    config.mixed_precision = "no"  # resolved, as the trainer leaves it
    assert rounds_stochastically(trainer.config) and not rounds_stochastically(config)


def _checkpoint_params(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_prompt_sampler_covers_epochs_and_is_a_function_of_seed_and_step():
    sampler = PromptSampler(num_tasks=7, seed=3)
    stream = [i for step in range(7) for i in sampler.indices(step, 3)]  # 21 prompts = 3 epochs
    assert [sorted(stream[e * 7 : (e + 1) * 7]) for e in range(3)] == [list(range(7))] * 3
    assert stream[:7] != stream[7:14]  # each epoch reshuffled
    assert PromptSampler(num_tasks=7, seed=3).indices(5, 3) == sampler.indices(5, 3) == stream[15:18]
    assert PromptSampler(num_tasks=7, seed=4).indices(0, 7) != sampler.indices(0, 7)
    unknown = PromptSampler(num_tasks=None, seed=3)
    assert unknown.indices(2, 4) == unknown.indices(2, 4) and len(set(unknown.indices(0, 50))) > 40
    assert sampler.state(2, 3) == {"seed": 3, "num_tasks": 7, "position": 6, "epoch": 0}


def test_eval_runs_every_n_steps_and_after_the_last():
    assert [s for s in range(1, 11) if eval_due(s, 4, 10)] == [4, 8, 10]
    assert [s for s in range(1, 9) if eval_due(s, 4, 8)] == [4, 8]
    assert [s for s in range(1, 4) if eval_due(s, 20, 3)] == [3]
    assert not any(eval_due(s, 0, 5) for s in range(1, 6))


def test_cli_runs_one_step_on_cpu(tiny_model_dir, tmp_path):
    """``python examples/train.py --config ... key=value``: the way a user starts a CPU run."""
    result = subprocess.run(
        train_py_command(
            tiny_model_dir,
            tmp_path,
            "max_steps=1",
            "eval.every=5",  # not a multiple of the run's length: the last step still evaluates
            "algorithm.beta=0",
        ),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 1 steps logged" in result.stdout and "eval/reward=" in result.stdout
    assert (tmp_path / "tiny_test" / "checkpoints" / "step_00000001" / "trainer_state.json").is_file()
    assert f"model: {tmp_path / 'tiny_test' / 'model'}" in result.stdout
    assert (tmp_path / "tiny_test" / "model" / "config.json").is_file()
    (metrics,) = [
        json.loads(line) for line in (tmp_path / "tiny_test" / "metrics.jsonl").read_text().splitlines()
    ]
    assert metrics["step"] == 1 and "eval/reward" in metrics
    bad = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train.py"), "--config", str(TINY_CONFIG), "optim.lrr=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "unknown key 'optim.lrr'" in bad.stderr


def silent_for_ping(episode) -> dict[str, float]:
    """0 for "ping" (a group without signal), the spread of text_reward for every other task."""
    if "ping" in episode.instance.question:
        return {"reward": 0.0}
    return text_reward(episode)


def test_dynamic_sampling_refills_a_silent_group_with_new_prompts(tiny_model_dir, tmp_path):
    first_draw = PromptSampler(4, 0).indices(0, 2)
    config = tiny_config(
        tiny_model_dir,
        tmp_path,
        "max_steps=1",
        "eval.every=0",
        "checkpoint.every=0",
        "checkpoint.save_final=false",
        "checkpoint.save_model=false",
        "algorithm.dynamic_sampling=true",
        "algorithm.max_refill_rounds=4",
    )
    tasks = config.env.kwargs["tasks"]  # t0 asks for "ping": put it where step 0 draws from
    tasks[0], tasks[first_draw[0]] = tasks[first_draw[0]], tasks[0]
    config.env.kwargs["reward"] = silent_for_ping
    trainer = Trainer(config)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    batch = trainer.last_batch
    assert metrics["groups/zero_variance"] == 0.5 and metrics["refill_rounds"] >= 1
    assert metrics["groups/refilled"] == 1 and metrics["kept_episodes"] == 4  # the batch is full again
    rewards = batch.rewards.reshape(-1, 2)
    assert torch.all(rewards[:, 0] != rewards[:, 1])  # every group trained on carries signal
    questions = [t[1]["content"] for t in batch.transcripts]
    assert not any("ping" in q for q in questions)


def test_async_rollout_mode_trains_with_the_hf_policy(tiny_model_dir, tmp_path):
    """``rollout.mode=async`` on HF runs (one request at a time: no engine to batch them)."""
    batch, metrics, _ = one_step(tiny_model_dir, tmp_path, "rollout.mode=async")
    assert metrics["grad_norm"] > 0 and metrics["kept_episodes"] == 4
    assert len(batch.timelines) == 4 and metrics["time/rollout"] <= metrics["time/step"]
