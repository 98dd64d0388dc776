"""Dev and test prompts: the seeded split, and best settings chosen on dev, measured on test."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.analysis.holdout import (
    DECODE,
    END_TO_END,
    Candidate,
    PromptSplit,
    best_setting,
    holdout_splits,
    split_prompts,
)
from orchestrator.analysis.pairing import SampleSpeed
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import SweepError, load_sweep

SWEEP = """\
name: holdout
pairs:
  - name: demo
    target: zoo:micro/target
    draft: zoo:micro/draft-s
datasets:
  - {name: "builtin:code", samples: 6, max_new_tokens: 16HOLDOUT}
temperatures: [0]
policies:
  - name: svip
    grid: {threshold: [0.3, 0.5]}
max_draft_lens: [4]
"""


@pytest.mark.parametrize("n", [2, 3, 6, 7, 64])
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_split_is_disjoint_covers_every_prompt_and_keeps_both_sides(n, fraction) -> None:
    split = split_prompts(n, fraction, seed=3)
    assert set(split.dev).isdisjoint(split.test)
    assert sorted(split.dev + split.test) == list(range(n))
    assert split.dev and split.test
    assert len(split.dev) == min(max(round(n * fraction), 1), n - 1)


def test_split_is_seeded() -> None:
    assert split_prompts(40, 0.5, seed=7) == split_prompts(40, 0.5, seed=7)
    assert split_prompts(40, 0.5, seed=7) != split_prompts(40, 0.5, seed=8)
    with pytest.raises(ValueError, match="at least 2 prompts"):
        split_prompts(1, 0.5, seed=0)


def _speeds(seconds: list[float], decode: list[float] | None = None) -> list[SampleSpeed]:
    """Prompt i: 10 tokens in ``seconds[i]`` (decode seconds ``decode[i]`` when given)."""
    return [
        SampleSpeed(f"p{i}", i, 10, s, None if decode is None else decode[i])
        for i, s in enumerate(seconds)
    ]


BASE = _speeds([1.0] * 4)
#: A is twice as fast as AR on prompts 0-1 and as slow on 2-3; B the other way round, a little
#: better overall.
A = _speeds([0.5, 0.5, 1.0, 1.0])
B = _speeds([1.0, 1.0, 0.45, 0.45])


def test_best_is_chosen_on_dev_and_measured_on_test() -> None:
    split = PromptSplit(dev=(0, 1), test=(2, 3))
    best = best_setting({"a": Candidate(A, BASE), "b": Candidate(B, BASE)}, split)
    assert best is not None and best.trial_id == "a"  # the test-best would be b
    assert best.dev_speedup == pytest.approx(2.0)
    assert best.test_speedup == pytest.approx(1.0)
    assert (best.n_dev, best.n_test, best.held_out) == (2, 2, True)
    assert best.test.n_prompts == 2 and best.test.ratio is not None
    assert best.test.ratio.estimate == pytest.approx(1.0)
    assert best.note() == "chosen on 2 dev prompts, measured on 2 test prompts (end-to-end)"


def test_without_a_split_the_best_is_chosen_and_measured_on_the_same_prompts() -> None:
    best = best_setting({"a": Candidate(A, BASE), "b": Candidate(B, BASE)}, None)
    assert best is not None and best.trial_id == "b"
    assert best.dev_speedup == best.test_speedup == pytest.approx(4 / 2.9)
    assert best.note() == "best chosen and measured on the same 4 prompts (end-to-end)"


def test_the_best_is_judged_decode_only_when_every_sample_has_decode_seconds() -> None:
    """A's heavy prefill hides its faster decoding end to end."""
    base = _speeds([1.0] * 4, decode=[0.8] * 4)
    a = _speeds([1.0] * 4, decode=[0.4] * 4)
    b = _speeds([0.9] * 4, decode=[0.7] * 4)
    best = best_setting({"a": Candidate(a, base), "b": Candidate(b, base)}, None)
    assert best is not None and (best.trial_id, best.measure) == ("a", DECODE)
    assert best.test_speedup == pytest.approx(2.0)
    older = _speeds([0.9] * 4)
    best = best_setting({"a": Candidate(a, base), "b": Candidate(older, base)}, None)
    assert best is not None and (best.trial_id, best.measure) == ("b", END_TO_END)


def _write(tmp_path: Path, holdout: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP.replace("HOLDOUT", holdout), encoding="utf-8")
    return path


def test_holdout_is_analysis_only_and_changes_no_trial_id(tmp_path: Path) -> None:
    plain = load_sweep(_write(tmp_path, ""))
    held = load_sweep(_write(tmp_path, ", holdout: {dev_fraction: 0.5, seed: 1}"))
    assert [t.trial_id for t in plan_sweep(held).trials] == [
        t.trial_id for t in plan_sweep(plain).trials
    ]
    assert holdout_splits(plain) == {}
    assert holdout_splits(held) == {("builtin:code", None, 6, 16): split_prompts(6, 0.5, 1)}


@pytest.mark.parametrize(
    ("holdout", "field"),
    [
        (", holdout: {dev_fraction: 1.0}", "datasets[0].holdout.dev_fraction"),
        (", holdout: {dev_fraction: 0.5, seeds: 1}", "datasets[0].holdout.seeds"),
        (", samples: 1, holdout: {dev_fraction: 0.5}", "datasets[0].holdout"),
    ],
)
def test_bad_holdouts_name_the_file_line_and_field(tmp_path: Path, holdout, field) -> None:
    text = SWEEP.replace("samples: 6, ", "") if "samples: 1" in holdout else SWEEP
    path = tmp_path / "sweep.yaml"
    path.write_text(text.replace("HOLDOUT", holdout), encoding="utf-8")
    with pytest.raises(SweepError) as caught:
        load_sweep(path)
    assert any(p.startswith(f"{path}:7: {field}") for p in caught.value.problems), (
        caught.value.problems
    )
