"""MCP's tool types on our side: a listed tool's schema going in, a call's result coming out.

:class:`RemoteTool` is a tool as its server listed it: the model-facing :class:`ToolSpec` and a
compiled check of the arguments against the tool's input schema, so bad arguments fail before they
reach the server. :func:`tool_result_from_mcp` turns an MCP ``CallToolResult`` into a
:class:`ToolResult`, reading the text the model sees with :func:`result_text`.

Example:
    >>> tool = RemoteTool.from_mcp(mcp_types.Tool(name="echo", input_schema={"title": "echoArguments",
    ...     "properties": {"text": {"type": "string", "title": "Text"}}, "required": ["text"]}))
    >>> tool.spec.parameters
    {'properties': {'text': {'type': 'string'}}, 'required': ['text'], 'type': 'object'}
    >>> tool.argument_error({"text": 5})
    "invalid arguments for 'echo': arguments.text: 5 is not of type 'string'"
"""

from __future__ import annotations

import copy
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import mcp_types

from rlf_envs.types import ErrorKind, ToolCall, ToolResult, ToolSpec

__all__ = ["RemoteTool", "result_text", "tool_result_from_mcp"]

logger = logging.getLogger(__name__)

# MCPServer (and FastMCP before it) reports arguments that fail its own validation as an isError
# result reading "Error executing tool <name>: 1 validation error for <name>Arguments ...".
_SERVER_VALIDATION_ERROR = re.compile(r"validation errors? for \S*Arguments\b")


@dataclass(frozen=True)
class RemoteTool:
    """A tool as listed by its server, with a compiled validator for its input schema."""

    spec: ToolSpec
    validator: Any  # a jsonschema Validator, or None when the schema itself is invalid

    @classmethod
    def from_mcp(cls, tool: mcp_types.Tool) -> RemoteTool:
        schema = dict(tool.input_schema or {})
        schema.setdefault("type", "object")
        description = tool.description or tool.title or tool.name
        return cls(
            ToolSpec(tool.name, description, _model_facing_schema(schema)),
            _compile_validator(tool.name, schema),
        )

    def argument_error(self, arguments: Any) -> str | None:
        """Why ``arguments`` fail the input schema, or None when they pass."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        if self.validator is None or self.validator.is_valid(arguments):  # the common case, cheaply
            return None
        from jsonschema.exceptions import best_match

        error = best_match(self.validator.iter_errors(arguments))
        if error is None:
            return None
        where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        return (
            f"invalid arguments for {self.spec.name!r}: "
            + (f"arguments{where}: " if where else "")
            + error.message
        )


def _compile_validator(name: str, schema: dict[str, Any]) -> Any:
    from jsonschema import Draft202012Validator, SchemaError
    from jsonschema.validators import validator_for

    validator_cls = validator_for(schema, default=Draft202012Validator)
    try:
        validator_cls.check_schema(schema)
    except SchemaError as exc:
        logger.warning("tool %r has an invalid input schema (arguments go unchecked): %s", name, exc.message)
        return None
    return validator_cls(schema)


def _model_facing_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema without the auto-generated titles ("Ms", "sleepArguments"): tokens the model need not read."""
    clean = copy.deepcopy(schema)
    clean.pop("title", None)
    for prop in clean.setdefault("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return clean


def tool_result_from_mcp(call: ToolCall, result: mcp_types.CallToolResult, latency_s: float) -> ToolResult:
    """The :class:`ToolResult` of ``call``; an isError result is a tool error, or bad arguments
    where the server's own argument validation rejected the call."""
    text = result_text(result)
    if result.is_error:
        kind = ErrorKind.BAD_ARGUMENTS if _SERVER_VALIDATION_ERROR.search(text) else ErrorKind.TOOL_ERROR
        return ToolResult.failure(
            call, kind, text or "the tool reported an error without a message", latency_s
        )
    return ToolResult(
        call=call, text=text, ok=True, latency_s=latency_s, structured=result.structured_content
    )


def result_text(result: mcp_types.CallToolResult) -> str:
    """What the model reads of an MCP tool result: text blocks joined, other blocks described briefly,
    the structured content as JSON when there is no text. Never truncated (the caller does that).

    Example:
        >>> result_text(mcp_types.CallToolResult(content=[], structured_content={"rows": 2}))
        '{"rows": 2}'
    """
    parts: list[str] = []
    has_text = False
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
            has_text = True
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            kind = "image" if isinstance(block, mcp_types.ImageContent) else "audio"
            parts.append(f"[{kind}: {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(
                f"[resource link: {block.uri}" + (f" ({block.description})]" if block.description else "]")
            )
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(resource.text)
                has_text = True
            else:
                parts.append(f"[resource: {resource.uri}, {resource.mime_type or 'binary'}]")
        else:
            parts.append(f"[{getattr(block, 'type', type(block).__name__)} content]")
    if not has_text and result.structured_content is not None:
        parts.insert(0, json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)
