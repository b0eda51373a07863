"""Parse and validate the ``mcpServers`` JSON (Claude Desktop / Cursor format) plus our per-server keys.

Accepted input: a dict (with or without the outer ``"mcpServers"`` key), a JSON string, or a path to
a ``.json`` file. Each server is either a stdio command, a streamable-HTTP URL, or several URLs of
the same server (its replicas on other hosts; the pool balances the calls and fails over)::

    {"mcpServers": {
        "search": {"command": "python", "args": ["-m", "rlf_envs.tasks.deepsearch.server"], "env": {"K": "v"},
                   "cwd": "/srv", "replicas": 2, "max_concurrency": 64, "timeout_s": 10, "cache": true},
        "remote": {"url": "http://127.0.0.1:8765/mcp", "headers": {"Authorization": "Bearer x"}},
        "farm": {"urls": ["http://10.0.0.1:8765/mcp", "http://10.0.0.2:8765/mcp"]}}}

Our optional keys: ``timeout_s`` (per call), ``max_concurrency`` (in-flight calls per replica),
``replicas`` (processes, or HTTP sessions per URL), ``cache`` (true, or the LRU's max entry count),
``start_timeout_s`` (spawn + initialize + list tools). ``"disabled": true`` skips a server, as in
Cursor. Anything wrong raises :class:`MCPConfigError` naming the server and the key.

Example:
    >>> [s.transport for s in load_mcp_config({"a": {"command": "python"}, "b": {"url": "http://h/mcp"}})]
    ['stdio', 'http']
    >>> try:
    ...     load_mcp_config({"a": {"args": []}})
    ... except MCPConfigError as exc:
    ...     print(exc)
    server 'a': needs "command" (stdio) or "url" (streamable HTTP)
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

DEFAULT_CACHE_SIZE = 1024
DEFAULT_START_TIMEOUT_S = 60.0

# Keys other clients put in the same file; accepted silently so one config serves every client.
_FOREIGN_KEYS = frozenset({"description", "autoApprove", "alwaysAllow", "disabledTools", "timeout", "trust"})
_HTTP_TYPES = frozenset({"http", "streamable-http", "streamable_http", "streamableHttp"})
_KNOWN_KEYS = frozenset(
    {
        *("command", "args", "env", "cwd", "url", "urls", "headers", "type", "transport", "disabled"),
        *("timeout_s", "max_concurrency", "replicas", "cache", "start_timeout_s"),
    }
)


class MCPConfigError(ValueError):
    """The MCP server configuration is malformed (missing command/url, bad types, duplicate tools...)."""


@dataclass(frozen=True)
class MCPServerConfig:
    """One validated server entry: a ``command`` (stdio) or ``urls`` (streamable HTTP, one or more).

    ``url`` is the endpoint one connection uses: the first of ``urls`` here, and each replica's own
    URL in the copies the pool makes per URL.
    """

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    urls: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float | None = None  # None: the pool's default
    max_concurrency: int | None = None  # None: unlimited
    replicas: int = 1
    cache_size: int = 0  # 0: no cache
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


def load_mcp_config(config: Mapping[str, Any] | str | os.PathLike[str]) -> list[MCPServerConfig]:
    """Validated server entries, in config order, from a dict, a JSON string or a JSON file path.

    Raises:
        MCPConfigError: unreadable file, invalid JSON, or any invalid server entry.
    """
    raw = _read(config)
    servers = raw.get("mcpServers", raw)
    if not isinstance(servers, Mapping):
        raise MCPConfigError(f'"mcpServers" must be an object mapping names to servers, got {_kind(servers)}')
    parsed = []
    for name, entry in servers.items():
        if not isinstance(name, str) or not name:
            raise MCPConfigError(f"server names must be non-empty strings, got {name!r}")
        if isinstance(entry, Mapping) and entry.get("disabled") is True:
            continue
        parsed.append(parse_server_config(name, entry))
    return parsed


def parse_server_config(name: str, entry: Any) -> MCPServerConfig:
    """Validate one ``mcpServers`` entry.

    Example:
        >>> parse_server_config("s", {"command": "python", "args": ["-V"], "replicas": 2}).replicas
        2
        >>> parse_server_config("s", {"urls": ["http://a:8000/mcp", "http://b:8000/mcp"]}).urls
        ('http://a:8000/mcp', 'http://b:8000/mcp')
    """

    def fail(message: str) -> MCPConfigError:
        return MCPConfigError(f"server {name!r}: {message}")

    if not isinstance(entry, Mapping):
        raise fail(f"must be an object, got {_kind(entry)}")
    unknown = sorted(set(entry) - _KNOWN_KEYS - _FOREIGN_KEYS)
    if unknown:
        logger.warning("MCP server %r: ignoring unknown config keys %s", name, unknown)
    command, urls = _endpoint(entry, fail)
    args = entry.get("args", [])
    if not isinstance(args, list | tuple) or not all(isinstance(a, str) for a in args):
        raise fail(f'"args" must be a list of strings, got {args!r}')
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise fail(f'"cwd" must be a string, got {cwd!r}')
    return MCPServerConfig(
        name=name,
        command=command,
        args=tuple(args),
        env=_string_map(entry.get("env", {}), '"env"', fail),
        cwd=cwd,
        url=urls[0] if urls else None,
        urls=urls,
        headers=_string_map(entry.get("headers", {}), '"headers"', fail),
        timeout_s=_positive_number(entry.get("timeout_s"), '"timeout_s"', fail),
        max_concurrency=_positive_int(entry.get("max_concurrency"), '"max_concurrency"', fail),
        replicas=_positive_int(entry.get("replicas"), '"replicas"', fail) or 1,
        cache_size=_cache_size(entry.get("cache"), fail),
        start_timeout_s=_positive_number(entry.get("start_timeout_s"), '"start_timeout_s"', fail)
        or DEFAULT_START_TIMEOUT_S,
    )


def _endpoint(entry: Mapping[str, Any], fail: Any) -> tuple[str | None, tuple[str, ...]]:
    """The entry's stdio ``command`` or its HTTP URLs (``url``, or the replicas' ``urls``), checked."""
    command, url, urls = entry.get("command"), entry.get("url"), entry.get("urls")
    if url is not None and urls is not None:
        raise fail('give either "url" (one endpoint) or "urls" (replicas on several hosts), not both')
    http_key = "urls" if urls is not None else "url"
    has_http = url is not None or urls is not None
    if command is not None and has_http:
        raise fail(f'give either "command" (stdio) or "{http_key}" (streamable HTTP), not both')
    if command is None and not has_http:
        raise fail('needs "command" (stdio) or "url" (streamable HTTP)')
    _check_declared_type(entry.get("type", entry.get("transport")), command is not None, fail)
    if command is not None:
        if not isinstance(command, str) or not command.strip():
            raise fail(f'"command" must be a non-empty string, got {command!r}')
        _reject_keys(entry, ("headers",), "HTTP servers", fail)
        return command, ()
    _reject_keys(entry, ("args", "env", "cwd"), "stdio (command) servers", fail)
    if urls is None:
        return None, (_http_url(url, '"url"', fail),)
    if not isinstance(urls, list | tuple) or not urls:
        raise fail(f'"urls" must be a non-empty list of http(s) URL strings, got {urls!r}')
    checked = tuple(_http_url(u, f'"urls"[{i}]', fail) for i, u in enumerate(urls))
    if len(set(checked)) < len(checked):
        raise fail('"urls" lists a URL twice; use "replicas" for several sessions per URL')
    return None, checked


def _check_declared_type(declared: Any, is_stdio: bool, fail: Any) -> None:
    if declared is None:
        return
    if declared == "sse":
        raise fail('the legacy SSE transport is not supported; serve streamable HTTP ("url" ending in /mcp)')
    if declared != "stdio" and declared not in _HTTP_TYPES:
        raise fail(f'"type" must be "stdio" or "http", got {declared!r}')
    if (declared == "stdio") != is_stdio:
        raise fail(f'"type" is {declared!r} but the entry gives {"a command" if is_stdio else "a url"}')


def _reject_keys(entry: Mapping[str, Any], keys: tuple[str, ...], owners: str, fail: Any) -> None:
    for key in keys:
        if key in entry:
            raise fail(f'"{key}" applies to {owners} only')


def _http_url(value: Any, what: str, fail: Any) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise fail(f"{what} must be an http(s) URL string, got {value!r}")
    return value


def _read(config: Mapping[str, Any] | str | os.PathLike[str]) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    if isinstance(config, str) and config.lstrip().startswith("{"):
        text, source = config, "the config string"
    elif isinstance(config, str | os.PathLike):
        path = Path(config)
        try:
            text, source = path.read_text(encoding="utf-8"), str(path)
        except OSError as exc:
            raise MCPConfigError(f"cannot read MCP config file {str(path)!r}: {exc.strerror or exc}") from exc
    else:
        raise MCPConfigError(f"MCP config must be a dict, a JSON string or a path, got {_kind(config)}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MCPConfigError(f"{source} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise MCPConfigError(f"{source} must hold a JSON object, got {_kind(data)}")
    return data


def _string_map(value: Any, what: str, fail: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise fail(f"{what} must be an object of string values, got {value!r}")
    return dict(value)


def _positive_number(value: Any, what: str, fail: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise fail(f"{what} must be a number > 0, got {value!r}")
    return float(value)


def _positive_int(value: Any, what: str, fail: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(f"{what} must be an integer >= 1, got {value!r}")
    return value


def _cache_size(value: Any, fail: Any) -> int:
    if value is None or value is False:
        return 0
    if value is True:
        return DEFAULT_CACHE_SIZE
    if isinstance(value, int) and value >= 1:
        return value
    raise fail(f'"cache" must be true, false or a max entry count >= 1, got {value!r}')


def _kind(value: Any) -> str:
    return type(value).__name__
