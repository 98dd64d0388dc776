"""The store's reads: trials, shards, samples, rounds, sweeps, runs, jobs as typed records."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, TypeVar

import pandas as pd
from sqlalchemy import func, select

from orchestrator.analysis.metrics import FitError
from orchestrator.analysis.pairing import SampleSpeed
from orchestrator.store.base import StoreBase
from orchestrator.store.db import StoreError
from orchestrator.store.fit_errors import check_ids, fit_of, side_fit
from orchestrator.store.models import (
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
)
from orchestrator.store.query import QueryLimits, run_query
from orchestrator.store.records import (
    QueryResult,
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
from orchestrator.store.rows import ID_CHUNK, trial_sample_speeds
from orchestrator.sweep.trial import REPLAY_MODE
from workers.records import GenerationResult, result_from_json

R = TypeVar("R")


class StoreReader(StoreBase):
    """Reads of the results store (mixed into :class:`~orchestrator.store.results.Store`)."""

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
            for start in range(0, len(wanted), ID_CHUNK):
                chunk = wanted[start : start + ID_CHUNK]
                query = select(id_column).where(id_column.in_(chunk), model.status == status)
                found.update(session.scalars(query))
        return found

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
            for start in range(0, len(wanted), ID_CHUNK):
                query = select(TrialShardRow.trial_id, TrialShardRow.prompts).where(
                    TrialShardRow.trial_id.in_(wanted[start : start + ID_CHUNK]),
                    TrialShardRow.status == "done",
                )
                for trial_id, prompts in session.execute(query):
                    found.setdefault(trial_id, set()).update(int(index) for index in prompts)
        return found

    def trial_shards(self, trial_ids: Iterable[str]) -> list[StoredShard]:
        """Return the shards of these trials (held results left out), by trial and shard."""
        order = (TrialShardRow.shard,)
        return self._of_trials(TrialShardRow, trial_ids, order, partial(record_of, StoredShard))

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

    def sweep_specs(self, names: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """Return {sweep name: its stored spec (the validated spec as JSON data)} of these
        sweeps (all without ``names``)."""
        query = select(SweepRow.name, SweepRow.spec)
        if names is not None:
            query = query.where(SweepRow.name.in_(list(names)))
        with self._transaction() as session:
            return {name: spec for name, spec in session.execute(query)}

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
            for start in range(0, len(wanted), ID_CHUNK):
                chunk = wanted[start : start + ID_CHUNK]
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
            speeds, _ids = trial_sample_speeds(session, [trial_id])
        return sorted(speeds.get(trial_id, []), key=lambda sample: sample.sample_index)

    def trials_sample_speeds(self, trial_ids: Iterable[str]) -> dict[str, list[SampleSpeed]]:
        """Return {trial id: its samples (prompt, tokens, seconds, decode seconds)} in sample
        order, for the trials that have samples."""
        with self._transaction() as session:
            speeds, _ids = trial_sample_speeds(session, trial_ids)
        return {
            trial_id: sorted(samples, key=lambda sample: sample.sample_index)
            for trial_id, samples in speeds.items()
        }

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
            for start in range(0, len(wanted), ID_CHUNK):
                query = (
                    select(model)
                    .where(model.trial_id.in_(wanted[start : start + ID_CHUNK]))
                    .order_by(model.trial_id, *order)
                )
                found += [convert(row) for row in session.scalars(query)]
        return found

    def runs(self, run_ids: Iterable[int] | None = None) -> list[StoredRun]:
        """Return stored runs (all, or those of ``run_ids``), oldest first."""
        query = select(RunRow).order_by(RunRow.id)
        if run_ids is not None:
            query = query.where(RunRow.id.in_(list(run_ids)))
        with self._transaction() as session:
            return [record_of(StoredRun, row) for row in session.scalars(query)]

    def cost_fits(self, sweep: str | None = None) -> list[StoredCostFit]:
        """Return the stored cost fits (of one sweep, or all), oldest first."""
        query = select(CostFitRow).order_by(CostFitRow.id)
        if sweep is not None:
            query = query.where(CostFitRow.sweep == sweep)
        with self._transaction() as session:
            return [record_of(StoredCostFit, row) for row in session.scalars(query)]

    def side_fits(self, rows: Iterable[StoredTrial]) -> dict[str, FitError]:
        """Return the cost fit of each replayed trial among ``rows``, by trial id: its stored
        out-of-sample error and its live checks' errors (``fit_errors``), what a paired ratio
        with a replayed side is widened by (``metrics.paired_model_error``)."""
        replayed = [row for row in rows if row.mode == REPLAY_MODE]
        if not replayed:
            return {}
        fits = self.cost_fits()
        found = {row.trial_id: fit_of(row, fits) for row in replayed}
        wanted = [trial_id for fit in found.values() if fit for trial_id in check_ids(fit)]
        checks = {row.trial_id: row for row in self.trial_rows(wanted)}
        return {row.trial_id: side_fit(row, found[row.trial_id], checks) for row in replayed}

    def cost_fits_dataframe(self, sweep: str | None = None) -> pd.DataFrame:
        """Return :meth:`cost_fits` as a DataFrame, one column per ``cost_fits`` column."""
        return records_frame(StoredCostFit, self.cost_fits(sweep))

    def traces(self, trace_key: str) -> StoredTraces | None:
        """Return the traces stored under ``trace_key`` (None when there are none)."""
        with self._transaction() as session:
            row = session.get(TraceRow, trace_key)
            return None if row is None else record_of(StoredTraces, row)

    def training_jobs(self, job_ids: Iterable[str] | None = None) -> list[StoredJob]:
        """Return training jobs (all, or those of ``job_ids``), oldest first."""
        query = select(TrainingJobRow).order_by(TrainingJobRow.created_at, TrainingJobRow.job_id)
        if job_ids is not None:
            query = query.where(TrainingJobRow.job_id.in_(list(job_ids)))
        with self._transaction() as session:
            return [record_of(StoredJob, row) for row in session.scalars(query)]

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
