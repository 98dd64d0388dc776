"""AR baselines of one target on one prompt set, on different worker pairs, must agree for
speedups across worker pairs (draft kind against draft kind) to compare."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.analysis.baseline_agreement import baseline_disagreements


def _ar(pair: str, rate: float, half: float, **changes: object) -> SimpleNamespace:
    """Return a done AR baseline row on HumanEval at temperature 0 decoding ``rate`` ± ``half``
    (its stored record as the store keeps it, ``changes`` applied)."""
    config = {
        "pair": pair,
        "target": "zoo:smol/target",
        "backend": "hf",
        "tp_size": 1,
        "dtype": "float32",
        "trust_remote_code": False,
        "draft": f"draft of {pair}",
        "dataset": "humaneval",
        "split": None,
        "samples": 48,
        "local_path": None,
        "max_new_tokens": 48,
        "temperature": 0.0,
        "top_k": 0,
        "top_p": 1.0,
        "seed": 0,
        **changes,
    }
    return SimpleNamespace(
        pair=pair,
        is_baseline=True,
        status="done",
        config=config,
        dataset=config["dataset"],
        temperature=config["temperature"],
        max_new_tokens=config["max_new_tokens"],
        decode_tokens_per_s=rate,
        decode_tokens_per_s_low=rate - half,
        decode_tokens_per_s_high=rate + half,
    )


def test_disjoint_intervals_across_worker_pairs_are_reported_with_both_rates() -> None:
    rows = [_ar("smollm2", 20.46, 1.2), _ar("smollm2~1", 23.06, 0.6)]
    (found,) = baseline_disagreements(rows)
    assert [r.pair for r in found.rates] == ["smollm2", "smollm2~1"]
    line = found.line()
    assert "smollm2 20.5 [19.3, 21.7]" in line and "smollm2~1 23.1 [22.5, 23.7]" in line
    assert "humaneval (temperature 0, 48 new tokens)" in line and "does not compare" in line


def test_overlapping_intervals_other_work_and_one_pair_are_not_reported() -> None:
    assert baseline_disagreements([_ar("a", 20.0, 2.0), _ar("a~1", 23.0, 2.0)]) == []
    for changes in ({"temperature": 0.7}, {"samples": 5}, {"target": "other"}, {"seed": 1}):
        assert baseline_disagreements([_ar("a", 20.0, 0.5), _ar("a~1", 23.0, 0.5, **changes)]) == []
    assert baseline_disagreements([_ar("a", 20.0, 0.5), _ar("a", 23.0, 0.5)]) == []
    failed = _ar("a~1", 23.0, 0.5)
    failed.status = "failed"
    assert baseline_disagreements([_ar("a", 20.0, 0.5), failed]) == []
