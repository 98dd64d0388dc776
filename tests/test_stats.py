"""Bootstrap intervals and paired comparisons (orchestrator/analysis/stats.py) against known
cases."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.analysis.stats import (
    Interval,
    paired_speed_ratio,
    ratio_interval,
    verdict,
)


def test_ratio_interval_estimate_is_ratio_of_sums() -> None:
    interval = ratio_interval([10, 30, 20], [1, 2, 4])
    assert interval is not None
    assert interval.estimate == pytest.approx(60 / 7)
    assert interval.low <= interval.estimate <= interval.high
    assert interval.n == 3


def test_ratio_interval_is_seeded() -> None:
    rng = np.random.default_rng(1)
    num, den = rng.uniform(10, 20, 12), rng.uniform(1, 2, 12)
    assert ratio_interval(num, den, seed=3) == ratio_interval(num, den, seed=3)
    assert ratio_interval(num, den, seed=3) != ratio_interval(num, den, seed=4)


def test_ratio_interval_matches_direct_percentile_bootstrap() -> None:
    """With unit denominators the statistic is the mean: compare with a hand-made bootstrap."""
    rng = np.random.default_rng(7)
    values = rng.normal(5.0, 2.0, 40)
    interval = ratio_interval(values, np.ones_like(values))
    assert interval is not None
    resampled = rng.choice(values, size=(20000, len(values)), replace=True).mean(axis=1)
    low, high = np.percentile(resampled, [2.5, 97.5])
    width = high - low
    assert interval.low == pytest.approx(low, abs=0.08 * width)
    assert interval.high == pytest.approx(high, abs=0.08 * width)
    # and the normal-theory interval of a mean, mean ± 1.96·s/√n
    half = 1.96 * values.std(ddof=1) / np.sqrt(len(values))
    assert interval.high - interval.low == pytest.approx(2 * half, rel=0.15)


def test_ratio_interval_covers_the_true_ratio_about_95_percent() -> None:
    rng = np.random.default_rng(11)
    true_rate, covered, runs = 50.0, 0, 200
    for run in range(runs):
        seconds = rng.uniform(0.5, 1.5, 30)
        tokens = true_rate * seconds * rng.lognormal(0.0, 0.2, 30) / np.exp(0.02)
        interval = ratio_interval(tokens, seconds, seed=run)
        assert interval is not None
        covered += interval.contains(true_rate)
    assert 0.88 <= covered / runs <= 0.99


def test_ratio_interval_none_without_data() -> None:
    assert ratio_interval([1.0], [2.0]) is None
    assert ratio_interval([0, 0, 0], [0, 0, 0]) is None
    with pytest.raises(ValueError, match="equal length"):
        ratio_interval([1, 2], [1, 2, 3])


def test_paired_ratio_cancels_prompt_difficulty() -> None:
    """Prompts that differ 10x in speed, A always 1.2x B: paired interval is tight around 1.2."""
    rng = np.random.default_rng(5)
    base_rate = rng.uniform(5, 50, 20)
    tokens = np.full(20, 32.0)
    seconds_b = tokens / base_rate
    seconds_a = seconds_b / (1.2 * rng.normal(1.0, 0.01, 20))
    paired = paired_speed_ratio(tokens, seconds_a, tokens, seconds_b)
    assert paired is not None
    assert paired.estimate == pytest.approx(1.2, rel=0.02)
    assert paired.contains(paired.estimate)
    assert paired.high - paired.low < 0.05
    assert verdict(paired) == "faster"
    # unpaired intervals of the two rates overlap: only pairing tells them apart
    rate_a, rate_b = ratio_interval(tokens, seconds_a), ratio_interval(tokens, seconds_b)
    assert rate_a is not None and rate_b is not None
    assert rate_a.low < rate_b.high


def test_paired_ratio_of_identical_trials_is_not_distinguishable() -> None:
    rng = np.random.default_rng(2)
    tokens, seconds = np.full(10, 16.0), rng.uniform(0.5, 1.0, 10)
    noisy = seconds * rng.normal(1.0, 0.05, 10)
    paired = paired_speed_ratio(tokens, noisy, tokens, seconds)
    assert paired is not None
    assert verdict(paired) == "not distinguishable"
    reverse = paired_speed_ratio(tokens, seconds * 2, tokens, seconds)
    assert reverse is not None and verdict(reverse) == "slower"


def test_paired_ratio_needs_equal_lengths_and_two_prompts() -> None:
    with pytest.raises(ValueError, match="one per prompt"):
        paired_speed_ratio([1, 2], [1, 1], [1], [1])
    assert paired_speed_ratio([1], [1], [1], [1]) is None


def test_verdict_bounds() -> None:
    assert verdict(Interval(1.1, 1.01, 1.2, 5)) == "faster"
    assert verdict(Interval(0.9, 0.8, 0.99, 5)) == "slower"
    assert verdict(Interval(1.0, 1.0, 1.2, 5)) == "not distinguishable"


def test_resamples_without_a_denominator_are_left_out() -> None:
    """Two of six prompts drafted nothing: some resamples have no acceptance rate at all."""
    accepted, drafted = [3, 0, 4, 0, 2, 5], [4, 0, 8, 0, 4, 6]
    interval = ratio_interval(accepted, drafted)
    assert interval is not None
    assert interval.estimate == pytest.approx(14 / 22)
    assert 0.0 <= interval.low <= interval.estimate <= interval.high <= 1.0
    # one drafting prompt: every resample that has a rate has this one
    assert ratio_interval([1, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0]) == Interval(0.5, 0.5, 0.5, 6)
