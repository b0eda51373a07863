"""SFT examples from chat-messages JSONL, built by the same code as the RL rollout's sequences.

A demonstration (a line of ``rlf-collect``'s output, or any ``{"messages": [...], "tools": [...]}``
line in the TRL / LLaMA-Factory shape) becomes one token sequence and one loss mask exactly as
:mod:`rlf_trainer.rollout.trajectory` builds an episode the policy played: the prompt (system + user
messages, tools rendered by the chat template), then each assistant turn's tokens (loss 1) ended by
the end-of-turn token, then the chat template's delta for the tool results or user reply that
follow (loss 0), and so on. The assistant tokens are the canonical tokenization of the turn's text
(:func:`rlf_trainer.rollout.chat.assistant_text`): where a policy sampled exactly those tokens, the SFT
sequence and mask equal its rollout's (tests/test_sft.py checks this on a real env).

An example longer than ``max_total_tokens`` is never cut: :func:`load_sft_examples` reports it
and leaves it out (``SFTData.too_long`` counts them; the trainer logs ``sft/too_long``).

Example:
    >>> line = {"messages": [{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": "42"}]}
    >>> _ = (tmp / "demos.jsonl").write_text(json.dumps(line) + "\\n")
    >>> example = load_sft_examples(tmp / "demos.jsonl", tok, max_total_tokens=2048).examples[0]
    >>> tok.decode([t for t, m in zip(example.token_ids, example.loss_mask) if m])  # what carries loss
    '42<|im_end|>'
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlf_trainer.rollout import chat
from rlf_trainer.rollout.trajectory import Trajectory, start_trajectory, turn_end_id

Message = dict[str, Any]


class SFTDataError(ValueError):
    """A demonstration file or line that cannot be trained on (names the file and line)."""


@dataclass(frozen=True)
class SFTExample:
    """One demonstration's tokens; ``loss_mask`` is 1 on the assistant's own tokens only."""

    token_ids: list[int]
    loss_mask: list[int]
    source: str  # "file:line", for messages that name an example


@dataclass
class SFTData:
    """The examples of a file, and those left out for being longer than the token budget."""

    examples: list[SFTExample] = field(default_factory=list)
    too_long: list[str] = field(default_factory=list)  # sources of the examples left out


def demonstration_trajectory(
    tokenizer: Any, messages: Sequence[Message], tools: Sequence[dict[str, Any]]
) -> Trajectory:
    """The :class:`~rlf_trainer.rollout.trajectory.Trajectory` an RL rollout would build for ``messages``.

    ``messages`` start with the prompt (everything before the first assistant message); each
    assistant message is one generated turn, each run of tool (or user) messages after it one
    env step's delta.
    """
    messages, tools = [dict(m) for m in messages], [dict(t) for t in tools]
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None or first == 0:
        raise SFTDataError("a demonstration needs prompt messages, then at least one assistant message")
    traj = start_trajectory(tokenizer, {"messages": messages[:first], "tools": tools}, group=0)
    end_id = turn_end_id(tokenizer)
    end_token = tokenizer.convert_ids_to_tokens(end_id)
    i = first
    while i < len(messages):
        turn = chat.encode(tokenizer, chat.assistant_text(messages[i])) + [end_id]
        start = len(traj.token_ids)
        traj.append(turn, trained=True)
        traj.turn_spans.append((start, len(traj.token_ids)))
        j = i + 1
        while j < len(messages) and messages[j].get("role") != "assistant":
            j += 1
        if j > i + 1:  # tool results (or a user reply) and the next assistant header, loss 0
            delta = chat.tool_delta_ids(tokenizer, messages[: i + 1], messages[i + 1 : j], tools,
                                        end_of_turn=end_token)  # fmt: skip
            if j < len(messages):
                traj.append(delta, trained=False)
        i = j
    return traj


def load_sft_examples(path: str | Path, tokenizer: Any, *, max_total_tokens: int) -> SFTData:
    """Every line of a chat-messages JSONL file as an :class:`SFTExample` (see the module docs)."""
    path = Path(path)
    if not path.is_file():
        raise SFTDataError(f"SFT data file {path} does not exist")
    data = SFTData()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        source = f"{path}:{number}"
        try:
            record = json.loads(line)
            messages, tools = record["messages"], record.get("tools") or []
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise SFTDataError(f"{source}: not a chat-messages line ({exc})") from exc
        try:
            traj = demonstration_trajectory(tokenizer, messages, tools)
        except (SFTDataError, ValueError) as exc:
            raise SFTDataError(f"{source}: {exc}") from exc
        if len(traj.token_ids) > max_total_tokens:
            data.too_long.append(source)
            print(
                f"SFT: {source} has {len(traj.token_ids)} tokens > max_total_tokens {max_total_tokens}: left out"
            )
            continue
        data.examples.append(SFTExample(traj.token_ids, traj.loss_mask, source))
    if not data.examples:
        raise SFTDataError(f"{path} holds no example within {max_total_tokens} tokens")
    return data


__all__ = ["SFTData", "SFTDataError", "SFTExample", "demonstration_trajectory", "load_sft_examples"]
