"""pass@k and avg@k over prompts sampled several times: the unbiased estimator of Chen et al. (2021).

A prompt sampled ``n`` times with ``c`` correct samples has pass@k, the chance that at least one of
``k`` samples is correct, estimated without bias by ``1 - C(n-c, k) / C(n, k)`` (``k`` of the
``n`` samples drawn without replacement; "Evaluating Large Language Models Trained on Code", eq. 1).
avg@n is ``c / n``, the mean correctness of its samples (so pass@1 equals avg@n). Both are averaged
over prompts.

Example:
    >>> pass_at_k(4, 1, 2)
    0.5
    >>> success_rates({"q0": [True, False, False, False], "q1": [True, True, True, True]}, ks=[1, 2])
    {'avg@4': 0.625, 'pass@1': 0.625, 'pass@2': 0.75}
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with ``c`` correct of ``n`` samples, ``1 <= k <= n``.

    Computed as ``(C(n, k) - C(n-c, k)) / C(n, k)``: exact integers, then one correctly rounded
    division, so the result is the float nearest the true value.

    Example:
        >>> pass_at_k(10, 0, 5), pass_at_k(10, 10, 1), pass_at_k(10, 3, 1), pass_at_k(5, 1, 5)
        (0.0, 1.0, 0.3, 1.0)
        >>> pass_at_k(4, 2, 2)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        0.8333333333333334
        >>> pass_at_k(2, 1, 3)
        Traceback (most recent call last):
        ...
        ValueError: pass@3 needs at least 3 samples of a prompt, got 2
    """
    if not 0 <= c <= n:
        raise ValueError(f"correct samples must be in [0, {n}], got {c}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples of a prompt, got {n}")
    total = math.comb(n, k)
    return (total - math.comb(n - c, k)) / total


def success_rates(successes: Mapping[Hashable, Sequence[bool]], ks: Sequence[int]) -> dict[str, float]:
    """``avg@n`` and ``pass@k`` for each ``k`` in ``ks``, averaged over the prompts of ``successes``
    (prompt -> the correctness of each of its ``n`` samples; every prompt has the same ``n``).

    Example:
        >>> success_rates({"q0": [False, True], "q1": [False, False]}, ks=[2])
        {'avg@2': 0.25, 'pass@2': 0.5}
        >>> success_rates({}, ks=[1])
        {}
    """
    if not successes:
        return {}
    counts = {len(samples) for samples in successes.values()}
    if len(counts) != 1:
        raise ValueError(f"every prompt needs the same number of samples, got {sorted(counts)}")
    n = counts.pop()
    correct = [sum(bool(s) for s in samples) for samples in successes.values()]
    out = {f"avg@{n}": sum(c / n for c in correct) / len(correct)}
    for k in sorted(set(ks)):
        out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(correct)
    return out


__all__ = ["pass_at_k", "success_rates"]
