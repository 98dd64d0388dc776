"""The store's refresh: recompute stored figures (intervals, speedups) from stored samples."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from sqlalchemy import ColumnElement, select, true
from sqlalchemy.orm import Session

from orchestrator.analysis.metrics import (
    SampleCounts,
    per_prompt,
    ratio,
    rounds_position_acceptance,
    trial_intervals,
)
from orchestrator.store.base import StoreBase
from orchestrator.store.models import RoundRow, SampleResultRow, SweepRow, SweepTrialRow, TrialRow
from orchestrator.store.row_values import cost_model_error
from orchestrator.store.rows import INTERVAL_COLUMNS, apply_speedups, replace_position_rows


class StoreRefresh(StoreBase):
    """Recomputes stored figures (mixed into :class:`~orchestrator.store.results.Store`)."""

    def refresh_speedups(self, sweep: str | None = None) -> int:
        """Recompute speedups of done trials (of one sweep, or all) vs their AR baselines.

        Returns the number of trials updated. A baseline's speedup is 1; a trial whose
        baseline is not done has speedup None.
        """
        condition: ColumnElement[bool] = true()
        if sweep is not None:
            condition = TrialRow.trial_id.in_(_sweep_trial_ids(sweep))
        with self._transaction() as session:
            return apply_speedups(session, condition)

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
            apply_speedups(session, condition)
        return len(rows)


def _sweep_trial_ids(sweep: str) -> Any:
    """Return a subquery selecting the trial ids linked to the sweep named ``sweep``."""
    return (
        select(SweepTrialRow.trial_id)
        .join(SweepRow, SweepRow.id == SweepTrialRow.sweep_id)
        .where(SweepRow.name == sweep)
    )


def _refresh_trial(session: Session, row: TrialRow) -> None:
    """Recompute a stored trial's intervals, sample rates and position tables from its rows.

    As the runner computes them (``metrics.trial_intervals``): the repeats of a prompt (its
    samples with one ``prompt_id``) summed within it, and a replayed trial's timed intervals
    widened by the cost-model error stored with it (its speedups' by ``apply_speedups``, which
    reads the same error)."""
    samples = list(
        session.scalars(
            select(SampleResultRow)
            .where(SampleResultRow.trial_id == row.trial_id)
            .order_by(SampleResultRow.sample_index)
        )
    )
    counts = [
        SampleCounts(
            s.generated_tokens,
            s.seconds,
            s.drafted,
            s.accepted,
            s.n_rounds,
            s.decode_seconds,
            s.batch_seconds,
        )
        for s in samples
    ]
    prompts: dict[str, int] = {}
    blocks = [prompts.setdefault(s.prompt_id, len(prompts)) for s in samples]
    intervals = trial_intervals(per_prompt(counts, blocks), cost_model_error(row.metrics))
    row.total_tokens_per_s = ratio(
        sum(c.tokens for c in counts), math.fsum(c.share_seconds for c in counts)
    )
    for name in INTERVAL_COLUMNS:
        interval = getattr(intervals, name)
        setattr(row, f"{name}_low", interval.low if interval else None)
        setattr(row, f"{name}_high", interval.high if interval else None)
    for sample in samples:
        sample.tokens_per_s = ratio(sample.generated_tokens, sample.seconds)
        if sample.decode_seconds is not None:
            sample.decode_tokens_per_s = ratio(sample.generated_tokens, sample.decode_seconds)
    rounds = list(session.scalars(select(RoundRow).where(RoundRow.trial_id == row.trial_id)))
    stored = (row.metrics or {}).get("accepted_length_histogram", {})
    lengths = (
        dict(sorted(Counter(r.accepted for r in rounds).items()))
        if rounds
        else {int(length): count for length, count in stored.items()}
    )
    replace_position_rows(session, row.trial_id, rounds_position_acceptance(rounds), lengths)
