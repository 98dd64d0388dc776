"""Seeded bootstrap 95% intervals over prompts, and paired comparisons (pure; scipy.stats).

Every trial figure is a ratio of sums over its samples (tokens/s = Σ tokens / Σ seconds,
acceptance rate = Σ accepted / Σ drafted, mean accepted = Σ accepted / Σ rounds), so the
bootstrap resamples prompts and recomputes that ratio of sums. A speedup (or the ratio of two
trials' tokens/s) resamples the prompts the two trials share, the same prompts for both
(``paired=True``): prompt difficulty then cancels instead of widening the interval. Intervals
are percentile intervals of ``scipy.stats.bootstrap`` under a fixed seed, so a figure and its
interval are reproducible from the stored samples.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0

Verdict = Literal["faster", "slower", "not distinguishable"]


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval over ``n`` prompts."""

    estimate: float
    low: float
    high: float
    n: int

    def contains(self, value: float) -> bool:
        """True when ``value`` lies inside the interval (bounds included)."""
        return self.low <= value <= self.high


def _ratio_of_sums(num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    """Return Σnum / Σden along ``axis`` (nan where the denominator sums to zero)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sum(num, axis=axis) / np.sum(den, axis=axis)


def _interval(
    data: tuple[np.ndarray, ...], statistic: object, estimate: float, paired: bool, seed: int
) -> Interval | None:
    """Run scipy's percentile bootstrap; None when the bounds are not finite.

    A resample whose denominator sums to zero (e.g. only prompts that drafted nothing) has no
    ratio; the bounds are then the percentiles of the resamples that have one, and None when
    fewer than half do.
    """
    # scipy.stats takes over a second to import: only commands that compute intervals pay it.
    from scipy.stats import DegenerateDataWarning, bootstrap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateDataWarning)
        result = bootstrap(
            data,
            statistic,  # type: ignore[arg-type]
            paired=paired,
            vectorized=True,
            n_resamples=N_RESAMPLES,
            confidence_level=CONFIDENCE,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if not (np.isfinite(low) and np.isfinite(high)):
        resampled = np.asarray(result.bootstrap_distribution, dtype=float)
        finite = resampled[np.isfinite(resampled)]
        if len(finite) < len(resampled) / 2:
            return None
        tail = (1 - CONFIDENCE) / 2 * 100
        low, high = (float(v) for v in np.percentile(finite, [tail, 100 - tail]))
    return Interval(estimate=estimate, low=low, high=high, n=len(data[0]))


def ratio_interval(
    numerators: Sequence[float], denominators: Sequence[float], seed: int = SEED
) -> Interval | None:
    """Return Σnumerators / Σdenominators with its bootstrap interval over samples.

    Pairs (numerator_i, denominator_i) are resampled together. None when there are fewer than
    two samples or the denominators sum to zero (e.g. the acceptance rate of an AR baseline).
    """
    num, den = np.asarray(numerators, float), np.asarray(denominators, float)
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError("numerators and denominators must be 1-D and of equal length")
    if len(num) < 2 or den.sum() == 0:
        return None
    estimate = float(_ratio_of_sums(num, den))
    return _interval((num, den), _ratio_of_sums, estimate, paired=True, seed=seed)


def _paired_rate_ratio(
    tokens_a: np.ndarray,
    seconds_a: np.ndarray,
    tokens_b: np.ndarray,
    seconds_b: np.ndarray,
    axis: int = -1,
) -> np.ndarray:
    """Return (Σtokens_a/Σseconds_a) / (Σtokens_b/Σseconds_b) along ``axis``."""
    return _ratio_of_sums(tokens_a, seconds_a, axis) / _ratio_of_sums(tokens_b, seconds_b, axis)


def paired_speed_ratio(
    tokens_a: Sequence[float],
    seconds_a: Sequence[float],
    tokens_b: Sequence[float],
    seconds_b: Sequence[float],
    seed: int = SEED,
) -> Interval | None:
    """Return A's tokens/s over B's on the same prompts, with its paired bootstrap interval.

    Entry i of every sequence belongs to prompt i. This is the speedup when B is the AR
    baseline. None with fewer than two prompts or zero seconds on either side.
    """
    data = tuple(np.asarray(v, float) for v in (tokens_a, seconds_a, tokens_b, seconds_b))
    if len({d.shape for d in data}) != 1 or data[0].ndim != 1:
        raise ValueError("the four sequences must be 1-D and of equal length (one per prompt)")
    if len(data[0]) < 2 or data[1].sum() == 0 or data[3].sum() == 0 or data[2].sum() == 0:
        return None
    estimate = float(_paired_rate_ratio(*data))
    return _interval(data, _paired_rate_ratio, estimate, paired=True, seed=seed)


def verdict(ratio: Interval) -> Verdict:
    """Return "faster" when the whole interval is above 1, "slower" below, else undecided."""
    if ratio.low > 1.0:
        return "faster"
    if ratio.high < 1.0:
        return "slower"
    return "not distinguishable"
