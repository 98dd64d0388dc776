"""Trial metrics against values computed by hand from hand-made rounds."""

from __future__ import annotations

import math

import pytest

from orchestrator.analysis.metrics import (
    accepted_length_histogram,
    draft_length_histogram,
    eesd_harmonic_mean,
    speedup,
    trial_metrics,
)
from workers.records import GenerationResult, RoundRecord


def _round(drafted: int, accepted: int, forwards: int | None = None) -> RoundRecord:
    return RoundRecord(
        drafted=drafted,
        accepted=accepted,
        bonus=accepted == drafted and drafted > 0,
        draft_forwards=drafted if forwards is None else forwards,
        draft_seconds=0.01 * drafted,
        verify_seconds=0.1,
    )


def _speculative_results() -> list[GenerationResult]:
    # Sample A emits 5 + 2 + 3 = 10 tokens in 2 s; sample B emits 1 + 1 + 3 = 5 tokens in 3 s.
    sample_a = GenerationResult(
        prompt_ids=[1, 2, 3],
        output_ids=list(range(10)),
        rounds=[_round(4, 4), _round(4, 1, forwards=5), _round(2, 2, forwards=3)],
        seconds=2.0,
    )
    sample_b = GenerationResult(
        prompt_ids=[4, 5],
        output_ids=list(range(5)),
        rounds=[_round(3, 0), _round(0, 0, forwards=1), _round(5, 2)],
        seconds=3.0,
    )
    return [sample_a, sample_b]


def test_trial_metrics_match_hand_computation() -> None:
    metrics = trial_metrics(_speculative_results())
    # drafted 4+4+2+3+0+5 = 18, accepted 4+1+2+0+0+2 = 9, 6 rounds, 15 tokens, 5 s.
    assert metrics.n_samples == 2
    assert metrics.generated_tokens == 15
    assert metrics.seconds == pytest.approx(5.0)
    assert metrics.n_rounds == 6
    assert metrics.n_drafted == 18
    assert metrics.n_accepted == 9
    assert metrics.n_draft_forwards == 4 + 5 + 3 + 3 + 1 + 5
    assert metrics.tokens_per_s == pytest.approx(15 / 5)
    assert metrics.acceptance_rate == pytest.approx(9 / 18)
    assert metrics.mean_accepted == pytest.approx(9 / 6)
    assert metrics.mean_drafted == pytest.approx(18 / 6)
    assert metrics.discard_rate == pytest.approx((18 - 9) / 15)
    assert metrics.verification_rate == pytest.approx(6 / 15)
    assert metrics.draft_seconds == pytest.approx(0.01 * 18)
    assert metrics.verify_seconds == pytest.approx(0.1 * 6)
    # HM with v = 0.5, r = 0.6: 2·0.3 / 1.1 = 6/11.
    assert metrics.eesd_hm == pytest.approx(6 / 11)


def test_tokens_per_s_pools_samples_rather_than_averaging_rates() -> None:
    metrics = trial_metrics(_speculative_results())
    mean_of_rates = (10 / 2 + 5 / 3) / 2
    assert metrics.tokens_per_s == pytest.approx(3.0)
    assert not math.isclose(metrics.tokens_per_s, mean_of_rates)


def test_histograms_count_rounds_per_length() -> None:
    results = _speculative_results()
    assert draft_length_histogram(results) == {0: 1, 2: 1, 3: 1, 4: 2, 5: 1}
    assert accepted_length_histogram(results) == {0: 2, 1: 1, 2: 2, 4: 1}
    assert list(draft_length_histogram(results)) == [0, 2, 3, 4, 5]
    metrics = trial_metrics(results)
    assert sum(metrics.draft_length_histogram.values()) == metrics.n_rounds


def test_autoregressive_baseline_has_no_acceptance() -> None:
    baseline = GenerationResult(
        prompt_ids=[1],
        output_ids=[7, 8, 9, 10],
        rounds=[_round(0, 0, forwards=0) for _ in range(4)],
        seconds=2.0,
    )
    metrics = trial_metrics([baseline])
    assert metrics.tokens_per_s == pytest.approx(2.0)
    assert metrics.acceptance_rate is None
    assert metrics.eesd_hm is None
    assert metrics.mean_accepted == 0.0
    assert metrics.discard_rate == 0.0
    assert metrics.verification_rate == pytest.approx(1.0)


def test_zero_time_gives_no_rate_and_empty_input_is_an_error() -> None:
    result = GenerationResult(prompt_ids=[1], output_ids=[2], rounds=[_round(1, 0)], seconds=0.0)
    assert trial_metrics([result]).tokens_per_s is None
    with pytest.raises(ValueError):
        trial_metrics([])


def test_speedup() -> None:
    assert speedup(3.0, 2.0) == pytest.approx(1.5)
    assert speedup(None, 2.0) is None
    assert speedup(3.0, None) is None
    assert speedup(3.0, 0.0) is None


def test_eesd_harmonic_mean() -> None:
    # v = 3/4, r = 3/6: HM = 2·(3/4)(1/2)/(3/4 + 1/2) = 0.75/1.25 = 0.6.
    assert eesd_harmonic_mean(accepted=3, drafted=4, generated=6) == pytest.approx(0.6)
    assert eesd_harmonic_mean(accepted=0, drafted=4, generated=6) == 0.0
    assert eesd_harmonic_mean(accepted=0, drafted=0, generated=6) is None
