"""The store's API: register sweeps, record trials and training jobs, read rows back.

Every method runs in one transaction. Recording is idempotent: a trial already ``done`` is never
written again (so a retried or duplicated worker cannot duplicate rows), and inserts of rows that
may already exist (a trial shared by two sweeps, a job) are ``ON CONFLICT DO NOTHING``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import pandas as pd
import yaml
from sqlalchemy import (
    ColumnElement,
    Engine,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from orchestrator.analysis.metrics import (
    PositionAcceptance,
    SampleCounts,
    ratio,
    rounds_position_acceptance,
    sample_tokens_per_s,
    speedup,
    trial_intervals,
)
from orchestrator.analysis.pairing import SampleSpeed, paired_ratio, sample_speedups
from orchestrator.store.db import (
    StoreError,
    check_readable,
    default_url,
    make_engine,
    upgrade_to_head,
)
from orchestrator.store.models import (
    INTERVAL_FIGURES,
    TRIAL_METRIC_COLUMNS,
    AcceptedLengthRow,
    ArtifactRow,
    Base,
    CostFitRow,
    PositionAcceptanceRow,
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
from orchestrator.store.query import QueryLimits, run_query
from orchestrator.store.records import (
    LeaseHolder,
    QueryResult,
    ShardClaim,
    StoredArtifact,
    StoredCostFit,
    StoredJob,
    StoredRound,
    StoredRun,
    StoredSample,
    StoredShard,
    StoredTraces,
    StoredTrial,
    SweepInfo,
    record_of,
    records_frame,
)
from workers.records import GenerationResult, result_from_json, result_to_json

if TYPE_CHECKING:
    from orchestrator.analysis.metrics import TrialMetrics
    from orchestrator.store.provenance_record import Provenance
    from orchestrator.sweep.planner import Plan, TrainingJob, Trial
    from orchestrator.sweep.spec import SweepSpec

R = TypeVar("R")
_MIGRATION_LOCK = threading.Lock()
_ID_CHUNK = 500
#: TrialMetrics intervals stored as ``<name>_low`` / ``<name>_high`` trial columns.
_INTERVAL_COLUMNS = tuple(name for name in INTERVAL_FIGURES if name != "speedup")


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


def open_store(url: str | None = None, read_only: bool = False) -> Store:
    """Open the results store at ``url`` (default ``$SPECSWEEP_DB`` or ``sqlite:///results.db``).

    Writers migrate the schema to the newest revision first; readers never write and fail with
    StoreError when the database is missing or not migrated.
    """
    engine = make_engine(url or default_url(), read_only=read_only)
    try:
        if read_only:
            check_readable(engine)
        else:
            with _MIGRATION_LOCK:
                upgrade_to_head(engine)
    except Exception:
        engine.dispose()
        raise
    return Store(engine=engine, read_only=read_only)


def prompt_id(prompt_ids: Sequence[int]) -> str:
    """Return a short hash of a prompt's token ids (the same prompt gets the same id anywhere)."""
    data = json.dumps([int(token) for token in prompt_ids], separators=(",", ":"))
    return hashlib.sha256(data.encode("ascii")).hexdigest()[:16]


@dataclass
class Store:
    """A handle on the results database; open it with :func:`open_store`."""

    engine: Engine
    read_only: bool = False
    #: The ``runs`` row of the sweep run in progress; trials recorded through this handle
    #: point to it (set by :meth:`record_run`).
    run_id: int | None = None

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """Yield a session inside one transaction, committed on success."""
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session

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
            _insert_ignore(session, SweepRow, [values])
            query = select(SweepRow).where(SweepRow.name == spec.name).with_for_update()
            sweep = session.scalars(query.execution_options(populate_existing=True)).one()
            for key, value in values.items():
                setattr(sweep, key, value)
            sweep.updated_at = utc_now()
            session.flush()
            _insert_ignore(session, TrialRow, [_trial_values(trial) for trial in plan.trials])
            _insert_ignore(session, TrainingJobRow, [_job_values(job) for job in plan.jobs])
            session.execute(delete(SweepTrialRow).where(SweepTrialRow.sweep_id == sweep.id))
            links = [
                {"sweep_id": sweep.id, "trial_id": trial.trial_id, "position": position}
                for position, trial in enumerate(plan.trials)
            ]
            if links:
                session.execute(insert(SweepTrialRow), links)
            return sweep.id

    def completed_trial_ids(self, trial_ids: Iterable[str]) -> set[str]:
        """Return those of ``trial_ids`` whose trials are done (the runner skips them)."""
        return self._ids_with_status(TrialRow, TrialRow.trial_id, trial_ids)

    def completed_job_ids(self, job_ids: Iterable[str]) -> set[str]:
        """Return those of ``job_ids`` whose training jobs are done."""
        return self._ids_with_status(TrainingJobRow, TrainingJobRow.job_id, job_ids)

    def _ids_with_status(
        self, model: type[Base], id_column: Any, ids: Iterable[str], status: str = "done"
    ) -> set[str]:
        """Return the ids among ``ids`` whose row in ``model`` has ``status``."""
        wanted = list(dict.fromkeys(ids))
        found: set[str] = set()
        with self._transaction() as session:
            for start in range(0, len(wanted), _ID_CHUNK):
                chunk = wanted[start : start + _ID_CHUNK]
                query = select(id_column).where(id_column.in_(chunk), model.status == status)
                found.update(session.scalars(query))
        return found

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
                return ShardClaim("done", stored and _other_driver(stored, holder))
            before = _locked_shard(session, trial.trial_id, shard, prompts)
            if before.status == "done":
                return ShardClaim("done", _other_driver(before, holder))
            now = _clock(session)
            attempt = {"status": "running", "attempts": TrialShardRow.attempts + 1}
            attempt |= {"started_at": now, "finished_at": None}
            taken = session.execute(
                update(TrialShardRow)
                .where(*_shard_key(trial.trial_id, shard), _free_for(holder, now))
                .values(**attempt, **_lease_values(holder, now, lease_s))
                .execution_options(synchronize_session=False)
            )
            if taken.rowcount != 1:
                return ShardClaim("held", before.driver, _seconds_left(before, now))
            if row.status != "running":
                row.started_at = now
            row.status = "running"
            row.attempts = max(row.attempts, before.attempts + 1)
            row.finished_at = None
            taken_over = before.status == "running" and before.driver_id is not None
            return ShardClaim("acquired", _other_driver(before, holder) if taken_over else None)

    def renew_leases(self, holder: LeaseHolder, lease_s: float) -> int:
        """Extend to ``lease_s`` seconds from now every lease ``holder`` holds on a running shard
        (the heartbeat); return how many. A lease another driver took over is not renewed."""
        with self._transaction() as session:
            now = _clock(session)
            renewed = session.execute(
                update(TrialShardRow)
                .where(*_held_by(holder))
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
                .where(*_held_by(holder))
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
            shard_row = _locked_shard(session, trial.trial_id, output.shard, output.indices)
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

    def shard_results(self, trial_id: str) -> list[tuple[int, GenerationResult]]:
        """Return (sample index, result) of every stored shard's sample of a trial, by index.

        Empty once the trial is done (its shards' results are cleared then).
        """
        query = select(TrialShardRow.prompts, TrialShardRow.results).where(
            TrialShardRow.trial_id == trial_id, TrialShardRow.status == "done"
        )
        with self._transaction() as session:
            found = [
                (int(index), result_from_json(data))
                for prompts, results in session.execute(query)
                if results is not None  # JSON null once the trial is done
                for index, data in zip(prompts, results, strict=True)
            ]
        return sorted(found, key=lambda pair: pair[0])

    def stored_prompts(self, trial_ids: Iterable[str]) -> dict[str, set[int]]:
        """Return, per trial, the sample indices of its stored shards (the resume skips them)."""
        wanted = list(dict.fromkeys(trial_ids))
        found: dict[str, set[int]] = {}
        with self._transaction() as session:
            for start in range(0, len(wanted), _ID_CHUNK):
                query = select(TrialShardRow.trial_id, TrialShardRow.prompts).where(
                    TrialShardRow.trial_id.in_(wanted[start : start + _ID_CHUNK]),
                    TrialShardRow.status == "done",
                )
                for trial_id, prompts in session.execute(query):
                    found.setdefault(trial_id, set()).update(int(index) for index in prompts)
        return found

    def trial_shards(self, trial_ids: Iterable[str]) -> list[StoredShard]:
        """Return the shards of these trials (held results left out), by trial and shard."""
        order = (TrialShardRow.shard,)
        return self._of_trials(TrialShardRow, trial_ids, order, partial(record_of, StoredShard))

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

    def refresh_speedups(self, sweep: str | None = None) -> int:
        """Recompute speedups of done trials (of one sweep, or all) vs their AR baselines.

        Returns the number of trials updated. A baseline's speedup is 1; a trial whose
        baseline is not done has speedup None.
        """
        condition: ColumnElement[bool] = true()
        if sweep is not None:
            condition = TrialRow.trial_id.in_(_sweep_trial_ids(sweep))
        with self._transaction() as session:
            return _apply_speedups(session, condition)

    def refresh_statistics(self, sweep: str | None = None) -> int:
        """Recompute, from the stored samples and rounds, every done trial's (of one sweep, or
        all) intervals, per-sample tokens/s and speedups, per-position acceptance and
        accepted lengths; return how many trials were refreshed.

        Exists for trials stored before these were recorded (revision 0005); per-position
        acceptance needs stored rounds (``record_rounds: true``).
        """
        condition: ColumnElement[bool] = true()
        if sweep is not None:
            condition = TrialRow.trial_id.in_(_sweep_trial_ids(sweep))
        with self._transaction() as session:
            query = select(TrialRow).where(TrialRow.status == "done", condition)
            rows = list(session.scalars(query))
            for row in rows:
                _refresh_trial(session, row)
            session.flush()
            _apply_speedups(session, condition)
        return len(rows)

    def trials(self, sweep: str | None = None) -> list[StoredTrial]:
        """Return every trial of ``sweep`` in plan order (without ``sweep``: all, oldest first).

        :meth:`trials_dataframe` gives the same as a DataFrame.
        """
        query = select(TrialRow)
        if sweep is None:
            query = query.order_by(TrialRow.created_at, TrialRow.trial_id)
        else:
            query = (
                query.join(SweepTrialRow, SweepTrialRow.trial_id == TrialRow.trial_id)
                .join(SweepRow, SweepRow.id == SweepTrialRow.sweep_id)
                .where(SweepRow.name == sweep)
                .order_by(SweepTrialRow.position)
            )
        with self._transaction() as session:
            return [record_of(StoredTrial, row) for row in session.scalars(query)]

    def trials_dataframe(self, sweep: str | None = None) -> pd.DataFrame:
        """Return :meth:`trials` as a DataFrame, one column per ``trials`` column.

        The columns are there also when no trial is stored.
        """
        return records_frame(StoredTrial, self.trials(sweep))

    def sweep_names(self) -> list[str]:
        """Return the names of the stored sweeps, oldest first."""
        with self._transaction() as session:
            return list(session.scalars(select(SweepRow.name).order_by(SweepRow.created_at)))

    def round_counts(self, trial_ids: Iterable[str]) -> pd.DataFrame:
        """Return the number of rounds per (trial_id, drafted, accepted) of these trials.

        Counted in the database, so a distribution never pulls every round.
        """
        wanted = list(dict.fromkeys(trial_ids))
        query = select(RoundRow.trial_id, RoundRow.drafted, RoundRow.accepted, func.count())
        query = query.group_by(RoundRow.trial_id, RoundRow.drafted, RoundRow.accepted)
        rows: list[tuple[Any, ...]] = []
        with self._transaction() as session:
            for start in range(0, len(wanted), _ID_CHUNK):
                chunk = wanted[start : start + _ID_CHUNK]
                rows += [
                    tuple(row) for row in session.execute(query.where(RoundRow.trial_id.in_(chunk)))
                ]
        return pd.DataFrame(rows, columns=["trial_id", "drafted", "accepted", "rounds"])

    def training_job_kinds(self) -> dict[str, str]:
        """Return {training job name: kind} of every stored training job."""
        with self._transaction() as session:
            return dict(session.execute(select(TrainingJobRow.name, TrainingJobRow.kind)).all())

    def trial_rows(self, trial_ids: Iterable[str]) -> list[StoredTrial]:
        """Return the trials of these ids (those stored), in the order given."""
        wanted = list(dict.fromkeys(trial_ids))
        found = {
            trial.trial_id: trial
            for trial in self._of_trials(TrialRow, wanted, (), partial(record_of, StoredTrial))
        }
        return [found[trial_id] for trial_id in wanted if trial_id in found]

    def sample_outputs(self, trial_id: str) -> list[StoredSample]:
        """Return the stored samples of one trial in sample order."""
        order = (SampleResultRow.sample_index,)
        return self._of_trials(SampleResultRow, [trial_id], order, partial(record_of, StoredSample))

    def sweeps(self) -> list[SweepInfo]:
        """Return every stored sweep (name, description, times, trial count), oldest first."""
        columns = (SweepRow.name, SweepRow.description, SweepRow.created_at, SweepRow.updated_at)
        query = (
            select(*columns, func.count(SweepTrialRow.trial_id))
            .outerjoin(SweepTrialRow, SweepTrialRow.sweep_id == SweepRow.id)
            .group_by(SweepRow.id, *columns)
            .order_by(SweepRow.created_at)
        )
        with self._transaction() as session:
            return [SweepInfo(*row) for row in session.execute(query)]

    def rounds(self, trial_ids: Iterable[str]) -> list[StoredRound]:
        """Return the stored rounds of these trials, ordered by trial, sample and round.

        Exists for the cost-model fit and the replay cross-check, which read the measured
        rounds (a trial stored without rounds contributes none).
        """
        order = (RoundRow.sample_index, RoundRow.round_index)
        return self._of_trials(RoundRow, trial_ids, order, partial(record_of, StoredRound))

    def sample_speeds(self, trial_id: str) -> list[SampleSpeed]:
        """Return one trial's samples (prompt, tokens, seconds) in sample order."""
        with self._transaction() as session:
            speeds, _ids = _sample_speeds(session, [trial_id])
        return sorted(speeds.get(trial_id, []), key=lambda sample: sample.sample_index)

    def position_acceptance(self, trial_ids: Iterable[str]) -> pd.DataFrame:
        """Return trial_id, position, drafted, accepted, rate of these trials, by trial and
        position (one row per trial and draft position)."""
        columns = ["trial_id", "position", "drafted", "accepted", "rate"]
        order = (PositionAcceptanceRow.position,)
        rows = self._of_trials(PositionAcceptanceRow, trial_ids, order, _values(columns))
        return pd.DataFrame(rows, columns=columns)

    def accepted_lengths(self, trial_ids: Iterable[str]) -> pd.DataFrame:
        """Return trial_id, length, rounds (rounds that accepted exactly ``length`` tokens) of
        these trials, by trial and length."""
        columns = ["trial_id", "length", "rounds"]
        order = (AcceptedLengthRow.length,)
        rows = self._of_trials(AcceptedLengthRow, trial_ids, order, _values(columns))
        return pd.DataFrame(rows, columns=columns)

    def _of_trials(
        self,
        model: Any,
        trial_ids: Iterable[str],
        order: Sequence[Any],
        convert: Callable[[Any], R],
    ) -> list[R]:
        """Return ``convert`` of every ``model`` row of these trial ids, by trial then ``order``.

        Reads the ids in chunks, so any number of trials fits in a statement.
        """
        wanted = list(dict.fromkeys(trial_ids))
        found: list[R] = []
        with self._transaction() as session:
            for start in range(0, len(wanted), _ID_CHUNK):
                query = (
                    select(model)
                    .where(model.trial_id.in_(wanted[start : start + _ID_CHUNK]))
                    .order_by(model.trial_id, *order)
                )
                found += [convert(row) for row in session.scalars(query)]
        return found

    def record_run(self, sweep: str, provenance: Provenance) -> int:
        """Store a sweep run's provenance; trials recorded through this handle point to it."""
        with self._transaction() as session:
            row = RunRow(sweep=sweep, fingerprint=provenance.fingerprint(), **provenance.columns())
            session.add(row)
            session.flush()
            self.run_id = row.id
        return row.id

    def runs(self, run_ids: Iterable[int] | None = None) -> list[StoredRun]:
        """Return stored runs (all, or those of ``run_ids``), oldest first."""
        query = select(RunRow).order_by(RunRow.id)
        if run_ids is not None:
            query = query.where(RunRow.id.in_(list(run_ids)))
        with self._transaction() as session:
            return [record_of(StoredRun, row) for row in session.scalars(query)]

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

    def cost_fits(self, sweep: str | None = None) -> list[StoredCostFit]:
        """Return the stored cost fits (of one sweep, or all), oldest first."""
        query = select(CostFitRow).order_by(CostFitRow.id)
        if sweep is not None:
            query = query.where(CostFitRow.sweep == sweep)
        with self._transaction() as session:
            return [record_of(StoredCostFit, row) for row in session.scalars(query)]

    def cost_fits_dataframe(self, sweep: str | None = None) -> pd.DataFrame:
        """Return :meth:`cost_fits` as a DataFrame, one column per ``cost_fits`` column."""
        return records_frame(StoredCostFit, self.cost_fits(sweep))

    def traces(self, trace_key: str) -> StoredTraces | None:
        """Return the traces stored under ``trace_key`` (None when there are none)."""
        with self._transaction() as session:
            row = session.get(TraceRow, trace_key)
            return None if row is None else record_of(StoredTraces, row)

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
            _insert_ignore(session, TrainingJobRow, [_job_values(job)])
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
            _insert_ignore(session, TrainingJobRow, [_job_values(job)])
            row = session.get(TrainingJobRow, job.job_id, with_for_update=True)
            assert row is not None
            row.attempt_errors = [*(row.attempt_errors or []), error]
            row.updated_at = utc_now()

    def training_jobs(self, job_ids: Iterable[str] | None = None) -> list[StoredJob]:
        """Return training jobs (all, or those of ``job_ids``), oldest first."""
        query = select(TrainingJobRow).order_by(TrainingJobRow.created_at, TrainingJobRow.job_id)
        if job_ids is not None:
            query = query.where(TrainingJobRow.job_id.in_(list(job_ids)))
        with self._transaction() as session:
            return [record_of(StoredJob, row) for row in session.scalars(query)]

    def record_artifact(self, job_id: str, kind: str, path: str) -> None:
        """Record a file a training job produced (recording the same one twice is a no-op)."""
        with self._transaction() as session:
            _insert_ignore(session, ArtifactRow, [{"job_id": job_id, "kind": kind, "path": path}])

    def artifacts(self, job_id: str) -> list[StoredArtifact]:
        """Return the artifacts of a training job, oldest first."""
        query = select(ArtifactRow).where(ArtifactRow.job_id == job_id).order_by(ArtifactRow.id)
        with self._transaction() as session:
            return [record_of(StoredArtifact, row) for row in session.scalars(query)]

    def query(
        self, sql: str, limits: QueryLimits | None = None, allow_superuser: bool = False
    ) -> QueryResult | None:
        """Run one hand-written read-only statement; return its result set, or None.

        Only on a store opened read-only (else StoreError); see
        :func:`orchestrator.store.query.run_query` for the checks and limits (QueryRefused,
        QueryLimitExceeded, and the database's own errors as SQLAlchemy's ``DBAPIError``).
        """
        if not self.read_only:
            raise StoreError("query runs only on a store opened with read_only=True")
        return run_query(self.engine, sql, limits or QueryLimits(), allow_superuser)


def _values(columns: Sequence[str]) -> Callable[[Any], tuple[Any, ...]]:
    """Return a function giving an ORM row's values of ``columns`` as a tuple."""
    return lambda row: tuple(getattr(row, column) for column in columns)


def _insert_ignore(session: Session, model: type[Base], rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` into ``model``'s table, skipping rows whose key already exists."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        statement = sqlite.insert(model).on_conflict_do_nothing()
    elif dialect == "postgresql":
        statement = postgresql.insert(model).on_conflict_do_nothing()
    else:
        raise NotImplementedError(f"the store supports SQLite and PostgreSQL, not {dialect}")
    session.execute(statement, rows)


def _set_done(row: TrialRow, metrics: TrialMetrics, run_id: int | None) -> None:
    """Fill a trial row's metric and interval columns from ``metrics`` and mark it done."""
    for column in TRIAL_METRIC_COLUMNS:
        setattr(row, column, getattr(metrics, column))
    for name in _INTERVAL_COLUMNS:
        interval = getattr(metrics, f"{name}_interval")
        setattr(row, f"{name}_low", interval.low if interval else None)
        setattr(row, f"{name}_high", interval.high if interval else None)
    row.metrics = _extra_metrics(metrics)
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
    _replace_position_rows(
        session, row.trial_id, metrics.position_acceptance, metrics.accepted_length_histogram
    )
    _apply_speedups(
        session, or_(TrialRow.trial_id == row.trial_id, TrialRow.baseline_id == row.trial_id)
    )


def _locked_trial(session: Session, trial: Trial) -> TrialRow:
    """Return the trial's row, inserted as pending if missing and locked for this transaction."""
    _insert_ignore(session, TrialRow, [_trial_values(trial)])
    row = session.get(TrialRow, trial.trial_id, with_for_update=True, populate_existing=True)
    assert row is not None
    return row


def _new_shard(trial_id: str, shard: int, prompts: Sequence[int]) -> dict[str, Any]:
    """Return the trial_shards values of a shard not run yet (running, no attempt, no lease)."""
    return {
        "trial_id": trial_id,
        "shard": shard,
        "status": "running",
        "attempts": 0,
        "prompts": [int(index) for index in prompts],
    }


def _locked_shard(
    session: Session, trial_id: str, shard: int, prompts: Sequence[int]
) -> TrialShardRow:
    """Return a shard row, inserted as running if missing and locked for this transaction."""
    _insert_ignore(session, TrialShardRow, [_new_shard(trial_id, shard, prompts)])
    return _shard_row(session, trial_id, shard)


def _shard_row(session: Session, trial_id: str, shard: int) -> TrialShardRow:
    """Return an existing shard row as the database has it now, locked for this transaction."""
    row = session.get(
        TrialShardRow, (trial_id, shard), with_for_update=True, populate_existing=True
    )
    assert row is not None
    return row


def _shard_key(trial_id: str, shard: int) -> tuple[ColumnElement[bool], ...]:
    """Return the conditions selecting one shard's row."""
    return (TrialShardRow.trial_id == trial_id, TrialShardRow.shard == shard)


def _clock(session: Session) -> datetime:
    """Return the time leases are measured by: the PostgreSQL server's clock (one clock for
    drivers on any host), else this host's (a SQLite store is a local file)."""
    if session.get_bind().dialect.name == "postgresql":
        now = session.scalar(select(func.clock_timestamp()))
        assert isinstance(now, datetime)
        return now
    return utc_now()


def _lease_values(holder: LeaseHolder, now: datetime, lease_s: float) -> dict[str, Any]:
    """Return the trial_shards values of a lease to ``holder`` lapsing ``lease_s`` after ``now``."""
    return {
        "driver_id": holder.driver_id,
        "driver": holder.name,
        "lease_expires_at": now + timedelta(seconds=lease_s),
    }


def _free_for(holder: LeaseHolder, now: datetime) -> ColumnElement[bool]:
    """Return the condition of a shard ``holder`` may take at ``now``: not done, and not
    running under another driver's lease that is still live."""
    return and_(
        TrialShardRow.status != "done",
        or_(
            TrialShardRow.status != "running",
            TrialShardRow.driver_id.is_(None),
            TrialShardRow.driver_id == holder.driver_id,
            TrialShardRow.lease_expires_at.is_(None),
            TrialShardRow.lease_expires_at <= now,
        ),
    )


def _held_by(holder: LeaseHolder) -> tuple[ColumnElement[bool], ...]:
    """Return the conditions selecting the running shards whose lease ``holder`` holds."""
    return (
        TrialShardRow.driver_id == holder.driver_id,
        TrialShardRow.status == "running",
        TrialShardRow.lease_expires_at.is_not(None),
    )


def _other_driver(row: TrialShardRow, holder: LeaseHolder) -> str | None:
    """Return the ``host:pid`` of the driver named on ``row`` unless it is ``holder``."""
    return None if row.driver_id in (None, holder.driver_id) else row.driver


def _seconds_left(row: TrialShardRow, now: datetime) -> float:
    """Return the seconds from ``now`` until ``row``'s lease lapses (0 when it has)."""
    expires = row.lease_expires_at
    if expires is None:
        return 0.0
    if expires.tzinfo is None:  # SQLite keeps UTC timestamps without their zone
        expires = expires.replace(tzinfo=UTC)
    return max(0.0, (expires - now).total_seconds())


def _insert_samples(
    session: Session, trial_id: str, output: ShardOutput, record_rounds: bool
) -> None:
    """Insert the sample rows (and, when ``record_rounds``, the rounds) of ``output``."""
    for name, extra in (("prompt_ids", output.prompt_ids), ("output_texts", output.output_texts)):
        if extra is not None and len(extra) != len(output.results):
            raise ValueError(f"{name} has {len(extra)} entries for {len(output.results)} results")
    samples = [
        _sample_values(
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
    rounds = _round_values(trial_id, output.indices, output.results) if record_rounds else []
    if rounds:
        session.execute(insert(RoundRow), rounds)


def _sweep_trial_ids(sweep: str) -> Any:
    """Return a subquery selecting the trial ids linked to the sweep named ``sweep``."""
    return (
        select(SweepTrialRow.trial_id)
        .join(SweepRow, SweepRow.id == SweepTrialRow.sweep_id)
        .where(SweepRow.name == sweep)
    )


def _apply_speedups(session: Session, condition: ColumnElement[bool]) -> int:
    """Set ``speedup`` and its paired interval on done trials matching ``condition``, and each
    of their samples' speedup; return how many trials were updated."""
    baseline = aliased(TrialRow)
    query = (
        select(
            TrialRow.trial_id,
            TrialRow.tokens_per_s,
            TrialRow.is_baseline,
            baseline.trial_id,
            baseline.tokens_per_s,
        )
        .outerjoin(
            baseline,
            and_(baseline.trial_id == TrialRow.baseline_id, baseline.status == "done"),
        )
        .where(TrialRow.status == "done", condition)
    )
    found = list(session.execute(query))
    wanted = {trial_id for trial_id, *_ in found} | {row[3] for row in found if row[3]}
    samples, sample_ids = _sample_speeds(session, wanted)
    updates, sample_updates = [], []
    for trial_id, tokens_per_s, is_baseline, baseline_id, baseline_tps in found:
        base_id = trial_id if is_baseline else baseline_id
        values: dict[str, Any] = {"trial_id": trial_id, "speedup_low": None, "speedup_high": None}
        values["speedup"] = speedup(tokens_per_s, tokens_per_s if is_baseline else baseline_tps)
        per_sample: dict[int, float | None] = {}
        if base_id is not None:
            compared = paired_ratio(samples.get(trial_id, []), samples.get(base_id, []))
            if compared.ratio is not None:
                values["speedup_low"] = compared.ratio.low
                values["speedup_high"] = compared.ratio.high
            per_sample = sample_speedups(samples.get(trial_id, []), samples.get(base_id, []))
        updates.append(values)
        sample_updates += [
            {
                "id": sample_ids[(trial_id, sample.sample_index)],
                "speedup": per_sample.get(sample.sample_index),
            }
            for sample in samples.get(trial_id, [])
        ]
    if updates:
        session.execute(update(TrialRow), updates)
    if sample_updates:
        session.execute(update(SampleResultRow), sample_updates)
    return len(updates)


def _sample_speeds(
    session: Session, trial_ids: Iterable[str]
) -> tuple[dict[str, list[SampleSpeed]], dict[tuple[str, int], int]]:
    """Return the samples of these trials as SampleSpeed lists, and their row ids."""
    wanted = list(trial_ids)
    speeds: dict[str, list[SampleSpeed]] = {}
    ids: dict[tuple[str, int], int] = {}
    columns = (
        SampleResultRow.id,
        SampleResultRow.trial_id,
        SampleResultRow.sample_index,
        SampleResultRow.prompt_id,
        SampleResultRow.generated_tokens,
        SampleResultRow.seconds,
    )
    for start in range(0, len(wanted), _ID_CHUNK):
        query = select(*columns).where(
            SampleResultRow.trial_id.in_(wanted[start : start + _ID_CHUNK])
        )
        for row_id, trial_id, index, prompt, tokens, seconds in session.execute(query):
            speeds.setdefault(trial_id, []).append(SampleSpeed(prompt, index, tokens, seconds))
            ids[(trial_id, index)] = row_id
    return speeds, ids


def _replace_position_rows(
    session: Session,
    trial_id: str,
    positions: Sequence[PositionAcceptance],
    lengths: dict[int, int],
) -> None:
    """Store the trial's per-position acceptance and accepted-length histogram."""
    for model in (PositionAcceptanceRow, AcceptedLengthRow):
        session.execute(delete(model).where(model.trial_id == trial_id))
    position_rows = [
        {
            "trial_id": trial_id,
            "position": p.position,
            "drafted": p.drafted,
            "accepted": p.accepted,
            "rate": p.rate,
        }
        for p in positions
    ]
    length_rows = [
        {"trial_id": trial_id, "length": length, "rounds": rounds}
        for length, rounds in lengths.items()
    ]
    if position_rows:
        session.execute(insert(PositionAcceptanceRow), position_rows)
    if length_rows:
        session.execute(insert(AcceptedLengthRow), length_rows)


def _refresh_trial(session: Session, row: TrialRow) -> None:
    """Recompute a stored trial's intervals, sample rates and position tables from its rows."""
    samples = list(
        session.scalars(
            select(SampleResultRow)
            .where(SampleResultRow.trial_id == row.trial_id)
            .order_by(SampleResultRow.sample_index)
        )
    )
    intervals = trial_intervals(
        [
            SampleCounts(s.generated_tokens, s.seconds, s.drafted, s.accepted, s.n_rounds)
            for s in samples
        ]
    )
    for name in _INTERVAL_COLUMNS:
        interval = getattr(intervals, name)
        setattr(row, f"{name}_low", interval.low if interval else None)
        setattr(row, f"{name}_high", interval.high if interval else None)
    for sample in samples:
        sample.tokens_per_s = ratio(sample.generated_tokens, sample.seconds)
    rounds = list(session.scalars(select(RoundRow).where(RoundRow.trial_id == row.trial_id)))
    stored = (row.metrics or {}).get("accepted_length_histogram", {})
    lengths = (
        dict(sorted(Counter(r.accepted for r in rounds).items()))
        if rounds
        else {int(length): count for length, count in stored.items()}
    )
    _replace_position_rows(session, row.trial_id, rounds_position_acceptance(rounds), lengths)


def _trial_values(trial: Trial) -> dict[str, Any]:
    """Return the trials-table values of a new (pending) trial."""
    config = trial.to_dict()
    config.pop("sweep", None)
    return {
        "trial_id": trial.trial_id,
        "pair": trial.pair,
        "target": trial.target,
        "draft": trial.draft,
        "draft_job": trial.draft_job,
        "backend": trial.backend,
        "tp_size": trial.tp_size,
        "dtype": trial.dtype,
        "dataset": trial.dataset,
        "split": trial.split,
        "samples": trial.samples,
        "max_new_tokens": trial.max_new_tokens,
        "temperature": trial.temperature,
        "top_k": trial.top_k,
        "top_p": trial.top_p,
        "policy": trial.policy,
        "threshold": trial.threshold,
        "max_draft_len": trial.max_draft_len,
        "seed": trial.seed,
        "is_baseline": trial.is_baseline,
        "mode": trial.mode,
        "baseline_id": trial.baseline_id,
        "code_version": trial.code_version,
        "params": trial.params_dict,
        "config": config,
        "status": "pending",
        "attempts": 0,
    }


def _job_values(job: TrainingJob) -> dict[str, Any]:
    """Return the training_jobs values of a new (pending) job."""
    return {
        "job_id": job.job_id,
        "name": job.name,
        "kind": job.kind,
        "config": {
            "base": job.base,
            "teacher": job.teacher,
            "dataset": job.dataset,
            "split": job.split,
            "samples": job.samples,
            "local_path": job.local_path,
            "epochs": job.epochs,
            "config": job.config,
        },
        "status": "pending",
        "attempts": 0,
    }


def _extra_metrics(metrics: TrialMetrics) -> dict[str, Any]:
    """Return the metrics kept in JSON: EESD's HM and the length histograms."""
    return {
        "eesd_hm": metrics.eesd_hm,
        "draft_length_histogram": {str(k): v for k, v in metrics.draft_length_histogram.items()},
        "accepted_length_histogram": {
            str(k): v for k, v in metrics.accepted_length_histogram.items()
        },
    }


def _sample_values(
    trial_id: str,
    index: int,
    result: GenerationResult,
    dataset_prompt_id: str | None,
    output_text: str | None,
) -> dict[str, Any]:
    """Return the sample_results values of one generated sample."""
    return {
        "trial_id": trial_id,
        "sample_index": index,
        "prompt_id": dataset_prompt_id or prompt_id(result.prompt_ids),
        "output_text": output_text,
        "prompt_len": len(result.prompt_ids),
        "generated_tokens": result.n_generated,
        "seconds": result.seconds,
        "output_ids": [int(token) for token in result.output_ids],
        "drafted": result.n_drafted,
        "accepted": result.n_accepted,
        "n_rounds": len(result.rounds),
        "stopped_on_eos": result.stopped_on_eos,
        "tokens_per_s": sample_tokens_per_s(result),
    }


def _round_values(
    trial_id: str, indices: Sequence[int], results: Sequence[GenerationResult]
) -> list[dict[str, Any]]:
    """Return the rounds-table values of every round of every sample (sample ``indices[i]``)."""
    return [
        {
            "trial_id": trial_id,
            "sample_index": sample_index,
            "round_index": round_index,
            "drafted": record.drafted,
            "accepted": record.accepted,
            "bonus": record.bonus,
            "draft_forwards": record.draft_forwards,
            "draft_seconds": record.draft_seconds,
            "verify_seconds": record.verify_seconds,
            "mean_entropy": record.mean_entropy,
            "min_max_prob": record.min_max_prob,
        }
        for sample_index, result in zip(indices, results, strict=True)
        for round_index, record in enumerate(result.rounds)
    ]
