"""The per-prompt spread of live trials about a cost fit (``validation.prompt_spread``).

A trial's and a prompt's common factors are what a level and the context terms explain; what
is left, one arm on one prompt, is the scatter a held-out trial's total carries.
"""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.analysis.costs.step_costs import (
    RoundObservation,
    SampleObservation,
    StepCostFit,
    StepDemands,
)
from orchestrator.analysis.costs.validation import LiveTrial, prompt_spread

FIT = StepCostFit(
    t_draft=0.01,
    t_feature=0.0,
    t_ask=0.0,
    draft_per_context=0.0,
    verify_table=((0, 0.04), (2, 0.05)),
    verify_per_context=0.0,
    overhead=0.02,
    overhead_per_prompt_token=0.0,
    r2_draft=1.0,
    r2_verify=1.0,
    n_rounds=1,
    n_samples=1,
)


def _trial(name: str, factors: list[float]) -> LiveTrial:
    """Return a static K = 2 trial whose prompt p takes ``factors[p]`` times the fit's seconds
    (3 rounds and the outside time per prompt)."""
    rounds, samples, owners = [], [], []
    for prompt, factor in enumerate(factors):
        for _ in range(3):
            rounds.append(RoundObservation(2, 2, 100, StepDemands(), factor * 0.02, factor * 0.05))
            owners.append(prompt)
        samples.append(SampleObservation(100, factor * 0.02))
    return LiveTrial(
        trial_id=name,
        policy="static",
        max_draft_len=2,
        rounds=tuple(rounds),
        samples=tuple(samples),
        counts=None,  # type: ignore[arg-type]
        stored=None,  # type: ignore[arg-type]
        stored_rounds=(),
        round_samples=tuple(owners),
        sample_indices=tuple(range(len(factors))),
    )


def test_trial_and_prompt_factors_leave_no_spread() -> None:
    prompts = [1.0, 1.3, 0.8, 1.1]
    trials = [_trial(f"t{i}", [level * p for p in prompts]) for i, level in enumerate((1, 1.2))]
    assert prompt_spread(FIT, trials) == pytest.approx(0.0, abs=1e-9)


def test_one_arm_slow_on_one_prompt_is_the_spread() -> None:
    slow = np.log(1.5)
    trials = [_trial("a", [1.0, 1.0, 1.5]), _trial("b", [1.0, 1.0, 1.0])]
    table = np.array([[0, 0, slow], [0, 0, 0]])
    residual = table - table.mean(0) - table.mean(1, keepdims=True) + table.mean()
    expected = np.sqrt((residual**2).sum() / 2)
    assert prompt_spread(FIT, trials) == pytest.approx(expected)
    assert expected > 0.1


def test_fewer_than_two_trials_or_prompts_have_no_spread() -> None:
    assert prompt_spread(FIT, [_trial("a", [1.0, 1.2])]) is None
    assert prompt_spread(FIT, [_trial("a", [1.0]), _trial("b", [1.1])]) is None
