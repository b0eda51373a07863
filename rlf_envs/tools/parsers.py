"""Tool-call parsers: turn one assistant turn into tool calls, parse failures and prose.

The default is the Hermes / Qwen2.5 / Qwen3 format, several calls per turn allowed::

    <tool_call>
    {"name": "search", "arguments": {"query": "Velmora Works founder"}}
    </tool_call>

A parser never raises: text that looks like a call but is not one becomes a :class:`ParseFailure`
with a specific :class:`ErrorKind`, which the env turns into an error observation.

Example:
    >>> turn = get_parser("hermes").parse('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    >>> turn.calls[0].name, turn.calls[0].arguments, turn.failures
    ('f', {'x': 1}, [])
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlf_envs.types import ErrorKind, ToolCall


@dataclass(frozen=True)
class ParseFailure:
    """A tool-call block that could not be turned into a call."""

    kind: ErrorKind
    message: str
    raw: str


@dataclass
class ParsedTurn:
    """The calls, failures (in order of appearance) and remaining prose of one assistant turn."""

    calls: list[ToolCall] = field(default_factory=list)
    failures: list[ParseFailure] = field(default_factory=list)
    content: str = ""

    @property
    def attempted(self) -> bool:
        """Whether the turn tried to call any tool, successfully or not."""
        return bool(self.calls or self.failures)


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedTurn: ...


def call_from_json(payload: Any, raw: str) -> ToolCall | ParseFailure:
    """Validate a decoded ``{"name": ..., "arguments": {...}}`` object (OpenAI-style JSON-string arguments accepted)."""
    if not isinstance(payload, dict):
        return ParseFailure(
            ErrorKind.BAD_FORMAT, "a tool call must be a JSON object with 'name' and 'arguments'", raw
        )
    if isinstance(payload.get("function"), dict):  # {"type": "function", "function": {...}}
        payload = payload["function"]
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        return ParseFailure(ErrorKind.BAD_FORMAT, "the tool call has no string 'name'", raw)
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ParseFailure(ErrorKind.BAD_JSON, f"'arguments' is a string but not valid JSON: {exc}", raw)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ParseFailure(ErrorKind.BAD_FORMAT, "'arguments' must be a JSON object", raw)
    return ToolCall(name=name.strip(), arguments=arguments)


class TagJSONParser:
    """Calls are JSON objects between an open and a close tag (Hermes/Qwen by default).

    A final block whose close tag is missing (generation stopped at the close tag, as with a
    stop string) is still parsed.
    """

    def __init__(self, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>") -> None:
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._block = re.compile(
            re.escape(open_tag) + r"(.*?)(?:" + re.escape(close_tag) + r"|\Z)", re.DOTALL
        )

    def parse(self, text: str) -> ParsedTurn:
        turn = ParsedTurn()
        prose: list[str] = []
        cursor = 0
        for match in self._block.finditer(text):
            prose.append(text[cursor : match.start()])
            cursor = match.end()
            raw = match.group(1).strip()
            result = self._parse_block(raw)
            if isinstance(result, ToolCall):
                turn.calls.append(result)
            else:
                turn.failures.append(result)
                prose.append(match.group(0))
        prose.append(text[cursor:])
        turn.content = "".join(prose).strip()
        return turn

    def _parse_block(self, raw: str) -> ToolCall | ParseFailure:
        if not raw:
            return ParseFailure(ErrorKind.BAD_JSON, f"empty {self.open_tag} block", raw)
        try:
            payload = json.loads(_strip_code_fence(raw))
        except json.JSONDecodeError as exc:
            return ParseFailure(
                ErrorKind.BAD_JSON, f"tool call is not valid JSON: {exc.msg} at char {exc.pos}", raw
            )
        except RecursionError:
            return ParseFailure(ErrorKind.BAD_JSON, "tool call JSON is nested too deeply", raw)
        return call_from_json(payload, raw)


def _strip_code_fence(raw: str) -> str:
    if raw.startswith("```"):
        raw = raw.strip("`")
        if raw.startswith("json"):
            raw = raw[4:]
    return raw.strip()


_PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": TagJSONParser,
    "qwen": TagJSONParser,
    "qwen3": TagJSONParser,
}


def register_parser(name: str, factory: Callable[[], ToolCallParser]) -> None:
    """Make a parser available by name (``parser="name"`` in every env)."""
    _PARSERS[name] = factory


def get_parser(parser: str | ToolCallParser | None = None) -> ToolCallParser:
    """A parser by name, or the object itself if it already is one; default "hermes"."""
    if parser is None:
        parser = "hermes"
    if isinstance(parser, str):
        try:
            return _PARSERS[parser]()
        except KeyError:
            raise ValueError(f"unknown tool-call parser {parser!r}; known: {sorted(_PARSERS)}") from None
    if not callable(getattr(parser, "parse", None)):
        raise TypeError(f"a parser needs a parse(text) -> ParsedTurn method, got {type(parser).__name__}")
    return parser
