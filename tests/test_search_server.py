"""The search MCP server as a real subprocess, over stdio (and once over streamable HTTP)."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from rlf_envs.tasks.deepsearch import server as search_server
from rlf_envs.tasks.deepsearch.index import ensure_world_index
from rlf_envs.tasks.deepsearch.task import DeepSearchTask
from rlf_envs.tasks.deepsearch.world import World
from tests.helpers import free_local_port, http_server

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER = [sys.executable, "-m", "rlf_envs.tasks.deepsearch.server"]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_world_index(seed=0, cache_dir=tmp_path_factory.mktemp("cache"))


def stdio_params(*args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "rlf_envs.tasks.deepsearch.server", *args],
        env={"PYTHONPATH": str(REPO_ROOT)},
        cwd=str(REPO_ROOT),
    )


def doc_titles(text: str) -> list[str]:
    return re.findall(r"^Doc \d+ \(Title: (.*?)\): ", text, flags=re.MULTILINE)


def test_search_tool_over_stdio(index_dir: Path, world: World) -> None:
    person = next(e for e in world.entities.values() if e.kind == "person")
    city = world.entities[person.relations["born_in"]]
    titles = [doc.title for doc in world.documents[::97]][:24]

    async def scenario() -> None:
        async with Client(stdio_params("--index", str(index_dir))) as client:
            tools = (await client.list_tools()).tools
            assert [tool.name for tool in tools] == ["search"]
            assert set(tools[0].input_schema["properties"]) == {"query", "top_k"}
            assert tools[0].input_schema["required"] == ["query"]

            result = await client.call_tool("search", {"query": person.name})
            assert not result.is_error
            text = result.content[0].text
            assert len(doc_titles(text)) == 3  # the default top_k
            assert doc_titles(text)[0] == person.name
            assert f"was born in {city.name}" in text.splitlines()[0]

            # top_k is clamped to [1, 10]
            one = await client.call_tool("search", {"query": person.name, "top_k": 1})
            assert doc_titles(one.content[0].text) == [person.name]
            many = await client.call_tool("search", {"query": "city river company", "top_k": 50})
            assert len(doc_titles(many.content[0].text)) == 10
            zero = await client.call_tool("search", {"query": person.name, "top_k": 0})
            assert len(doc_titles(zero.content[0].text)) == 1

            missing = await client.call_tool("search", {"query": "qqqzzz"})
            assert not missing.is_error and "No documents found" in missing.content[0].text

            # an empty query and bad arguments are tool errors, and the server keeps serving
            for query in ("", "   \n"):
                empty = await client.call_tool("search", {"query": query})
                assert empty.is_error and "query is empty" in empty.content[0].text
            assert (await client.call_tool("search", {"query": "x", "top_k": "many"})).is_error

            # many calls in flight on one session: each gets its own answer
            gathered = await asyncio.gather(
                *(client.call_tool("search", {"query": t, "top_k": 1}) for t in titles)
            )
            assert [doc_titles(r.content[0].text)[0] for r in gathered] == titles

    asyncio.run(scenario())


def test_oracle_walks_every_hop_through_the_task_config(index_dir: Path, world: World) -> None:
    task = DeepSearchTask(world_seed=0, cache_dir=index_dir.parent.parent)  # reuses the fixture's index
    entry = task.mcp_config()["mcpServers"]["search"]
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"])
    questions = [q for q in world.split("test") if q.hops == 3][:8]

    async def scenario() -> None:
        async with Client(params) as client:
            for question in questions:
                solution = world.solve(question.id)
                hop_targets = [world.entities[d] for d in question.supporting_doc_ids[1:]]
                for hop, query in enumerate(solution.queries):
                    text = (await client.call_tool("search", {"query": query})).content[0].text
                    assert query in doc_titles(text)
                    # each result names what to search next, and the last one names the answer
                    expected = hop_targets[hop].name if hop < len(hop_targets) else solution.answer
                    assert expected in text

    asyncio.run(scenario())


def test_search_over_streamable_http_with_the_world_seed_flag(index_dir: Path, world: World) -> None:
    port = free_local_port()
    country = next(e for e in world.entities.values() if e.kind == "country")
    cache_root = index_dir.parent.parent  # --world-seed finds the fixture's index there and reuses it
    meta_inode = (index_dir / "meta.json").stat().st_ino

    async def scenario() -> str:
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            result = await client.call_tool("search", {"query": country.name, "top_k": 2})
            assert not result.is_error
            return result.content[0].text

    with http_server([*SERVER, "--world-seed", "0", "--cache-dir", str(cache_root)], port):
        text = asyncio.run(scenario())
    assert doc_titles(text)[0] == country.name and len(doc_titles(text)) == 2
    assert (index_dir / "meta.json").stat().st_ino == meta_inode


def test_missing_index_exits_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert search_server.main(["--index", str(tmp_path / "nope")]) == 2
    assert "no search index" in capsys.readouterr().err
