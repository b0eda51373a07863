"""Plain Python functions (sync or async, typed) as tools, with the same contract as MCP tools.

The schema comes from the signature's type hints (through pydantic) and the docstring: its first
paragraph is the description and Google-style ``Args:`` lines describe parameters. Sync functions
run in a worker thread so a slow one never blocks the env's event loop.

Example:
    >>> import asyncio
    >>> def add(a: int, b: int = 1) -> int:
    ...     '''Add two integers.
    ...
    ...     Args:
    ...         a: the first term
    ...         b: the second term
    ...     '''
    ...     return a + b
    >>> tools = FunctionTools([add])
    >>> tools.specs()[0].parameters["required"]
    ['a']
    >>> asyncio.run(tools.call(ToolCall("add", {"a": 2}))).text
    '3'
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import pydantic

from rlf_envs.types import ErrorKind, ToolCall, ToolResult, ToolSpec

_ARG_LINE = re.compile(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.+)$")


class FunctionTool:
    """One function exposed as a tool."""

    def __init__(
        self, fn: Callable[..., Any], *, name: str | None = None, timeout_s: float | None = None
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.timeout_s = timeout_s
        self.is_async = inspect.iscoroutinefunction(fn)
        description, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
        self._model = _arguments_model(fn, self.name)
        schema = self._model.model_json_schema()
        schema.pop("title", None)
        for prop_name, prop in schema.get("properties", {}).items():
            prop.pop("title", None)
            if prop_name in arg_docs:
                prop["description"] = arg_docs[prop_name]
        schema.setdefault("properties", {})
        self.spec = ToolSpec(name=self.name, description=description or self.name, parameters=schema)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check and coerce arguments; raises ``pydantic.ValidationError``."""
        model = self._model.model_validate(arguments)
        return {key: getattr(model, key) for key in type(model).model_fields}

    async def invoke(self, arguments: dict[str, Any]) -> Any:
        if self.is_async:
            return await self.fn(**arguments)
        return await asyncio.to_thread(self.fn, **arguments)


def _arguments_model(fn: Callable[..., Any], name: str) -> type[pydantic.BaseModel]:
    signature = inspect.signature(fn)
    hints = _type_hints(fn)
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args/**kwargs cannot be described as a tool schema")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    return pydantic.create_model(f"{name}_arguments", __config__=config, **fields)


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        import typing

        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to Any
        return {}


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    description = doc.split("\n\n", 1)[0].strip()
    arg_docs: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            match = _ARG_LINE.match(line)
            if match:
                arg_docs[match.group(1)] = match.group(2).strip()
            elif line.strip() and not line.startswith(" "):
                in_args = False
    return description, arg_docs


def result_text(value: Any) -> tuple[str, Any]:
    """What the model reads for a python return value, and its structured form if any."""
    if isinstance(value, str):
        return value, None
    try:
        return json.dumps(value, ensure_ascii=False, default=str), value
    except (TypeError, ValueError):
        return str(value), None


class FunctionTools:
    """A :class:`~rlf_envs.types.ToolProvider` over python functions."""

    def __init__(
        self, functions: Sequence[Callable[..., Any] | FunctionTool], *, tool_timeout_s: float = 30.0
    ) -> None:
        self.tool_timeout_s = tool_timeout_s
        self._tools: dict[str, FunctionTool] = {}
        for fn in functions:
            tool = fn if isinstance(fn, FunctionTool) else FunctionTool(fn)
            if tool.name in self._tools:
                raise ValueError(f"two python tools are named {tool.name!r}")
            self._tools[tool.name] = tool

    async def start(self) -> None:
        return None

    def specs(self) -> list[ToolSpec]:
        return [tool.spec for tool in self._tools.values()]

    def has_tool(self, name: str) -> bool:
        return name in self._tools

    async def call(self, call: ToolCall) -> ToolResult:
        tool = self._tools.get(call.name)
        if tool is None:
            return ToolResult.failure(call, ErrorKind.UNKNOWN_TOOL, f"no tool named {call.name!r}")
        try:
            arguments = tool.validate(call.arguments)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            return ToolResult.failure(
                call, ErrorKind.BAD_ARGUMENTS, f"invalid arguments for {call.name}: {problems}"
            )
        timeout = tool.timeout_s if tool.timeout_s is not None else self.tool_timeout_s
        started = time.perf_counter()
        try:
            value = await asyncio.wait_for(tool.invoke(arguments), timeout)
        except TimeoutError:
            return ToolResult.failure(
                call,
                ErrorKind.TIMEOUT,
                f"{call.name} took longer than {timeout:g}s",
                time.perf_counter() - started,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the tool's own failure is the model's observation
            return ToolResult.failure(
                call, ErrorKind.TOOL_ERROR, f"{type(exc).__name__}: {exc}", time.perf_counter() - started
            )
        text, structured = result_text(value)
        return ToolResult(
            call=call, text=text, ok=True, latency_s=time.perf_counter() - started, structured=structured
        )

    async def aclose(self) -> None:
        return None
