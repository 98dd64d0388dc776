"""A pool's cost fit keeps one shape over its datasets and each dataset's group its own level.

The reproduction's live checks, projected out of sample by the fit pooled over HumanEval and
math, erred with one sign per dataset (HumanEval -2 to -5%, math +3 to +5.5%): the machine
drifted between the two groups, which ran minutes apart. The level of a group is its live
trials' measured over projected seconds; a held-out check is projected at the level its
group's other live trials measure, and replayed trials at their group's level.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.analysis.costs.replay import fit_group
from orchestrator.analysis.costs.run_fit import TrialCounts
from orchestrator.analysis.costs.step_costs import RoundObservation, SampleObservation, StepDemands
from orchestrator.analysis.costs.validation import (
    LiveTrial,
    fit_group_of,
    fit_trials,
    held_out,
    projected_seconds,
)
from orchestrator.sweep.trial import record_fit_group_key

T_DRAFT, T_VERIFY, OUTSIDE = 0.01, 0.1, 0.05


def _record(dataset: str) -> dict:
    """Return the stored record fields a trial's cost-fit group is made of."""
    return {
        "pair": "p",
        "draft_kind": "lm",
        "dataset": dataset,
        "split": None,
        "samples": 4,
        "local_path": None,
        "chat_template": None,
        "temperature": 0.0,
        "top_k": 0,
        "top_p": 1.0,
        "max_new_tokens": 16,
    }


def _trial(name: str, dataset: str, k: int, slow: float) -> LiveTrial:
    """Return a live trial of static K = ``k`` (0: AR) whose every cost is ``slow`` times the
    base costs: 4 samples of 6 rounds, each round verifying ``k`` drafted tokens."""
    ar = k == 0
    rounds = tuple(
        RoundObservation(
            drafted=k,
            draft_forwards=k,
            context=100 + 10 * i,
            demands=StepDemands(),
            draft_seconds=slow * T_DRAFT * k,
            verify_seconds=slow * (T_VERIFY + 0.02 * k),
            target_only=ar,
        )
        for _ in range(4)
        for i in range(6)
    )
    samples = tuple(SampleObservation(50 + s, slow * OUTSIDE) for s in range(4))
    seconds = sum(r.draft_seconds + r.verify_seconds for r in rounds) + slow * OUTSIDE * 4
    counts = TrialCounts(
        draft_forwards=k * 24, rounds=24, drafted=k * 24, samples=4, tokens=48, seconds=seconds
    )
    draft_s = sum(r.draft_seconds for r in rounds)
    verify_s = sum(r.verify_seconds for r in rounds)
    stored = SimpleNamespace(
        config=_record(dataset),
        draft_kind="lm",
        is_baseline=ar,
        trial_id=name,
        seconds=seconds,
        draft_seconds=draft_s,
        verify_seconds=verify_s,
        n_samples=4,
    )
    policy = "ar" if ar else "static"
    return LiveTrial(name, policy, k, rounds, samples, counts, stored, rounds)


def _pool() -> list[LiveTrial]:
    """Return a pool of two groups: ``code`` at the base costs, ``math`` 10% slower."""
    return [
        _trial(f"{dataset}-{k}", dataset, k, slow)
        for dataset, slow in (("code", 1.0), ("math", 1.1))
        for k in (0, 1, 2, 3)
    ]


def test_each_group_of_a_pool_gets_its_own_level() -> None:
    trials = _pool()
    fit = fit_group(trials, check_ids={"code-2", "math-2"})
    code, math = (record_fit_group_key(_record(d)) for d in ("code", "math"))
    assert fit_group_of(trials[0]) == code
    # One shape fits both; the levels stand the groups apart by their 10%.
    assert fit.level(math) / fit.level(code) == pytest.approx(1.1, rel=1e-6)
    assert fit.level("no such group") == 1.0
    # Each check's block size is measured only in the other group, so without levels a check
    # errs by about the drift (code -9%, math +10%); at its group's level, by under half that.
    for check in fit.checks:
        own = next(t for t in trials if t.trial_id == check.trial_id)
        others = [t for t in trials if t is not own]
        plain = own.counts.seconds / projected_seconds(fit_trials(others), own) - 1
        assert abs(plain) > 0.08 and abs(check.error) < abs(plain) / 2
        assert (plain > 0) == check.trial_id.startswith("math")


def test_without_its_groups_level_a_held_out_check_errs_by_the_drift() -> None:
    trials = _pool()
    # Alone in its group, the math check has no other trial to measure its group's level.
    pool = [t for t in trials if not t.trial_id.startswith("math") or t.trial_id == "math-2"]
    check = next(t for t in pool if t.trial_id == "math-2")
    error = held_out(pool, check).error
    assert error == pytest.approx(0.1, rel=1e-3)
