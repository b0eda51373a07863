"""Env-level behaviour over real MCP servers (spawned subprocesses, stdio and streamable HTTP)."""

import json
import os
import signal
import subprocess
import sys
import threading

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlf_envs  # noqa: F401
from tests.helpers import faulty_server, free_local_port, http_server, latency_server

TASKS = [{"question": f"q{i}", "answer": str(i)} for i in range(8)]


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def stats_of(envs):
    """The latency server's counters, read through the env itself (a fresh single-env step)."""
    vec = envs.unwrapped
    result = vec.runtime.run(vec.toolbox.call_many([_tool_call("stats")]))[0]
    return json.loads(result.text)


def _tool_call(name, **arguments):
    from rlf_envs.types import ToolCall

    return ToolCall(name=name, arguments=arguments)


def test_256_calls_of_one_step_are_in_flight_at_once_stdio():
    servers = {"mcpServers": {"lat": latency_server()}}
    envs = gym.make_vec("RLF/ToolUse-v0", num_envs=128, tasks=TASKS, mcp_servers=servers, max_turns=3)
    envs.reset(seed=0)
    # Each call returns once 256 are in flight at once (or after 60 s, when the peak is then < 256).
    obs, _, terminated, truncated, infos = envs.step(
        [call("sleep", ms=60_000, until_in_flight=256) * 2] * 128
    )
    assert not terminated.any() and not truncated.any()
    assert all(o.count("<tool_response>") == 2 for o in obs)
    assert sum(len(r) for r in infos["tool_calls"]) == 256 and not any(infos["errors"][i] for i in range(128))
    assert stats_of(envs)["peak_in_flight"] == 256
    envs.close()


def test_256_calls_of_one_step_are_in_flight_at_once_http():
    port = free_local_port()
    argv = [sys.executable, "-m", "rlf_envs.servers.latency"]
    with http_server(argv, port):
        servers = {"mcpServers": {"lat": {"url": f"http://127.0.0.1:{port}/mcp"}}}
        envs = gym.make_vec("RLF/ToolUse-v0", num_envs=256, tasks=TASKS, mcp_servers=servers, max_turns=3)
        envs.reset(seed=0)
        obs, *_ = envs.step([call("sleep", ms=60_000, until_in_flight=256)] * 256)
        assert all("<tool_response>" in o and "Error" not in o for o in obs)
        assert stats_of(envs)["peak_in_flight"] == 256
        envs.close()


def test_server_killed_mid_step_spares_other_envs_and_restarts():
    servers = {"mcpServers": {"a": faulty_server("a_"), "b": faulty_server("b_")}}
    envs = gym.make_vec("RLF/ToolUse-v0", num_envs=16, tasks=TASKS, mcp_servers=servers, max_turns=4)
    envs.reset(seed=0)
    obs, *_ = envs.step([call("a_pid")] + [call("b_pid")] * 15)
    a_pid = int(obs[0].split("\n")[1])
    killer = threading.Timer(0.5, os.kill, args=(a_pid, signal.SIGKILL))
    killer.start()
    actions = [call("a_echo", text=f"a{i}", delay_s=3.0) for i in range(8)]
    actions += [call("b_echo", text=f"b{i}", delay_s=1.0) for i in range(8, 16)]
    obs, rewards, terminated, truncated, infos = envs.step(actions)
    killer.join()
    for i in range(8):
        assert infos["errors"][i] == ["server_died"], obs[i]
    for i in range(8, 16):
        assert infos["errors"][i] == [] and f"b{i}" in obs[i]
    obs, *_, infos = envs.step([call("a_echo", text="back")] * 16)
    assert all("back" in o for o in obs) and all(not e for e in infos["errors"])
    assert envs.unwrapped.toolbox.providers[0].stats()["a"]["restarts"] >= 1
    envs.close()


def test_hung_tool_becomes_a_timeout_observation():
    servers = {"mcpServers": {"f": faulty_server("", timeout_s=0.5)}}
    env = gym.make("RLF/ToolUse-v0", tasks=TASKS, mcp_servers=servers)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("hang") + call("echo", text="still here"))
    assert info["errors"] == ["timeout"]
    assert "Error (timeout)" in obs and "still here" in obs
    assert not terminated and not truncated
    env.close()


def test_deepsearch_passes_check_env():
    env = gym.make("RLF/DeepSearch-v0")
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_tool_use_over_mcp_passes_check_env():
    env = gym.make("RLF/ToolUse-v0", tasks=TASKS, mcp_servers={"mcpServers": {"f": faulty_server()}})
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def oracle_turns(world, question_id, answer=None):
    solution = world.solve(question_id)
    turns = [call("search", query=q) for q in solution.queries]
    return [*turns, f"<answer>{solution.answer if answer is None else answer}</answer>"]


def test_deepsearch_vector_scripted_agents_right_wrong_and_redundant(world):
    """Right answers score 1; a wrong one after only the first search scores the evidence bonus for
    the one supporting document of ``hops`` that it saw; a search after all the evidence was shown
    costs ``redundant_search_cost`` on its own turn (the returns add the step rewards)."""
    by_hops = [[q for q in world.split("test") if q.hops == hops][:10] for hops in (1, 2, 3)]
    test_questions = [q for questions in by_hops for q in questions]
    n, repeated = len(test_questions), by_hops[0]
    envs = gym.make_vec(
        "RLF/DeepSearch-v0",
        num_envs=2 * n + len(repeated),
        split="test",
        max_turns=5,
        evidence_reward=0.3,
        redundant_search_cost=0.25,
        autoreset_mode="Disabled",
    )
    position = {q.id: i for i, q in enumerate(world.split("test"))}
    indices = [position[q.id] for q in [*test_questions, *test_questions, *repeated]]
    envs.reset(seed=0, options={"task_indices": indices})
    scripts = [oracle_turns(world, q.id) for q in test_questions]
    scripts += [[oracle_turns(world, q.id)[0], "<answer>Nobody Knows</answer>"] for q in test_questions]
    scripts += [[call("search", query="anything"), *oracle_turns(world, q.id)] for q in repeated]
    scripts[-1] = [*oracle_turns(world, repeated[-1].id)[:1], *oracle_turns(world, repeated[-1].id)]
    final, returns = [None] * len(scripts), [0.0] * len(scripts)
    redundant_turn_rewards = []
    for turn in range(5):
        actions = [s[turn] if turn < len(s) else "" for s in scripts]
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        for i in range(len(scripts)):
            if final[i] is not None:
                continue
            returns[i] += rewards[i]
            if terminated[i] or truncated[i]:
                info = infos["reward_info"]
                final[i] = (returns[i], info["em"][i], info["evidence"][i], terminated[i])
                final[i] += (info["redundant_searches"][i],)
            else:
                assert "Doc 1 (Title:" in obs[i] or (i >= 2 * n and turn == 0)
                if i == len(scripts) - 1 and turn == 1:
                    redundant_turn_rewards.append(rewards[i])
    assert [f[:3] for f in final[:n]] == [(1.0, 1.0, 1.0)] * n
    one_of = [1 / q.hops for q in test_questions]
    assert [f[1:3] for f in final[n : 2 * n]] == [(0.0, share) for share in one_of]
    assert [f[0] for f in final[n : 2 * n]] == pytest.approx([0.3 * share for share in one_of])
    assert [f[4] for f in final[: 2 * n]] == [0.0] * (2 * n)
    # a search before the evidence (a useless query) is free; the same search twice is not
    assert [f[:3] + f[4:] for f in final[2 * n : -1]] == [(1.0, 1.0, 1.0, 0.0)] * (len(repeated) - 1)
    assert final[-1][:3] + final[-1][4:] == (0.75, 1.0, 1.0, 1.0)
    assert redundant_turn_rewards == [-0.25]
    assert [len(questions) for questions in by_hops] == [10, 10, 10]
    assert all(f[3] for f in final)
    envs.close()


def test_make_vec_64_runs_episodes_to_the_end():
    envs = gym.make_vec("RLF/DeepSearch-v0", num_envs=64, max_turns=3)
    envs.reset(seed=3)
    done_count = 0
    for step in range(3):
        actions = [
            call("search", query=f"river {step}") if i % 3 else "<answer>x</answer>" for i in range(64)
        ]
        _, rewards, terminated, truncated, _ = envs.step(actions)
        done_count += int((terminated | truncated).sum())
    # next-step autoreset: envs that answered restart, the searching ones truncate at turn 3
    assert done_count >= 64
    envs.close()


def _run_clean(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout


def test_module_form_needs_no_import_and_envs_never_import_torch():
    out = _run_clean(
        "import sys, gymnasium as gym\n"
        "env = gym.make('envs_registry:RLF/ToolUse-v0', tasks=[{'question': 'q'}])\n"
        "print(env.reset(seed=0)[0]); env.close()\n"
        "import rlf_envs.core.vector, rlf_bench.env_bench, rlf_envs.tasks.deepsearch.task\n"
        "import rlf_envs.integrations.trl_environment\n"
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'vllm', 'rlf_trainer') if m in sys.modules))"
    )
    assert out.splitlines() == ["q", "[]"]
