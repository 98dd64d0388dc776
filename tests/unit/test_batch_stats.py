"""Batch statistics: each request's share of the batch's wall time, and a trial's total
tokens/s (throughput) beside its per-sequence tokens/s, with intervals over prompts."""

from __future__ import annotations

import pytest

from orchestrator.analysis.metrics import SampleCounts, per_prompt, trial_intervals, trial_metrics
from orchestrator.analysis.stats import ratio_interval
from workers.batch_time import time_shares
from workers.records import GenerationResult, RoundRecord, result_from_json, result_to_json


def test_a_span_alone_is_its_own_length_and_overlaps_are_split_evenly() -> None:
    assert time_shares([(1.0, 4.0)]) == [pytest.approx(3.0)]
    # 0-2: A alone; 2-4: A and B; 4-5: B alone; 6-7: C alone (a gap before it)
    shares = time_shares([(0.0, 4.0), (2.0, 5.0), (6.0, 7.0)])
    assert shares == [pytest.approx(3.0), pytest.approx(2.0), pytest.approx(1.0)]
    assert sum(shares) == pytest.approx(6.0)  # the time covered, the gap left out


def test_shares_of_a_full_batch_sum_to_its_wall_time() -> None:
    spans = [(0.0, 10.0), (0.0, 3.0), (3.0, 7.0), (7.0, 10.0), (0.5, 9.0)]
    shares = time_shares(spans)
    assert sum(shares) == pytest.approx(10.0)
    assert shares[0] == pytest.approx(0.5 / 2 + 2.5 / 3 + 4 / 3 + 2 / 3 + 1 / 2)


def test_a_span_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(ValueError, match="ends before it starts"):
        time_shares([(2.0, 1.0)])


def _result(tokens: int, seconds: float, batch_seconds: float | None) -> GenerationResult:
    rounds = [RoundRecord(0, 0, False, 0, 0.0, seconds / tokens)] * tokens
    return GenerationResult(
        prompt_ids=[1, 2],
        output_ids=list(range(tokens)),
        rounds=rounds,
        seconds=seconds,
        prefill_seconds=0.1,
        decode_seconds=seconds - 0.1,
        batch_seconds=batch_seconds,
    )


def test_total_tokens_per_s_divides_by_the_shares_and_per_sequence_by_each_time() -> None:
    results = [_result(10, 4.0, 1.5), _result(20, 5.0, 2.0), _result(6, 2.0, 1.0)]
    metrics = trial_metrics(results)
    assert metrics.tokens_per_s == pytest.approx(36 / 11.0)  # per sequence: waiting included
    assert metrics.total_tokens_per_s == pytest.approx(36 / 4.5)  # the batch's throughput
    interval = metrics.total_tokens_per_s_interval
    assert interval is not None and interval.n == 3
    assert interval == ratio_interval([10, 20, 6], [1.5, 2.0, 1.0])
    assert interval.low < metrics.total_tokens_per_s < interval.high


def test_a_trial_decoded_alone_has_total_equal_to_per_sequence_tokens_per_s() -> None:
    metrics = trial_metrics([_result(10, 4.0, None), _result(20, 5.0, None)])
    assert metrics.total_tokens_per_s == pytest.approx(metrics.tokens_per_s)
    assert metrics.total_tokens_per_s_interval == metrics.tokens_per_s_interval


def test_repeats_of_a_prompt_sum_their_shares_before_the_interval() -> None:
    counts = [
        SampleCounts(10, 4.0, 0, 0, 10, 3.9, 1.0),
        SampleCounts(12, 4.0, 0, 0, 12, 3.9, 2.0),
        SampleCounts(8, 3.0, 0, 0, 8, 2.9, None),
    ]
    summed = per_prompt(counts, [0, 0, 1])
    assert [c.share_seconds for c in summed] == [pytest.approx(3.0), pytest.approx(3.0)]
    assert trial_intervals(summed).total_tokens_per_s == ratio_interval([22, 8], [3.0, 3.0])


def test_the_share_survives_the_shard_json_and_is_absent_for_batch_one() -> None:
    batched, alone = _result(3, 1.0, 0.4), _result(3, 1.0, None)
    assert result_from_json(result_to_json(batched)).batch_seconds == 0.4
    assert "batch_seconds" not in result_to_json(alone)
    assert result_from_json(result_to_json(alone)).batch_seconds is None
