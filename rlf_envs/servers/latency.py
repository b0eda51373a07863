"""An MCP server whose one real tool just waits: a stand-in for a slow search API or sandbox.

Tests use it to prove that calls really overlap (``stats()["peak_in_flight"]``) and the env
benchmark uses it to price tool latency without any real work behind it.

Tools:
    sleep(ms=None, payload="")  wait ``ms`` (default: the server's latency +- uniform jitter), echo back
    stats()                     {"in_flight": n, "peak_in_flight": n, "calls": n} (sleep calls only)
    reset_stats()               zero the counters (in_flight is left alone: those calls are still running)

Example:
    python -m rlf_envs.servers.latency --latency-ms 100 --jitter-ms 20
    python -m rlf_envs.servers.latency --transport http --port 8765
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
from dataclasses import asdict, dataclass

from mcp.server.mcpserver import MCPServer

from rlf_envs.servers._runner import add_transport_args, run_server


@dataclass
class LatencyStats:
    """Counters over ``sleep`` calls; one instance per server process."""

    in_flight: int = 0
    peak_in_flight: int = 0
    calls: int = 0


def build_server(latency_ms: float = 100.0, jitter_ms: float = 0.0, seed: int = 0) -> MCPServer:
    """An MCPServer with ``sleep``, ``stats`` and ``reset_stats``.

    Example:
        >>> server = build_server(latency_ms=50)
        >>> server.name
        'latency'
    """
    if latency_ms < 0 or jitter_ms < 0:
        raise ValueError(f"latency and jitter must be >= 0, got {latency_ms} and {jitter_ms}")
    server = MCPServer("latency", log_level="WARNING")
    counters = LatencyStats()
    rng = random.Random(seed)

    peak_reached = asyncio.Event()
    wanted_peak = 0

    @server.tool()
    async def sleep(ms: float | None = None, payload: str = "", until_in_flight: int = 0) -> str:
        """Wait `ms` milliseconds (default: the server's configured latency), then echo the payload.

        With `until_in_flight` > 0 the call returns early, as soon as that many calls have been in
        flight at once: a load-independent way for tests to prove concurrency (a serialising
        client never gets there and every call waits its full `ms`).
        """
        nonlocal wanted_peak
        if ms is None:
            ms = max(0.0, latency_ms + rng.uniform(-jitter_ms, jitter_ms))
        counters.calls += 1
        counters.in_flight += 1
        counters.peak_in_flight = max(counters.peak_in_flight, counters.in_flight)
        if until_in_flight > 0:
            wanted_peak = until_in_flight
            if counters.in_flight >= until_in_flight:
                peak_reached.set()
        try:
            if until_in_flight > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(peak_reached.wait(), max(0.0, ms) / 1000.0)
            else:
                await asyncio.sleep(max(0.0, ms) / 1000.0)
        finally:
            counters.in_flight -= 1
            if counters.in_flight == 0 and wanted_peak:
                peak_reached.clear()
                wanted_peak = 0
        return f"slept {ms:.1f} ms" + (f": {payload}" if payload else "")

    @server.tool()
    def stats() -> dict[str, int]:
        """In-flight, peak in-flight and total counts of `sleep` calls."""
        return asdict(counters)

    @server.tool()
    def reset_stats() -> str:
        """Zero the call and peak counters (calls still running stay counted in in_flight)."""
        counters.calls = 0
        counters.peak_in_flight = counters.in_flight
        return "ok"

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--latency-ms", type=float, default=100.0, help="default sleep per call")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="uniform +- jitter on the default sleep")
    parser.add_argument("--seed", type=int, default=0, help="seed of the jitter")
    add_transport_args(parser)
    args = parser.parse_args(argv)
    run_server(build_server(args.latency_ms, args.jitter_ms, args.seed), args)


if __name__ == "__main__":
    main()
