"""Intervals, per-sample speedups, per-position acceptance and runs in the real store.

SQLite per test, and PostgreSQL too when ``SPECSWEEP_TEST_PG_URL`` is set (fixtures shared with
``tests/support/store_db.py``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from support import store_db

from orchestrator.analysis.metrics import trial_metrics
from orchestrator.analysis.pairing import SampleSpeed, paired_ratio
from orchestrator.analysis.stats import paired_speed_ratio
from orchestrator.run.provenance import collect_provenance, worker_torch_threads
from orchestrator.store import Store
from orchestrator.store.provenance_record import Provenance, provenance_note
from orchestrator.sweep.planner import Trial
from workers.records import GenerationResult, RoundRecord

db_url = store_db.db_url
store = store_db.store


def _samples(seconds: list[float], rounds: list[list[tuple[int, int]]]) -> list[GenerationResult]:
    """One sample per entry: prompt i, 8 tokens, the given (drafted, accepted) rounds."""
    return [
        GenerationResult(
            prompt_ids=[100 + i, 1, 2],
            output_ids=list(range(8)),
            rounds=[RoundRecord(d, a, d == a, d, 0.001, 0.002) for d, a in sample_rounds],
            seconds=s,
        )
        for i, (s, sample_rounds) in enumerate(zip(seconds, rounds, strict=True))
    ]


def _ar(seconds: list[float]) -> list[GenerationResult]:
    return _samples(seconds, [[(0, 0)] * 8 for _ in seconds])


def _trials(store: Store) -> tuple[Trial, Trial]:
    """Register the test sweep; return its first baseline and a trial measured against it."""
    spec, plan = store_db.spec_and_plan()
    store.register_sweep(spec, plan)
    baseline = next(t for t in plan.trials if t.is_baseline)
    trial = next(t for t in plan.trials if t.baseline_id == baseline.trial_id)
    return baseline, trial


SPEC_ROUNDS = [[(4, 4), (4, 1)], [(4, 2), (3, 0)], [(2, 2), (4, 3)], [(4, 4), (1, 1)]]


def test_intervals_and_sample_speedups_are_stored(store: Store) -> None:
    baseline, trial = _trials(store)
    base_seconds = [1.0, 2.0, 4.0, 0.5]
    spec_seconds = [0.5, 1.2, 1.9, 0.3]
    spec_results = _samples(spec_seconds, SPEC_ROUNDS)
    store.record_trial(trial, spec_results, trial_metrics(spec_results))
    row = store.trial_rows([trial.trial_id])[0]
    assert row.speedup is None and row.speedup_low is None  # baseline not done yet
    assert row.tokens_per_s_low <= row.tokens_per_s <= row.tokens_per_s_high
    assert row.acceptance_rate_low <= row.acceptance_rate <= row.acceptance_rate_high
    assert row.mean_accepted_low <= row.mean_accepted <= row.mean_accepted_high
    base_results = _ar(base_seconds)
    store.record_trial(baseline, base_results, trial_metrics(base_results))
    row = store.trial_rows([trial.trial_id])[0]
    expected = paired_speed_ratio([8] * 4, spec_seconds, [8] * 4, base_seconds)
    assert expected is not None
    assert row.speedup == pytest.approx(expected.estimate)
    assert (row.speedup_low, row.speedup_high) == pytest.approx((expected.low, expected.high))
    samples = store.sample_outputs(trial.trial_id)
    assert [s.speedup for s in samples] == pytest.approx(
        [b / s for s, b in zip(spec_seconds, base_seconds, strict=True)]
    )
    assert [s.tokens_per_s for s in samples] == pytest.approx([8 / s for s in spec_seconds])
    base_row = store.trial_rows([baseline.trial_id])[0]
    assert base_row.speedup == 1.0 and base_row.acceptance_rate_low is None


def _split(results: list[GenerationResult], prefill: list[float]) -> list[GenerationResult]:
    """The results with their seconds split: ``prefill[i]`` of sample i, the rest decode."""
    return [
        dataclasses.replace(r, prefill_seconds=p, decode_seconds=r.seconds - p)
        for r, p in zip(results, prefill, strict=True)
    ]


def test_decode_only_and_end_to_end_speedups_are_stored_apart(store: Store) -> None:
    """Prefill weighs on AR's end-to-end time here: decode-only speedups are larger, and each
    is the paired ratio of its own seconds; a trial stored without the split has none."""
    baseline, trial = _trials(store)
    base_seconds, spec_seconds = [1.0, 2.0, 4.0, 0.5], [0.5, 1.2, 1.9, 0.3]
    prefill = [0.2, 0.4, 0.3, 0.1]
    base_results = _split(_ar(base_seconds), prefill)
    spec_results = _split(_samples(spec_seconds, SPEC_ROUNDS), prefill)
    store.record_trial(baseline, base_results, trial_metrics(base_results))
    store.record_trial(trial, spec_results, trial_metrics(spec_results))
    row = store.trial_rows([trial.trial_id])[0]
    decode = [s - p for s, p in zip(spec_seconds, prefill, strict=True)]
    base_decode = [s - p for s, p in zip(base_seconds, prefill, strict=True)]
    expected = paired_speed_ratio([8] * 4, decode, [8] * 4, base_decode)
    assert expected is not None
    assert row.decode_speedup == pytest.approx(expected.estimate)
    assert (row.decode_speedup_low, row.decode_speedup_high) == pytest.approx(
        (expected.low, expected.high)
    )
    assert row.decode_tokens_per_s == pytest.approx(32 / sum(decode))
    assert row.decode_tokens_per_s_low <= row.decode_tokens_per_s <= row.decode_tokens_per_s_high
    assert row.prefill_seconds == pytest.approx(sum(prefill))
    assert row.speedup == pytest.approx(sum(base_seconds) / sum(spec_seconds))
    assert row.decode_speedup > row.speedup
    samples = store.sample_outputs(trial.trial_id)
    assert [s.decode_tokens_per_s for s in samples] == pytest.approx([8 / d for d in decode])
    assert [s.decode_speedup for s in samples] == pytest.approx(
        [b / d for d, b in zip(decode, base_decode, strict=True)]
    )
    _, plan = store_db.spec_and_plan()
    older = next(
        t
        for t in plan.trials
        if t.baseline_id == baseline.trial_id and t.trial_id != trial.trial_id
    )
    unsplit = _samples(spec_seconds, SPEC_ROUNDS)
    store.record_trial(older, unsplit, trial_metrics(unsplit))
    row = store.trial_rows([older.trial_id])[0]
    assert row.decode_speedup is None and row.decode_tokens_per_s is None
    assert row.decode_speedup_low is None and row.speedup is not None


def test_position_acceptance_and_accepted_lengths_are_queryable(store: Store) -> None:
    _baseline, trial = _trials(store)
    results = _samples([1.0] * 4, SPEC_ROUNDS)
    store.record_trial(trial, results, trial_metrics(results))
    positions = store.position_acceptance([trial.trial_id])
    # rounds drafting >= i: i=1: 8, i=2: 7, i=3: 6, i=4: 5; accepting >= i: 7, 5, 3, 2
    columns = ["position", "drafted", "accepted"]
    assert list(positions[columns].itertuples(index=False, name=None)) == [
        (1, 8, 7),
        (2, 7, 5),
        (3, 6, 3),
        (4, 5, 2),
    ]
    assert positions["rate"][2] == pytest.approx(0.5)
    lengths = dict(store.accepted_lengths([trial.trial_id])[["length", "rounds"]].values.tolist())
    assert lengths == {0: 1, 1: 2, 2: 2, 3: 1, 4: 2}


def test_runs_are_recorded_and_trials_point_to_them(store: Store) -> None:
    _baseline, trial = _trials(store)
    provenance = collect_provenance()
    run_id = store.record_run("store", provenance)
    results = _samples([1.0] * 4, SPEC_ROUNDS)
    store.record_trial(trial, results, trial_metrics(results))
    assert store.trial_rows([trial.trial_id])[0].run_id == run_id
    (run,) = store.runs([run_id])
    assert run.cpu == provenance.cpu and run.torch_version == provenance.torch_version
    assert run.fingerprint == provenance.fingerprint()
    assert provenance_note({run_id: run}, {run_id: 1}, provenance) == []
    moved = dataclasses.replace(provenance, commit="0" * 40, torch_threads=99)
    (line,) = provenance_note({run_id: run}, {run_id: 1}, moved)
    assert "1 done trial(s) kept from run" in line and "torch_threads" in line
    assert "commit" in line and "cpu" not in line


def test_an_unknown_dirtiness_is_named_so(store: Store) -> None:
    clean = dataclasses.replace(collect_provenance(), dirty=False)
    run_id = store.record_run("store", clean)
    (run,) = store.runs([run_id])
    (line,) = provenance_note({run_id: run}, {run_id: 1}, dataclasses.replace(clean, dirty=None))
    assert line.endswith("different provenance: dirty False → unknown")


def test_collect_provenance_reads_this_process() -> None:
    import importlib.metadata

    import torch

    provenance = collect_provenance()
    assert isinstance(provenance, Provenance)
    assert provenance.torch_version == importlib.metadata.version("torch")
    # the workers' threads (checked against a real actor in test_cli_stats), not this driver's
    assert provenance.torch_threads == worker_torch_threads()
    assert provenance.gpu_count == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert provenance.commit is None or len(provenance.commit) == 40


def test_paired_ratio_pairs_on_prompts_and_refuses_disjoint_ones() -> None:
    rng = np.random.default_rng(0)
    seconds = rng.uniform(0.5, 2.0, 6)
    a = [SampleSpeed(f"p{i}", i, 10, s / 2) for i, s in enumerate(seconds)]
    b = [SampleSpeed(f"p{i}", 5 - i, 10, s) for i, s in reversed(list(enumerate(seconds)))]
    compared = paired_ratio(a, b)
    assert compared.n_prompts == 6 and compared.ratio is not None
    assert compared.ratio.estimate == pytest.approx(2.0)
    assert compared.verdict == "faster"
    other = [SampleSpeed(f"q{i}", i, 10, 1.0) for i in range(6)]
    disjoint = paired_ratio(a, other)
    assert disjoint.n_prompts == 0 and disjoint.ratio is None and disjoint.verdict is None


def test_refresh_statistics_rebuilds_what_an_old_store_lacks(store: Store) -> None:
    """Wipe what revision 0005 added, as for trials stored before it, and refresh it back."""
    baseline, trial = _trials(store)
    spec_results = _samples([0.5, 1.2, 1.9, 0.3], SPEC_ROUNDS)
    base_results = _ar([1.0, 2.0, 4.0, 0.5])
    store.record_trial(trial, spec_results, trial_metrics(spec_results))
    store.record_trial(baseline, base_results, trial_metrics(base_results))
    ids = [trial.trial_id, baseline.trial_id]
    before = (
        store.trial_rows(ids),
        store.sample_outputs(trial.trial_id),
        store.position_acceptance(ids),
        store.accepted_lengths(ids),
    )
    intervals = ", ".join(
        f"{name}_{end} = NULL"
        for name in ("tokens_per_s", "speedup", "acceptance_rate", "mean_accepted")
        for end in ("low", "high")
    )
    with store.engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE trials SET {intervals}")
        connection.exec_driver_sql("UPDATE sample_results SET tokens_per_s = NULL, speedup = NULL")
        connection.exec_driver_sql("DELETE FROM position_acceptance")
        connection.exec_driver_sql("DELETE FROM accepted_lengths")
    assert store.trial_rows(ids)[0].speedup_low is None
    assert store.refresh_statistics("store") == 2
    after = (
        store.trial_rows(ids),
        store.sample_outputs(trial.trial_id),
        store.position_acceptance(ids),
        store.accepted_lengths(ids),
    )
    assert after[:2] == before[:2]
    for stored, expected in zip(after[2:], before[2:], strict=True):
        pd.testing.assert_frame_equal(stored, expected)
