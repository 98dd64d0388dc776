"""The cost table of a replay group at a batch size above 1, from the store: its live queues,
its fit with each live check held out, its ``cost_fits`` row and its line.

A live trial's queues are its stored shards (each shard's sample indices, in the order the arm
decoded them: ``trial_shards.prompts``) with each sample's stored rounds and times; a replayed
trial decodes its prompts as the queues its AR baseline ran (the same group: prompts, repeats,
shards). The pure parts are ``orchestrator.analysis.costs.batch_costs`` and ``batch_replay``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict
from typing import Any

from orchestrator.analysis.costs.batch_costs import LiveQueue
from orchestrator.analysis.costs.batch_replay import BatchGroupFit, fit_batch_group, live_queues
from orchestrator.run.group_fits import pool_label
from orchestrator.store import Store
from orchestrator.store.models import CostFitRow
from orchestrator.store.row_values import table_values
from orchestrator.sweep.planner import LIVE_MODE, Trial
from orchestrator.sweep.trial import fit_group_identity


def stored_queues(store: Store, trial_id: str) -> list[list[int]]:
    """Return the sample indices of ``trial_id``'s stored done shards, shard by shard."""
    shards = [s for s in store.trial_shards([trial_id]) if s.status == "done"]
    return [
        [int(index) for index in shard.prompts] for shard in sorted(shards, key=lambda s: s.shard)
    ]


def queues_from_store(store: Store, trials: Sequence[Trial]) -> list[LiveQueue]:
    """Return the live queues of the done live ``trials`` (their shards, samples, rounds)."""
    live = [t for t in trials if t.mode == LIVE_MODE]
    rows = {row.trial_id: row for row in store.trial_rows(t.trial_id for t in live)}
    queues: list[LiveQueue] = []
    for trial in live:
        row = rows.get(trial.trial_id)
        if row is None or row.status != "done":
            continue
        queues += live_queues(
            trial.trial_id,
            trial.batch_size,
            store.rounds([trial.trial_id]),
            store.sample_outputs(trial.trial_id),
            stored_queues(store, trial.trial_id),
        )
    return queues


def fit_batch_from_store(
    store: Store, trials: Sequence[Trial], check_ids: Collection[str]
) -> BatchGroupFit:
    """Return the cost table over the stored queues of the live ``trials`` (one batch size),
    each of ``check_ids`` held out in turn. Raises CostModelError when it cannot be fit."""
    batch_size = trials[0].batch_size
    return fit_batch_group(batch_size, queues_from_store(store, trials), check_ids)


def replay_queues(store: Store, trial: Trial, prompts: int) -> list[list[int]]:
    """Return the queues a replayed ``trial`` decodes its ``prompts`` in: its AR baseline's
    stored shards (their first repeat), else one queue of every prompt in order."""
    found = stored_queues(store, trial.baseline_id) if trial.baseline_id else []
    queues = [[index for index in queue if index < prompts] for queue in found]
    queues = [queue for queue in queues if queue]
    covered = sorted(index for queue in queues for index in queue)
    return queues if covered == list(range(prompts)) else [list(range(prompts))]


def batch_fit_values(sweep: str, key: str, trial: Trial, fit: BatchGroupFit) -> dict[str, Any]:
    """Return the ``cost_fits`` row of a batch group's table: the table as its ``step_model``,
    its checks and out-of-sample error; the scalar columns from the table at the full batch
    (draft step, verify of the pending token, verify slope per drafted token)."""
    table = fit.table
    size = table.batch_size
    return {
        "sweep": sweep,
        "group_key": key,
        **table_values(CostFitRow, fit_group_identity(trial)),
        "t_draft": table.draft_step_seconds(size) if table.draft_step else 0.0,
        "t_target": table.verify_seconds(size, 0),
        "t_per_verified": table.verify_plane[2],
        "r2_draft": table.r2_draft,
        "r2_verify": table.r2_verify,
        "r2_round": table.r2_round,
        "n_rounds": table.n_rounds,
        "n_trials": fit.n_trials,
        "overhead_seconds": table.round_overhead,
        "step_model": {"kind": "batch", **asdict(table)},
        "checks": [asdict(check) for check in fit.checks],
        "out_of_sample_error": fit.out_of_sample_error,
    }


def batch_fit_note(trials: Sequence[Trial], fit: BatchGroupFit) -> str:
    """Return the one-line summary of a batch group's cost table."""
    table = fit.table
    size = table.batch_size
    draft = f"{table.draft_step_seconds(size) * 1e3:.3f}" if table.draft_step else "n/a"
    error = fit.out_of_sample_error
    held = f"{error:.1%}" if error is not None else "not measured (no check can be held out)"
    wall = f", wall {fit.wall_error:.1%}" if fit.wall_error is not None else ""
    return (
        f"cost table {pool_label(trials)} at batch size {size}: draft step {draft} ms, verify "
        f"{table.verify_seconds(size, 0) * 1e3:.3f} ms + {table.verify_plane[2] * 1e3:.3f} ms "
        f"per drafted token at {size} rows, {table.round_overhead * 1e3:.3f} ms a round "
        f"outside them, over {table.n_rounds} batch rounds; out-of-sample error {held}{wall}"
    )
