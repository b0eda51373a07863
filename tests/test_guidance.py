from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch

import rlf_envs  # noqa: F401  (registers the env ids)
from rlf_envs.rewards.rules import exact_match
from rlf_envs.tasks.deepsearch.oracle import DeepSearchOracle, oracle_turns
from rlf_envs.tasks.deepsearch.task import DeepSearchTask
from rlf_trainer import build
from rlf_trainer.algorithms.grpo import episode_advantages
from rlf_trainer.algorithms.guided import guide
from rlf_trainer.algorithms.losses import policy_shaping_terms
from rlf_trainer.algorithms.sft_data import demonstration_trajectory
from rlf_trainer.config import ConfigError, load_config
from rlf_trainer.data import demonstrations_cli
from rlf_trainer.data.demonstrations import (
    CollectError,
    ScriptedAgent,
    build_agent,
    collect_demonstrations,
    select_tasks,
)
from rlf_trainer.policy import SamplingParams
from rlf_trainer.rollout.collect import collect
from rlf_trainer.rollout.guidance import DemonstrationRequest, play_demonstrations, replace_episodes
from rlf_trainer.rollout.lockstep import run_rollout
from rlf_trainer.trainer import Trainer
from tests.helpers import (
    ANSWER_WORDS,
    ECHO_QUESTION,
    ScriptedTextPolicy,
    echo_demonstrator,
    echo_turn,
    latency_server,
    model_params,
    tiny_config,
)

DEEPSEARCH = "RLF/DeepSearch-v0"


# ------------------------------------------------------------------------------------------------
# (d) the DeepSearch oracle's hop limit
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["plain", "kinds"])
def test_hop_limited_oracle_never_answers_a_three_hop_question_right(world, style):
    """Every question of the world: with max_hops=2 the 1- and 2-hop turns are the full solution,
    and no 3-hop question's final answer matches its golden answers."""
    by_hops: dict[int, int] = {1: 0, 2: 0, 3: 0}
    for question in world.questions:
        turns = oracle_turns(world, question.id, max_hops=2, style=style)
        answer = turns[-1].split("<answer>")[1].split("</answer>")[0]
        searches = sum("<tool_call>" in turn for turn in turns)
        assert searches == min(question.hops, 2)
        if question.hops < 3:
            assert turns == oracle_turns(world, question.id, style=style)  # below the limit nothing changes
        assert exact_match(answer, list(question.golden_answers)) == (question.hops < 3), question.id
        by_hops[question.hops] += 1
    assert min(by_hops.values()) > 0
    with pytest.raises(ValueError, match="max_hops must be >= 1"):
        DeepSearchOracle(0, max_hops=0)


def test_the_kinds_rule_solves_every_question_at_every_hop_count(world):
    """``style="kinds"`` searches again exactly while the kind it found differs from the kind the
    question asks for: on every question of the world that rule takes ``hops`` searches, so what it
    shows on 1 and 2 hops also answers 3."""
    for question in world.questions:
        turns = oracle_turns(world, question.id, style="kinds")
        asked = turns[0].split("The question asks for a ")[1].split(".")[0]
        found = [turn.split(" is a ")[1].split(",")[0] for turn in turns[1:]]
        assert [kind == asked for kind in found] == [False] * (question.hops - 1) + [True], question.id
        assert sum("<tool_call>" in turn for turn in turns) == question.hops
        assert turns[-1].endswith(f"<answer>{question.golden_answers[0]}</answer>")


@pytest.mark.parametrize("agent_name", ["deepsearch-oracle", "deepsearch-oracle-kinds"])
def test_hop_limited_oracle_in_the_real_env_scores_one_and_two_hops_only(tmp_path, agent_name):
    task = DeepSearchTask(world_seed=0)
    agent = build_agent(agent_name, env_kwargs={"world_seed": 0}, max_hops=2)
    for hops, expected in ((1, 1.0), (2, 1.0), (3, 0.0)):
        picked = select_tasks(task, "train", {"hops": [str(hops)]}, limit=2)
        out = tmp_path / f"hops{hops}.jsonl"
        if expected:
            report = collect_demonstrations(DEEPSEARCH, agent, out=out, task_indices=picked, concurrency=2)
            assert report.rewards == [1.0, 1.0]
        else:  # played, scored 0, nothing kept
            with pytest.raises(CollectError, match="no episode reached the threshold 1.0"):
                collect_demonstrations(DEEPSEARCH, agent, out=out, task_indices=picked, concurrency=2)


def test_rlf_collect_max_hops(tmp_path, capsys):
    out = tmp_path / "three.jsonl"
    argv = [
        DEEPSEARCH,
        "--agent",
        "deepsearch-oracle",
        "--max-hops",
        "2",
        "--where",
        "hops=3",
        "--limit",
        "1",
    ]
    assert demonstrations_cli.main([*argv, "--out", str(out)]) == 2
    assert "no episode reached the threshold" in capsys.readouterr().err
    assert (
        demonstrations_cli.main(
            [*argv[:-4], "--where", "hops=2", "--limit", "1", "--out", str(tmp_path / "two.jsonl")]
        )
        == 0
    )
    assert "kept 1 of 1 episodes" in capsys.readouterr().out
    with pytest.raises(CollectError, match="use it with --agent deepsearch-oracle"):
        build_agent(base_url="http://127.0.0.1:1/v1", model="m", max_hops=2)


# ------------------------------------------------------------------------------------------------
# (e) LUFFY's policy shaping, the pure function
# ------------------------------------------------------------------------------------------------


def test_policy_shaping_against_hand_computed_values():
    probs = torch.tensor([[0.5, 0.01, 0.9, 0.3]])
    logp = probs.log().requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    advantages = torch.tensor([[-1.0, 2.0, 2.0, 5.0]])  # per token; the masked 5.0 must not count
    terms = policy_shaping_terms(logp, advantages, mask, gamma=0.1)
    # term = -A p / (p + gamma): 0.5/0.6, 2 * 0.01/0.11, 2 * 0.9/1.0
    expected = [1 * 0.5 / 0.6, -2 * 0.01 / 0.11, -2 * 0.9 / 1.0, 0.0]
    assert terms[0].tolist() == pytest.approx(expected, abs=1e-6)
    # d term / d logp = -A gamma p / (p + gamma)^2: the rare token (p = 0.01) gets 8x the plain
    # importance weight's p, the known one (p = 0.9) 10x less
    terms.sum().backward()
    hand = [1 * 0.1 * 0.5 / 0.36, -2 * 0.1 * 0.01 / 0.11**2, -2 * 0.1 * 0.9 / 1.0, 0.0]
    assert logp.grad[0].tolist() == pytest.approx(hand, abs=1e-6)
    # one advantage per sequence; a masked filler of -inf or +inf log-prob gives 0, never nan
    wild = torch.tensor([[math.log(0.5), float("inf"), float("-inf")]])
    out = policy_shaping_terms(wild, torch.tensor([1.0]), torch.tensor([[1.0, 0.0, 0.0]]), gamma=0.5)
    assert out.tolist() == [[-0.5, 0.0, 0.0]]
    with pytest.raises(ValueError, match="gamma > 0"):
        policy_shaping_terms(logp, advantages, mask, gamma=0.0)


# ------------------------------------------------------------------------------------------------
# (b) a demonstration's tokens are the rollout's
# ------------------------------------------------------------------------------------------------

ECHO_TASKS = [
    {"id": f"t{i}", "question": f"Echo the word {w}.", "answer": w} for i, w in enumerate(ANSWER_WORDS)
]


def _echo_envs(num_envs: int):
    """RLF/ToolUse-v0 on tiny_test.yaml's questions over the real latency MCP server (its ``sleep``)."""
    server = latency_server("--latency-ms", "1", timeout_s=30)
    return gym.make_vec("RLF/ToolUse-v0", num_envs=num_envs, autoreset_mode="Disabled", max_turns=2,
                        mcp_servers={"mcpServers": {"latency": server}}, tasks=ECHO_TASKS, reward="exact_match")  # fmt: skip


class EchoTextPolicy(ScriptedTextPolicy):
    """Writes :func:`tests.helpers.echo_turn` for the prompt's question."""

    def turn(self, prompt_text: str) -> str:
        question = ECHO_QUESTION.search(prompt_text).group(1)
        return echo_turn(question, prompt_text.count("<|im_start|>assistant") - 1)


def test_a_demonstration_is_built_exactly_as_the_rollout_of_a_policy_writing_its_text(tiny_tokenizer):
    envs = _echo_envs(2)
    try:
        rolled = run_rollout(envs, EchoTextPolicy(tiny_tokenizer), [1, 3], group_size=1,
                             sampling=SamplingParams(max_new_tokens=128, seed=0), max_total_tokens=2048)  # fmt: skip
        requests = [DemonstrationRequest(slot=1, task_index=3, group=1), DemonstrationRequest(0, 1, 0)]
        agent = ScriptedAgent(echo_demonstrator)
        demos = play_demonstrations(envs, tiny_tokenizer, agent, requests, max_total_tokens=2048)
    finally:
        envs.close()
    assert [s.reward for s in rolled.stats] == [1.0, 1.0]
    for row, demo in zip((1, 0), demos, strict=True):
        length = int(rolled.attention_mask[row].sum())
        assert demo.token_ids == rolled.input_ids[row, :length].tolist()
        assert demo.loss_mask == rolled.loss_mask[row, :length].tolist()
        assert demo.turn_spans == rolled.turn_spans[row] and len(demo.turn_spans) == 2
        # the same chat (tool-call ids come from the env's counter, and the template does not render them)
        assert [(m["role"], m.get("content")) for m in demo.messages] == [
            (m["role"], m.get("content")) for m in rolled.transcripts[row]
        ]
        assert demo.logprobs == [0.0] * length  # no sampler: the trainer computes the policy's own
        assert (demo.stats.reward, demo.stats.tool_calls, demo.stats.demonstration) == (1.0, 1, True)
        # the SFT stage's assembly of the same chat agrees too
        sft = demonstration_trajectory(tiny_tokenizer, demo.messages, demo.tools)
        assert (sft.token_ids, sft.loss_mask) == (demo.token_ids, demo.loss_mask)
    guided = replace_episodes(rolled, {1: demos[0]}, tiny_tokenizer)
    assert torch.equal(guided.input_ids, rolled.input_ids) and torch.equal(guided.loss_mask, rolled.loss_mask)
    assert [s.demonstration for s in guided.stats] == [False, True]
    assert guided.turn_rewards == rolled.turn_rewards


# ------------------------------------------------------------------------------------------------
# (a) an all-fail group gets signal; the config's rules
# ------------------------------------------------------------------------------------------------

GUIDED = (
    "algorithm.guidance.enabled=true",
    "algorithm.guidance.demonstrator=tests.helpers:echo_demonstrator",
)
SHORT_RUN = (
    "eval.every=0",
    "checkpoint.every=0",
    "checkpoint.save_final=false",
    "checkpoint.save_model=false",
    "logging.report_to=[]",
    "logging.samples_jsonl=false",
)


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate keeps one mixed-precision setting per process, and `mixed_precision: auto` may
    differ from what an earlier test's Accelerator chose: forget it before and after these runs."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_an_all_fail_group_gets_nonzero_advantages_once_guided(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path, *GUIDED, *SHORT_RUN, "max_steps=1")
    config.env.kwargs["reward"] = "exact_match"  # the random tiny model never echoes the word
    trainer = Trainer(config)
    try:
        rollout, size = trainer.rollout, config.algorithm.group_size
        collected = collect(rollout, 0)
        assert [s.reward for s in collected.batch.stats] == [0.0] * len(collected.batch)
        assert all(v == 0.0 for episode in episode_advantages(rollout, collected.batch) for v in episode)
        guided, info = guide(rollout, 0, collected)
        assert info["guidance/guided_share"] == 1.0 and info["guidance/own_success"] == 0.0
        after = episode_advantages(rollout, guided)
        for group in range(len(guided) // size):
            rows = range(group * size, (group + 1) * size)
            demos = [r for r in rows if guided.stats[r].demonstration]
            assert demos == [rows[-1]]  # equal returns: the last sample is the one replaced
            assert guided.stats[demos[0]].reward == 1.0 and after[demos[0]][0] > 0
            assert all(after[r][0] < 0 for r in rows if r != demos[0])
        metrics = trainer.train_step()  # the whole step: demonstrations through the shaped loss
    finally:
        trainer.close()
    assert metrics["guidance/guided_share"] == 1.0 and metrics["guidance/own_success"] == 0.0
    assert metrics["guidance/advantage"] == pytest.approx(math.sqrt(0.5), abs=1e-4)  # G=2: +-1/sqrt(2)
    assert metrics["groups/zero_variance"] == 0.0 and metrics["grad_norm"] > 0
    assert metrics["reward/mean"] == 0.0  # rollout metrics are the policy's own episodes
    assert sum(s.demonstration for s in trainer.last_batch.stats) == len(trainer.last_batch) // size


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("algorithm.guidance.enabled=true",), "algorithm.guidance.enabled needs a demonstrator"),
        (
            (*GUIDED, "algorithm.guidance.base_url=http://x/v1", "algorithm.guidance.model=m"),
            "needs one demonstrator",
        ),
        (
            ("algorithm.guidance.enabled=true", "algorithm.guidance.base_url=http://x/v1"),
            "base_url and algorithm.guidance.model go together",
        ),
        ((*GUIDED, "algorithm.guidance.max_hops=2"), "max_hops limits the scripted DeepSearch oracle"),
        ((*GUIDED, "algorithm.loss=gspo"), "use algorithm.loss grpo, dr_grpo or dapo"),
        ((*GUIDED, "algorithm.group_size=1"), "needs algorithm.group_size >= 2"),
        ((*GUIDED, "algorithm.guidance.probability=0"), "probability=0 never guides a group"),
        (
            (*GUIDED, "algorithm.guidance.probability=1.5"),
            r"algorithm.guidance.probability must be in \[0, 1\]",
        ),
        ((*GUIDED, "algorithm.guidance.when=sometimes"), "algorithm.guidance.when must be one of"),
        ((*GUIDED, "algorithm.guidance.max_hops=0"), "algorithm.guidance.max_hops must be >= 1"),
        ((*GUIDED, "algorithm.guidance.shaping_gamma=0"), "algorithm.guidance.shaping_gamma must be > 0"),
        ((*GUIDED, "algorithm.guidance.oops=1"), "unknown key 'algorithm.guidance.oops'"),
    ],
)
def test_guidance_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["model.path=m", *overrides])


def test_the_demonstrator_is_built_from_the_config():
    oracle = build.make_demonstrator(load_config(None, ["model.path=m", "algorithm.guidance.enabled=true",
        "algorithm.guidance.demonstrator=deepsearch-oracle", "algorithm.guidance.max_hops=2"]))  # fmt: skip
    assert oracle.fn.max_hops == 2 and oracle.fn.world.seed == 0
    assert build.make_demonstrator(load_config(None, ["model.path=m"])) is None
    missing = load_config(
        None,
        ["model.path=m", "algorithm.guidance.enabled=true", "algorithm.guidance.demonstrator=tests.nope:x"],
    )
    with pytest.raises(ConfigError, match="algorithm.guidance: --agent 'tests.nope:x': cannot import it"):
        build.make_demonstrator(missing)


# ------------------------------------------------------------------------------------------------
# (c) guidance off changes nothing, bit for bit
# ------------------------------------------------------------------------------------------------


def _two_steps(tiny_model_dir, root, name: str, *overrides: str):
    trainer = Trainer(
        tiny_config(tiny_model_dir, root, f"logging.run_name={name}", "max_steps=2", *SHORT_RUN, *overrides)
    )
    history = trainer.train()
    return history.records, model_params(trainer)


def _comparable(records):
    """Every metric but wall-clock times and the guidance metrics themselves."""
    drop = ("time/", "samples/s", "guidance/")
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in records]


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_guidance_off_or_untriggered_changes_nothing_bit_for_bit(tiny_model_dir, tmp_path):
    plain_records, plain_params = _two_steps(tiny_model_dir, tmp_path, "plain")
    defaults = ("algorithm.guidance.enabled=false", "algorithm.guidance.when=all_fail",
                "algorithm.guidance.probability=1.0", "algorithm.guidance.shaping_gamma=0.1")  # fmt: skip
    # enabled, the demonstrator built, but no group fails (every return >= -1): guide() runs, plays nothing
    untriggered = (*GUIDED, "algorithm.guidance.success_reward=-1.0")
    for name, overrides in (("guidance_off", defaults), ("untriggered", untriggered)):
        records, params = _two_steps(tiny_model_dir, tmp_path, name, *overrides)
        assert _comparable(records) == _comparable(plain_records), name
        assert params.keys() == plain_params.keys()
        assert all(torch.equal(params[k], plain_params[k]) for k in params), name
        assert plain_records[-1]["grad_norm"] > 0  # the runs did learn something to compare
    assert [r["guidance/guided_share"] for r in records] == [0.0, 0.0]
    assert [r["guidance/own_success"] for r in records] == [1.0, 1.0]
    assert not any(k.startswith("guidance/") for r in plain_records for k in r)
