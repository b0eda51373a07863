"""Chat-template helpers: prompt token ids, and the token delta a tool turn adds.

The trainer builds each episode's token sequence as
``prompt_ids + generated_1 + delta_1 + generated_2 + delta_2 + ...`` where every ``generated_k`` is
the policy's own token ids (never retokenized) and every ``delta_k`` is what the chat template adds
for the tool results plus the next assistant header. :func:`tool_delta_ids` computes that delta by
rendering the chat with and without the tool messages and checks that the result tokenizes the same
way as the full rendering, so the sequence equals the chat template's own rendering of the chat.

Templates without tool support (e.g. SmolLM2's plain ChatML) still work: the tools are described
in the system message in the Hermes/Qwen style (:func:`render_tools_hermes`), assistant tool calls
become ``<tool_call>`` blocks and tool results a user turn of ``<tool_response>`` blocks.

Example (``tok``: the tiny Qwen3's tokenizer, ChatML with Hermes tool tags): the policy's sampled
ids plus the tool delta are exactly the ids of the whole chat rendered by the template.

    >>> chat = [{"role": "user", "content": "What is 6*7?"}]
    >>> ids = prompt_ids(tok, chat)
    >>> call = {"role": "assistant", "content": '<tool_call>\\n{"name": "calc", "arguments": {"expr": "6*7"}}\\n</tool_call>'}
    >>> generated = tok.encode(call["content"] + "<|im_end|>", add_special_tokens=False)  # as sampled
    >>> result = [{"role": "tool", "content": "42"}]
    >>> delta = tool_delta_ids(tok, chat + [call], result)
    >>> ids + generated + delta == prompt_ids(tok, chat + [call] + result)
    True
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Message = dict[str, Any]

_PROBE_TOOL_NAME = "rlf_probe_tool_q8z"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": _PROBE_TOOL_NAME,
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}


class TemplateNotPrefixStableError(ValueError):
    """Rendering a chat and then the same chat with more messages changed the earlier text or tokens.

    The trainer cannot then extend a token sequence turn by turn; use a template that renders
    earlier turns identically whatever follows (ChatML-style templates do).
    """


def render_tools_hermes(tools: list[dict[str, Any]]) -> str:
    """A system-prompt block that describes ``tools`` (OpenAI function format) in the Hermes/Qwen style.

    For models whose chat template has no tool support. The model is asked to answer with
    ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks, the format the env's default
    parser reads.

    Example:
        >>> print(render_tools_hermes([{"type": "function", "function": {"name": "search"}}]))
        # Tools
        <BLANKLINE>
        You can call the functions below. Their signatures, one JSON object a line:
        <tools>
        {"type": "function", "function": {"name": "search"}}
        </tools>
        <BLANKLINE>
        To call a function, answer with one block per call:
        <tool_call>
        {"name": <function-name>, "arguments": <arguments-as-json-object>}
        </tool_call>
    """
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou can call the functions below. Their signatures, one JSON object a line:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "To call a function, answer with one block per call:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <arguments-as-json-object>}\n</tool_call>'
    )


def template_supports_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template renders the ``tools`` it is given (probed with a dummy tool)."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}],
            tools=[_PROBE_TOOL],
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception:  # a template may raise on arguments it does not expect: then it has no tool support
        return False
    return _PROBE_TOOL_NAME in text


def plain_messages(messages: list[Message], tools: list[dict[str, Any]] | None) -> list[Message]:
    """``messages`` rewritten for a template without tool support.

    The tools block joins the system message (a system message is added if there is none),
    assistant ``tool_calls`` become ``<tool_call>`` blocks after the content, and each run of
    consecutive ``tool`` messages becomes one user message of ``<tool_response>`` blocks.
    """
    out: list[Message] = []
    if tools:
        block = render_tools_hermes(tools)
        if messages and messages[0]["role"] == "system":
            out.append({"role": "system", "content": f"{messages[0]['content']}\n\n{block}"})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": block})
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls"):
            out.append({"role": "assistant", "content": assistant_text(message)})
        elif message["role"] == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_turn": True})
        else:
            out.append({"role": message["role"], "content": message.get("content") or ""})
    return [{k: v for k, v in m.items() if k != "_tool_turn"} for m in out]


def assistant_text(message: Message) -> str:
    """An assistant message as the text a model writes: its content, then a ``<tool_call>`` block per call.

    The env stores a turn as ``content`` (the prose) plus parsed ``tool_calls``; this is the
    canonical text of that turn, the one the SFT stage trains on (:mod:`rlf_trainer.algorithms.sft_data`).

    Example:
        >>> print(assistant_text({"role": "assistant", "content": "Let me look.",
        ...     "tool_calls": [{"function": {"name": "search", "arguments": {"query": "x"}}}]}))
        Let me look.
        <tool_call>
        {"name": "search", "arguments": {"query": "x"}}
        </tool_call>
    """
    content = message.get("content") or ""
    if not message.get("tool_calls"):
        return content
    calls = "\n".join(_tool_call_block(call) for call in message["tool_calls"])
    return f"{content}\n{calls}" if content else calls


def _tool_call_block(call: dict[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):  # else keep the model's own (invalid) text
            arguments = json.loads(arguments)
    payload = {"name": function.get("name"), "arguments": arguments}
    return f"<tool_call>\n{json.dumps(payload, ensure_ascii=False)}\n</tool_call>"


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool,
) -> str:
    """The chat template's text for ``messages``.

    A template with tool support gets the messages and ``tools`` as they are; any other template
    gets :func:`plain_messages` (tools in the system message, calls and results as text).
    """
    if template_supports_tools(tokenizer):
        extra = {"tools": tools} if tools else {}
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )
    return tokenizer.apply_chat_template(
        plain_messages(messages, tools), tokenize=False, add_generation_prompt=add_generation_prompt
    )


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of rendered chat text; no BOS/EOS added (the template writes any it wants)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """Token ids of ``messages`` followed by the assistant generation prompt.

    ``tools`` (OpenAI function format, e.g. the env's ``info["tools"]``) go to the template when it
    supports them, otherwise into the system message (:func:`render_tools_hermes`).

    Example:
        >>> ids = prompt_ids(tok, [{"role": "user", "content": "hi"}])
        >>> tok.decode(ids)
        '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
    """
    return encode(tokenizer, render(tokenizer, messages, tools, add_generation_prompt=True))


def default_end_of_turn(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The token that ends an assistant turn: ChatML's ``<|im_end|>`` when the vocabulary has it
    (base Qwen3 checkpoints set ``eos_token`` to ``<|endoftext|>``), else ``eos_token``."""
    if "<|im_end|>" in tokenizer.get_vocab():
        return "<|im_end|>"
    return tokenizer.eos_token


def tool_delta_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages_before: list[Message],
    tool_messages: list[Message],
    tools: list[dict[str, Any]] | None = None,
    *,
    end_of_turn: str | None = None,
    include_end_of_turn: bool = False,
) -> list[int]:
    """Token ids the template adds after an assistant turn for ``tool_messages`` and the next generation prompt.

    ``messages_before`` ends with the assistant turn the policy generated, which ended with the
    end-of-turn token (``end_of_turn``, default :func:`default_end_of_turn`).
    The delta starts right after that token: it includes whatever the template writes after the end
    of turn (e.g. ChatML's ``"\\n"``), the tool results, and the next assistant header, so that
    ``prompt + generated + delta`` is the template's rendering of
    ``messages_before + tool_messages`` with a generation prompt.
    ``include_end_of_turn=True`` starts the delta with the end-of-turn token itself, for a turn cut
    at ``max_new_tokens`` that never produced it.

    Raises :class:`TemplateNotPrefixStableError` when the longer chat does not render (or tokenize)
    as an extension of the shorter one.

    Example:
        >>> before = [{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": "<tool_call>...</tool_call>"}]
        >>> delta = tool_delta_ids(tok, before, [{"role": "tool", "content": "42"}])
        >>> tok.decode(delta)
        '\\n<|im_start|>user\\n<tool_response>\\n42\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n'
    """
    if not messages_before or messages_before[-1]["role"] != "assistant":
        raise ValueError("messages_before must end with the assistant turn the tool messages answer")
    if not tool_messages:
        raise ValueError("tool_messages is empty: there is no delta to add")
    end_of_turn = end_of_turn or default_end_of_turn(tokenizer)
    if not end_of_turn:
        raise ValueError(
            "the tokenizer has no eos_token: pass end_of_turn (the token that ends an assistant turn)"
        )

    base = render(tokenizer, messages_before, tools, add_generation_prompt=False)
    full = render(tokenizer, list(messages_before) + list(tool_messages), tools, add_generation_prompt=True)
    if not full.startswith(base):
        at = next((i for i, (a, b) in enumerate(zip(base, full, strict=False)) if a != b), len(base))
        raise TemplateNotPrefixStableError(
            f"adding tool messages changed the earlier rendering at character {at}: "
            f"{base[max(0, at - 40) : at + 40]!r} became {full[max(0, at - 40) : at + 40]!r}"
        )
    turn_end = base.rfind(end_of_turn)
    if turn_end < 0:
        raise TemplateNotPrefixStableError(f"the rendered chat has no end-of-turn marker {end_of_turn!r}")
    cut = turn_end if include_end_of_turn else turn_end + len(end_of_turn)
    delta = encode(tokenizer, full[cut:])
    # The trainer concatenates ids, so the delta must tokenize exactly as it does inside the full text.
    if encode(tokenizer, full[:cut]) + delta != encode(tokenizer, full):
        raise TemplateNotPrefixStableError(
            f"the text after {end_of_turn!r} tokenizes differently on its own than inside the full chat"
        )
    return delta
