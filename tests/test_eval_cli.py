"""``rlf-eval`` (rlf_trainer/eval_cli.py) and the pass@k maths it reports (rlf_trainer/observe/pass_k.py).

The evals run examples/configs/tiny_test.yaml: RLF/ToolUse-v0 with the real latency MCP server
(stdio), played by the tiny Qwen3 (a model folder) or by a scripted agent behind
:class:`tests.helpers.OpenAITestServer` (a real HTTP endpoint on 127.0.0.1). The error cases run
``python -m rlf_trainer.eval_cli`` as a user does: exit code 2, one line, no traceback.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlf_trainer.eval_cli import main
from rlf_trainer.observe.pass_k import pass_at_k, success_rates
from tests.helpers import REPO, TINY_CONFIG, OpenAITestServer, free_local_port

LATENCY = f"env.kwargs.mcp_servers.mcpServers.latency.command={sys.executable}"

# ------------------------------------------------------------------------------------------------
# pass@k
# ------------------------------------------------------------------------------------------------


def test_pass_at_k_matches_hand_computed_values() -> None:
    # n=5 samples, c=2 correct: 1 - C(3,k)/C(5,k)
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)
    assert pass_at_k(5, 2, 4) == 1.0  # fewer wrong samples than k: every draw holds a correct one
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # C(7,5)=21, C(10,5)=252
    rates = success_rates({"a": [True, False, False, False], "b": [False, False, False, False]}, ks=[1, 2, 4])
    assert rates == pytest.approx({"avg@4": 0.125, "pass@1": 0.125, "pass@2": 0.25, "pass@4": 0.5})
    with pytest.raises(ValueError, match="same number of samples"):
        success_rates({"a": [True], "b": [True, False]}, ks=[1])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_is_the_share_of_k_draws_with_a_correct_sample(n_c: tuple[int, int]) -> None:
    n, c = n_c
    samples = [True] * c + [False] * (n - c)
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert values[0] == pytest.approx(c / n)  # pass@1 is avg@n, the mean correctness
    assert all(a <= b for a, b in itertools.pairwise(values))  # monotone in k
    for k, value in enumerate(values, start=1):
        draws = list(itertools.combinations(samples, k))
        assert value == pytest.approx(sum(any(d) for d in draws) / len(draws))  # unbiased: the exact share


# ------------------------------------------------------------------------------------------------
# A model folder
# ------------------------------------------------------------------------------------------------


def _model_eval(tiny_model_dir: Path, out: Path, *extra: str) -> dict[str, Any]:
    argv = ["--config", str(TINY_CONFIG), "--out", str(out), "--samples", "3", "--pass-k", "1", "2", "3",
            "--temperature", "1.0", "--success-reward", "0.5", "--no-progress",
            f"model.path={tiny_model_dir}", "model.prepare=null", LATENCY,
            "env.import_kwargs.reward=tests.helpers:text_score", *extra]  # fmt: skip
    assert main(argv) == 0
    return json.loads(out.read_text())


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _pass_k_from_samples(samples: list[dict[str, Any]], ks: tuple[int, ...]) -> dict[str, float]:
    """pass@k recomputed from the samples file alone: the report's numbers must be these."""
    by_prompt: dict[int, list[bool]] = {}
    for s in samples:
        by_prompt.setdefault(s["prompt_index"], []).append(s["correct"])
    n = len(next(iter(by_prompt.values())))
    return {
        f"eval/pass@{k}": sum(pass_at_k(n, sum(v), k) for v in by_prompt.values()) / len(by_prompt)
        for k in ks
    }


def test_model_eval_writes_n_times_k_samples_and_repeats_itself_with_the_same_seed(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    report = _model_eval(tiny_model_dir, tmp_path / "a.json")
    samples = _lines(tmp_path / "a.samples.jsonl")
    metrics = report["metrics"]

    assert report["eval"]["prompts"] == [0, 1, 2, 3] and report["counts"]["episodes"] == 12
    assert len(samples) == 12  # 4 prompts x 3 samples, in episode order
    assert [(s["prompt_index"], s["sample_index"]) for s in samples] == [
        (p, k) for p in range(4) for k in range(3)
    ]
    assert all(s["correct"] == (s["reward"] >= 0.5) for s in samples)  # no em from this reward: the threshold
    assert samples[0]["transcript"][1] == {"role": "user", "content": "Echo the word ping."}
    assert len({s["reward"] for s in samples}) > 1, "the rewards must differ, or pass@k shows nothing"
    assert metrics["eval/reward"] == pytest.approx(sum(s["reward"] for s in samples) / 12)
    assert metrics["eval/avg@3"] == pytest.approx(sum(s["correct"] for s in samples) / 12)
    assert metrics == pytest.approx(metrics | _pass_k_from_samples(samples, (1, 2, 3)))
    assert metrics["eval/pass@1"] <= metrics["eval/pass@2"] <= metrics["eval/pass@3"]
    assert {"eval/tool_calls_per_episode", "eval/tool_error_rate", "eval/turns"} <= set(metrics)
    assert sum(report["counts"]["finish_reasons"].values()) == 12

    again = _model_eval(tiny_model_dir, tmp_path / "b.json")
    assert again["metrics"] == metrics
    assert (tmp_path / "b.samples.jsonl").read_text() == (tmp_path / "a.samples.jsonl").read_text()


# ------------------------------------------------------------------------------------------------
# An endpoint
# ------------------------------------------------------------------------------------------------


def scripted_agent(body: dict[str, Any]) -> str:
    """An agent behind the test server: calls ``sleep`` once, then answers; every third seed answers wrong."""
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    asked = re.search(r"Echo the word (\w+)", users[0])
    if asked is None:  # rlf-eval's reachability check
        return "pong"
    if not any("<tool_response>" in text for text in users):
        return '<tool_call>\n{"name": "sleep", "arguments": {"ms": 1}}\n</tool_call>'
    return f"<answer>{asked.group(1) if body['seed'] % 3 else 'wrong'}</answer>"


@pytest.fixture
def agent_server(openai_server: OpenAITestServer) -> OpenAITestServer:
    openai_server.responder = scripted_agent
    return openai_server


# tiny_test.yaml's tasks with a metadata field to group by (a task's extra fields are its metadata)
LEVELLED_TASKS = json.dumps(
    {"tasks": [{"id": f"t{i}", "question": f"Echo the word {w}.", "answer": w, "level": 1 + i // 2}
               for i, w in enumerate(["ping", "pong", "zorvia", "velmora"])]}
)  # fmt: skip


def _endpoint_eval(server: OpenAITestServer, out: Path, *extra: str) -> dict[str, Any]:
    argv = ["--config", str(TINY_CONFIG), "--base-url", server.url, "--model", "scripted", "--out", str(out),
            "--samples", "2", "--temperature", "0.7", "--env-kwargs", LEVELLED_TASKS, "--group-by", "level",
            "--no-progress", LATENCY, *extra]  # fmt: skip
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_endpoint_eval_plays_the_env_with_text_turns_and_seeded_requests(
    agent_server: OpenAITestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLF_TEST_EVAL_KEY", "sk-test")
    report = _endpoint_eval(agent_server, tmp_path / "a.json", "--api-key-env", "RLF_TEST_EVAL_KEY")
    samples = _lines(tmp_path / "a.samples.jsonl")
    metrics = report["metrics"]

    assert report["counts"] == {
        "episodes": 8,
        "tool_calls": 8,
        "tool_errors": {},
        "finish_reasons": {"answer": 8},
    }
    assert len(samples) == 8 and report["policy"] == {"base_url": agent_server.url, "model": "scripted"}
    assert metrics["eval/tool_calls_per_episode"] == 1.0 and metrics["eval/turns"] == 2.0
    assert all(s["correct"] == (s["reward"] == 1.0) for s in samples)  # f1 reward: its em decides
    assert 0 < metrics["eval/accuracy"] < 1, "the scripted agent must miss some answers"
    assert metrics == pytest.approx(metrics | _pass_k_from_samples(samples, (1, 2)))
    assert [s["group"] for s in samples] == ["1"] * 4 + ["2"] * 4
    for level in ("1", "2"):  # every figure per group value too
        members = [s for s in samples if s["group"] == level]
        expected = _pass_k_from_samples(members, (1, 2))
        assert metrics[f"eval/level={level}/pass@2"] == pytest.approx(expected["eval/pass@2"])
        assert metrics[f"eval/level={level}/avg@2"] == pytest.approx(expected["eval/pass@1"])
        assert metrics[f"eval/level={level}/reward"] == pytest.approx(sum(s["reward"] for s in members) / 4)
        assert metrics[f"eval/level={level}/tool_calls_per_episode"] == 1.0
    assert samples[0]["transcript"][-1] == {
        "role": "assistant",
        "content": samples[0]["transcript"][-1]["content"],
    }
    played = agent_server.bodies[1:]  # after the reachability check
    assert len(played) == 16 and all(b["max_tokens"] == 16 and b["temperature"] == 0.7 for b in played)
    assert len({b["seed"] for b in played}) == 16  # one seed a request
    assert set(agent_server.authorizations) == {"Bearer sk-test"}  # the key from the named variable

    seeds = sorted(b["seed"] for b in played)
    agent_server.reset()
    agent_server.responder = scripted_agent
    again = _endpoint_eval(agent_server, tmp_path / "b.json", "--api-key-env", "RLF_TEST_EVAL_KEY")
    assert sorted(b["seed"] for b in agent_server.bodies[1:]) == seeds
    assert again["metrics"] == metrics
    assert (tmp_path / "b.samples.jsonl").read_text() == (tmp_path / "a.samples.jsonl").read_text()


# ------------------------------------------------------------------------------------------------
# Errors: one line, exit code 2
# ------------------------------------------------------------------------------------------------


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlf_trainer.eval_cli", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=240)  # fmt: skip


def test_an_unreachable_endpoint_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_local_port()}/v1"  # nothing listens there
    result = _cli(
        "--env", "RLF/Codebook-v0", "--base-url", url, "--model", "m", "--out", str(tmp_path / "r.json")
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"rlf-eval: the endpoint {url}/chat/completions did not answer")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_missing_model_folder_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    result = _cli(
        "--env", "RLF/Codebook-v0", "--model-path", str(tmp_path / "nope"), "--out", str(tmp_path / "r.json")
    )
    assert result.returncode == 2
    assert result.stderr == f"rlf-eval: --model-path {tmp_path / 'nope'}: no such model folder\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model-path", "."], "name what to evaluate on"),
        (["--env", "RLF/Codebook-v0"], "name a policy"),
        (
            ["--config", str(TINY_CONFIG), "--samples", "2", "--pass-k", "4"],
            "pass@4 needs at least 4 samples",
        ),
        (["--env", "RLF/Codebook-v0", "--base-url", "http://127.0.0.1:1/v1"], "--base-url needs --model"),
        (["--config", str(TINY_CONFIG), "--env-kwargs", "[1]"], "--env-kwargs must be a JSON object"),
        (["--config", str(TINY_CONFIG), "eval.num_prompts=0"], "config error: eval.num_prompts must be"),
        (
            [
                "--config",
                str(TINY_CONFIG),
                "--base-url",
                "http://h/v1",
                "--model",
                "m",
                "--api-key-env",
                "RLF_UNSET_KEY",
            ],
            "the environment variable RLF_UNSET_KEY is not set",
        ),
    ],  # fmt: skip
)
def test_bad_arguments_are_one_line_and_exit_code_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlf-eval: ") and message in err and len(err.strip().splitlines()) == 1


VLLM = importlib.util.find_spec("vllm") is not None
# vLLM's CPU engine for the tiny model: fp32 as the HF runs, a small share of memory
VLLM_ENGINE = ("--backend", "vllm", "policy.vllm.dtype=float32", "policy.vllm.gpu_memory_utilization=0.3")


@pytest.mark.skipif(VLLM, reason="vllm is installed: the backend is there")
def test_the_vllm_backend_without_vllm_is_one_line_and_exit_code_2(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--env", "RLF/Codebook-v0", "--model-path", str(tiny_model_dir), "--backend", "vllm"]
    assert main([*argv, "--out", str(tmp_path / "r.json")]) == 2
    assert (
        capsys.readouterr().err
        == "rlf-eval: --backend vllm needs vLLM installed (pip install -e '.[vllm]')\n"
    )


@pytest.mark.vllm
@pytest.mark.skipif(not VLLM, reason="vllm is not installed")
def test_model_eval_on_the_vllm_backend(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    report = _model_eval(tiny_model_dir, tmp_path / "v.json", *VLLM_ENGINE, "policy.vllm.max_model_len=1024")
    assert report["counts"]["episodes"] == 12 and report["policy"]["backend"] == "vllm"
    assert len(_lines(tmp_path / "v.samples.jsonl")) == 12


@pytest.mark.vllm
@pytest.mark.skipif(not VLLM, reason="vllm is not installed")
def test_deepsearch_eval_on_the_vllm_backend(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DeepSearch env imports bm25s (and numba, when installed) before vLLM's CPU engine starts."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    out = tmp_path / "deepsearch.json"
    argv = ["--env", "RLF/DeepSearch-v0", "--env-kwargs", '{"world_seed": 0, "max_turns": 2}',
            "--model-path", str(tiny_model_dir), "--num-prompts", "2", "--max-new-tokens", "8",
            "--no-progress", "--out", str(out), *VLLM_ENGINE, "policy.vllm.max_model_len=2048"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["counts"]["episodes"] == 2 and report["env"]["id"] == "RLF/DeepSearch-v0"
