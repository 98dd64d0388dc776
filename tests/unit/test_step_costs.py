"""The per-step cost model: known costs recovered from synthetic rounds, the table rule."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from orchestrator.analysis.costs.model import CostModelError
from orchestrator.analysis.costs.step_costs import (
    RoundObservation,
    SampleObservation,
    StepCostFit,
    StepDemands,
    fit_step_costs,
)
from orchestrator.analysis.costs.validation import policy_demands, round_contexts
from orchestrator.analysis.metrics import widen
from orchestrator.analysis.stats import Interval

T_DRAFT, T_FEATURE, T_ASK, DRAFT_PER_CONTEXT = 4e-3, 1.2e-3, 0.5e-3, 2e-6
VERIFY = {0: 0.040, 3: 0.060, 7: 0.075, 16: 0.120}
VERIFY_PER_CONTEXT = 1e-5
OVERHEAD, OVERHEAD_PER_TOKEN = 0.05, 3e-3


def _synthetic(rng: np.random.Generator, noise: float) -> tuple[list, list]:
    """Return rounds and samples timed by the known costs above, plus Gaussian noise."""
    demands = [StepDemands(), StepDemands(asks=True), StepDemands(features=True, asks=True)]
    rounds = []
    for _ in range(600):
        size = int(rng.choice(list(VERIFY)))
        chosen = demands[int(rng.integers(3))]
        forwards = size if size else int(rng.integers(0, 2))
        context = int(rng.integers(50, 400))
        step = T_DRAFT + T_FEATURE * chosen.features + T_ASK * chosen.asks
        draft = forwards * (step + DRAFT_PER_CONTEXT * context)
        verify = VERIFY[size] + VERIFY_PER_CONTEXT * context
        rounds.append(
            RoundObservation(
                size,
                forwards,
                context,
                chosen,
                draft + rng.normal(0, noise),
                verify + rng.normal(0, noise),
            )
        )
    lengths = rng.integers(40, 300, size=40)
    samples = [
        SampleObservation(int(n), OVERHEAD + OVERHEAD_PER_TOKEN * n + rng.normal(0, noise))
        for n in lengths
    ]
    return rounds, samples


def test_fit_recovers_known_costs_per_size_context_feature_and_overhead() -> None:
    rounds, samples = _synthetic(np.random.default_rng(0), noise=1e-4)
    fit = fit_step_costs(rounds, samples)
    assert fit.t_draft == pytest.approx(T_DRAFT, rel=0.02)
    assert fit.t_feature == pytest.approx(T_FEATURE, rel=0.05)
    assert fit.t_ask == pytest.approx(T_ASK, rel=0.1)
    assert fit.draft_per_context == pytest.approx(DRAFT_PER_CONTEXT, rel=0.05)
    assert dict(fit.verify_table) == pytest.approx(VERIFY, rel=0.01)
    assert fit.verify_per_context == pytest.approx(VERIFY_PER_CONTEXT, rel=0.05)
    assert fit.overhead == pytest.approx(OVERHEAD, abs=1e-3)
    assert fit.overhead_per_prompt_token == pytest.approx(OVERHEAD_PER_TOKEN, rel=0.01)
    assert fit.unidentified == ()


def test_terms_no_round_determines_are_zero_and_named() -> None:
    rng = np.random.default_rng(1)
    rounds, samples = _synthetic(rng, noise=0.0)
    plain = [
        RoundObservation(r.drafted, r.draft_forwards, r.context, StepDemands(), 0.004, 0.05)
        for r in rounds
    ]
    same_prompt = [SampleObservation(100, 0.3) for _ in samples]
    fit = fit_step_costs(plain, same_prompt)
    assert (fit.t_feature, fit.t_ask) == (0.0, 0.0)
    assert {"t_feature", "t_ask", "overhead_per_prompt_token"} <= set(fit.unidentified)
    assert fit.overhead == pytest.approx(0.3)


def _table_fit(table: tuple[tuple[int, float], ...]) -> StepCostFit:
    return StepCostFit(
        t_draft=0.0,
        t_feature=0.0,
        t_ask=0.0,
        draft_per_context=0.0,
        verify_table=table,
        verify_per_context=0.0,
        overhead=0.0,
        overhead_per_prompt_token=0.0,
        r2_draft=1.0,
        r2_verify=1.0,
        n_rounds=0,
        n_samples=0,
    )


def test_sizes_beyond_the_table_take_the_nearest_measured_cost_never_a_slope() -> None:
    fit = _table_fit(((0, 0.040), (1, 0.050), (3, 0.060)))
    assert fit.block_seconds(16) == pytest.approx(0.060)
    assert fit.block_seconds(2) == pytest.approx(0.055)
    assert fit.block_seconds(3) == pytest.approx(0.060)


def test_sizes_with_too_few_rounds_stay_out_of_the_table() -> None:
    rounds, samples = _synthetic(np.random.default_rng(2), noise=0.0)
    rare = [RoundObservation(11, 11, 100, StepDemands(), 0.044, 0.5) for _ in range(2)]
    fit = fit_step_costs(rounds + rare, samples)
    assert 11 not in dict(fit.verify_table)
    assert fit.block_seconds(11) == pytest.approx(
        float(np.interp(11, [7, 16], [VERIFY[7], VERIFY[16]])), rel=0.01
    )


def test_no_draft_forward_is_refused() -> None:
    rounds = [RoundObservation(0, 0, 10, StepDemands(), 0.0, 0.04) for _ in range(5)]
    with pytest.raises(CostModelError, match="t_draft"):
        fit_step_costs(rounds, [SampleObservation(10, 0.1)])


def test_a_replayed_interval_widens_by_the_out_of_sample_error() -> None:

    interval = Interval(estimate=10.0, low=9.0, high=11.0, n=6)
    widened = widen(interval, 0.02)
    assert widened is not None
    assert (widened.estimate, widened.low, widened.high) == pytest.approx((10.0, 8.82, 11.22))
    assert widen(interval, None) == interval


def test_a_round_context_counts_the_prompt_and_every_token_emitted_before_it() -> None:
    rounds = [SimpleNamespace(accepted=a) for a in (2, 0, 3)]
    assert round_contexts(10, rounds) == [10, 13, 14]


def test_feature_and_decision_costs_are_charged_to_the_policies_that_ask() -> None:
    assert policy_demands("static", 4, {}) == StepDemands()
    assert policy_demands("hf_heuristic", 4, {}) == StepDemands()
    assert policy_demands("beta_ts", 4, {}) == StepDemands(asks=True)
    assert policy_demands("svip", 4, {}) == StepDemands(features=True, asks=True)
    assert policy_demands("ar", 0, {}) == StepDemands()


def test_a_policy_its_stored_parameters_no_longer_build_is_charged_a_decision() -> None:
    assert policy_demands("svip", 4, {"retired_knob": 1}) == StepDemands(asks=True)


def _target_steps(n: int, seconds: float) -> list[RoundObservation]:
    """Return ``n`` AR baseline steps of ``seconds`` each (no draft forward, context 100)."""
    return [RoundObservation(0, 0, 100, StepDemands(), 0.0, seconds, True) for _ in range(n)]


def test_the_ar_baselines_steps_are_a_class_apart_from_speculative_size_0_rounds() -> None:
    """An AR step runs inside the target worker; a speculative round that keeps no candidate
    pays its own call: the fit keeps both costs, and projects each round by its own."""
    rounds, samples = _synthetic(np.random.default_rng(2), noise=0.0)
    fit = fit_step_costs([*rounds, *_target_steps(200, 0.030)], samples)
    assert dict(fit.verify_table)[0] == pytest.approx(VERIFY[0])
    assert fit.t_target_step == pytest.approx(0.030 - VERIFY_PER_CONTEXT * 100)
    assert fit.verify_seconds(0, 100, target_only=True) == pytest.approx(0.030)
    assert fit.verify_seconds(0, 100) == pytest.approx(VERIFY[0] + VERIFY_PER_CONTEXT * 100)


def test_the_ar_step_stands_in_for_size_0_only_where_no_speculative_round_kept_none() -> None:
    rounds, samples = _synthetic(np.random.default_rng(3), noise=0.0)
    speculative = [r for r in rounds if r.drafted > 0]
    fit = fit_step_costs([*speculative, *_target_steps(50, 0.030)], samples)
    assert dict(fit.verify_table)[0] == pytest.approx(fit.t_target_step)
    alone = fit_step_costs(speculative, samples)
    assert alone.t_target_step is None and 0 not in dict(alone.verify_table)
