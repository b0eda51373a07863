"""Token sampling for :class:`~rlf_trainer.policy.hf.HFPolicy`: one uniform draw a row, not one a logit.

``generate``'s own sampler calls ``torch.multinomial``, which on a CPU draws an exponential variate
for every vocabulary entry of every row, serially: 14.4 ms a decoding step for 16 rows of
SmolLM2's 49,152 logits on the 2-core development VM, a fifth of a bf16 decoding step there.
:class:`InverseCdfSampler` draws the same distribution from one uniform number a row (the token
whose cumulative probability interval holds it, found by :func:`sample_rows`): 0.97 ms with the
softmax and warpers, plus 0.6 ms for ``generate``'s argmax (docs/benchmarks.md). It runs as the
last logits processor of a greedy ``generate``: it applies the temperature, top-k and top-p warpers
(transformers' own, in transformers' order), picks a token a row and leaves that token the only
finite score, so the greedy argmax takes it.

The tokens differ from ``torch.multinomial``'s for the same seed (another use of the random
stream), not in distribution; the raw logits that the log-probs come from are unchanged.

Example:
    >>> import torch
    >>> sampler = InverseCdfSampler(temperature=1.0, top_k=2, top_p=1.0)
    >>> _ = torch.manual_seed(0)
    >>> scores = sampler(torch.zeros(3, 1, dtype=torch.long), torch.tensor([[0.0, 5.0, 4.0, -1.0]] * 3))
    >>> [row.isfinite().sum().item() for row in scores], set(scores.argmax(-1).tolist()) <= {1, 2}
    ([1, 1, 1], True)
"""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


class InverseCdfSampler(LogitsProcessor):
    """Samples a token a row from the warped scores; returns scores whose only finite entry is it.

    ``temperature`` > 0; ``top_k`` 0 and ``top_p`` 1.0 turn those filters off (as in
    :class:`~rlf_trainer.policy.base.SamplingParams`). Uses the default torch generator of the
    scores' device, so a seeded ``generate`` samples reproducibly.
    """

    def __init__(self, temperature: float, top_k: int, top_p: float) -> None:
        if temperature <= 0:
            raise ValueError(f"sampling needs a temperature > 0, got {temperature} (0 is greedy)")
        warpers: list[LogitsProcessor] = []
        if temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(temperature))
        if top_k:
            warpers.append(TopKLogitsWarper(top_k=top_k))
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=top_p))
        self.warpers = LogitsProcessorList(warpers)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tokens = sample_rows(torch.softmax(self.warpers(input_ids, scores).float(), dim=-1))
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, tokens[:, None], 0.0)


def sample_rows(probs: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """One index a row of ``probs`` ``[rows, vocab]``, drawn with probability proportional to its entry.

    Two binary searches: over the cumulative masses of ``block``-sized runs of the vocabulary, then
    within the chosen run (a cumulative sum over the whole row is a serial pass; a sum is not). Sums
    run in float64, and every draw lands strictly inside a positive interval, so an entry of 0 is
    never drawn.

    >>> _ = torch.manual_seed(0)
    >>> draws = sample_rows(torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]]).expand(4000, 5), block=2)
    >>> sorted(set(draws.tolist())), abs(float((draws == 3).double().mean()) - 0.75) < 0.03
    ([1, 3], True)
    """
    rows, vocab = probs.shape
    padded = torch.nn.functional.pad(probs, (0, -vocab % block)) if vocab % block else probs
    runs = padded.reshape(rows, -1, block)
    mass = runs.sum(dim=-1, dtype=torch.float64)
    cumulative = mass.cumsum(dim=-1)
    total = cumulative[:, -1:]
    if not bool((total > 0).all()):
        raise ValueError("cannot sample: a row's probabilities are all zero or not finite")
    draw = _below(torch.rand(rows, 1, dtype=torch.float64, device=probs.device) * total, total)
    run = torch.searchsorted(cumulative, draw, right=True)  # the first run whose cumulative mass exceeds it
    within = runs[torch.arange(rows, device=probs.device), run.squeeze(1)].double().cumsum(dim=-1)
    left = (draw - (cumulative.gather(1, run) - mass.gather(1, run))).clamp_(min=0.0)
    offset = torch.searchsorted(within, _below(left, within[:, -1:]), right=True)
    return (run * block + offset).squeeze(1)


def _below(values: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """``values`` kept strictly below ``bounds`` (a product or difference may round up onto its bound)."""
    return torch.minimum(values, torch.nextafter(bounds, torch.zeros_like(bounds)))
