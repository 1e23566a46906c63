"""Length calibration: the largest haystack size whose sample fits the target, found in few tokenizations.

A sample's length is ``tokens(input) + tokens(context) + tokens_to_generate`` (as in MemAgent's RULER data), and it
grows almost linearly with the haystack size ``n`` (sentences, words, needles...). A linear model ``a + b*n``
fitted once per task on a small probe gives the first guess; then secant steps on exact counts, kept
inside a bracket [fits, too long], land within ``accept`` of the target, usually in one or two full
tokenizations (O(L) each). The official generator binary-searches with ~10-16 full re-tokenizations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class CalibrationError(RuntimeError):
    """No haystack size makes the sample fit the target length."""


@dataclass
class Fit:
    n: int
    tokens: int
    sample: Any
    evaluations: int


def linear_probe(count_at: Callable[[int], int], n_a: int) -> tuple[float, float]:
    """Intercept and slope of tokens(n) from two probe sizes ``n_a`` and ``2 * n_a``."""
    t_a, t_b = count_at(n_a), count_at(2 * n_a)
    slope = max((t_b - t_a) / n_a, 1e-6)
    return t_a - slope * n_a, slope


def fit_units(
    build: Callable[[int], tuple[Any, int]],
    target: int,
    intercept: float,
    slope: float,
    n_min: int = 1,
    n_max: int | None = None,
    accept: float = 0.995,
    max_evaluations: int = 40,
) -> Fit:
    """Largest-enough ``n`` with ``build(n)[1] <= target`` and, when the granularity allows,
    ``>= accept * target``. ``build(n)`` returns ``(sample, tokens)``."""
    aim = target * (1 + accept) / 2  # the middle of the acceptance band

    def clamp(n: float) -> int:
        n = max(n_min, int(n))
        return min(n, n_max) if n_max is not None else n

    lo: Fit | None = None  # largest n seen that fits
    hi_n, hi_t = None, None  # smallest n seen that is too long
    n = clamp((aim - intercept) / slope)
    evaluations = 0
    while evaluations < max_evaluations:
        sample, tokens = build(n)
        evaluations += 1
        if tokens <= target:
            if lo is None or n > lo.n:
                lo = Fit(n, tokens, sample, evaluations)
            if tokens >= accept * target or n == n_max:
                break
        else:
            if n == n_min:
                raise CalibrationError(f"even the smallest haystack ({n_min}) gives {tokens} > {target} tokens")
            if hi_n is None or n < hi_n:
                hi_n, hi_t = n, tokens
        del sample
        if lo is not None and hi_n is not None:
            if hi_n - lo.n <= 1:
                break
            local = (hi_t - lo.tokens) / (hi_n - lo.n)
            step = (aim - lo.tokens) / local if local > 0 else (hi_n - lo.n) / 2
            n = min(max(lo.n + max(1, int(step)), lo.n + 1), hi_n - 1)
        elif lo is not None:
            n = clamp(max(lo.n + 1, lo.n + (aim - lo.tokens) / slope))
        else:
            n = clamp(min(hi_n - 1, hi_n + (aim - hi_t) / slope))
    if lo is None:
        raise CalibrationError(f"no haystack size fits {target} tokens after {evaluations} tokenizations")
    lo.evaluations = evaluations
    return lo
