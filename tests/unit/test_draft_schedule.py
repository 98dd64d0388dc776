"""The best static K per batch size, and the schedules written for vLLM and TensorRT-LLM."""

from __future__ import annotations

import json

import pytest
import yaml
from support.store_records import stored_trial

from orchestrator.analysis.draft_schedule import (
    draft_schedules,
    schedule_snippet,
    trtllm_bounds,
    vllm_ranges,
)


def _static(batch: int, k: int, decode: float | None, **values):
    """A done static trial of pair p at ``batch`` and K ``k`` with its decode speedup."""
    defaults = {
        "trial_id": f"b{batch}k{k}",
        "pair": "p",
        "dataset": "code",
        "temperature": 0.0,
        "status": "done",
        "policy": "static",
        "batch_size": batch,
        "max_draft_len": k,
        "decode_speedup": decode,
        "decode_speedup_low": None if decode is None else decode - 0.1,
        "decode_speedup_high": None if decode is None else decode + 0.1,
        "speedup": None if decode is None else decode * 0.9,
    }
    return stored_trial(**{**defaults, **values})


TRIALS = [
    _static(1, 2, 1.4),
    _static(1, 4, 1.7),
    _static(4, 2, 1.2),
    _static(4, 4, 1.1),
    _static(16, 2, 0.8),
    _static(16, 4, 0.6),
    _static(4, 8, 3.0, status="failed"),
    _static(4, 8, 3.0, policy="svip"),
    stored_trial(trial_id="ar", pair="p", dataset="code", temperature=0.0, status="done",
                 policy="ar", batch_size=4, max_draft_len=0, decode_speedup=1.0),
]  # fmt: skip


def test_the_best_done_static_k_per_batch_size_and_off_where_none_pays() -> None:
    (schedule,) = draft_schedules(TRIALS)
    choices = {c.batch_size: (c.draft_len, c.speedup, c.trial_id) for c in schedule.choices}
    assert choices == {1: (4, 1.7, "b1k4"), 4: (2, 1.2, "b4k2"), 16: (0, 0.8, "b16k2")}
    first = schedule.choices[0]
    assert (first.low, first.high) == (pytest.approx(1.6), pytest.approx(1.8))
    assert first.figure == "decode_speedup"
    assert schedule.max_draft_len == 4 and schedule.speculates


def test_a_trial_without_decode_figures_makes_the_choice_end_to_end() -> None:
    rows = [_static(1, 2, 1.5), _static(1, 4, None, speedup=1.9, speedup_low=1.8, speedup_high=2.0)]
    (schedule,) = draft_schedules(rows)
    (choice,) = schedule.choices
    assert (choice.figure, choice.draft_len, choice.speedup) == ("speedup", 4, 1.9)


def test_schedules_are_per_pair_dataset_and_temperature() -> None:
    rows = [*TRIALS, _static(1, 2, 1.3, pair="q"), _static(1, 2, 1.3, temperature=0.7)]
    keys = [(s.pair, s.dataset, s.temperature) for s in draft_schedules(rows)]
    assert keys == [("p", "code", 0.0), ("q", "code", 0.0), ("p", "code", 0.7)]


def test_vllm_gets_inclusive_ranges_from_one_and_its_longest_k() -> None:
    (schedule,) = draft_schedules(TRIALS)
    assert vllm_ranges(schedule) == [[1, 1, 4], [2, 4, 2], [5, 16, 0]]
    config = json.loads(schedule_snippet(schedule, "vllm"))
    assert config == {
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 4, 2], [5, 16, 0]],
    }


def test_trtllm_gets_upper_bounds_without_trailing_zeros() -> None:
    (schedule,) = draft_schedules(TRIALS)
    assert trtllm_bounds(schedule) == {1: 4, 4: 2}
    config = yaml.safe_load(schedule_snippet(schedule, "trtllm"))
    expected = {"max_draft_len": 4, "draft_len_schedule": {1: 4, 4: 2}}
    assert config == {"speculative_config": expected}


def test_no_snippet_when_speculation_never_pays_or_for_an_unknown_engine() -> None:
    (never,) = draft_schedules([_static(1, 2, 0.9), _static(8, 2, 0.7)])
    assert not never.speculates
    with pytest.raises(ValueError, match="without speculative decoding"):
        schedule_snippet(never, "vllm")
    (schedule,) = draft_schedules(TRIALS)
    with pytest.raises(ValueError, match="vllm, trtllm"):
        schedule_snippet(schedule, "sglang")  # type: ignore[arg-type]
