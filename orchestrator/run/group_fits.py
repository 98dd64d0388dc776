"""Cost fits of trial groups from the stored live rounds: fit, store, and one line to print.

After a pair's live trials, the cost model is fit over each pool's stored rounds (a pool: the
pair at one sampling setting across its datasets, or one dataset group where every group runs
enough live checks, ``trial.fit_pools``; the per-step model's context terms carry what differs
between datasets) and stored (``cost_fits``) under each trial group of the pool, with the
run-level fit beside it; replay mode fits the same way before it replays a group.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict
from typing import Any

from orchestrator.analysis.costs.model import CostModelError
from orchestrator.analysis.costs.replay import GroupFit, fit_group
from orchestrator.analysis.costs.run_fit import TrialCounts, compare_fits
from orchestrator.analysis.costs.validation import LiveTrial, live_trial
from orchestrator.store import Store
from orchestrator.store.models import CostFitRow
from orchestrator.store.row_values import table_values
from orchestrator.sweep.planner import LIVE_MODE, Plan, Trial, fit_group_key, fit_pools
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.trial import fit_group_identity


def store_live_fits(spec: SweepSpec, plan: Plan, store: Store, skip: set[str]) -> list[str]:
    """Fit the cost model of every pool of live trials (``trial.fit_pools``) and store it
    under each of the pool's groups not in ``skip``; return a note per pool. Trials at a batch
    size above 1 are not fit: the cost model prices batch-1 rounds."""
    if not spec.execution.record_rounds:
        return ["no cost fit: the sweep ran with record_rounds: false, so no rounds are stored"]
    notes = []
    for trials, groups in live_pools(plan.trials):
        stored = {key: first for key, first in groups.items() if key not in skip}
        if not stored:
            continue
        try:
            fit = fit_from_store(store, trials)
        except CostModelError as error:
            notes.append(f"no cost fit for {pool_label(trials)}: {error}")
            continue
        run_fit = run_fit_columns(store, trials, fit)
        for key, first in stored.items():
            store.record_cost_fit({**fit_values(plan.sweep, key, first, fit), **run_fit})
        notes.append(fit_note(trials, fit) + run_fit_note(run_fit))
    return notes


def live_pools(trials: Sequence[Trial]) -> list[tuple[list[Trial], dict[str, Trial]]]:
    """Return the live batch-1 ``trials`` by cost-fit pool: each pool's trials and, per fit
    group of the pool (its ``cost_fits`` key), the group's first trial; in plan order."""
    batch_one = [t for t in trials if t.mode == LIVE_MODE and t.batch_size == 1]
    pools = []
    for members in fit_pools(batch_one).values():
        groups: dict[str, Trial] = {}
        for trial in members:
            groups.setdefault(fit_group_key(trial), trial)
        pools.append((members, groups))
    return pools


def live_trials_from_store(store: Store, trials: Sequence[Trial]) -> list[LiveTrial]:
    """Return the done live ``trials`` as the cost model reads them (rounds, samples)."""
    rows = [
        row
        for row in store.trial_rows(t.trial_id for t in trials if t.mode == LIVE_MODE)
        if row.status == "done"
    ]
    rounds: dict[str, list[Any]] = {}
    for row in store.rounds(row.trial_id for row in rows):
        rounds.setdefault(row.trial_id, []).append(row)
    return [
        live_trial(row, rounds.get(row.trial_id, []), store.sample_outputs(row.trial_id))
        for row in rows
    ]


def fit_from_store(
    store: Store, trials: Sequence[Trial], check_ids: Collection[str] = ()
) -> GroupFit:
    """Return the cost fit over the stored rounds of the done live ``trials``, holding out
    each of ``check_ids`` in turn for its out-of-sample error."""
    return fit_group(live_trials_from_store(store, trials), check_ids)


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


def pool_label(trials: Sequence[Trial]) -> str:
    """Return a short name of a cost-fit pool (its pair, datasets and sampling) for messages."""
    first = trials[0]
    datasets = ", ".join(dict.fromkeys(t.prompts.dataset for t in trials))
    return f"{first.pair} [{datasets}] (temperature {first.sampling.temperature:g})"


def run_fit_note(columns: dict[str, Any]) -> str:
    """Return the run-level fit's part of a group's fit line ("" when there is none)."""
    if not columns:
        return "; no run-level fit (the trials cannot separate the two costs)"
    return (
        f"; on trial seconds: round fit R² {columns['round_trial_r2']:.3f}, error "
        f"{columns['round_trial_mre']:.1%}, run-level fit R² {columns['run_r2']:.3f}, error "
        f"{columns['run_mre']:.1%}: projecting with the {columns['projection_fit']} fit"
    )


def fit_note(trials: Sequence[Trial], group: GroupFit) -> str:
    """Return the one-line summary of a pool's stored fit (the per-step model replay uses)."""
    steps = group.steps
    sizes = ", ".join(f"{size}: {cost * 1e3:.1f}" for size, cost in steps.verify_table)
    error = group.out_of_sample_error
    held = f"{error:.1%}" if error is not None else "not measured (no check can be held out)"
    ar_step = "" if steps.t_target_step is None else f", AR step {steps.t_target_step * 1e3:.1f}"
    levels = ", ".join(f"{level:.3f}" for _, level in group.levels)
    return (
        f"cost fit {pool_label(trials)}: draft step {steps.t_draft * 1e3:.3f} ms "
        f"(+{steps.t_feature * 1e3:.3f} with features, +{steps.t_ask * 1e3:.3f} per decision), "
        f"verify ms by block size {{{sizes}}}{ar_step} + "
        f"{steps.verify_per_context * 1e6:.2f} µs per token of context, R² draft "
        f"{steps.r2_draft:.3f} verify {steps.r2_verify:.3f} over "
        f"{steps.n_rounds} rounds of {group.n_trials} trials, groups at levels {levels}; "
        f"out-of-sample error {held}"
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
        "step_model": {**asdict(group.steps), "level": group.level(key)},
        "checks": [asdict(check) for check in group.checks],
        "out_of_sample_error": group.out_of_sample_error,
    }
