"""An MCP server whose one real tool just waits: a stand-in for a slow search API or sandbox.

Tests use it to prove that calls really overlap (``stats()["peak_in_flight"]``) and the env
benchmark uses it to price tool latency without any real work behind it.

Tools:
    sleep(ms=None, payload="")  wait ``ms`` (default: drawn from the server's latency distribution), echo back
    stats()                     {"in_flight": n, "peak_in_flight": n, "calls": n} (sleep calls only)
    reset_stats()               zero the counters (in_flight is left alone: those calls are still running)

The default latency is ``--latency-ms`` +- uniform ``--jitter-ms``, or, with ``--latency-dist
lognormal``, a heavy-tailed draw whose median is ``--latency-ms`` and whose log has standard
deviation ``--sigma`` (real search APIs, sandboxes and judges: p99 often 10x p50).

Example:
    python -m rlf_envs.servers.latency --latency-ms 100 --jitter-ms 20
    python -m rlf_envs.servers.latency --latency-dist lognormal --latency-ms 500 --sigma 1.0
    python -m rlf_envs.servers.latency --transport http --port 8765
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

from mcp.server.mcpserver import MCPServer

from rlf_envs.servers.launch import add_transport_args, run_server


@dataclass
class LatencyStats:
    """Counters over ``sleep`` calls; one instance per server process."""

    in_flight: int = 0
    peak_in_flight: int = 0
    calls: int = 0


LATENCY_DISTRIBUTIONS = ("uniform", "lognormal")


def latency_sampler(
    latency_ms: float, jitter_ms: float = 0.0, *, dist: str = "uniform", sigma: float = 1.0, seed: int = 0
) -> Callable[[], float]:
    """A function drawing one default latency in ms: uniform around ``latency_ms``, or lognormal with that median.

    Example:
        >>> draw = latency_sampler(500, dist="lognormal", sigma=1.0, seed=0)
        >>> samples = sorted(draw() for _ in range(2001))
        >>> 400 < samples[1000] < 600, samples[1980] > 4 * samples[1000]   # median ~500, a heavy tail
        (True, True)
    """
    if latency_ms < 0 or jitter_ms < 0 or sigma < 0:
        raise ValueError(f"latency, jitter and sigma must be >= 0, got {latency_ms}, {jitter_ms}, {sigma}")
    if dist not in LATENCY_DISTRIBUTIONS:
        raise ValueError(f"unknown latency distribution {dist!r}; choose one of {LATENCY_DISTRIBUTIONS}")
    rng = random.Random(seed)
    if dist == "lognormal":
        mu = math.log(latency_ms) if latency_ms > 0 else -math.inf
        return lambda: 0.0 if latency_ms == 0 else rng.lognormvariate(mu, sigma)
    return lambda: max(0.0, latency_ms + rng.uniform(-jitter_ms, jitter_ms))


class InFlightGate:
    """Counts the ``sleep`` calls in flight; a call may end early once a wanted number were in
    flight at once (the proof of concurrency that does not depend on the machine's load)."""

    def __init__(self, counters: LatencyStats) -> None:
        self.counters = counters
        self.peak_reached = asyncio.Event()
        self.wanted_peak = 0

    async def wait(self, seconds: float, until_in_flight: int = 0) -> None:
        c = self.counters
        c.calls += 1
        c.in_flight += 1
        c.peak_in_flight = max(c.peak_in_flight, c.in_flight)
        if until_in_flight > 0:
            self.wanted_peak = until_in_flight
            if c.in_flight >= until_in_flight:
                self.peak_reached.set()
        try:
            if until_in_flight > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.peak_reached.wait(), seconds)
            else:
                await asyncio.sleep(seconds)
        finally:
            c.in_flight -= 1
            if c.in_flight == 0 and self.wanted_peak:
                self.peak_reached.clear()
                self.wanted_peak = 0


def build_server(
    latency_ms: float = 100.0,
    jitter_ms: float = 0.0,
    seed: int = 0,
    *,
    dist: str = "uniform",
    sigma: float = 1.0,
) -> MCPServer:
    """An MCPServer with ``sleep``, ``stats`` and ``reset_stats``.

    Example:
        >>> server = build_server(latency_ms=50)
        >>> server.name
        'latency'
    """
    draw_ms = latency_sampler(latency_ms, jitter_ms, dist=dist, sigma=sigma, seed=seed)
    server = MCPServer("latency", log_level="WARNING")
    counters = LatencyStats()
    gate = InFlightGate(counters)

    @server.tool()
    async def sleep(ms: float | None = None, payload: str = "", until_in_flight: int = 0) -> str:
        """Wait `ms` milliseconds (default: the server's configured latency), then echo the payload.

        With `until_in_flight` > 0 the call returns early, as soon as that many calls have been in
        flight at once: a load-independent way for tests to prove concurrency (a serialising
        client never gets there and every call waits its full `ms`).
        """
        if ms is None:
            ms = draw_ms()
        await gate.wait(max(0.0, ms) / 1000.0, until_in_flight)
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
    parser.add_argument("--latency-dist", choices=LATENCY_DISTRIBUTIONS, default="uniform")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal: std of log latency")
    parser.add_argument("--seed", type=int, default=0, help="seed of the jitter / lognormal draws")
    add_transport_args(parser)
    args = parser.parse_args(argv)
    server = build_server(
        args.latency_ms, args.jitter_ms, args.seed, dist=args.latency_dist, sigma=args.sigma
    )
    run_server(server, args)


if __name__ == "__main__":
    main()
