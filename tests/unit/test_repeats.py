"""Repeats of a prompt (``execution.repeats``): intervals keep the prompt as their unit, and the
setting enters trial ids only when it is not 1."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.analysis.metrics import SampleCounts, per_prompt, trial_metrics
from orchestrator.analysis.pairing import SampleSpeed, paired_ratio
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep
from workers.records import GenerationResult


def _speeds(seconds: list[float], prompts: int) -> list[SampleSpeed]:
    """Samples of ``prompts`` prompts, sample s being repeat s // prompts of prompt s % prompts."""
    return [SampleSpeed(f"p{s % prompts}", s, 10, sec) for s, sec in enumerate(seconds)]


def test_paired_repeats_are_summed_within_their_prompt():
    a = _speeds([1.0, 2.0, 3.0, 1.5, 2.5, 2.0], prompts=3)
    b = _speeds([1.2, 2.1, 3.3, 1.4, 2.9, 2.2], prompts=3)
    summed_a = [SampleSpeed(f"p{i}", i, 20, a[i].seconds + a[i + 3].seconds) for i in range(3)]
    summed_b = [SampleSpeed(f"p{i}", i, 20, b[i].seconds + b[i + 3].seconds) for i in range(3)]
    repeated, once = paired_ratio(a, b), paired_ratio(summed_a, summed_b)
    assert repeated.n_prompts == 3
    assert repeated.ratio == once.ratio


def test_trial_intervals_sum_repeats_within_their_prompt():
    results = [
        GenerationResult(prompt_ids=[1], output_ids=[2] * tokens, seconds=seconds)
        for tokens, seconds in [(4, 1.0), (6, 2.0), (5, 1.5), (7, 1.0)]
    ]
    blocks = [0, 1, 0, 1]
    repeated = trial_metrics(results, blocks).tokens_per_s_interval
    assert repeated is not None and repeated.n == 2
    summed = per_prompt([SampleCounts(r.n_generated, r.seconds, 0, 0, 0) for r in results], blocks)
    assert [(s.tokens, s.seconds) for s in summed] == [(9, 2.5), (13, 3.0)]
    assert trial_metrics(results).tokens_per_s_interval.n == 4


SWEEP = {
    "name": "repeats",
    "pairs": [{"name": "p", "target": {"model": "t"}, "draft": {"model": "d"}}],
    "datasets": [{"name": "builtin:code", "samples": 4, "max_new_tokens": 8}],
    "policies": [{"name": "static"}],
    "temperatures": [0.0],
    "max_draft_lens": [3],
}


def _ids(execution: dict) -> set[str]:
    text = yaml.safe_dump({**SWEEP, "execution": execution})
    return {trial.trial_id for trial in plan_sweep(parse_sweep(text, "repeats.yaml")).trials}


def test_repeats_enter_trial_ids_only_when_not_one():
    assert _ids({}) == _ids({"repeats": 1})
    assert _ids({"repeats": 3}).isdisjoint(_ids({}))
    plan = plan_sweep(parse_sweep(yaml.safe_dump({**SWEEP, "execution": {"repeats": 3}}), "r"))
    assert {trial.repeats for trial in plan.trials} == {3}


def test_repeats_must_be_at_least_one():
    with pytest.raises(ValueError, match="repeats"):
        parse_sweep(yaml.safe_dump({**SWEEP, "execution": {"repeats": 0}}), "repeats.yaml")
