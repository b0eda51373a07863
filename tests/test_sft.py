"""Demonstrations and SFT: rlf-collect through the real DeepSearch env (BM25 search MCP server),
and SFT token sequences that equal the RL rollout's for the same episode."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import pytest

import rlf_envs  # noqa: F401  (registers the env ids)
from rlf_envs.tasks.deepsearch.oracle import DeepSearchOracle
from rlf_envs.tasks.deepsearch.task import DeepSearchTask
from rlf_trainer.algorithms.sft_data import SFTDataError, demonstration_trajectory, load_sft_examples
from rlf_trainer.data import demonstrations_cli
from rlf_trainer.data.demonstrations import (
    CollectError,
    NoDemonstrationsError,
    ScriptedAgent,
    build_agent,
    collect_demonstrations,
    select_tasks,
)
from rlf_trainer.policy import SamplingParams
from rlf_trainer.rollout.lockstep import run_rollout
from tests.helpers import ScriptedTextPolicy, free_local_port

ENV_ID = "RLF/DeepSearch-v0"


@pytest.fixture(scope="module")
def two_hop_tasks() -> list[int]:
    return select_tasks(DeepSearchTask(world_seed=0), "train", {"hops": ["2"]}, limit=3)


def test_collect_keeps_passing_episodes_and_resumes(tmp_path, two_hop_tasks):
    out = tmp_path / "demos.jsonl"
    agent = ScriptedAgent(DeepSearchOracle(world_seed=0))
    report = collect_demonstrations(ENV_ID, agent, out=out, task_indices=two_hop_tasks, threshold=1.0,
                                    concurrency=2)  # fmt: skip
    assert (report.played, report.kept) == (3, 3)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["task_index"] for r in lines) == sorted(two_hop_tasks)
    record = lines[0]
    assert record["env_id"] == ENV_ID and record["split"] == "train" and record["reward"] == 1.0
    roles = [m["role"] for m in record["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert record["messages"][2]["tool_calls"][0]["function"]["name"] == "search"
    assert record["tools"][0]["function"]["name"] == "search"
    # --resume: nothing is played twice, nothing is written twice; a new seed adds new lines
    again = collect_demonstrations(ENV_ID, agent, out=out, task_indices=two_hop_tasks, resume=True)
    assert (again.played, again.already_done) == (0, 3)
    more = collect_demonstrations(ENV_ID, agent, out=out, task_indices=two_hop_tasks, resume=True,
                                  samples_per_task=2)  # fmt: skip
    assert (more.played, more.already_done, more.kept) == (3, 3, 3)
    keys = [(r["task_id"], r["seed"]) for r in map(json.loads, out.read_text().splitlines())]
    assert len(keys) == len(set(keys)) == 6


def test_collect_rejects_bad_input(tmp_path, two_hop_tasks):
    agent = ScriptedAgent(DeepSearchOracle(world_seed=0))
    with pytest.raises(NoDemonstrationsError, match="no episode reached the threshold 2.0"):
        collect_demonstrations(ENV_ID, agent, out=tmp_path / "a.jsonl", task_indices=two_hop_tasks[:1],
                               threshold=2.0)  # fmt: skip
    with pytest.raises(CollectError, match="unknown env id 'RLF/Nope-v0'"):
        collect_demonstrations("RLF/Nope-v0", agent, out=tmp_path / "b.jsonl", task_indices=[0])
    (tmp_path / "c.jsonl").write_text("")
    with pytest.raises(CollectError, match="exists: pass resume=True"):
        collect_demonstrations(ENV_ID, agent, out=tmp_path / "c.jsonl", task_indices=[0])
    endpoint = build_agent(base_url=f"http://127.0.0.1:{free_local_port()}/v1", model="m")
    with pytest.raises(CollectError, match="did not answer"):
        collect_demonstrations(ENV_ID, endpoint, out=tmp_path / "d.jsonl", task_indices=[0])


def test_rlf_collect_command(tmp_path):
    out = tmp_path / "one_hop.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "rlf_trainer.data.demonstrations_cli", ENV_ID, "--agent", "deepsearch-oracle",
         "--where", "hops=1", "--limit", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "kept 2 of 2 episodes" in done.stdout
    assert {json.loads(line)["reward"] for line in out.read_text().splitlines()} == {1.0}
    bad = subprocess.run(
        [sys.executable, "-m", "rlf_trainer.data.demonstrations_cli", ENV_ID, "--agent", "deepsearch-oracle",
         "--where", "hops=9", "--out", str(tmp_path / "x.jsonl")],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert bad.returncode == 2 and "no train task of RLF/DeepSearch-v0 matches" in bad.stderr


def test_rlf_collect_plays_the_split_it_is_given(tmp_path):
    """--split test plays test questions (the vector env's areset_one honours options["split"])."""
    out = tmp_path / "test_split.jsonl"
    argv = [ENV_ID, "--agent", "deepsearch-oracle", "--split", "test", "--where", "hops=2", "--limit", "3"]
    assert demonstrations_cli.main([*argv, "--out", str(out)]) == 0
    test_questions = {i.id: i.question for i in DeepSearchTask(world_seed=0).instances("test")}
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3 and {r["split"] for r in records} == {"test"}
    for record in records:
        asked = next(m["content"] for m in record["messages"] if m["role"] == "user")
        assert test_questions[record["task_id"]] in asked


class OracleTextPolicy(ScriptedTextPolicy):
    """Writes the oracle's turns for the question in the prompt."""

    def __init__(self, tokenizer, world_seed: int = 0):
        super().__init__(tokenizer)
        self.oracle = DeepSearchOracle(world_seed)
        self.by_question = {q.question: q.id for q in self.oracle.world.questions}

    def turn(self, prompt_text: str) -> str:
        qid = next(q for question, q in self.by_question.items() if question in prompt_text)
        done = prompt_text.count("<|im_start|>assistant") - 1
        return self.oracle([{"role": "assistant"}] * done, {"task_id": qid})


def test_sft_tokens_and_mask_equal_the_rl_rollout(tiny_tokenizer, two_hop_tasks):
    envs = gym.make_vec(ENV_ID, num_envs=len(two_hop_tasks), autoreset_mode="Disabled", world_seed=0)
    try:
        batch = run_rollout(envs, OracleTextPolicy(tiny_tokenizer), two_hop_tasks, group_size=1,
                            sampling=SamplingParams(max_new_tokens=128, seed=0), max_total_tokens=4096)  # fmt: skip
    finally:
        envs.close()
    assert [s.reward for s in batch.stats] == [1.0] * len(two_hop_tasks)
    for i in range(len(batch)):
        length = int(batch.attention_mask[i].sum())
        start = int(batch.attention_mask[i].argmax())  # left or right padding alike
        rl_ids = batch.input_ids[i, start : start + length].tolist()
        rl_mask = batch.loss_mask[i, start : start + length].tolist()
        sft = demonstration_trajectory(tiny_tokenizer, batch.transcripts[i], batch.tools[i])
        assert sft.token_ids == rl_ids
        assert sft.loss_mask == rl_mask
        assert sum(sft.loss_mask) > 0 and 0 in sft.loss_mask


def test_load_sft_examples_skips_too_long_and_names_bad_lines(tmp_path, tiny_tokenizer, two_hop_tasks):
    out = tmp_path / "demos.jsonl"
    collect_demonstrations(ENV_ID, ScriptedAgent(DeepSearchOracle(0)), out=out, task_indices=two_hop_tasks)
    lengths = [len(load_sft_examples(out, tiny_tokenizer, max_total_tokens=10**6).examples[i].token_ids)
               for i in range(3)]  # fmt: skip
    budget = sorted(lengths)[1]  # the longest example is over it
    data = load_sft_examples(out, tiny_tokenizer, max_total_tokens=budget)
    assert len(data.examples) == sum(n <= budget for n in lengths) and len(data.too_long) == 3 - len(
        data.examples
    )
    with out.open("a") as f:
        f.write('{"messages": [{"role": "assistant", "content": "hi"}]}\n')
    with pytest.raises(SFTDataError, match="demos.jsonl:4: a demonstration needs prompt messages"):
        load_sft_examples(out, tiny_tokenizer, max_total_tokens=10**6)


# --------------------------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def demos_file(tmp_path_factory, two_hop_tasks):
    out = tmp_path_factory.mktemp("demos") / "demos.jsonl"
    tasks = [*two_hop_tasks, *select_tasks(DeepSearchTask(world_seed=0), "train", {"hops": ["1"]}, limit=3)]
    collect_demonstrations(ENV_ID, ScriptedAgent(DeepSearchOracle(0)), out=out, task_indices=tasks)
    return out


def sft_config(tiny_model_dir, run_dir, demos, *overrides):
    from tests.helpers import tiny_config

    return tiny_config(tiny_model_dir, run_dir, "algorithm.name=sft", f"sft.data={demos}", "sft.batch_size=4",
                       "optim.lr=1e-3", "rollout.max_total_tokens=2048", "eval.every=0", *overrides)  # fmt: skip


def test_sft_step_loss_is_the_masked_token_mean_nll(tiny_model_dir, tmp_path, demos_file, tiny_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    from rlf_trainer.algorithms.sft import padded, step_examples
    from rlf_trainer.trainer import Trainer

    config = sft_config(tiny_model_dir, tmp_path, demos_file, "max_steps=1", "checkpoint.every=0")
    trainer = Trainer(config)
    examples = step_examples(trainer.sft_data, trainer.sft_sampler, 0, 4, 0, 1)
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = padded(examples, tiny_tokenizer.pad_token_id or 0)
    with torch.no_grad():
        logits = before(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(2, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["loss_mask"][:, 1:].float()
    expected = float(-(logp * mask).sum() / mask.sum())
    metrics = trainer.train_step()
    trainer.close()
    assert metrics["sft/loss"] == pytest.approx(expected, rel=1e-4)
    assert metrics["sft/tokens"] == float(mask.sum())
    assert "reward/mean" not in metrics and "grad_norm" in metrics


def test_sft_resume_is_exact_then_grpo_continues_from_the_sft_model(tiny_model_dir, tmp_path, demos_file):
    from rlf_trainer.trainer import Trainer
    from tests.helpers import model_params, tiny_config

    full = Trainer(sft_config(tiny_model_dir, tmp_path / "a", demos_file, "max_steps=2"))
    history = full.train()
    params = model_params(full)
    assert (tmp_path / "a" / "tiny_test" / "model" / "config.json").exists()
    # resume from the step-1 checkpoint: step 2 is the same step
    resumed_dir = tmp_path / "b"
    import shutil

    shutil.copytree(tmp_path / "a", resumed_dir)
    ckpts = sorted((resumed_dir / "tiny_test" / "checkpoints").glob("step_*"))
    shutil.rmtree(ckpts[-1])
    resumed = Trainer(sft_config(tiny_model_dir, resumed_dir, demos_file, "max_steps=2"))
    assert resumed.step == 1
    again = resumed.train()
    assert again.records[-1]["sft/loss"] == history.records[-1]["sft/loss"]
    for name, value in model_params(resumed).items():
        assert torch_equal(value, params[name]), name
    # the exported SFT model is where GRPO starts
    grpo = Trainer(tiny_config(tmp_path / "a" / "tiny_test" / "model", tmp_path / "c", "max_steps=2",
                                   "eval.every=0"))  # fmt: skip
    rows = grpo.train().records
    assert len(rows) == 2 and all("reward/mean" in r for r in rows)


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))
