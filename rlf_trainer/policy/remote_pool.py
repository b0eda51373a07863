"""The inference servers of a remote policy: which one takes the next request, which are down.

:class:`ServerPool` picks the server with the fewest requests in flight among those that are up,
preferring servers that hold the newest weights (one that missed a weight push serves older ones);
a server that fails is taken out for a backoff that doubles with each consecutive failure (1 s,
2 s, ... up to 30 s) and is tried again after it. It also keeps each server's counters for the
trainer's metrics (peak requests in flight, generated tokens per busy second). It does no I/O:
:class:`~rlf_trainer.policy.remote.RemotePolicy` sends the requests and reports back, all on one
event loop, so nothing here needs a lock.

Example:
    >>> pool = ServerPool(["http://a:8000/v1", "http://b:8000"], clock=lambda: 100.0)
    >>> [s.url for s in pool.servers]
    ['http://a:8000', 'http://b:8000']
    >>> first = pool.pick(newest=0); first.begin(); first.url
    'http://a:8000'
    >>> pool.pick(newest=0).url  # a has a request in flight, b has none
    'http://b:8000'
    >>> pool.mark_failed(pool.servers[1], "ConnectionRefusedError", weights_unknown=True)
    >>> pool.pick(newest=0).url, pool.servers[1].version
    ('http://a:8000', None)
    >>> pool.mark_failed(pool.servers[0], "HTTP 503", weights_unknown=False)
    >>> pool.pick(newest=0), pool.next_ready_in()  # both in their backoff: try again in 1 s
    (None, 1.0)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

_BACKOFF_S = 1.0
_MAX_BACKOFF_S = 30.0


def server_root(url: str) -> str:
    """``url`` without a trailing ``/`` or ``/v1``: the server's root, where vLLM's admin routes live.

    Example:
        >>> server_root("http://127.0.0.1:8000/v1/"), server_root("https://h")
        ('http://127.0.0.1:8000', 'https://h')
    """
    root = url.strip().rstrip("/")
    return root.removesuffix("/v1")


@dataclass
class InferenceServer:
    """One server's state as the client sees it.

    ``version``: the weights version it serves (0: the weights it started with; None: unknown,
    after a failure it may have restarted with other weights, so it gets the newest ones again
    before it serves).
    """

    url: str
    index: int
    version: int | None = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    down_until: float = 0.0
    failures: int = 0  # consecutive
    last_error: str = ""
    tokens: int = 0  # generated tokens since the last metrics window
    busy_s: float = 0.0  # seconds with a request in flight since the last metrics window
    busy_since: float | None = None

    def begin(self, now: float = 0.0) -> None:
        if self.in_flight == 0:
            self.busy_since = now
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def end(self, now: float = 0.0, tokens: int = 0) -> None:
        self.in_flight -= 1
        self.tokens += tokens
        if self.in_flight == 0 and self.busy_since is not None:
            self.busy_s += now - self.busy_since
            self.busy_since = None

    def take_window(self, now: float) -> tuple[int, float]:
        """(peak requests in flight, generated tokens per busy second) since the last call; resets."""
        busy = self.busy_s + (now - self.busy_since if self.busy_since is not None else 0.0)
        out = (self.peak_in_flight, self.tokens / busy if busy > 0 else 0.0)
        self.peak_in_flight, self.tokens, self.busy_s = self.in_flight, 0, 0.0
        if self.busy_since is not None:
            self.busy_since = now
        return out


class ServerPool:
    """The servers behind one remote policy; see the module docstring."""

    def __init__(self, urls: list[str], *, clock: Callable[[], float] = time.monotonic) -> None:
        if not urls:
            raise ValueError("a remote policy needs at least one server URL")
        self.servers = [InferenceServer(server_root(url), i) for i, url in enumerate(urls)]
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    def pick(self, newest: int) -> InferenceServer | None:
        """The server for the next request, or None while every server is down.

        Among the servers that are up: those holding version ``newest`` first, then those whose
        version is known, then the rest; the fewest requests in flight within each.
        """
        now = self._clock()
        ready = [s for s in self.servers if s.down_until <= now]
        if not ready:
            return None
        return min(ready, key=lambda s: (s.version != newest, s.version is None, s.in_flight, s.index))

    def next_ready_in(self) -> float:
        """Seconds until the first server that is down may be tried again (0 when one is up)."""
        now = self._clock()
        return max(0.0, min(s.down_until for s in self.servers) - now)

    def mark_failed(self, server: InferenceServer, error: str, *, weights_unknown: bool) -> None:
        """Take ``server`` out for its backoff; ``weights_unknown``: it may come back with other weights."""
        server.failures += 1
        server.last_error = error
        server.down_until = self._clock() + min(_BACKOFF_S * 2 ** (server.failures - 1), _MAX_BACKOFF_S)
        if weights_unknown:
            server.version = None

    def mark_ok(self, server: InferenceServer) -> None:
        server.failures = 0
        server.down_until = 0.0

    def describe_failures(self) -> str:
        """Each server's last error, for an error message."""
        return "; ".join(f"{s.url}: {s.last_error or 'no error'}" for s in self.servers)

    def take_metrics(self) -> dict[str, float]:
        """Per server: peak requests in flight and generated tokens per busy second since the last
        call; and how many servers are up now."""
        now = self._clock()
        out: dict[str, float] = {"remote/servers_up": float(sum(s.down_until <= now for s in self.servers))}
        for server in self.servers:
            peak, tokens_per_s = server.take_window(now)
            out[f"remote/server{server.index}/in_flight_peak"] = float(peak)
            out[f"remote/server{server.index}/tokens_per_s"] = tokens_per_s
        return out


__all__ = ["InferenceServer", "ServerPool", "server_root"]
