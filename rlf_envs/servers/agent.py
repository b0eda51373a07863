"""MCP server that exposes another model (or agent) as one tool, e.g. ``ask_expert(question) -> str``.

Each call forwards the tool's text argument as the user message (after an optional system
prompt) to an OpenAI-compatible ``/v1/chat/completions`` endpoint (``rlf-serve``, vLLM, a hosted
API, another agent behind such an endpoint) and returns the reply. Failures come back as tool
errors that say what went wrong (unreachable, timed out, HTTP error, empty reply), so the policy
reads a clear message instead of a generic timeout; the HTTP timeout is per attempt and the
client retries connection errors, timeouts, 429 and 5xx.

Example::

    python -m rlf_envs.servers.agent --base-url http://127.0.0.1:8000/v1 --model qwen3-8b
    python -m rlf_envs.servers.agent --base-url http://127.0.0.1:8000/v1 --model qwen3-8b \\
        --name summarize --arg-name text --system-prompt "Summarize the text in two sentences." \\
        --transport http --port 8790

In an ``mcpServers`` config, :func:`agent_server_config` writes the entry::

    {"mcpServers": {"expert": agent_server_config("http://127.0.0.1:8000/v1", "qwen3-8b")}}
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from rlf_envs.llm_client import ChatCompletionError, ChatErrorKind, OpenAIChatClient
from rlf_envs.servers.launch import add_transport_args, run_server, stdio_server_entry

BACKOFF_S = 0.5  # wait before the first retry; doubles each retry
DEFAULT_TOOL_NAME = "ask_expert"
DEFAULT_ARG_NAME = "question"
DEFAULT_DESCRIPTION = (
    "Ask an expert model a question and get its answer as text. Ask one self-contained question "
    "with all the context the expert needs: it does not see your conversation."
)

_FAILURE_HINTS = {
    ChatErrorKind.UNAVAILABLE: "the model behind this tool is unavailable or too slow right now",
    ChatErrorKind.BAD_RESPONSE: "the model behind this tool rejected the request or answered malformed",
}


def _check_identifier(value: str, what: str) -> None:
    if not value.isidentifier() or value.startswith("_"):
        raise ValueError(f"{what} must be a Python identifier not starting with '_', got {value!r}")


def build_server(
    client: OpenAIChatClient,
    *,
    tool_name: str = DEFAULT_TOOL_NAME,
    arg_name: str = DEFAULT_ARG_NAME,
    description: str = DEFAULT_DESCRIPTION,
    system_prompt: str | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    seed: int | None = None,
) -> MCPServer:
    """An MCP server with one tool ``tool_name(arg_name: str) -> str`` answered by ``client``'s model.

    Example:
        >>> import asyncio
        >>> client = OpenAIChatClient("http://127.0.0.1:8000/v1", "tiny", timeout_s=60)
        >>> server = build_server(client, tool_name="summarize", arg_name="text")
        >>> [(tool.name, tool.input_schema["required"]) for tool in asyncio.run(server.list_tools())]
        [('summarize', ['text'])]
        >>> server.run("stdio")  # serves stdin until it closes  # doctest: +SKIP
    """
    _check_identifier(tool_name, "the tool name")
    _check_identifier(arg_name, "the argument name")
    server = MCPServer(name=f"rlf-agent-{tool_name}", instructions=description, log_level="WARNING")
    extra = {} if seed is None else {"seed": seed}

    async def forward(**arguments: str) -> str:
        text = arguments[arg_name]
        if not text.strip():
            raise ToolError(f"'{arg_name}' is empty: pass the text for the model behind {tool_name}")
        messages = [{"role": "user", "content": text}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        try:
            completion = await client.complete(
                messages, max_tokens=max_tokens, temperature=temperature, **extra
            )
        except ChatCompletionError as exc:
            hint = _FAILURE_HINTS.get(exc.kind, "the model behind this tool failed")
            raise ToolError(f"{tool_name} failed ({exc.kind.value}): {hint}. Details: {exc}") from None
        if not completion.text.strip():
            raise ToolError(
                f"{tool_name} failed (empty_reply): the model returned no text; rephrase and retry"
            )
        return completion.text

    # The MCP SDK reads the tool's input schema from the signature: give `forward` the one we serve.
    forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(arg_name, inspect.Parameter.KEYWORD_ONLY, annotation=str)], return_annotation=str
    )
    forward.__annotations__ = {arg_name: str, "return": str}
    forward.__name__ = tool_name
    server.add_tool(forward, name=tool_name, description=description)
    return server


def agent_server_config(
    base_url: str,
    model: str,
    *,
    name: str = DEFAULT_TOOL_NAME,
    arg_name: str = DEFAULT_ARG_NAME,
    description: str | None = None,
    system_prompt: str | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    seed: int | None = None,
    timeout_s: float = 60.0,
    retries: int = 1,
    max_concurrency: int = 16,
    api_key_env: str | None = None,
) -> dict[str, Any]:
    """An ``mcpServers`` entry that runs this server over stdio with these settings.

    The entry's own ``timeout_s`` (the env's per-call limit) leaves room for every HTTP attempt
    and backoff, so a slow model is reported by this server, with its reason, not cut off by the
    env. ``api_key_env`` names an environment variable holding the API key; its value is copied
    into the entry's ``env`` (stdio servers do not inherit the parent's environment).

    Example:
        >>> entry = agent_server_config("http://127.0.0.1:8000/v1", "tiny", name="summarize", arg_name="text")
        >>> entry["args"][:2], entry["args"][entry["args"].index("--name") + 1]
        (['-m', 'rlf_envs.servers.agent'], 'summarize')
    """
    _check_identifier(name, "the tool name")
    _check_identifier(arg_name, "the argument name")
    args = ["--base-url", base_url, "--model", model, "--name", name,
            "--arg-name", arg_name, "--max-tokens", str(max_tokens), "--temperature", str(temperature),
            "--timeout-s", str(timeout_s), "--retries", str(retries), "--max-concurrency", str(max_concurrency)]  # fmt: skip
    if seed is not None:
        args += ["--seed", str(seed)]
    if description is not None:
        args += ["--description", description]
    if system_prompt is not None:
        args += ["--system-prompt", system_prompt]
    env: dict[str, str] = {}
    if api_key_env is not None:
        args += ["--api-key-env", api_key_env]
        if api_key_env in os.environ:
            env[api_key_env] = os.environ[api_key_env]
    backoff_total = sum(BACKOFF_S * 2**k for k in range(retries))
    return stdio_server_entry(
        "rlf_envs.servers.agent", args, env=env, timeout_s=timeout_s * (retries + 1) + backoff_total + 5.0
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlf_envs.servers.agent", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--base-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1"
    )
    parser.add_argument("--model", required=True, help="model name sent in each request")
    parser.add_argument("--name", default=DEFAULT_TOOL_NAME, help="the tool's name")
    parser.add_argument("--arg-name", default=DEFAULT_ARG_NAME, help="the tool's one string argument")
    parser.add_argument("--description", default=None, help="the tool's description shown to the policy")
    parser.add_argument("--system-prompt", default=None, help="system message sent before the argument")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--seed", type=int, default=None, help="sent with each request (reproducible sampling)"
    )
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per HTTP attempt")
    parser.add_argument("--retries", type=int, default=1, help="after connection errors, timeouts, 429, 5xx")
    parser.add_argument("--max-concurrency", type=int, default=16, help="requests in flight to the model")
    parser.add_argument("--api-key-env", default=None, help="environment variable holding the API key")
    add_transport_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        print(f"agent server: environment variable {args.api_key_env} is not set", file=sys.stderr)
        return 2
    try:
        client = OpenAIChatClient(args.base_url, args.model, max_concurrency=args.max_concurrency,
                                  timeout_s=args.timeout_s, retries=args.retries, backoff_s=BACKOFF_S, api_key=api_key)  # fmt: skip
        server = build_server(
            client,
            tool_name=args.name,
            arg_name=args.arg_name,
            description=args.description or DEFAULT_DESCRIPTION,
            system_prompt=args.system_prompt,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
        )
    except ValueError as exc:
        print(f"agent server: {exc}", file=sys.stderr)
        return 2
    run_server(server, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
