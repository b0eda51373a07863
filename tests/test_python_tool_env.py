"""RLF/PythonTool-v0 end to end: generated problems, the real sandbox server, scripted agents, rewards."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlf_envs  # noqa: F401  (registers the ids)
from rlf_envs.isolation import probe_bubblewrap
from rlf_envs.tasks.python_tool import WORD_TEMPLATES, PythonToolTask, generate_problems
from rlf_envs.tasks.python_tool.sandbox import PythonSandbox, SandboxLimits
from tests.helpers import free_local_port, http_server


@pytest.fixture(scope="module")
def sandbox_servers() -> Iterator[dict]:
    """One sandbox server over streamable HTTP, shared by the env tests (the default stdio
    server is what check_env starts); an ``mcp_servers`` config pointing at it."""
    port = free_local_port()
    with http_server([sys.executable, "-m", "rlf_envs.tasks.python_tool.server"], port):
        yield {"mcpServers": {"python": {"url": f"http://127.0.0.1:{port}/mcp"}}}


def run_python(code: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'run_python', 'arguments': {'code': code}})}</tool_call>"


def printed_number(obs: str) -> str:
    """The first line the program printed, from a ``<tool_response>`` observation."""
    match = re.search(r"<tool_response>\n(-?\d+)\n", obs)
    assert match, obs
    return match.group(1)


def test_python_tool_env_passes_check_env() -> None:
    env = gym.make("RLF/PythonTool-v0")
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


@pytest.mark.parametrize("kind", ["arithmetic", "word"])
def test_scripted_agent_computes_with_the_tool_and_is_scored(kind: str, sandbox_servers: dict) -> None:
    env = gym.make("RLF/PythonTool-v0", kind=kind, split="test", max_turns=3, mcp_servers=sandbox_servers)
    task = env.unwrapped.task
    instance = task.instances("test")[2]
    obs, info = env.reset(seed=0, options={"task_index": 2})
    assert obs == instance.question and info["task_id"] == instance.id
    assert [tool["function"]["name"] for tool in info["tools"]] == ["run_python"]
    assert "run_python" in info["messages"][0]["content"] and "<answer>" in info["messages"][0]["content"]

    obs, reward, terminated, truncated, info = env.step(run_python(instance.metadata["solution_code"]))
    assert not terminated and not truncated and reward == 0.0 and info["errors"] == []
    computed = printed_number(obs)
    assert computed == instance.answer and obs.rstrip().endswith("[exit code 0]\n</tool_response>")

    obs, reward, terminated, truncated, info = env.step(f"The result is <answer> {int(computed):,} </answer>")
    assert terminated and not truncated and reward == 1.0
    assert info["reward_info"] == {"reward": 1.0, "correct": 1.0, "format": 1.0, "used_tool": 1.0}

    # off by one is wrong, even where a relative tolerance would call a large number "close"
    env.reset(seed=0, options={"task_index": 2})
    _, reward, terminated, _, info = env.step(f"<answer>{int(instance.answer) + 1}</answer>")
    assert terminated and reward == 0.0
    assert info["reward_info"] == {"reward": 0.0, "correct": 0.0, "format": 1.0, "used_tool": 0.0}
    env.close()


def test_vector_agents_right_and_wrong_and_abuse_in_the_same_step(sandbox_servers: dict) -> None:
    n = 6
    envs = gym.make_vec(
        "RLF/PythonTool-v0",
        num_envs=n,
        kind="word",
        split="test",
        max_turns=3,
        autoreset_mode="Disabled",
        mcp_servers=sandbox_servers,
    )
    task = envs.unwrapped.task
    instances = [task.instances("test")[i] for i in range(n)]
    envs.reset(seed=0, options={"task_indices": list(range(n))})

    # every env computes at once; env 5 also tries to read /etc/passwd in the same turn
    actions = [run_python(inst.metadata["solution_code"]) for inst in instances]
    actions[5] += run_python("print(open('/etc/passwd').read())")
    obs, rewards, terminated, truncated, infos = envs.step(actions)
    assert not terminated.any() and not truncated.any()
    computed = [printed_number(o) for o in obs]
    assert computed == [inst.answer for inst in instances]
    assert "sandbox: reading '/etc/passwd' is not allowed" in obs[5] and "root:" not in obs[5]
    assert all(errors == [] for errors in infos["errors"])  # a denied program is a result, not a tool failure

    # an empty program is a tool error the model can read; the env keeps going
    answers = [
        f"<answer>{c}</answer>" if i % 2 == 0 else f"<answer>{int(c) - 1}</answer>"
        for i, c in enumerate(computed)
    ]
    answers[5] = run_python("   ")
    obs, rewards, terminated, truncated, infos = envs.step(answers)
    assert list(rewards[:5]) == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert list(terminated) == [True] * 5 + [False]
    assert infos["errors"][5] == ["tool_error"] and "code is empty" in obs[5]
    envs.close()


def test_reset_info_says_how_run_python_is_isolated(sandbox_servers: dict) -> None:
    expected = "bwrap" if probe_bubblewrap().bubblewrap is not None else "guards"
    env = gym.make("RLF/PythonTool-v0", max_turns=2)  # auto: bwrap wherever it works
    task = env.unwrapped.task
    args = task.mcp_config()["mcpServers"]["python"]["args"]
    assert task.isolation.value == expected and args[args.index("--isolation") + 1] == expected
    _, info = env.reset(seed=0)
    assert info["sandbox"]["isolation"] == expected
    obs, *_ = env.step(run_python("print(6 * 7)"))
    assert printed_number(obs) == "42"
    env.close()
    # a server the caller passed is not the task's: the env claims nothing about it
    remote = gym.make("RLF/PythonTool-v0", mcp_servers=sandbox_servers)
    assert "sandbox" not in remote.reset(seed=0)[1]
    remote.close()


def test_forced_guards_mode_in_a_vector_env() -> None:
    envs = gym.make_vec("RLF/PythonTool-v0", num_envs=2, isolation="guards", max_turns=2)
    _, infos = envs.reset(seed=0)
    assert list(infos["sandbox"]["isolation"]) == ["guards", "guards"]  # nested dicts batch per key
    obs, *_ = envs.step([run_python("print(6 * 7)")] * 2)
    assert [printed_number(o) for o in obs] == ["42", "42"]
    envs.close()


def test_problems_are_deterministic_and_splits_disjoint() -> None:
    first = PythonToolTask(seed=3, kind="mixed", num_train=200, num_test=50)
    again = PythonToolTask(seed=3, kind="mixed", num_train=50, num_test=50)
    other = PythonToolTask(seed=4, kind="mixed", num_train=200, num_test=50)
    test_questions = [i.question for i in first.instances("test")]
    train_questions = [i.question for i in first.instances("train")]
    assert test_questions == [i.question for i in again.instances("test")]  # independent of num_train
    assert test_questions != [i.question for i in other.instances("test")]
    assert not set(test_questions) & set(train_questions) and len(set(train_questions)) == 200
    assert {i.metadata["kind"] for i in first.instances("train")} == {"mixed"}
    templates = {i.metadata["template"] for i in first.instances("train")}
    assert templates == {"chain"} | {template.__name__ for template in WORD_TEMPLATES}
    # the numbers are meant to defeat mental arithmetic
    assert all(
        abs(int(i.answer)) >= 1000 for i in first.instances("train") if i.metadata["template"] == "chain"
    )
    with pytest.raises(ValueError, match="unknown kind"):
        PythonToolTask(kind="geometry")


def test_every_template_solution_program_prints_its_answer_in_the_sandbox() -> None:
    # the generator's answer and its (independent, often brute-force) program must agree
    problems = generate_problems(seed=11, kind="mixed", count=60)
    one_per_template = list({p.template: p for p in problems}.values())
    assert len(one_per_template) == 1 + len(WORD_TEMPLATES)
    sandbox = PythonSandbox(SandboxLimits(cpu_s=5, wall_s=30))

    async def run_all() -> list:
        return await asyncio.gather(*(sandbox.run(p.solution_code) for p in one_per_template))

    for problem, result in zip(one_per_template, asyncio.run(run_all()), strict=True):
        assert result.ok, (problem.template, result.to_text())
        assert result.stdout.strip() == str(problem.answer), problem.template


def test_new_modules_never_import_torch() -> None:
    code = (
        "import sys\n"
        "import rlf_envs.tasks.python_tool.task, rlf_envs.tasks.python_tool.server\n"
        "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'rlf_trainer') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_auto_fallback_to_guards_warns_in_reset_info_and_the_servers_instructions() -> None:
    """bwrap that does not work here: 'auto' falls back, the reset info says so, and the server is
    started with 'auto' too, so its MCP instructions warn every client (test_sandbox_guards checks
    what a server started that way says)."""
    from rlf_envs.tasks.python_tool.task import PythonToolTask

    task = PythonToolTask(isolation="auto", bwrap_path="/nonexistent/bwrap")
    assert (
        task.isolation.value == "guards"
        and "not a security boundary" in task.env_info()["sandbox"]["warning"]
    )
    args = task.mcp_config()["mcpServers"]["python"]["args"]
    assert args[args.index("--isolation") + 1] == "auto"
    forced = PythonToolTask(isolation="guards", bwrap_path="/nonexistent/bwrap")
    assert "warning" not in forced.env_info()["sandbox"]  # guards on purpose: the user chose it
    forced_args = forced.mcp_config()["mcpServers"]["python"]["args"]
    assert forced_args[forced_args.index("--isolation") + 1] == "guards"
