"""The store's writes: sweeps, trials, shard leases and outputs, runs, jobs, artifacts, fits.

Recording is idempotent: a trial already ``done`` is never written again (so a retried or
duplicated worker cannot duplicate rows), and inserts of rows that may already exist (a trial
shared by two sweeps, a job) are ``ON CONFLICT DO NOTHING``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import yaml
from sqlalchemy import delete, func, insert, or_, select, update
from sqlalchemy.orm import Session

from orchestrator.store.base import StoreBase
from orchestrator.store.leases import (
    free_for,
    held_by,
    lease_clock,
    lease_values,
    locked_shard,
    other_driver,
    seconds_left,
    shard_key,
)
from orchestrator.store.models import (
    TRIAL_METRIC_COLUMNS,
    ArtifactRow,
    CostFitRow,
    RoundRow,
    RunRow,
    SampleResultRow,
    SweepRow,
    SweepTrialRow,
    TraceRow,
    TrainingJobRow,
    TrialRow,
    TrialShardRow,
    utc_now,
)
from orchestrator.store.records import LeaseHolder, ShardClaim
from orchestrator.store.row_values import (
    extra_metrics,
    job_values,
    round_values,
    sample_values,
    trial_values,
)
from orchestrator.store.rows import (
    INTERVAL_COLUMNS,
    apply_speedups,
    insert_ignore,
    replace_position_rows,
)
from workers.records import GenerationResult, result_to_json

if TYPE_CHECKING:
    from orchestrator.analysis.metrics import TrialMetrics
    from orchestrator.store.provenance_record import Provenance
    from orchestrator.sweep.planner import Plan, TrainingJob, Trial
    from orchestrator.sweep.spec import SweepSpec


@dataclass(frozen=True)
class ShardOutput:
    """A finished shard of a trial: its index, its samples' indices and results, where it ran.

    ``indices`` are positions in the trial's prompt list (one per result), so a trial's
    samples keep the indices they would have in one piece and pair with the AR baseline's.
    ``prompt_ids`` and ``output_texts`` are optional, one per result.
    """

    shard: int
    indices: tuple[int, ...]
    results: Sequence[GenerationResult]
    prompt_ids: Sequence[str] | None = None
    output_texts: Sequence[str] | None = None
    node_id: str | None = None
    seconds: float | None = None


class StoreWriter(StoreBase):
    """Writes of the results store (mixed into :class:`~orchestrator.store.results.Store`)."""

    def register_sweep(self, spec: SweepSpec, plan: Plan, spec_yaml: str | None = None) -> int:
        """Store the sweep, its trials (as pending when new) and jobs; return the sweep's row id.

        Re-registering a sweep name replaces its spec and its trial membership with ``plan``'s;
        results of trials already stored are kept.
        """
        spec_data = spec.model_dump(mode="json")
        values = {
            "name": spec.name,
            "description": spec.description,
            "spec": spec_data,
            "spec_yaml": spec_yaml or yaml.safe_dump(spec_data, sort_keys=False),
            "code_version": plan.trials[0].code_version if plan.trials else "",
        }
        with self._transaction() as session:
            insert_ignore(session, SweepRow, [values])
            query = select(SweepRow).where(SweepRow.name == spec.name).with_for_update()
            sweep = session.scalars(query.execution_options(populate_existing=True)).one()
            for key, value in values.items():
                setattr(sweep, key, value)
            sweep.updated_at = utc_now()
            session.flush()
            insert_ignore(session, TrialRow, [trial_values(trial) for trial in plan.trials])
            insert_ignore(session, TrainingJobRow, [job_values(job) for job in plan.jobs])
            session.execute(delete(SweepTrialRow).where(SweepTrialRow.sweep_id == sweep.id))
            links = [
                {"sweep_id": sweep.id, "trial_id": trial.trial_id, "position": position}
                for position, trial in enumerate(plan.trials)
            ]
            if links:
                session.execute(insert(SweepTrialRow), links)
            return sweep.id

    def mark_running(self, trial: Trial) -> bool:
        """Mark a trial running and count an attempt; returns False (no change) if it is done."""
        with self._transaction() as session:
            row = _locked_trial(session, trial)
            if row.status == "done":
                return False
            row.status = "running"
            row.attempts += 1
            row.started_at = utc_now()
            row.finished_at = None
            return True

    def record_attempt_error(self, trial: Trial, error: str) -> bool:
        """Append a failed attempt's error to the trial's ``attempt_errors``; False if it is done.

        Exists so that a trial that succeeds on a retry still shows why its earlier attempts
        failed (``error`` holds only the reason of a trial that is ``failed`` now).
        """
        with self._transaction() as session:
            row = _locked_trial(session, trial)
            if row.status == "done":
                return False
            row.attempt_errors = [*(row.attempt_errors or []), error]
            return True

    def record_trial(
        self,
        trial: Trial,
        results: Sequence[GenerationResult],
        metrics: TrialMetrics,
        record_rounds: bool = True,
        prompt_ids: Sequence[str] | None = None,
        output_texts: Sequence[str] | None = None,
    ) -> bool:
        """Store a finished trial, its samples and (optionally) rounds in one transaction.

        ``prompt_ids`` (the dataset's ids) and ``output_texts`` (decoded outputs) are optional,
        one per result. Returns False and writes nothing when the trial is already done.
        Updates the speedup of the trial and, for a baseline, of the trials measured against it.
        """
        with self._transaction() as session:
            row = _locked_trial(session, trial)
            if row.status == "done":
                return False
            session.execute(delete(RoundRow).where(RoundRow.trial_id == trial.trial_id))
            session.execute(
                delete(SampleResultRow).where(SampleResultRow.trial_id == trial.trial_id)
            )
            output = ShardOutput(0, tuple(range(len(results))), results, prompt_ids, output_texts)
            _insert_samples(session, trial.trial_id, output, record_rounds)
            _close_trial(session, row, metrics, self.run_id)
            return True

    def claim_shard(
        self,
        trial: Trial,
        shard: int,
        prompts: Sequence[int],
        holder: LeaseHolder,
        lease_s: float,
    ) -> ShardClaim:
        """Lease one shard of a trial to ``holder`` for ``lease_s`` seconds and count an attempt.

        One conditional UPDATE takes the lease (the shard is not done, and not running under
        another driver's unlapsed lease), so of drivers claiming one shard at once exactly one
        gets it. Lease times are the PostgreSQL server's clock (drivers on several hosts agree
        on it), or this host's for SQLite (a local file). Returns ``done`` when the trial or the
        shard is stored already, ``held`` when another driver's lease is live, else ``acquired``:
        the shard and the trial are then running, the trial's ``attempts`` the most any of its
        shards took.
        """
        with self._transaction() as session:
            row = _locked_trial(session, trial)
            if row.status == "done":
                stored = session.get(TrialShardRow, (trial.trial_id, shard))
                return ShardClaim("done", stored and other_driver(stored, holder))
            before = locked_shard(session, trial.trial_id, shard, prompts)
            if before.status == "done":
                return ShardClaim("done", other_driver(before, holder))
            now = lease_clock(session)
            attempt = {"status": "running", "attempts": TrialShardRow.attempts + 1}
            attempt |= {"started_at": now, "finished_at": None}
            taken = session.execute(
                update(TrialShardRow)
                .where(*shard_key(trial.trial_id, shard), free_for(holder, now))
                .values(**attempt, **lease_values(holder, now, lease_s))
                .execution_options(synchronize_session=False)
            )
            if taken.rowcount != 1:
                return ShardClaim("held", before.driver, seconds_left(before, now))
            if row.status != "running":
                row.started_at = now
            row.status = "running"
            row.attempts = max(row.attempts, before.attempts + 1)
            row.finished_at = None
            taken_over = before.status == "running" and before.driver_id is not None
            return ShardClaim("acquired", other_driver(before, holder) if taken_over else None)

    def renew_leases(self, holder: LeaseHolder, lease_s: float) -> int:
        """Extend to ``lease_s`` seconds from now every lease ``holder`` holds on a running shard
        (the heartbeat); return how many. A lease another driver took over is not renewed."""
        with self._transaction() as session:
            now = lease_clock(session)
            renewed = session.execute(
                update(TrialShardRow)
                .where(*held_by(holder))
                .values(lease_expires_at=now + timedelta(seconds=lease_s))
                .execution_options(synchronize_session=False)
            )
            return int(renewed.rowcount)

    def release_leases(self, holder: LeaseHolder) -> int:
        """Release every lease ``holder`` holds on a running shard (a driver ending or stopped);
        return how many. Any driver may take those shards at once."""
        with self._transaction() as session:
            released = session.execute(
                update(TrialShardRow)
                .where(*held_by(holder))
                .values(lease_expires_at=None)
                .execution_options(synchronize_session=False)
            )
            return int(released.rowcount)

    def record_shard(
        self,
        trial: Trial,
        output: ShardOutput,
        record_rounds: bool = True,
        holder: LeaseHolder | None = None,
    ) -> bool:
        """Store one finished shard: its samples (and rounds) and its results, in one transaction.

        Returns False and writes nothing when the trial or the shard is already done, so a
        duplicated worker cannot duplicate rows. The shard's lease ends; ``holder`` (the driver
        that ran it) is kept on the row. The trial stays not done: once every shard is stored,
        :meth:`finish_trial` writes its metrics.
        """
        with self._transaction() as session:
            row = _locked_trial(session, trial)
            if row.status == "done":
                return False
            shard_row = locked_shard(session, trial.trial_id, output.shard, output.indices)
            if shard_row.status == "done":
                return False
            _insert_samples(session, trial.trial_id, output, record_rounds)
            shard_row.status = "done"
            shard_row.prompts = list(output.indices)
            shard_row.results = [result_to_json(result) for result in output.results]
            shard_row.node_id = output.node_id
            shard_row.seconds = output.seconds
            shard_row.finished_at = utc_now()
            shard_row.lease_expires_at = None
            if holder is not None:
                shard_row.driver_id, shard_row.driver = holder.driver_id, holder.name
            session.flush()
            running = select(func.count()).where(
                TrialShardRow.trial_id == trial.trial_id, TrialShardRow.status == "running"
            )
            if not session.scalar(running):
                row.status = "pending"
            return True

    def record_shard_failure(self, trial: Trial, shard: int, error: str) -> bool:
        """Mark a shard given up (after its retries) and its trial failed with ``error``.

        The trial's other stored shards are kept: a resubmit runs only the missing ones.
        Returns False when the trial is already done.
        """
        with self._transaction() as session:
            row = _locked_trial(session, trial)
            if row.status == "done":
                return False
            shard_row = session.get(TrialShardRow, (trial.trial_id, shard), with_for_update=True)
            if shard_row is not None and shard_row.status != "done":
                shard_row.status = "failed"
                shard_row.finished_at = utc_now()
                shard_row.lease_expires_at = None
            row.status = "failed"
            row.error = error
            row.finished_at = utc_now()
            return True

    def finish_trial(self, trial: Trial, metrics: TrialMetrics) -> bool:
        """Mark a trial whose shards are all stored done with ``metrics`` (from all its samples).

        Writes its metric and interval columns, per-position tables and speedups, and clears
        its shards' results. Returns False when it is already done.
        """
        with self._transaction() as session:
            row = _locked_trial(session, trial)
            if row.status == "done":
                return False
            session.execute(
                update(TrialShardRow)
                .where(TrialShardRow.trial_id == trial.trial_id)
                .values(results=None)
            )
            _close_trial(session, row, metrics, self.run_id)
            return True

    def record_failure(self, trial: Trial, error: str, attempts: int | None = None) -> bool:
        """Mark a trial failed with its error (and attempt count); False if it is already done."""
        with self._transaction() as session:
            row = _locked_trial(session, trial)
            if row.status == "done":
                return False
            row.status = "failed"
            row.error = error
            if attempts is not None:
                row.attempts = attempts
            row.finished_at = utc_now()
            return True

    def record_run(self, sweep: str, provenance: Provenance) -> int:
        """Store a sweep run's provenance; trials recorded through this handle point to it."""
        with self._transaction() as session:
            row = RunRow(sweep=sweep, fingerprint=provenance.fingerprint(), **provenance.columns())
            session.add(row)
            session.flush()
            self.run_id = row.id
        return row.id

    def record_cost_fit(self, values: dict[str, Any]) -> None:
        """Store a sweep's cost fit of one group (``CostFitRow`` columns), replacing an old one."""
        with self._transaction() as session:
            session.execute(
                delete(CostFitRow).where(
                    CostFitRow.sweep == values["sweep"],
                    CostFitRow.group_key == values["group_key"],
                )
            )
            session.execute(insert(CostFitRow), [values])

    def record_traces(
        self, trace_key: str, cap: int, traces: Sequence[dict[str, Any]], seconds: float
    ) -> bool:
        """Store one group's traces (JSON-ready dicts); False when the key is already stored."""
        with self._transaction() as session:
            if session.get(TraceRow, trace_key) is not None:
                return False
            values = {
                "trace_key": trace_key,
                "cap": cap,
                "n_samples": len(traces),
                "traces": list(traces),
                "seconds": seconds,
            }
            session.execute(insert(TraceRow), [values])
            return True

    def record_training_job(
        self,
        job: TrainingJob,
        status: str,
        attempts: int | None = None,
        error: str | None = None,
        metrics: dict[str, Any] | None = None,
        seconds: float | None = None,
    ) -> None:
        """Create or update a training job's row with its status and outcome."""
        with self._transaction() as session:
            insert_ignore(session, TrainingJobRow, [job_values(job)])
            row = session.get(TrainingJobRow, job.job_id, with_for_update=True)
            assert row is not None
            row.status = status
            if attempts is not None:
                row.attempts = attempts
            row.error = error
            if metrics is not None:
                row.metrics = metrics
            if seconds is not None:
                row.seconds = seconds
            row.updated_at = utc_now()

    def record_job_attempt_error(self, job: TrainingJob, error: str) -> None:
        """Append a failed attempt's error to the job's ``attempt_errors`` (kept when done)."""
        with self._transaction() as session:
            insert_ignore(session, TrainingJobRow, [job_values(job)])
            row = session.get(TrainingJobRow, job.job_id, with_for_update=True)
            assert row is not None
            row.attempt_errors = [*(row.attempt_errors or []), error]
            row.updated_at = utc_now()

    def record_artifact(self, job_id: str, kind: str, path: str) -> None:
        """Record a file a training job produced (recording the same one twice is a no-op)."""
        with self._transaction() as session:
            insert_ignore(session, ArtifactRow, [{"job_id": job_id, "kind": kind, "path": path}])


def _locked_trial(session: Session, trial: Trial) -> TrialRow:
    """Return the trial's row, inserted as pending if missing and locked for this transaction."""
    insert_ignore(session, TrialRow, [trial_values(trial)])
    row = session.get(TrialRow, trial.trial_id, with_for_update=True, populate_existing=True)
    assert row is not None
    return row


def _set_done(row: TrialRow, metrics: TrialMetrics, run_id: int | None) -> None:
    """Fill a trial row's metric and interval columns from ``metrics`` and mark it done."""
    for column in TRIAL_METRIC_COLUMNS:
        setattr(row, column, getattr(metrics, column))
    for name in INTERVAL_COLUMNS:
        interval = getattr(metrics, f"{name}_interval")
        setattr(row, f"{name}_low", interval.low if interval else None)
        setattr(row, f"{name}_high", interval.high if interval else None)
    row.metrics = extra_metrics(metrics)
    row.run_id = run_id
    row.status = "done"
    row.error = None
    row.attempts = max(row.attempts, 1)
    row.finished_at = utc_now()


def _close_trial(
    session: Session, row: TrialRow, metrics: TrialMetrics, run_id: int | None
) -> None:
    """Mark a trial done with ``metrics``: its columns, per-position tables and speedups (its
    own and, for a baseline, those of the trials measured against it)."""
    _set_done(row, metrics, run_id)
    session.flush()
    replace_position_rows(
        session, row.trial_id, metrics.position_acceptance, metrics.accepted_length_histogram
    )
    apply_speedups(
        session, or_(TrialRow.trial_id == row.trial_id, TrialRow.baseline_id == row.trial_id)
    )


def _insert_samples(
    session: Session, trial_id: str, output: ShardOutput, record_rounds: bool
) -> None:
    """Insert the sample rows (and, when ``record_rounds``, the rounds) of ``output``."""
    for name, extra in (("prompt_ids", output.prompt_ids), ("output_texts", output.output_texts)):
        if extra is not None and len(extra) != len(output.results):
            raise ValueError(f"{name} has {len(extra)} entries for {len(output.results)} results")
    samples = [
        sample_values(
            trial_id,
            index,
            result,
            output.prompt_ids[position] if output.prompt_ids is not None else None,
            output.output_texts[position] if output.output_texts is not None else None,
        )
        for position, (index, result) in enumerate(zip(output.indices, output.results, strict=True))
    ]
    if samples:
        session.execute(insert(SampleResultRow), samples)
    rounds = round_values(trial_id, output.indices, output.results) if record_rounds else []
    if rounds:
        session.execute(insert(RoundRow), rounds)
