"""rlf-serve as a real subprocess with the tiny random Qwen3: the OpenAI API, batching, errors."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rlf_serve.protocol import RequestError, apply_stop_strings, parse_chat_request
from tests.helpers import rlf_serve

USER = [{"role": "user", "content": "Tell me about the river."}]


NO_VLLM = importlib.util.find_spec("vllm") is None


@pytest.fixture(
    scope="module",
    params=[
        "hf",
        pytest.param(
            "vllm",
            marks=[pytest.mark.vllm, pytest.mark.skipif(NO_VLLM, reason="vllm is not installed")],
        ),
    ],
)
def root(request: pytest.FixtureRequest, shared_tiny_model_dir: Path) -> Iterator[str]:
    """The server's root URL (no /v1); at most 16 requests a batch, batches wait up to 1 s.

    The long wait keeps a burst of concurrent requests in one batch even on a busy machine; a batch
    that fills up (16) starts at once. Every test runs against both backends; ``vllm`` only where
    vLLM is installed (``-m vllm`` in ``.venv-vllm``, float32 like the HF backend on CPU).
    """
    backend = ("--backend", "vllm", "--dtype", "float32") if request.param == "vllm" else ()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    batching = ("--batch-wait-ms", "1000", "--max-batch", "16")
    with rlf_serve(shared_tiny_model_dir, *batching, *backend) as (url, _):
        yield url.removesuffix("/v1")


async def _request(session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> tuple[int, Any]:
    async with session.request(method, url, **kwargs) as response:
        return response.status, await response.json()


def call(method: str, url: str, **kwargs: Any) -> tuple[int, Any]:
    async def once() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session:
            return await _request(session, method, url, **kwargs)

    return asyncio.run(once())


def chat(root: str, **body: Any) -> tuple[int, Any]:
    return call("POST", f"{root}/v1/chat/completions", json={"model": "tiny", "messages": USER, **body})


def concurrent_chats(root: str, bodies: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    async def all_at_once() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession() as session:
            url = f"{root}/v1/chat/completions"
            return list(await asyncio.gather(*(_request(session, "POST", url, json=b) for b in bodies)))

    return asyncio.run(all_at_once())


def test_health_models_and_one_completion(root: str) -> None:
    assert call("GET", f"{root}/health") == (200, {"status": "ok", "model": "tiny"})
    status, models = call("GET", f"{root}/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"]
    status, reply = chat(root, max_tokens=5, temperature=0.7, top_p=0.9)
    assert status == 200, reply
    [choice] = reply["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = reply["usage"]
    assert 1 <= usage["completion_tokens"] <= 5 and usage["prompt_tokens"] > 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert (choice["finish_reason"] == "length") == (usage["completion_tokens"] == 5)


def test_seeded_sampling_repeats_and_stop_strings_cut_the_reply(root: str) -> None:
    _, first = chat(root, max_tokens=24, seed=7)
    _, again = chat(root, max_tokens=24, seed=7)
    text = first["choices"][0]["message"]["content"]
    assert again["choices"][0]["message"]["content"] == text and len(text) >= 4
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    _, cut = chat(root, max_tokens=24, seed=7, stop=[stop, "never-in-the-text"])
    assert cut["choices"][0]["message"]["content"] == text[: text.find(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_20_concurrent_requests_are_batched_up_to_max_batch(root: str) -> None:
    call("POST", f"{root}/stats/reset")
    bodies = [{"model": "tiny", "messages": USER, "max_tokens": 16, "temperature": 1.0} for _ in range(20)]
    replies = concurrent_chats(root, bodies)
    assert [status for status, _ in replies] == [200] * 20
    _, stats = call("GET", f"{root}/stats")
    assert stats["requests"] == 20 and stats["peak_in_flight"] == 20 and stats["in_flight"] == 0
    assert stats["largest_batch"] == 16 and stats["batches"] >= 2  # 16 closes the first batch
    assert stats["completion_tokens"] == sum(r["usage"]["completion_tokens"] for _, r in replies)


def test_a_batch_mixing_sampling_settings_runs_one_call_per_setting(root: str) -> None:
    call("POST", f"{root}/stats/reset")
    greedy = {"model": "tiny", "messages": USER, "max_tokens": 6, "temperature": 0}
    sampled = {**greedy, "temperature": 1.0, "max_tokens": 3}
    replies = concurrent_chats(root, [greedy] * 4 + [sampled] * 4)
    assert [status for status, _ in replies] == [200] * 8
    assert len({r["choices"][0]["message"]["content"] for _, r in replies[:4]}) == 1  # greedy: identical
    assert all(r["usage"]["completion_tokens"] <= 3 for _, r in replies[4:])  # cut to their own max_tokens
    _, stats = call("GET", f"{root}/stats")
    assert stats["generate_calls"] > stats["batches"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": USER, "n": 2}, 400, "n"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"content": "no role"}]}, 400, "messages"),
        ({"messages": USER, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": USER, "temperature": "hot"}, 400, "temperature"),
        ({"messages": USER, "stream": True}, 400, "stream"),
        ({"messages": USER, "model": "gpt-9"}, 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors(root: str, body: dict[str, Any], status: int, param: str) -> None:
    got_status, reply = call("POST", f"{root}/v1/chat/completions", json=body)
    assert got_status == status
    assert reply["error"]["param"] == param and reply["error"]["type"] == "invalid_request_error"


def test_invalid_json_is_a_400_and_the_server_stays_up(root: str) -> None:
    status, reply = call("POST", f"{root}/v1/chat/completions", data=b"{not json", headers={"content-type": "application/json"})  # fmt: skip
    assert status == 400 and "not valid JSON" in reply["error"]["message"]
    assert chat(root, max_tokens=2)[0] == 200


def test_parse_chat_request_accepts_openai_shapes() -> None:
    request = parse_chat_request(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ],
            "max_completion_tokens": 9,
            "stop": "\n",
            "seed": 3,
        }  # fmt: skip
    )
    assert request.messages[0]["content"] == "ab"
    assert (request.max_tokens, request.stop, request.seed, request.temperature) == (9, ("\n",), 3, 1.0)
    with pytest.raises(RequestError, match="only text parts"):
        parse_chat_request({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
    assert apply_stop_strings("abc", ["x"]) == ("abc", False)
    assert apply_stop_strings("a<|x|>b</s>", ["</s>", "<|x|>"]) == ("a", True)
