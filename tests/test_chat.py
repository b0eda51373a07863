"""Chat helpers on the tiny Qwen3 template, a ChatML-only template and (if prepared) SmolLM2's tokenizer.

The central property: for a multi-turn tool episode, ``prompt + generated + delta + generated + ...``
equals the chat template's own rendering of the whole chat, token for token.
"""

from __future__ import annotations

import copy
import json

import pytest

from rlf_trainer.data.models import default_cache_dir
from rlf_trainer.rollout.chat import (
    TemplateNotPrefixStableError,
    encode,
    plain_messages,
    prompt_ids,
    render,
    render_tools_hermes,
    template_supports_tools,
    tool_delta_ids,
)

# SmolLM2-135M-Instruct's template: plain ChatML, a default system prompt, no tool support.
CHATML_ONLY_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the wiki.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "python", "description": "Run code.", "parameters": {"type": "object"}},
    },
]


@pytest.fixture(scope="module")
def chatml_tokenizer(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = CHATML_ONLY_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    folder = default_cache_dir() / "smollm2-135m"
    if not (folder / "tokenizer.json").exists():
        pytest.skip("SmolLM2 not prepared (rlf-models prepare smollm2-135m)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def model_turn(tokenizer, text: str) -> list[int]:
    """What a policy generates for an assistant turn: the text, then the end-of-turn (stop) token."""
    return encode(tokenizer, text) + [tokenizer.eos_token_id]


def run_episode(tokenizer, tools):
    """Two tool turns and an answer, built the way the rollout builds token sequences."""
    messages = [
        {"role": "system", "content": "You are a research agent."},
        {"role": "user", "content": "Who founded Velmora Works, and when?"},
    ]
    sequence = prompt_ids(tokenizer, messages, tools)
    turns = [
        (
            "I will search.",
            [call("c0", "search", {"query": "Velmora Works founder"})],
            ["Velmora Works was founded by Ana Ruiz."],
        ),
        (
            "",
            [
                call("c1", "search", {"query": "Velmora Works 1921"}),
                call("c2", "python", {"code": "print(1921)"}),
            ],
            ["Founded in 1921.", "Error (tool_error): boom"],
        ),
    ]
    for content, calls, results in turns:
        blocks = "\n".join(
            "<tool_call>\n" + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
            + "\n</tool_call>"
            for c in calls
        )  # fmt: skip
        sequence += model_turn(tokenizer, f"{content}\n{blocks}" if content else blocks)
        messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        tool_messages = [
            {"role": "tool", "name": c["function"]["name"], "tool_call_id": c["id"], "content": r}
            for c, r in zip(calls, results, strict=True)
        ]
        sequence += tool_delta_ids(tokenizer, messages, tool_messages, tools)
        messages.extend(tool_messages)
        assert sequence == prompt_ids(tokenizer, messages, tools), (
            "the running sequence left the template's rendering"
        )
    sequence += model_turn(tokenizer, "<answer>Ana Ruiz, 1921</answer>")
    messages.append({"role": "assistant", "content": "<answer>Ana Ruiz, 1921</answer>"})
    full = encode(tokenizer, render(tokenizer, messages, tools, add_generation_prompt=False))
    return sequence, full, messages


def test_render_tools_hermes_lists_every_tool_as_a_json_line():
    block = render_tools_hermes(TOOLS)
    inner = block.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in inner.splitlines()] == TOOLS
    assert "<tool_call>" in block and '"arguments"' in block


def test_template_supports_tools(tiny_tokenizer, chatml_tokenizer):
    assert template_supports_tools(tiny_tokenizer)
    assert not template_supports_tools(chatml_tokenizer)


def test_prompt_ids_end_with_the_generation_prompt(tiny_tokenizer, chatml_tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    for tokenizer in (tiny_tokenizer, chatml_tokenizer):
        text = tokenizer.decode(prompt_ids(tokenizer, messages))
        assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_prompt_ids_pass_tools_to_a_template_that_supports_them(tiny_tokenizer):
    ids = prompt_ids(tiny_tokenizer, [{"role": "user", "content": "hi"}], TOOLS)
    native = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert ids == encode(tiny_tokenizer, native)
    assert json.dumps(TOOLS[0]) in tiny_tokenizer.decode(ids)


def test_prompt_ids_put_tools_in_the_system_message_otherwise(chatml_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = chatml_tokenizer.decode(prompt_ids(chatml_tokenizer, messages, TOOLS))
    assert text.startswith("<|im_start|>system\nBe brief.\n\n" + render_tools_hermes(TOOLS) + "<|im_end|>\n")
    # without a system message, the tools block becomes one (replacing the template's default prompt)
    text = chatml_tokenizer.decode(prompt_ids(chatml_tokenizer, messages[1:], TOOLS))
    assert text.startswith("<|im_start|>system\n# Tools") and "helpful AI assistant" not in text


def test_plain_messages_turn_calls_and_results_into_text():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call("a", "search", {"query": "x"})]},
        {"role": "tool", "name": "search", "tool_call_id": "a", "content": "r1"},
        {"role": "tool", "name": "search", "tool_call_id": "b", "content": "r2"},
    ]
    out = plain_messages(messages, None)
    assert out == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>',
        },
        {
            "role": "user",
            "content": "<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>",
        },
    ]


@pytest.mark.parametrize("which", ["tiny_tokenizer", "chatml_tokenizer", "smollm2_tokenizer"])
@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tools", "no-tools"])
def test_prompt_generated_and_deltas_rebuild_the_full_rendering(request, which, tools):
    tokenizer = request.getfixturevalue(which)
    sequence, full, _ = run_episode(tokenizer, tools)
    # the final "\n" after the last <|im_end|> is template text the model never generates
    assert full[: len(sequence)] == sequence
    assert tokenizer.decode(full[len(sequence) :]) in ("", "\n")


def test_delta_text_on_chatml(tiny_tokenizer, chatml_tokenizer):
    before = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call("a", "search", {"query": "x"})]},
    ]
    expected = "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    for tokenizer in (tiny_tokenizer, chatml_tokenizer):
        delta = tool_delta_ids(tokenizer, before, [{"role": "tool", "content": "42"}])
        assert tokenizer.decode(delta) == expected
        cut_turn = tool_delta_ids(
            tokenizer, before, [{"role": "tool", "content": "42"}], include_end_of_turn=True
        )
        assert cut_turn == [tokenizer.eos_token_id] + delta


def test_delta_arguments_are_checked(tiny_tokenizer):
    user_last = [{"role": "user", "content": "q"}]
    with pytest.raises(ValueError, match="must end with the assistant turn"):
        tool_delta_ids(tiny_tokenizer, user_last, [{"role": "tool", "content": "r"}])
    with pytest.raises(ValueError, match="empty"):
        tool_delta_ids(tiny_tokenizer, [*user_last, {"role": "assistant", "content": "a"}], [])


def test_a_template_that_rewrites_earlier_turns_is_refused(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    # the system line depends on how many messages follow: not prefix-stable
    tokenizer.chat_template = (
        "{{ 'Chat of ' + (messages | length | string) + ' messages\n' }}"
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    before = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    with pytest.raises(TemplateNotPrefixStableError, match="changed the earlier rendering"):
        tool_delta_ids(tokenizer, before, [{"role": "tool", "content": "r"}])


def test_a_delta_that_tokenizes_differently_in_context_is_refused(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"  # no turn markers at all
    assert encode(tokenizer, "th") + encode(tokenizer, "e") != encode(tokenizer, "the")  # "the" is one merge
    before = [{"role": "assistant", "content": "th"}]
    with pytest.raises(TemplateNotPrefixStableError, match="tokenizes differently"):
        tool_delta_ids(tokenizer, before, [{"role": "user", "content": "e"}], end_of_turn="th")


def test_missing_end_of_turn_marker_is_reported(tiny_tokenizer):
    before = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    with pytest.raises(TemplateNotPrefixStableError, match="no end-of-turn marker"):
        tool_delta_ids(tiny_tokenizer, before, [{"role": "tool", "content": "r"}], end_of_turn="<|never|>")
