"""Cost fits of trial groups from the stored live rounds: fit, store, and one line to print.

After a pair's live trials, each trial group's block-aware cost model is fit over its stored
rounds and stored (``cost_fits``) with the run-level fit beside it; replay mode fits the same
way before it replays a group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.analysis.costs.model import CostModelError
from orchestrator.analysis.costs.replay import GroupFit, fit_group
from orchestrator.analysis.costs.run_fit import TrialCounts, compare_fits
from orchestrator.store import Store
from orchestrator.store.models import CostFitRow
from orchestrator.store.row_values import table_values
from orchestrator.sweep.planner import LIVE_MODE, Plan, Trial, fit_group_key
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.trial import fit_group_identity


def store_live_fits(spec: SweepSpec, plan: Plan, store: Store, skip: set[str]) -> list[str]:
    """Fit and store the cost model of every group not in ``skip``; return a note per group."""
    if not spec.execution.record_rounds:
        return ["no cost fit: the sweep ran with record_rounds: false, so no rounds are stored"]
    grouped: dict[str, list[Trial]] = {}
    for trial in plan.trials:
        if trial.mode == LIVE_MODE:
            grouped.setdefault(fit_group_key(trial), []).append(trial)
    notes = []
    for key, trials in grouped.items():
        if key in skip:
            continue
        try:
            fit = fit_from_store(store, trials)
        except CostModelError as error:
            notes.append(f"no cost fit for {group_label(trials[0])}: {error}")
            continue
        values = fit_values(plan.sweep, key, trials[0], fit)
        run_fit = run_fit_columns(store, trials, fit)
        store.record_cost_fit({**values, **run_fit})
        notes.append(fit_note(trials[0], fit) + run_fit_note(run_fit))
    return notes


def fit_from_store(store: Store, trials: Sequence[Trial]) -> GroupFit:
    """Return the cost fit over the stored rounds of the done live ``trials``."""
    rows = [
        row
        for row in store.trial_rows(t.trial_id for t in trials if t.mode == LIVE_MODE)
        if row.status == "done"
    ]
    return fit_group(store.rounds(row.trial_id for row in rows), rows)


def run_fit_columns(store: Store, trials: Sequence[Trial], group: GroupFit) -> dict[str, Any]:
    """Return the run-level fit's ``cost_fits`` columns ({} when it cannot be fit)."""
    rows = store.trial_rows(t.trial_id for t in trials if t.mode == LIVE_MODE)
    counts = [TrialCounts.from_row(row) for row in rows if row.status == "done"]
    try:
        return compare_fits(group.fit, group.overhead_seconds, counts).columns()
    except CostModelError:
        return {}


def group_label(trial: Trial) -> str:
    """Return a short name of a trial's group for messages."""
    return (
        f"{trial.pair} {trial.prompts.dataset} (temperature {trial.sampling.temperature:g}, "
        f"{trial.sampling.max_new_tokens} new tokens)"
    )


def run_fit_note(columns: dict[str, Any]) -> str:
    """Return the run-level fit's part of a group's fit line ("" when there is none)."""
    if not columns:
        return "; no run-level fit (the trials cannot separate the two costs)"
    return (
        f"; on trial seconds: round fit R² {columns['round_trial_r2']:.3f}, error "
        f"{columns['round_trial_mre']:.1%}, run-level fit R² {columns['run_r2']:.3f}, error "
        f"{columns['run_mre']:.1%}: projecting with the {columns['projection_fit']} fit"
    )


def fit_note(trial: Trial, group: GroupFit) -> str:
    """Return the one-line summary of a stored group fit."""
    fit = group.fit
    return (
        f"cost fit {group_label(trial)}: t_draft {fit.t_draft * 1e3:.3f} ms, t_target "
        f"{fit.t_target * 1e3:.3f} ms + {fit.t_per_verified * 1e3:.3f} ms/token, R² round "
        f"{fit.r2_round:.3f} over {fit.n_rounds} rounds of {group.n_trials} trials"
    )


def fit_values(sweep: str, key: str, trial: Trial, group: GroupFit) -> dict[str, Any]:
    """Return the ``cost_fits`` row of a group's fit (no cross-check)."""
    fit = group.fit
    return {
        "sweep": sweep,
        "group_key": key,
        **table_values(CostFitRow, fit_group_identity(trial)),
        "t_draft": fit.t_draft,
        "t_target": fit.t_target,
        "t_per_verified": fit.t_per_verified,
        "r2_draft": fit.r2_draft,
        "r2_verify": fit.r2_verify,
        "r2_round": fit.r2_round,
        "n_rounds": fit.n_rounds,
        "n_trials": group.n_trials,
        "overhead_seconds": group.overhead_seconds,
    }
