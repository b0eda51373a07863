"""MCP server with one tool, ``search``: BM25 over a saved index, results formatted for a model.

The index is loaded once at start-up; each query runs in a worker thread so concurrent calls
overlap instead of queueing behind one another on the event loop.

Example:
    python -m rlf_envs.tasks.deepsearch.server --index indexes/world0
    python -m rlf_envs.tasks.deepsearch.server --world-seed 0 --transport http --port 8770
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from rlf_envs.servers.launch import add_transport_args, serve_or_exit
from rlf_envs.tasks.deepsearch.index import SearchIndex, SearchIndexError, ensure_world_index

MIN_TOP_K, MAX_TOP_K = 1, 10

SEARCH_DESCRIPTION = (
    "Search the document collection. Returns the top_k most relevant documents, each with its title. "
    "Use short keyword queries such as an entity name; search again with a new query for each fact you need."
)


def format_hits(hits: Sequence[dict[str, Any]]) -> str:
    """Hits as numbered lines a model can read: ``Doc 1 (Title: X): text``.

    Example:
        >>> format_hits([{"title": "Zorvia", "contents": "Zorvia is a country."}])
        'Doc 1 (Title: Zorvia): Zorvia is a country.'
    """
    return "\n".join(
        f"Doc {rank} (Title: {hit['title']}): {hit['contents']}" for rank, hit in enumerate(hits, 1)
    )


def build_server(index: SearchIndex, *, default_top_k: int = 3, name: str = "rlf-search") -> MCPServer:
    """An MCP server exposing ``search(query, top_k=default_top_k)`` over ``index``.

    Example:
        >>> import asyncio
        >>> from rlf_envs.tasks.deepsearch.data import Document
        >>> index = SearchIndex.build([Document("a", "Zorvia", "Zorvia is a country."),
        ...                            Document("b", "Leidax", "Leidax is the capital of Zorvia.")])
        >>> server = build_server(index)   # e.g. SearchIndex.load("indexes/world0")
        >>> asyncio.run(server.call_tool("search", {"query": "capital", "top_k": 1})).content[0].text
        'Doc 1 (Title: Leidax): Leidax is the capital of Zorvia.'
        >>> server.run("stdio")   # serves stdin until it closes  # doctest: +SKIP
    """
    server = MCPServer(name=name, instructions="Keyword search over a document collection.")

    @server.tool(description=SEARCH_DESCRIPTION)
    async def search(query: str, top_k: int = default_top_k) -> str:
        if not query.strip():
            raise ToolError("query is empty: pass the words to search for, e.g. an entity name")
        k = min(max(int(top_k), MIN_TOP_K), MAX_TOP_K)
        hits = await anyio.to_thread.run_sync(index.search, query, k)
        if not hits:
            return f"No documents found for query: {query!r}. Try different keywords."
        return format_hits(hits)

    return server


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlf_envs.tasks.deepsearch.server", description=__doc__.split("\n\n")[0]
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--index", type=Path, help="index directory (built with rlf-search-index)")
    source.add_argument(
        "--world-seed", type=int, help="use (building on first use) the generated world's index"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="with --world-seed: cache root (default $RLF_CACHE_DIR or ~/.cache/rlf)")  # fmt: skip
    parser.add_argument("--top-k", type=int, default=3, help="documents returned when the call omits top_k")
    parser.add_argument("--mmap", action="store_true", help="leave the score matrix on disk (huge corpora)")
    add_transport_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    directory = args.index if args.index is not None else ensure_world_index(args.world_seed, args.cache_dir)
    return serve_or_exit(
        "search server",
        args,
        lambda: build_server(SearchIndex.load(directory, mmap=args.mmap), default_top_k=args.top_k),
        (SearchIndexError,),
    )


if __name__ == "__main__":
    sys.exit(main())
