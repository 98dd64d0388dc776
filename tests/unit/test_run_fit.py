"""The run-level (SpecDec++) fit beside the round-level one
(orchestrator/analysis/costs/run_fit.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from orchestrator.analysis.costs.model import CostModelError, RoundCostFit
from orchestrator.analysis.costs.run_fit import TrialCounts, compare_fits, mean_relative_error

ROUND_FIT = RoundCostFit(
    t_draft=0.002,
    t_target=0.010,
    t_per_verified=0.001,
    r2_draft=1.0,
    r2_verify=1.0,
    r2_round=1.0,
    n_rounds=100,
)


def _trials(
    seconds_of: Callable[[TrialCounts], float], rng: np.random.Generator
) -> list[TrialCounts]:
    trials = [TrialCounts(0, 64, 0, 2, 64, 0.0)]  # the AR baseline: one target call per token
    for k in (2, 4, 6, 8):
        rounds = int(64 / (1 + 0.6 * k)) + int(rng.integers(0, 3))
        forwards = rounds * k
        counts = TrialCounts(forwards, rounds, forwards, 2, 64, 0.0)
        trials.append(counts)
    return [
        TrialCounts(t.draft_forwards, t.rounds, t.drafted, t.samples, t.tokens, seconds_of(t))
        for t in trials
    ]


def test_run_fit_recovers_run_level_costs_and_wins_on_its_own_data() -> None:
    trials = _trials(lambda t: 0.003 * t.draft_forwards + 0.02 * t.rounds, np.random.default_rng(0))
    comparison = compare_fits(ROUND_FIT, 0.0, trials)
    assert comparison.run_t_draft == pytest.approx(0.003)
    assert comparison.run_t_target == pytest.approx(0.02)
    assert comparison.run_r2 == pytest.approx(1.0)
    assert comparison.run_mre == pytest.approx(0.0, abs=1e-9)
    assert comparison.round_trial_mre > 0.1
    assert comparison.projection_fit == "run"
    assert comparison.columns()["projection_fit"] == "run"


def test_round_fit_wins_when_time_grows_with_the_block() -> None:
    def seconds(t: TrialCounts) -> float:
        return 0.002 * t.draft_forwards + 0.010 * t.rounds + 0.001 * t.drafted + 0.05 * t.samples

    comparison = compare_fits(ROUND_FIT, 0.05, _trials(seconds, np.random.default_rng(1)))
    assert comparison.round_trial_mre == pytest.approx(0.0, abs=1e-9)
    assert comparison.round_trial_r2 == pytest.approx(1.0)
    assert comparison.run_mre > 0.0
    assert comparison.projection_fit == "round"


def test_an_exactly_determined_run_fit_does_not_project() -> None:
    # Two trials (a replay group's AR baseline and live check): the run-level fit matches both
    # exactly even though the seconds grow with the block, as only the round fit models.
    def seconds(t: TrialCounts) -> float:
        return 0.002 * t.draft_forwards + 0.010 * t.rounds + 0.004 * t.drafted + 0.05 * t.samples

    two = _trials(seconds, np.random.default_rng(2))[:2]
    comparison = compare_fits(ROUND_FIT, 0.05, two)
    assert comparison.run_mre == pytest.approx(0.0, abs=1e-9)
    assert comparison.round_trial_mre > 0.0
    assert comparison.projection_fit == "round"
    three = _trials(seconds, np.random.default_rng(2))[:3]
    assert compare_fits(ROUND_FIT, 0.05, three).projection_fit == "run"


def test_compare_fits_needs_separable_trials() -> None:
    one = [TrialCounts(8, 4, 8, 1, 12, 0.1), TrialCounts(16, 8, 16, 1, 24, 0.2)]
    with pytest.raises(CostModelError, match="proportional"):
        compare_fits(ROUND_FIT, 0.0, one)


def test_mean_relative_error() -> None:
    assert mean_relative_error([1.0, 2.0], [1.1, 1.0]) == pytest.approx((0.1 + 0.5) / 2)
