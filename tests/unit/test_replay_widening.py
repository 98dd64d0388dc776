"""A replayed trial's intervals are widened by its cost fit's out-of-sample error, and stay so.

Tokens/s (end to end and decode-only) and the speedups over the live AR baseline (both) are
widened when the runner stores the trial, and ``refresh-stats`` (``Store.refresh_statistics``)
recomputes the same widened intervals. Real SQLite, and PostgreSQL when
``SPECSWEEP_TEST_PG_URL`` is set.
"""

from __future__ import annotations

import dataclasses

import pytest
from support import store_db

from orchestrator.analysis.metrics import SampleCounts, trial_intervals, trial_metrics, widen
from orchestrator.analysis.pairing import SampleSpeed, decode_speeds, paired_ratio
from orchestrator.store import Store
from workers.records import GenerationResult, RoundRecord

db_url = store_db.db_url
store = store_db.store

ERROR = 0.1
#: One prompt set of five prompts: a replayed trial has one sample per prompt.
SWEEP = """\
name: widening
pairs:
  - name: demo
    target: zoo:micro/target
    draft: zoo:micro/draft-s
datasets: [{name: "builtin:code", samples: 5, max_new_tokens: 8}]
temperatures: [0]
policies: [{name: static}]
max_draft_lens: [4]
"""
FIGURES = ("tokens_per_s", "decode_tokens_per_s", "speedup", "decode_speedup")


def _results(seconds: list[float], drafted: int, prompts: int = 5) -> list[GenerationResult]:
    """One sample per entry (sample i of prompt i % ``prompts``): 8 tokens, two rounds, a fifth
    of it prefill."""
    return [
        GenerationResult(
            prompt_ids=[100 + i % prompts, 1, 2],
            output_ids=list(range(8)),
            rounds=[RoundRecord(drafted, drafted // 2, False, drafted, 0.001, 0.002)] * 2,
            seconds=s,
            prefill_seconds=s / 5,
            decode_seconds=s - s / 5,
        )
        for i, s in enumerate(seconds)
    ]


def _bounds(store: Store, trial_id: str) -> dict[str, float]:
    row = store.trial_rows([trial_id])[0]
    return {f"{f}_{end}": getattr(row, f"{f}_{end}") for f in FIGURES for end in ("low", "high")}


def _speeds(results: list[GenerationResult]) -> list[SampleSpeed]:
    return [
        SampleSpeed(str(i), i, r.n_generated, r.seconds, r.decode_seconds)
        for i, r in enumerate(results)
    ]


def test_a_replayed_trials_four_intervals_are_widened_and_survive_refresh(store: Store) -> None:
    spec, plan = store_db.spec_and_plan(SWEEP)
    store.register_sweep(spec, plan)
    baseline = next(t for t in plan.trials if t.is_baseline)
    trial = dataclasses.replace(
        next(t for t in plan.trials if t.baseline_id == baseline.trial_id), mode="replay"
    )
    base = _results([1.0, 2.0, 4.0, 0.5, 1.5], 0)
    replayed = _results([0.5, 1.2, 1.9, 0.3, 0.9], 4)
    store.record_trial(baseline, base, trial_metrics(base))
    store.record_trial(trial, replayed, trial_metrics(replayed, cost_model_error=ERROR))
    counts = [
        SampleCounts(8, r.seconds, r.n_drafted, r.n_accepted, 2, r.decode_seconds) for r in replayed
    ]
    plain = trial_intervals(counts)
    expected = {
        "tokens_per_s": widen(plain.tokens_per_s, ERROR),
        "decode_tokens_per_s": widen(plain.decode_tokens_per_s, ERROR),
        "speedup": widen(paired_ratio(_speeds(replayed), _speeds(base)).ratio, ERROR),
        "decode_speedup": widen(
            paired_ratio(decode_speeds(_speeds(replayed)), decode_speeds(_speeds(base))).ratio,
            ERROR,
        ),
    }
    wanted = {
        f"{f}_{end}": getattr(i, end) for f, i in expected.items() if i for end in ("low", "high")
    }
    assert len(wanted) == 2 * len(FIGURES)
    assert _bounds(store, trial.trial_id) == pytest.approx(wanted)
    assert store.refresh_statistics() == 2
    assert _bounds(store, trial.trial_id) == pytest.approx(wanted)
    # the live baseline is not widened: its tokens/s interval is its prompts' alone
    row = store.trial_rows([baseline.trial_id])[0]
    plain_base = trial_intervals(
        [SampleCounts(8, r.seconds, 0, 0, 2, r.decode_seconds) for r in base]
    ).tokens_per_s
    assert (row.tokens_per_s_low, row.tokens_per_s_high) == pytest.approx(
        (plain_base.low, plain_base.high)
    )


def test_refresh_sums_repeats_within_their_prompt_as_the_runner_does(store: Store) -> None:
    spec, plan = store_db.spec_and_plan(SWEEP)
    store.register_sweep(spec, plan)
    trial = next(t for t in plan.trials if t.is_baseline)
    prompts = trial.prompts.samples
    # two repeats of each of the five prompts (sample r * 5 + i is repeat r of prompt i)
    results = _results([1.0, 2.0, 1.5, 3.0, 0.7, 1.1, 2.4, 1.2, 2.6, 0.9], 0)
    blocks = [index % prompts for index in range(len(results))]
    store.record_trial(trial, results, trial_metrics(results, blocks))
    before = _bounds(store, trial.trial_id)["tokens_per_s_low"]
    assert before is not None
    store.refresh_statistics()
    assert _bounds(store, trial.trial_id)["tokens_per_s_low"] == pytest.approx(before)
