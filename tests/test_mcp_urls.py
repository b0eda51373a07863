"""One server's replicas on several URLs: real streamable-HTTP latency servers on 127.0.0.1, no mocks.

Each server answers ``sleep()`` with its own default latency (``BASE_MS + i``), so the text of an
answer ("slept 41.0 ms: ...") says which URL served it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest

import rlf_envs  # noqa: F401  (registers the env ids)
from rlf_envs.tools.mcp_config import MCPConfigError, load_mcp_config
from rlf_envs.tools.mcp_pool import MCPServerStartError, MCPToolPool
from rlf_envs.tools.mcp_replica import MCPReplica, ReplicaState
from rlf_envs.types import ErrorKind, ToolCall, ToolResult
from tests.helpers import REPO, free_local_port, wait_for_port

BASE_MS = 40  # server i sleeps BASE_MS + i ms by default
EPISODES = 24
TURNS = 8


class LatencyFarm:
    """Latency servers over streamable HTTP on fixed ports, shared by this module's tests.

    Server i answers ``sleep()`` after BASE_MS + i ms. A test may kill or stop servers;
    :meth:`ensure_running` starts every dead one again on its own port (all at once).
    """

    def __init__(self, count: int) -> None:
        self.ports = [free_local_port() for _ in range(count)]
        self.urls = [f"http://127.0.0.1:{port}/mcp" for port in self.ports]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * count

    def ensure_running(self, *indices: int) -> LatencyFarm:
        """Start the given servers (default: all) that are not running, and wait for their ports."""
        started = []
        for i in indices or range(len(self.ports)):
            process = self.processes[i]
            if process is None or process.poll() is not None:
                argv = [sys.executable, "-m", "rlf_envs.servers.latency", "--latency-ms", str(BASE_MS + i)]
                argv += ["--transport", "http", "--host", "127.0.0.1", "--port", str(self.ports[i])]
                env = {**os.environ, "PYTHONPATH": str(REPO)}
                self.processes[i] = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
                started.append(i)
        for i in started:
            wait_for_port(self.ports[i], self.process(i), timeout_s=60)
        return self

    def process(self, i: int) -> subprocess.Popen[bytes]:
        process = self.processes[i]
        assert process is not None
        return process

    def kill(self, i: int) -> None:
        process = self.process(i)
        process.kill()
        process.wait(timeout=10)  # reaped: its sockets are closed before this returns

    def close(self) -> None:
        for i, process in enumerate(self.processes):
            if process is not None and process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                self.kill(i)


@pytest.fixture(scope="module")
def latency_farm() -> Iterator[LatencyFarm]:
    farm = LatencyFarm(3)
    yield farm
    farm.close()


@pytest.fixture
def farm(latency_farm: LatencyFarm) -> LatencyFarm:
    """The module's three servers, every one of them running."""
    return latency_farm.ensure_running()


def served_by_text(text: str) -> int:
    """Which server wrote "slept 41.0 ms" in an observation."""
    return round(float(text.split("slept ", 1)[1].split()[0])) - BASE_MS


def served_by(result: ToolResult) -> int | None:
    """Which server answered a default ``sleep()``: its index, from the latency in the text."""
    if not result.ok:
        return None
    return round(float(result.text.split()[1])) - BASE_MS


class Episodes:
    """``EPISODES`` concurrent episodes of ``TURNS`` tool calls each, as a vector env would run them."""

    def __init__(self, pool: MCPToolPool) -> None:
        self.pool = pool
        self.calls: list[tuple[float, ToolResult]] = []  # (start time, result) of every call
        self.halfway = asyncio.Event()

    async def run(self) -> list[list[ToolResult]]:
        return await asyncio.gather(*(self._episode(e) for e in range(EPISODES)))

    async def _episode(self, episode: int) -> list[ToolResult]:
        results = []
        for turn in range(TURNS):
            started = time.monotonic()
            result = await self.pool.call(ToolCall("sleep", {"payload": f"{episode}.{turn}"}))
            self.calls.append((started, result))
            results.append(result)
            if len(self.calls) >= EPISODES * TURNS // 3:
                self.halfway.set()
        return results


def run(coro: Any, timeout_s: float = 120.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def replica_stats(pool: MCPToolPool, url: str) -> dict[str, Any]:
    return pool.stats()["lat"]["by_replica"][f"lat@{url}"]


# -- servers that stay up ----------------------------------------------------------------------


def test_a_slow_call_on_a_healthy_url_is_a_timeout_and_the_check_it_triggers_keeps_the_session(
    farm: LatencyFarm,
) -> None:
    async def scenario() -> None:
        async with MCPToolPool({"lat": {"urls": farm.urls[:2], "timeout_s": 0.5}}) as pool:
            slow = await pool.call(ToolCall("sleep", {"ms": 5_000}))
            assert slow.error_kind is ErrorKind.TIMEOUT, slow.text
            for _ in range(200):  # until the check the timeout triggered is done
                replicas = pool.stats()["lat"]["by_replica"].values()
                if sum(r["health_checks"] for r in replicas) == 1:
                    break
                await asyncio.sleep(0.05)
            # The server answered the check (tools/list; ping is gone from the 2026 protocol).
            assert [r["health_checks"] for r in replicas].count(1) == 1
            assert all(r["state"] == ReplicaState.READY.value for r in replicas)
            assert pool.stats()["lat"]["restarts"] == 0
            assert all([(await pool.call(ToolCall("sleep", {}))).ok for _ in range(4)])

    run(scenario())


def test_a_url_down_at_start_is_skipped_and_all_down_at_start_is_a_start_error(farm: LatencyFarm) -> None:
    nothing = [f"http://127.0.0.1:{free_local_port()}/mcp" for _ in range(2)]

    async def scenario() -> None:
        async with MCPToolPool({"lat": {"urls": [nothing[0], farm.urls[0]]}}) as pool:
            results = await asyncio.gather(*(pool.call(ToolCall("sleep", {})) for _ in range(10)))
            assert all(r.ok and served_by(r) == 0 for r in results), [r.text for r in results]
            assert replica_stats(pool, nothing[0])["state"] == ReplicaState.FAILED.value
            assert replica_stats(pool, nothing[0])["calls"] == 0
        with pytest.raises(MCPServerStartError) as raised:
            await MCPToolPool({"lat": {"urls": nothing}}).start()
        assert all(f"replica lat@{url}" in raised.value.failures["lat"] for url in nothing)

    run(scenario())


@pytest.mark.timeout(180)
def test_a_url_that_stops_answering_is_taken_out_after_its_calls_time_out(farm: LatencyFarm) -> None:
    async def scenario() -> None:
        config = {"lat": {"urls": farm.urls, "timeout_s": 2, "start_timeout_s": 3}}
        async with MCPToolPool(config) as pool:
            assert all([(await pool.call(ToolCall("sleep", {}))).ok for _ in range(6)])
            stopped = farm.process(1).pid
            os.kill(stopped, signal.SIGSTOP)  # alive, accepting connections, never answering
            try:
                hung: list[ToolResult] = []
                for _ in range(60):  # rounds until the check after a timeout has taken the URL out
                    if replica_stats(pool, farm.urls[1])["state"] != ReplicaState.READY.value:
                        break
                    calls = [pool.call(ToolCall("sleep", {"payload": str(i)})) for i in range(6)]
                    hung += [r for r in await asyncio.gather(*calls) if not r.ok]
                out = replica_stats(pool, farm.urls[1])
                assert out["state"] != ReplicaState.READY.value
                assert hung and {r.error_kind for r in hung} <= {ErrorKind.TIMEOUT, ErrorKind.SERVER_DIED}
                later = await asyncio.gather(*(pool.call(ToolCall("sleep", {})) for _ in range(30)))
                assert all(r.ok and served_by(r) in (0, 2) for r in later), [r.text for r in later]
                assert replica_stats(pool, farm.urls[1])["calls"] == out["calls"]
            finally:
                os.kill(stopped, signal.SIGCONT)

    run(scenario())


# -- servers killed ------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_killed_url_fails_only_its_in_flight_calls_and_later_calls_go_to_the_live_ones(
    farm: LatencyFarm, capsys: pytest.CaptureFixture[str]
) -> None:
    async def scenario() -> None:
        async with MCPToolPool({"lat": {"urls": farm.urls, "timeout_s": 30}}) as pool:
            episodes = Episodes(pool)
            running = asyncio.create_task(episodes.run())
            await episodes.halfway.wait()
            before = Counter(served_by(r) for _, r in episodes.calls)
            await asyncio.to_thread(farm.kill, 1)  # the episodes run on meanwhile
            killed_at = time.monotonic()
            finished = await running

            # Every episode finished every turn; the only errors are calls in flight at the kill.
            assert [len(results) for results in finished] == [TURNS] * EPISODES
            errors = [(t, r) for t, r in episodes.calls if not r.ok]
            assert {r.error_kind for _, r in errors} <= {ErrorKind.SERVER_DIED}
            assert all(t < killed_at for t, _ in errors) and len(errors) <= EPISODES
            later = [r for t, r in episodes.calls if t > killed_at]
            assert later and all(r.ok for r in later), [r.text for r in later if not r.ok]
            after = Counter(served_by(r) for r in later)
            assert set(before) == {0, 1, 2} and set(after) == {0, 2}
            assert min(after[0], after[2]) >= len(later) / 4  # least-in-flight spreads them

            # The dead URL is out: once it has left READY, it gets no more calls.
            dead = replica_stats(pool, farm.urls[1])
            assert dead["state"] != ReplicaState.READY.value
            again = await Episodes(pool).run()
            assert all(r.ok and served_by(r) in (0, 2) for results in again for r in results)
            assert replica_stats(pool, farm.urls[1])["calls"] == dead["calls"]
            stats = pool.stats()["lat"]
            with capsys.disabled():
                print(
                    f"\n[urls] {EPISODES} episodes x {TURNS} calls; served before the kill {dict(before)}, "
                    f"after {dict(after)}; server_died (in flight at the kill): {len(errors)}; "
                    f"failovers {stats['failovers']}; "
                    f"calls per replica {[r['calls'] for r in stats['by_replica'].values()]}"
                )

    run(scenario())


@pytest.mark.timeout(180)
def test_vector_env_episodes_over_urls_finish_with_every_call_answered_after_a_url_dies(
    farm: LatencyFarm,
) -> None:
    servers = {"mcpServers": {"lat": {"urls": farm.urls}}}
    tasks = [{"question": f"q{i}", "answer": str(i)} for i in range(8)]
    envs = gym.make_vec("RLF/ToolUse-v0", num_envs=8, tasks=tasks, mcp_servers=servers, max_turns=4)
    try:
        envs.reset(seed=0)
        sleep = '<tool_call>{"name": "sleep", "arguments": {}}</tool_call>'
        obs, *_ = envs.step([sleep] * 8)
        assert {served_by_text(o) for o in obs} == {0, 1, 2}
        farm.kill(1)  # between steps: no call is on it, so none may fail
        obs, _, terminated, truncated, infos = envs.step([sleep] * 8)
        assert not any(infos["errors"][i] for i in range(8)), obs
        assert {served_by_text(o) for o in obs} <= {0, 2} and not (terminated | truncated).any()
        obs, rewards, terminated, *_ = envs.step([f"<answer>{i}</answer>" for i in range(8)])
        assert terminated.all()
    finally:
        envs.close()


@pytest.mark.timeout(180)
def test_all_urls_down_gives_error_observations_without_a_hang_and_a_url_that_returns_serves_again(
    farm: LatencyFarm, capsys: pytest.CaptureFixture[str]
) -> None:
    timeout_s = 20.0

    async def scenario() -> None:
        async with MCPToolPool({"lat": {"urls": farm.urls, "timeout_s": timeout_s}}) as pool:
            assert (await pool.call(ToolCall("sleep", {}))).ok
            in_flight = [asyncio.create_task(pool.call(ToolCall("sleep", {"ms": 60_000}))) for _ in range(6)]
            await asyncio.sleep(0.5)
            for i in range(3):
                farm.kill(i)
            killed_at = time.monotonic()
            cut = await asyncio.gather(*in_flight)
            cut_s = time.monotonic() - killed_at
            assert {r.error_kind for r in cut} == {ErrorKind.SERVER_DIED}, [r.text for r in cut]
            down = await asyncio.gather(
                *(pool.call(ToolCall("sleep", {"payload": str(i)})) for i in range(20))
            )
            all_down_s = time.monotonic() - killed_at
            assert all(r.error_kind in (ErrorKind.SERVER_DIED, ErrorKind.SERVER_UNAVAILABLE) for r in down)
            assert max(r.latency_s for r in down) < timeout_s  # a generous hang guard, not a speed
            unavailable = [r for r in down if r.error_kind is ErrorKind.SERVER_UNAVAILABLE]
            assert unavailable and all("lat@" in r.text for r in unavailable)

            # One URL comes back on its port: a later call past its backoff finds it again.
            farm.ensure_running(2)
            back = None
            for _ in range(120):
                back = await pool.call(ToolCall("sleep", {}))
                if back.ok:
                    break
                await asyncio.sleep(0.25)
            assert back is not None and back.ok and served_by(back) == 2, back
            with capsys.disabled():
                print(
                    f"\n[urls] all 3 killed: the {len(cut)} calls in flight got server_died {cut_s:.2f} s "
                    f"after the kill; 20 new calls answered "
                    f"{dict(Counter(r.error_kind.value for r in down if r.error_kind))}, all within "
                    f"{all_down_s:.2f} s of the kill (slowest call {max(r.latency_s for r in down):.3f} s)"
                )

    run(scenario())


def test_a_refused_request_was_not_delivered_and_one_in_flight_at_the_death_was(
    latency_farm: LatencyFarm,
) -> None:
    farm = latency_farm.ensure_running(2)  # the one the test before left running

    async def scenario() -> None:
        [config] = load_mcp_config({"s": {"url": farm.urls[2]}})
        replica = MCPReplica(config, index=0, timeout_s=30.0)
        replica.start()
        try:
            assert await replica.wait_started() is None
            in_flight = asyncio.create_task(replica.attempt(ToolCall("sleep", {"ms": 60_000})))
            await asyncio.sleep(0.5)
            farm.kill(2)
            died = await in_flight
            assert died.result.error_kind is ErrorKind.SERVER_DIED and died.delivered
            refused = await replica.attempt(ToolCall("sleep", {}))
            assert refused.result.error_kind in (ErrorKind.SERVER_DIED, ErrorKind.SERVER_UNAVAILABLE)
            assert not refused.delivered, refused.result.text
        finally:
            await replica.stop()

    run(scenario())


# -- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"urls": []}, '"urls" must be a non-empty list'),
        ({"urls": "http://h/mcp"}, '"urls" must be a non-empty list'),
        ({"urls": ["http://h/mcp", "ftp://h/mcp"]}, '"urls"[1] must be an http(s) URL'),
        ({"urls": ["http://h/mcp", 8765]}, '"urls"[1] must be an http(s) URL'),
        ({"url": "http://a/mcp", "urls": ["http://b/mcp"]}, 'either "url" (one endpoint) or "urls"'),
        ({"command": "python", "urls": ["http://b/mcp"]}, 'either "command" (stdio) or "urls"'),
        ({"urls": ["http://h/mcp", "http://h/mcp"]}, "lists a URL twice"),
        ({"urls": ["http://h/mcp"], "type": "stdio"}, "\"type\" is 'stdio' but the entry gives a url"),
        ({"urls": ["http://h/mcp"], "env": {}}, '"env" applies to stdio (command) servers only'),
    ],
)
def test_bad_urls_entries_are_config_errors_naming_server_and_key(
    entry: dict[str, Any], expected: str
) -> None:
    with pytest.raises(MCPConfigError) as raised:
        MCPToolPool({"farm": entry})
    assert expected in str(raised.value) and "server 'farm'" in str(raised.value)


def test_urls_make_replicas_per_url_named_by_url() -> None:
    pool = MCPToolPool({"farm": {"urls": ["http://a:1/mcp", "http://b:2/mcp"], "replicas": 2}})
    stats = pool.stats()["farm"]
    assert stats["transport"] == "http" and stats["replicas"] == 4
    assert list(stats["by_replica"]) == [
        "farm@http://a:1/mcp#0",
        "farm@http://a:1/mcp#1",
        "farm@http://b:2/mcp#0",
        "farm@http://b:2/mcp#1",
    ]
