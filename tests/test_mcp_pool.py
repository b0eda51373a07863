"""MCPToolPool against real MCP servers: subprocesses over stdio and streamable HTTP, no mocks."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from typing import Any

import mcp_types
import pytest

from rlf_envs.tools import mcp_replica
from rlf_envs.tools.mcp_config import MCPConfigError, load_mcp_config
from rlf_envs.tools.mcp_pool import MCPServerStartError, MCPToolPool, result_text
from rlf_envs.tools.mcp_replica import MCPReplica, ReplicaState
from rlf_envs.types import ErrorKind, ToolCall, ToolProvider, ToolResult
from tests.helpers import (
    FAULTY_SERVER,
    LoopThread,
    faulty_server,
    free_local_port,
    http_server,
    latency_server,
    pid_alive,
    tiny_server,
)


def run(coro: Any, timeout_s: float = 60.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def call(pool: MCPToolPool, name: str, **arguments: Any) -> ToolResult:
    return await pool.call(ToolCall(name, arguments))


async def value(pool: MCPToolPool, name: str, **arguments: Any) -> Any:
    result = await call(pool, name, **arguments)
    assert result.ok, result.text
    structured = result.structured
    # MCPServer wraps a non-object return value as {"result": value}.
    return (
        structured["result"] if isinstance(structured, dict) and set(structured) == {"result"} else structured
    )


async def wait_until(predicate: Any, attempts: int = 100, pause_s: float = 0.05) -> None:
    for _ in range(attempts):
        if await predicate():
            return
        await asyncio.sleep(pause_s)
    raise AssertionError("condition never became true")


@pytest.fixture(scope="module")
def loop() -> Any:
    """One persistent loop in a background thread, the way the env drives the pool."""
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def pool(loop: LoopThread) -> Any:
    """A started pool shared by the tests that leave its servers as they found them."""
    config = {"mcpServers": {"basic": faulty_server(), "short": faulty_server("t_", timeout_s=0.5)}}

    async def start() -> MCPToolPool:
        started = MCPToolPool(config)
        await started.start()
        return started

    started = loop.run(start())
    yield started
    loop.run(started.aclose())


# -- concurrency ----------------------------------------------------------------------------------


def test_256_calls_are_in_flight_at_once_on_one_stdio_session() -> None:
    async def scenario() -> None:
        async with MCPToolPool({"lat": latency_server("--latency-ms", "2000")}) as pool:
            assert isinstance(pool, ToolProvider)
            results = await asyncio.gather(*(call(pool, "sleep", payload=str(i)) for i in range(256)))
            assert [r.text for r in results] == [f"slept 2000.0 ms: {i}" for i in range(256)]
            assert all(r.ok and r.latency_s >= 2.0 for r in results)  # each call slept 2 s on the server
            stats = await call(pool, "stats")
            assert stats.structured == {"in_flight": 0, "peak_in_flight": 256, "calls": 256}
            assert json.loads(stats.text) == stats.structured
            assert pool.stats()["lat"]["calls"] == 257 and pool.stats()["lat"]["ok"] == 257

    run(scenario())


def test_256_calls_are_in_flight_at_once_over_streamable_http() -> None:
    port = free_local_port()
    with http_server([sys.executable, "-m", "rlf_envs.servers.latency"], port):

        async def scenario() -> None:
            async with MCPToolPool({"lat": {"url": f"http://127.0.0.1:{port}/mcp"}}) as pool:
                assert (await call(pool, "sleep", ms=1, payload="warm")).text == "slept 1.0 ms: warm"
                calls = [asyncio.create_task(call(pool, "sleep", ms=60_000)) for _ in range(256)]
                await wait_until(
                    lambda: _value_is(pool, "stats", {"in_flight": 256, "peak_in_flight": 256, "calls": 257})
                )
                # Cancelling the callers cancels the requests on the server too.
                for task in calls:
                    task.cancel()
                outcomes = await asyncio.gather(*calls, return_exceptions=True)
                assert all(isinstance(o, asyncio.CancelledError) for o in outcomes)
                await wait_until(lambda: _in_flight_is(pool, 0))
                assert pool.stats()["lat"]["transport"] == "http"
                assert pool.stats()["lat"]["in_flight"] == 0

        run(scenario())


async def _in_flight_is(pool: MCPToolPool, expected: int) -> bool:
    return (await value(pool, "stats"))["in_flight"] == expected


# -- one call's failures become typed results ----------------------------------------------------


def test_specs_follow_the_servers_input_schemas(pool: MCPToolPool) -> None:
    specs = {spec.name: spec for spec in pool.specs()}
    assert {"echo", "fail", "hang", "die", "pid", "t_echo", "t_hang"} <= set(specs)
    echo = specs["echo"].to_openai()["function"]
    assert echo["parameters"]["required"] == ["text"]
    assert echo["parameters"]["properties"]["text"] == {"type": "string"}
    assert "wait" in echo["description"].lower()
    assert pool.has_tool("echo") and not pool.has_tool("nope")


def test_unknown_tool(pool: MCPToolPool, loop: LoopThread) -> None:
    result = loop.run(call(pool, "search", query="x"))
    assert result.error_kind is ErrorKind.UNKNOWN_TOOL and not result.ok
    assert "'search'" in result.text and "echo" in result.text


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("echo", {}, "'text' is a required property"),
        ("echo", {"text": 5}, "5 is not of type 'string'"),
        ("echo", {"text": "x", "delay_s": "soon"}, "arguments.delay_s"),
        ("even", {"n": 3}, "n must be even"),  # passes the schema; the server's own validation rejects it
        ("strict", {"n": -1}, "n must be >= 0"),  # a JSON-RPC invalid-params error from the server
    ],
)
def test_bad_arguments(
    pool: MCPToolPool, loop: LoopThread, name: str, arguments: dict, expected: str
) -> None:
    result = loop.run(pool.call(ToolCall(name, arguments)))
    assert result.error_kind is ErrorKind.BAD_ARGUMENTS, result.text
    assert expected in result.text


def test_arguments_that_are_not_an_object(pool: MCPToolPool, loop: LoopThread) -> None:
    result = loop.run(pool.call(ToolCall("echo", ["x"])))  # type: ignore[arg-type]
    assert result.error_kind is ErrorKind.BAD_ARGUMENTS and "JSON object" in result.text


def test_tool_error_carries_the_servers_message(pool: MCPToolPool, loop: LoopThread) -> None:
    result = loop.run(call(pool, "fail", message="the index is on fire"))
    assert result.error_kind is ErrorKind.TOOL_ERROR
    assert "the index is on fire" in result.text
    assert loop.run(value(pool, "even", n=4)) == 4


def test_timeout_cancels_the_request_and_the_session_stays_usable(
    pool: MCPToolPool, loop: LoopThread
) -> None:
    async def scenario() -> None:
        before = pool.stats()["short"]
        result = await call(pool, "t_hang")
        assert result.error_kind is ErrorKind.TIMEOUT and "0.5 s" in result.text
        assert (await call(pool, "t_echo", text="still here")).text == "still here"

        async def hang_was_cancelled_on_the_server() -> bool:
            return await value(pool, "t_in_flight") == 0

        await wait_until(hang_was_cancelled_on_the_server)
        after = pool.stats()["short"]
        assert after["errors"].get("timeout", 0) == before["errors"].get("timeout", 0) + 1
        assert after["restarts"] == 0

    loop.run(scenario())


def testresult_text_joins_text_describes_other_blocks_and_falls_back_to_structured() -> None:
    blocks = [
        mcp_types.TextContent(type="text", text="first"),
        mcp_types.ImageContent(type="image", data="AAAA", mime_type="image/png"),
        mcp_types.EmbeddedResource(
            type="resource", resource=mcp_types.TextResourceContents(uri="file:///a.txt", text="inside")
        ),
        mcp_types.TextContent(type="text", text="last"),
    ]
    assert (
        result_text(mcp_types.CallToolResult(content=blocks))
        == "first\n[image: image/png, 3 bytes]\ninside\nlast"
    )
    structured_only = mcp_types.CallToolResult(content=[], structured_content={"rows": 2, "name": "é"})
    assert json.loads(result_text(structured_only)) == {"rows": 2, "name": "é"}
    long_text = "x" * 100_000
    assert (
        result_text(mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=long_text)]))
        == long_text
    )


# -- servers that die -----------------------------------------------------------------------------


def test_killed_server_fails_its_calls_only_and_is_restarted() -> None:
    config = {"a": faulty_server("a_"), "b": faulty_server("b_")}

    async def scenario() -> None:
        pool = MCPToolPool(config)
        await pool.start()
        old_pid = await value(pool, "a_pid")
        a_calls = [asyncio.create_task(call(pool, "a_echo", text=f"a{i}", delay_s=5)) for i in range(20)]
        b_calls = [asyncio.create_task(call(pool, "b_echo", text=f"b{i}", delay_s=2)) for i in range(20)]

        async def all_in_flight() -> bool:
            return await value(pool, "a_in_flight") == 20 and await value(pool, "b_in_flight") == 20

        await wait_until(all_in_flight)
        os.kill(old_pid, signal.SIGKILL)
        a_results = await asyncio.gather(*a_calls)
        assert {r.error_kind for r in a_results} == {ErrorKind.SERVER_DIED}
        assert "'a'" in a_results[0].text
        # Promptly: B's 2-second calls are all still running when A's failures are back.
        assert await value(pool, "b_in_flight") == 20
        b_results = await asyncio.gather(*b_calls)
        assert [r.text for r in b_results] == [f"b{i}" for i in range(20)]

        new_pid = await value(pool, "a_pid")
        assert new_pid != old_pid and not pid_alive(old_pid)
        assert pool.stats()["a"]["restarts"] == 1 and pool.stats()["b"]["restarts"] == 0
        assert pool.stats()["a"]["errors"] == {"server_died": 20}
        assert pool.stats()["b"]["errors"] == {}

        # aclose stops the restarted process too, and answers the call still running on B.
        b_pid = await value(pool, "b_pid")
        hanging = asyncio.create_task(call(pool, "b_hang"))
        await wait_until(lambda: _value_is(pool, "b_in_flight", 1))
        await pool.aclose()
        assert not pid_alive(new_pid) and not pid_alive(b_pid)
        assert (await hanging).error_kind is ErrorKind.SERVER_UNAVAILABLE
        assert (await call(pool, "a_echo", text="x")).error_kind is ErrorKind.SERVER_UNAVAILABLE

    run(scenario())


def test_server_that_cannot_restart_gives_server_unavailable(tmp_path: Any) -> None:
    config = {"once": tiny_server("", "--start-once", str(tmp_path / "started"))}

    async def scenario() -> None:
        async with MCPToolPool(config) as pool:
            os.kill(int((await call(pool, "pid")).text), signal.SIGKILL)

            async def unavailable() -> bool:
                result = await call(pool, "echo", text="x")
                assert result.error_kind in (ErrorKind.SERVER_DIED, ErrorKind.SERVER_UNAVAILABLE), result.text
                return result.error_kind is ErrorKind.SERVER_UNAVAILABLE

            await wait_until(unavailable)
            result = await call(pool, "echo", text="x")
            assert result.error_kind is ErrorKind.SERVER_UNAVAILABLE
            assert "refusing to restart" in result.text  # the server's stderr says why
            assert pool.stats()["once"]["restart_failures"] >= 1
            assert pool.stats()["once"]["restarts"] == 0

    run(scenario())


def test_http_server_death_fails_calls_and_the_pool_reconnects() -> None:
    port = free_local_port()
    argv = [sys.executable, FAULTY_SERVER]

    async def scenario() -> None:
        pool = MCPToolPool({"remote": {"url": f"http://127.0.0.1:{port}/mcp"}})
        try:
            with http_server(argv, port) as server:
                await pool.start()
                assert (await call(pool, "echo", text="before")).text == "before"
                in_flight = [asyncio.create_task(call(pool, "echo", text="x", delay_s=30)) for _ in range(5)]
                await wait_until(lambda: _value_is(pool, "in_flight", 5))
                died = await call(pool, "die")  # the server process exits while answering
                results = await asyncio.gather(*in_flight)
                assert {r.error_kind for r in [died, *results]} == {ErrorKind.SERVER_DIED}
                assert server.wait(timeout=10) == 1
            with http_server(argv, port):

                async def back() -> bool:
                    result = await call(pool, "echo", text="after")
                    return result.ok and result.text == "after"

                await wait_until(back, attempts=60, pause_s=0.25)
            assert pool.stats()["remote"]["restarts"] >= 1
        finally:
            await pool.aclose()

    run(scenario())


async def _value_is(pool: MCPToolPool, name: str, expected: Any) -> bool:
    return await value(pool, name) == expected


# -- one replica's state machine, as its module docstring documents it ---------------------------

# "FROM -> TO" at the start of a row of the transition table in mcp_replica's docstring.
DOCUMENTED_TRANSITIONS = set(
    re.findall(r"^(\(new\)|any|[A-Z]+) -> ([A-Z]+)\s", mcp_replica.__doc__ or "", re.M)
)
CONNECTING, READY, FAILED, CLOSED = (
    ReplicaState.CONNECTING,
    ReplicaState.READY,
    ReplicaState.FAILED,
    ReplicaState.CLOSED,
)


def replica_of(server: dict[str, Any]) -> MCPReplica:
    [config] = load_mcp_config({"s": server})
    return MCPReplica(config, index=0, timeout_s=60.0)


class StateLog:
    """The states one replica passes through, from the one it has now; a repeated state counts once."""

    def __init__(self, replica: MCPReplica) -> None:
        self.replica = replica
        self.states = [replica.state]
        self._follower = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        while self.states[-1] is not CLOSED:
            await self.replica.wait_state_change()
            if self.replica.state is not self.states[-1]:
                self.states.append(self.replica.state)

    async def until(self, state: ReplicaState, *, times: int = 1) -> None:
        while self.states.count(state) < times:
            await self.replica.wait_state_change()
            await asyncio.sleep(0)  # let the follower record the transition first

    async def closed(self) -> list[ReplicaState]:
        await self._follower
        return self.states


def assert_documented(states: list[ReplicaState]) -> None:
    assert states[0] is CONNECTING and ("(new)", "CONNECTING") in DOCUMENTED_TRANSITIONS
    for before, after in zip(states, states[1:], strict=False):
        assert {(before.name, after.name), ("any", after.name)} & DOCUMENTED_TRANSITIONS, (before, after)


async def replica_value(replica: MCPReplica, name: str, **arguments: Any) -> Any:
    result = await replica.call(ToolCall(name, arguments))
    assert result.ok, result.text
    return result.structured["result"]


async def replica_in_flight_is(replica: MCPReplica, expected: int) -> bool:
    return await replica_value(replica, "in_flight") == expected


def test_replica_docstring_tables_every_transition_into_every_state() -> None:
    assert {after for _, after in DOCUMENTED_TRANSITIONS} == {state.name for state in ReplicaState}
    assert sorted(DOCUMENTED_TRANSITIONS) == [
        ("(new)", "CONNECTING"),
        ("CONNECTING", "FAILED"),
        ("CONNECTING", "READY"),
        ("FAILED", "CONNECTING"),
        ("READY", "CONNECTING"),
        ("any", "CLOSED"),
    ]


def test_replica_killed_mid_call_cuts_its_calls_restarts_and_stop_is_final() -> None:
    async def scenario() -> None:
        replica = replica_of(faulty_server())
        log = StateLog(replica)
        replica.start()
        assert await replica.wait_started() is None and replica.state is READY
        old_pid = await replica_value(replica, "pid")
        in_flight = [
            asyncio.create_task(replica.call(ToolCall("echo", {"text": "x", "delay_s": 30})))
            for _ in range(3)
        ]
        await wait_until(lambda: replica_in_flight_is(replica, 3))

        # READY -> CONNECTING: the process dies, its in-flight calls are cut as server_died ...
        os.kill(old_pid, signal.SIGKILL)
        results = await asyncio.gather(*in_flight)
        assert {r.error_kind for r in results} == {ErrorKind.SERVER_DIED}, [r.text for r in results]
        assert all("'s'" in r.text for r in results)
        # ... and CONNECTING -> READY: the restart begins at once, the next call works.
        await log.until(READY, times=2)
        new_pid = await replica_value(replica, "pid")
        assert new_pid != old_pid and not pid_alive(old_pid)
        assert (await replica.call(ToolCall("echo", {"text": "back"}))).text == "back"
        assert (replica.restarts, replica.restart_failures) == (1, 0)

        # any -> CLOSED: stop() cuts the in-flight call as server_unavailable and never restarts.
        hanging = asyncio.create_task(replica.call(ToolCall("hang", {})))
        await wait_until(lambda: replica_in_flight_is(replica, 1))
        await replica.stop()
        stopped = await hanging
        assert stopped.error_kind is ErrorKind.SERVER_UNAVAILABLE and "was stopped" in stopped.text
        later = await replica.call(ToolCall("echo", {"text": "x"}))
        assert later.error_kind is ErrorKind.SERVER_UNAVAILABLE and "is stopped" in later.text
        assert not pid_alive(new_pid) and replica.restarts == 1
        states = await log.closed()
        assert states == [CONNECTING, READY, CONNECTING, READY, CLOSED]
        assert_documented(states)

    run(scenario())


def test_replica_that_cannot_restart_fails_and_retries_only_when_a_call_asks(tmp_path: Any) -> None:
    async def scenario() -> None:
        replica = replica_of(tiny_server("", "--start-once", str(tmp_path / "started")))
        log = StateLog(replica)
        replica.start()
        assert await replica.wait_started() is None

        # READY -> CONNECTING -> FAILED: the process dies and the restart attempt fails.
        os.kill(int((await replica.call(ToolCall("pid", {}))).text), signal.SIGKILL)
        await log.until(FAILED)
        assert (replica.restarts, replica.restart_failures) == (0, 1)
        # FAILED -> CONNECTING -> FAILED: calls get server_unavailable (with the server's stderr);
        # the first call past the backoff has the supervisor try again.
        while replica.restart_failures < 2:
            result = await replica.call(ToolCall("echo", {"text": "x"}))
            assert result.error_kind is ErrorKind.SERVER_UNAVAILABLE, result.text
            assert "could not be restarted" in result.text and "refusing to restart" in result.text
            await asyncio.sleep(0.05)
        assert replica.state is FAILED and replica.restarts == 0

        await replica.stop()
        states = await log.closed()
        attempts = len(states[4:-1]) // 2
        assert states == [CONNECTING, READY, CONNECTING, FAILED, *[CONNECTING, FAILED] * attempts, CLOSED]
        assert attempts == replica.restart_failures - 1 >= 1
        assert_documented(states)

    run(scenario())


# -- replicas, cache, start and stop --------------------------------------------------------------


def test_replicas_share_the_calls_and_aclose_stops_every_process() -> None:
    async def scenario() -> None:
        pool = MCPToolPool({"r": tiny_server(replicas=3)})
        await pool.start()
        pids = [int(r.text) for r in await asyncio.gather(*(call(pool, "pid") for _ in range(30)))]
        assert sorted(pids.count(p) for p in set(pids)) == [10, 10, 10]
        sequential = [int((await call(pool, "pid")).text) for _ in range(6)]
        assert set(sequential) == set(pids)
        assert pool.stats()["r"]["replicas"] == 3
        await pool.aclose()
        assert not any(pid_alive(p) for p in set(pids))

    run(scenario())


def test_max_concurrency_queues_calls_per_replica() -> None:
    async def scenario() -> None:
        async with MCPToolPool({"lat": latency_server(max_concurrency=4)}) as pool:
            results = await asyncio.gather(*(call(pool, "sleep", ms=100) for _ in range(12)))
            assert all(r.ok for r in results)
            assert (await value(pool, "stats"))["peak_in_flight"] == 4

    run(scenario())


def test_cache_serves_repeats_without_calling_the_server() -> None:
    async def scenario() -> None:
        async with MCPToolPool({"c": tiny_server(cache=True)}) as pool:
            first = await call(pool, "echo", text="x", n=1)
            again = await call(pool, "echo", n=1, text="x")  # same arguments, other key order
            assert first.ok and not first.cached
            assert again.ok and again.cached and again.text == "x"
            assert again.call.id != first.call.id
            assert (await call(pool, "echo", text="y")).cached is False
            assert (await call(pool, "count")).text == "2"  # the repeat never reached the server
            failed = [await call(pool, "fail", message="no") for _ in range(2)]
            assert [r.error_kind for r in failed] == [ErrorKind.TOOL_ERROR] * 2
            assert not any(r.cached for r in failed)  # errors are never cached
            assert pool.stats()["c"]["cache_hits"] == 1

    run(scenario())


def test_server_that_cannot_start_raises_with_its_stderr() -> None:
    broken = {"command": sys.executable, "args": ["-c", "import sys; sys.exit('no index at /nowhere')"]}
    missing = {"command": "/nonexistent/mcp-server"}
    silent = {
        "command": sys.executable,
        "args": ["-c", "import sys; sys.stdin.read()"],
        "start_timeout_s": 0.5,
    }

    async def scenario() -> None:
        pool = MCPToolPool({"good": tiny_server(), "broken": broken, "missing": missing, "silent": silent})
        with pytest.raises(MCPServerStartError) as raised:
            await pool.start()
        assert set(raised.value.failures) == {"broken", "missing", "silent"}
        assert "no index at /nowhere" in raised.value.failures["broken"]
        assert "FileNotFoundError" in raised.value.failures["missing"]
        assert "within 0.5 s" in raised.value.failures["silent"]
        assert (await call(pool, "echo", text="x")).error_kind is ErrorKind.SERVER_UNAVAILABLE

    run(scenario())


# -- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"s": {"args": ["x"]}}, 'needs "command"'),
        ({"s": {"command": "python", "url": "http://h/mcp"}}, "not both"),
        ({"s": {"command": ["python"]}}, '"command" must be'),
        ({"s": {"command": "python", "args": "-m server"}}, '"args" must be a list'),
        ({"s": {"command": "python", "env": {"N": 1}}}, '"env" must be an object of string'),
        ({"s": {"url": "ftp://h/mcp"}}, '"url" must be an http'),
        ({"s": {"url": "http://h/mcp", "args": []}}, "stdio (command) servers only"),
        ({"s": {"command": "python", "replicas": 0}}, '"replicas" must be an integer >= 1'),
        ({"s": {"command": "python", "replicas": True}}, '"replicas" must be an integer >= 1'),
        ({"s": {"command": "python", "timeout_s": -1}}, '"timeout_s" must be a number > 0'),
        ({"s": {"command": "python", "max_concurrency": 2.5}}, '"max_concurrency" must be an integer'),
        ({"s": {"command": "python", "cache": "yes"}}, '"cache" must be true'),
        ({"s": {"url": "http://h/mcp", "type": "sse"}}, "SSE transport is not supported"),
        ({"s": "python server.py"}, "must be an object"),
        ({"mcpServers": ["s"]}, '"mcpServers" must be an object'),
        ("{not json", "not valid JSON"),
        ("/nonexistent/mcp.json", "cannot read MCP config file"),
    ],
)
def test_malformed_config_raises_a_typed_error(config: Any, expected: str) -> None:
    with pytest.raises(MCPConfigError) as raised:
        MCPToolPool(config)
    assert expected in str(raised.value)
    if isinstance(config, dict) and "s" in config:
        assert "server 's'" in str(raised.value)


def test_config_from_json_string_and_file(tmp_path: Any) -> None:
    config = {
        "mcpServers": {"a": {"command": "python", "cache": 8}, "off": {"command": "x", "disabled": True}}
    }
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(config))
    for source in (config, config["mcpServers"], json.dumps(config), str(path), path):
        [server] = load_mcp_config(source)
        assert (server.name, server.transport, server.cache_size) == ("a", "stdio", 8)


def test_duplicate_tool_names_across_servers_are_a_config_error() -> None:
    async def scenario() -> None:
        pool = MCPToolPool({"first": tiny_server(), "second": tiny_server()})
        with pytest.raises(MCPConfigError) as raised:
            await pool.start()
        assert "'first'" in str(raised.value) and "'second'" in str(raised.value)

    run(scenario())
