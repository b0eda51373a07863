import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rlf_envs.tools.parsers import TagJSONParser, get_parser, register_parser
from rlf_envs.types import ErrorKind


def test_several_calls_in_one_turn_keep_order_and_prose():
    text = (
        "Let me look.\n"
        '<tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"b\\"}"}\n</tool_call>'
    )
    turn = get_parser().parse(text)
    assert [c.arguments["query"] for c in turn.calls] == ["a", "b"]
    assert turn.failures == []
    assert turn.content == "Let me look."
    assert len({c.id for c in turn.calls}) == 2


def test_unclosed_final_block_is_parsed():
    turn = get_parser("qwen3").parse('ok <tool_call>{"name": "f", "arguments": {}}')
    assert [c.name for c in turn.calls] == ["f"]


def test_failure_kinds():
    parser = get_parser()
    assert parser.parse("<tool_call>{not json}</tool_call>").failures[0].kind is ErrorKind.BAD_JSON
    assert parser.parse("<tool_call></tool_call>").failures[0].kind is ErrorKind.BAD_JSON
    assert parser.parse('<tool_call>{"arguments": {}}</tool_call>').failures[0].kind is ErrorKind.BAD_FORMAT
    assert parser.parse("<tool_call>[1, 2]</tool_call>").failures[0].kind is ErrorKind.BAD_FORMAT
    assert (
        parser.parse('<tool_call>{"name": "f", "arguments": 3}</tool_call>').failures[0].kind
        is ErrorKind.BAD_FORMAT
    )
    bad_args = parser.parse('<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>')
    assert bad_args.failures[0].kind is ErrorKind.BAD_JSON
    deep = "<tool_call>" + "[" * 100_000 + "</tool_call>"
    assert parser.parse(deep).failures[0].kind is ErrorKind.BAD_JSON


def test_plain_text_is_not_a_call():
    turn = get_parser().parse("The answer is <answer>Paris</answer>")
    assert not turn.attempted
    assert turn.content == "The answer is <answer>Paris</answer>"


def test_custom_parser_registration():
    register_parser("xml_fn", lambda: TagJSONParser("<fn>", "</fn>"))
    turn = get_parser("xml_fn").parse('<fn>{"name": "g", "arguments": {"x": 1}}</fn>')
    assert turn.calls[0].name == "g"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=400, deadline=None)
@given(
    st.text(max_size=300), json_values, st.sampled_from(["<tool_call>", "</tool_call>", "{", '"name"', ""])
)
def test_parser_never_raises_and_sees_every_attempt(text, payload, noise):
    valid = f"<tool_call>{json.dumps({'name': 't', 'arguments': {'v': payload}})}</tool_call>"
    near_valid = valid.replace("</tool_call>", noise + "</tool_call>")
    for candidate in (text, near_valid, text + near_valid + noise, noise + text):
        turn = get_parser().parse(candidate)
        assert turn.attempted == ("<tool_call>" in candidate)
        assert all(isinstance(call.arguments, dict) for call in turn.calls)
    turn = get_parser().parse(text.replace("<tool_call>", "") + valid)
    assert turn.calls[-1].name == "t" and turn.calls[-1].arguments == {"v": payload}
