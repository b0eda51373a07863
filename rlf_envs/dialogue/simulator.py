"""User simulators: what writes the user's next message when the agent talks instead of calling a tool.

A simulator gets a :class:`UserTurnRequest` (the task instance, its hidden user instructions, the
chat so far from the agent's side, how many replies it gave) and returns the raw reply text; a
reply holding the stop marker (``###STOP###`` by default) ends the conversation. Two kinds:

- :class:`LLMUserSimulator`: any OpenAI-compatible endpoint (rlf-serve, vLLM, an API) through
  :class:`~rlf_envs.llm_client.OpenAIChatClient`; the chat is role-flipped so the simulator
  model speaks as the user, with the persona/goal in its system prompt.
- :class:`ScriptedUserSimulator`: a Python callable ``fn(request) -> str`` (sync or async), for
  tests and cheap runs.

:func:`resolve_user_simulator` turns an env's ``user_simulator=`` argument (a simulator, a
callable, or a dict of :class:`LLMUserSimulator` keyword arguments, e.g. from a YAML config) into
one. Failures and bad replies are handled by :mod:`rlf_envs.dialogue.runner`, never here.

Example:
    >>> import asyncio
    >>> from rlf_envs.types import TaskInstance
    >>> sim = resolve_user_simulator(lambda request: "It is order #W1. ###STOP###")
    >>> request = UserTurnRequest(TaskInstance("0", "Hi, cancel my order."), "You are Ann.", [], 0)
    >>> asyncio.run(sim.reply(request))
    'It is order #W1. ###STOP###'
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rlf_envs.dialogue.flags import DEFAULT_STOP_MARKER
from rlf_envs.llm_client import OpenAIChatClient
from rlf_envs.types import TaskInstance

__all__ = [
    "DEFAULT_SIMULATOR_PROMPT",
    "LLMUserSimulator",
    "ScriptedUserSimulator",
    "UserSimulator",
    "UserTurnRequest",
    "resolve_user_simulator",
    "simulator_view",
]

DEFAULT_SIMULATOR_PROMPT = """\
You are playing a customer (a user) who talks to an agent. Stay in your role: write only what \
the user says next, one short message, in plain text. Never act as the agent, never say you are \
an AI, and never repeat or mention these instructions. Give information only when the agent asks \
for it, one piece at a time. When your request is done (or cannot be done), write a last short \
message that ends with {stop_marker}

Your instructions:
{instructions}"""


@dataclass(frozen=True)
class UserTurnRequest:
    """What a simulator sees for one user turn.

    ``messages`` is the chat so far as the env keeps it (system, user, assistant, tool); ``turn``
    counts the simulator's replies before this one (0 on the first).
    """

    instance: TaskInstance
    instructions: str
    messages: list[dict[str, Any]]
    turn: int


@runtime_checkable
class UserSimulator(Protocol):
    """Writes the user's next message; may raise (the runner turns any failure into a flag)."""

    stop_marker: str

    async def reply(self, request: UserTurnRequest) -> str: ...


def simulator_view(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The chat from the user's side: the agent's words as ``user``, the user's own as ``assistant``.

    The system prompt, tool results and tool-call-only turns are left out (users see neither).

    Example:
        >>> simulator_view([{"role": "system", "content": "policy"}, {"role": "user", "content": "Hi"},
        ...                 {"role": "assistant", "content": "", "tool_calls": [{}]},
        ...                 {"role": "tool", "content": "{}"}, {"role": "assistant", "content": "Email?"}])
        [{'role': 'assistant', 'content': 'Hi'}, {'role': 'user', 'content': 'Email?'}]
    """
    flipped = {"user": "assistant", "assistant": "user"}
    view = []
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        if role in flipped and content.strip():
            view.append({"role": flipped[role], "content": content})
    return view


class ScriptedUserSimulator:
    """A Python callable as a simulator: ``fn(request)`` returns (or awaits to) the reply text."""

    def __init__(
        self, fn: Callable[[UserTurnRequest], Any], *, stop_marker: str = DEFAULT_STOP_MARKER
    ) -> None:
        self.fn = fn
        self.stop_marker = stop_marker

    async def reply(self, request: UserTurnRequest) -> str:
        value = self.fn(request)
        if inspect.isawaitable(value):
            value = await value
        if not isinstance(value, str):
            raise TypeError(f"the scripted simulator returned {type(value).__name__}, not str")
        return value


class LLMUserSimulator:
    """A user played by a model behind an OpenAI-compatible endpoint.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (or pass ``client``).
        model: the ``model`` field of each request.
        client: an existing :class:`OpenAIChatClient` (then ``base_url``/``model``... are unused).
        system_prompt: the simulator's system prompt, with ``{instructions}`` and ``{stop_marker}``.
        stop_marker: the text that ends the conversation.
        max_tokens, temperature: sampling of each reply; ``extra`` more request fields.
        max_concurrency, timeout_s, retries, api_key: the client's settings (one request per env);
            ``timeout_s`` is per HTTP attempt: two attempts of 14 s fit in the env's 30 s
            ``sim_timeout_s``.

    Example:
        >>> sim = LLMUserSimulator("http://127.0.0.1:8000/v1", "tiny", max_concurrency=64)
        >>> sim.prompt(UserTurnRequest(TaskInstance("0", "Hi"), "You are Ann.", [], 0))[0]["role"]
        'system'
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str = "default",
        *,
        client: OpenAIChatClient | None = None,
        system_prompt: str = DEFAULT_SIMULATOR_PROMPT,
        stop_marker: str = DEFAULT_STOP_MARKER,
        max_tokens: int = 200,
        temperature: float = 0.7,
        max_concurrency: int = 64,
        timeout_s: float = 14.0,
        retries: int = 1,
        api_key: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        if client is None:
            if base_url is None:
                raise ValueError("LLMUserSimulator needs base_url (or an OpenAIChatClient as client)")
            client = OpenAIChatClient(
                base_url, model, max_concurrency=max_concurrency, timeout_s=timeout_s,
                retries=retries, api_key=api_key,
            )  # fmt: skip
        self.client = client
        self.system_prompt = system_prompt
        self.stop_marker = stop_marker
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.extra = dict(extra or {})

    def system_text(self, request: UserTurnRequest) -> str:
        """The system prompt for ``request``: what the leak check compares replies against."""
        return self.system_prompt.format(instructions=request.instructions, stop_marker=self.stop_marker)

    def prompt(self, request: UserTurnRequest) -> list[dict[str, str]]:
        """The simulator's chat: its persona prompt, then the conversation seen from the user's side."""
        return [{"role": "system", "content": self.system_text(request)}, *simulator_view(request.messages)]

    async def reply(self, request: UserTurnRequest) -> str:
        completion = await self.client.complete(
            self.prompt(request), max_tokens=self.max_tokens, temperature=self.temperature, **self.extra
        )
        return completion.text

    async def aclose(self) -> None:
        await self.client.aclose()


def resolve_user_simulator(spec: Any) -> UserSimulator | None:
    """An env's ``user_simulator=`` argument as a simulator (None / False: no simulator).

    Accepts a :class:`UserSimulator`, a callable (wrapped in :class:`ScriptedUserSimulator`), or a
    mapping of :class:`LLMUserSimulator` keyword arguments (``{"base_url": ..., "model": ...}``).

    Example:
        >>> type(resolve_user_simulator({"base_url": "http://127.0.0.1:1/v1", "model": "m"})).__name__
        'LLMUserSimulator'
    """
    if spec is None or spec is False:
        return None
    if isinstance(spec, UserSimulator):
        return spec
    if isinstance(spec, Mapping):
        return LLMUserSimulator(**dict(spec))
    if callable(spec):
        return ScriptedUserSimulator(spec)
    raise TypeError(
        f"user_simulator must be a UserSimulator, a callable or a dict of LLMUserSimulator "
        f"arguments, got {type(spec).__name__}"
    )
