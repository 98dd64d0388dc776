"""Jackknife t intervals, paired comparisons and Holm (orchestrator/analysis/stats.py), known
cases."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.analysis.stats import (
    Interval,
    family_confidence,
    holm_adjusted,
    p_verdict,
    paired_speed_ratio,
    ratio_interval,
    too_few_prompts,
    verdict,
)


def test_ratio_interval_estimate_is_ratio_of_sums() -> None:
    interval = ratio_interval([10, 30, 20], [1, 2, 4])
    assert interval is not None
    assert interval.estimate == pytest.approx(60 / 7)
    assert interval.low <= interval.estimate <= interval.high
    assert interval.n == 3


def test_ratio_interval_is_the_hand_worked_jackknife_t_interval() -> None:
    """Three prompts: leave-one-out ratios 50/6, 40/5, 30/3 of 60/7; t quantile with 2 df."""
    interval = ratio_interval([10, 20, 30], [1, 2, 4])
    theta = np.log(60 / 7)
    jack = np.log([50 / 6, 40 / 5, 30 / 3])
    se = np.sqrt(2 / 3 * np.sum((jack - jack.mean()) ** 2))
    half = 4.302652729911275 * se  # scipy.stats.t.ppf(0.975, 2)
    assert interval == Interval(
        pytest.approx(60 / 7),
        pytest.approx(np.exp(theta - half)),
        pytest.approx(np.exp(theta + half)),
        3,
    )


def test_ratio_interval_of_a_mean_is_the_t_interval_of_its_log() -> None:
    """With unit denominators the statistic is the mean; its jackknife se is s/√n exactly."""
    rng = np.random.default_rng(7)
    values = rng.normal(5.0, 0.5, 40)
    interval = ratio_interval(values, np.ones_like(values))
    assert interval is not None
    relative = 2.0226909117347285 * values.std(ddof=1) / np.sqrt(40) / values.mean()
    assert np.log(interval.high / interval.low) == pytest.approx(2 * relative, rel=0.02)


def test_ratio_interval_covers_the_true_ratio_about_95_percent() -> None:
    rng = np.random.default_rng(11)
    true_rate, covered, runs = 50.0, 0, 200
    for _ in range(runs):
        seconds = rng.uniform(0.5, 1.5, 30)
        tokens = true_rate * seconds * rng.lognormal(0.0, 0.2, 30) / np.exp(0.02)
        interval = ratio_interval(tokens, seconds)
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


def test_a_trial_against_itself_is_exactly_one() -> None:
    # an AR baseline's speedup over itself: the log ratio of equal sums must be 0, not a
    # rounding error that puts the whole interval a hair off 1 (it did for these seconds)
    tokens, seconds = [48.0] * 3, [2.092, 1.174, 0.602]
    same = paired_speed_ratio(tokens, seconds, tokens, seconds)
    assert same is not None
    assert (same.estimate, same.low, same.high, same.p_value) == (1.0, 1.0, 1.0, 1.0)


def test_paired_ratio_needs_equal_lengths_and_two_prompts() -> None:
    with pytest.raises(ValueError, match="one per prompt"):
        paired_speed_ratio([1, 2], [1, 1], [1], [1])
    assert paired_speed_ratio([1], [1], [1], [1]) is None


def test_verdict_bounds() -> None:
    assert verdict(Interval(1.1, 1.01, 1.2, 5)) == "faster"
    assert verdict(Interval(0.9, 0.8, 0.99, 5)) == "slower"
    assert verdict(Interval(1.0, 1.0, 1.2, 5)) == "not distinguishable"


def test_prompts_without_a_denominator_keep_the_rest() -> None:
    """Two of six prompts drafted nothing: every leave-one-out rate exists, so does the interval."""
    accepted, drafted = [3, 0, 4, 0, 2, 5], [4, 0, 8, 0, 4, 6]
    interval = ratio_interval(accepted, drafted)
    assert interval is not None
    assert interval.estimate == pytest.approx(14 / 22)
    assert 0.0 < interval.low < interval.estimate < interval.high < 1.0
    # one drafting prompt: leaving it out leaves no rate, nothing accepted: no log; no interval
    assert ratio_interval([1, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0]) is None
    assert ratio_interval([0, 0, 0], [2, 3, 4]) is None


def test_p_value_agrees_with_the_interval() -> None:
    """p < 0.05 exactly when the 95% interval excludes 1, on many random paired sets."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        n = int(rng.integers(2, 12))
        seconds = rng.uniform(0.5, 2.0, n)
        faster = seconds / (1.05 * np.exp(rng.normal(0, 0.1, n)))
        ratio = paired_speed_ratio(np.full(n, 32.0), faster, np.full(n, 32.0), seconds)
        assert ratio is not None and ratio.p_value is not None
        assert (ratio.p_value < 0.05) == (not ratio.contains(1.0))
        assert p_verdict(ratio.estimate, ratio.p_value) == verdict(ratio)


def test_holm_adjusted_matches_a_hand_worked_example() -> None:
    """p = 0.01, 0.04, 0.03, 0.005: sorted 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06,
    0.04·1 = 0.04 raised to the running maximum 0.06."""
    adjusted = holm_adjusted([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p < 0.05 for p in adjusted] == [True, False, False, True]
    assert holm_adjusted([0.5, 0.6]) == [1.0, 1.0]
    assert holm_adjusted([0.04]) == [0.04]
    assert holm_adjusted([]) == []


def test_family_confidence_is_bonferroni() -> None:
    assert family_confidence(4) == pytest.approx(0.9875)
    assert family_confidence(1) == pytest.approx(0.95)
    wide = paired_speed_ratio([8, 8, 8, 8], [1, 1.1, 0.9, 1], [8] * 4, [2, 2, 2, 2.1], 0.9875)
    narrow = paired_speed_ratio([8, 8, 8, 8], [1, 1.1, 0.9, 1], [8] * 4, [2, 2, 2, 2.1])
    assert wide is not None and narrow is not None and wide.confidence == 0.9875
    assert wide.low < narrow.low < narrow.high < wide.high


def test_too_few_prompts_says_how_many_are_needed() -> None:
    assert too_few_prompts(1) == "n = 1; an interval needs at least 2 prompts"
