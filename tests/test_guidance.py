"""Guidance (``algorithm.guidance``): demonstrations inside GRPO groups, and the oracle's hop limit.

Real pieces throughout: the tiny Qwen3, RLF/ToolUse-v0 over the latency MCP server (a real
subprocess) for the trainer runs, RLF/DeepSearch-v0 with its generated world and BM25 search
server for the hop limit.
"""

from __future__ import annotations

import pytest

import rlf_envs  # noqa: F401  (registers the env ids)
from rlf_envs.rewards.rules import exact_match
from rlf_envs.tasks.deepsearch.oracle import DeepSearchOracle, oracle_turns
from rlf_envs.tasks.deepsearch.task import DeepSearchTask
from rlf_trainer.data import demonstrations_cli
from rlf_trainer.data.demonstrations import (
    CollectError,
    ScriptedAgent,
    build_agent,
    collect_demonstrations,
    select_tasks,
)

DEEPSEARCH = "RLF/DeepSearch-v0"


# ------------------------------------------------------------------------------------------------
# (d) the DeepSearch oracle's hop limit
# ------------------------------------------------------------------------------------------------


def test_hop_limited_oracle_never_answers_a_three_hop_question_right(world):
    """Every question of the world: with max_hops=2 the 1- and 2-hop turns are the full solution,
    and no 3-hop question's final answer matches its golden answers."""
    by_hops: dict[int, int] = {1: 0, 2: 0, 3: 0}
    for question in world.questions:
        turns = oracle_turns(world, question.id, max_hops=2)
        answer = turns[-1].split("<answer>")[1].split("</answer>")[0]
        searches = sum("<tool_call>" in turn for turn in turns)
        assert searches == min(question.hops, 2)
        if question.hops < 3:
            assert turns == oracle_turns(world, question.id)  # below the limit nothing changes
        assert exact_match(answer, list(question.golden_answers)) == (question.hops < 3), question.id
        by_hops[question.hops] += 1
    assert min(by_hops.values()) > 0
    with pytest.raises(ValueError, match="max_hops must be >= 1"):
        DeepSearchOracle(0, max_hops=0)


def test_hop_limited_oracle_in_the_real_env_scores_one_and_two_hops_only(tmp_path):
    task = DeepSearchTask(world_seed=0)
    agent = ScriptedAgent(DeepSearchOracle(world_seed=0, max_hops=2))
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
