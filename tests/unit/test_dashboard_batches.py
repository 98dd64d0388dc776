"""The batch-size page's data: each policy's best speedup per batch size (the crossover) and
the throughput/latency points, from trials measured at several batch sizes."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dashboard import batches, charts, data


def _trials() -> pd.DataFrame:
    """Static K 2 and 4 and the AR baseline at batch sizes 1 and 4, two seeds each."""
    rows = []
    speedups = {(1, 2): 1.5, (1, 4): 1.8, (4, 2): 1.1, (4, 4): 0.7}
    for seed in (0, 1):
        for batch in (1, 4):
            rows.append(("ar", 0, batch, seed, 1.0, 10.0, 10.0 * batch))
            for k in (2, 4):
                s = speedups[(batch, k)] + 0.1 * seed
                rows.append(("static", k, batch, seed, s, 10.0 * s, 10.0 * s * batch * 0.9))
    records = []
    for index, (policy, k, batch, seed, speedup, per_seq, total) in enumerate(rows):
        record = dict.fromkeys(data.TRIAL_COLUMNS)
        record.update(
            trial_id=f"t{index}",
            pair="p",
            dataset="code",
            temperature=0.0,
            policy=policy,
            threshold=math.nan,
            max_draft_len=k,
            seed=seed,
            batch_size=batch,
            is_baseline=policy == "ar",
            status="done",
            speedup=speedup,
            decode_speedup=speedup,
            tokens_per_s=per_seq,
            total_tokens_per_s=total,
        )
        records.append(record)
    return pd.DataFrame(records, columns=list(data.TRIAL_COLUMNS))


def test_batches_are_noticed_only_above_one() -> None:
    trials = _trials()
    assert batches.has_batches(trials)
    assert not batches.has_batches(trials[trials["batch_size"] == 1])


def test_each_policy_has_its_best_setting_per_batch_size() -> None:
    best = batches.speedup_by_batch(_trials(), "decode_speedup")
    assert list(best["batch_size"]) == [1, 4]
    assert list(best["max_draft_len"]) == [4, 2]  # K shrinks as the batch grows
    assert list(best["decode_speedup"]) == [pytest.approx(1.85), pytest.approx(1.15)]
    assert list(best["n_trials"]) == [2, 2]
    figure = charts.batch_speedup_figure(best, "decode_speedup", "decode-only")
    assert [shape["y0"] for shape in figure.layout.shapes] == [1.0]
    assert figure.layout.xaxis.type == "log"


def test_the_frontier_has_a_point_per_setting_and_batch_size() -> None:
    points = batches.batch_frontier(_trials())
    assert len(points) == 3 * 2
    ar = points[points["policy"] == "ar"]
    assert list(ar["batch_size"]) == [1, 4]
    assert list(ar["total_tokens_per_s"]) == [pytest.approx(10.0), pytest.approx(40.0)]
    assert set(points["setting"]) == {"ar K 0 (p)", "static K 2 (p)", "static K 4 (p)"}
    figure = charts.throughput_latency_figure(points)
    assert {trace.name for trace in figure.data} == {"ar", "static"}


def test_the_batch_filter_keeps_one_batch_size() -> None:
    kept = data.apply_filters(_trials(), data.TrialFilters(batch_sizes=(4,)))
    assert set(kept["batch_size"]) == {4}
    assert data.filter_options(_trials())["batch_sizes"] == [1, 4]
