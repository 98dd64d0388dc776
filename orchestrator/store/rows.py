"""SQL the store's writer, reader and refresh share: insert-or-ignore, speedups, position tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from orchestrator.analysis.metrics import PositionAcceptance, speedup, widen
from orchestrator.analysis.pairing import (
    SampleSpeed,
    decode_speeds,
    paired_ratio,
    sample_speedups,
)
from orchestrator.store.models import (
    INTERVAL_FIGURES,
    SPEEDUP_FIGURES,
    AcceptedLengthRow,
    Base,
    PositionAcceptanceRow,
    SampleResultRow,
    TrialRow,
)
from orchestrator.store.row_values import cost_model_error

ID_CHUNK = 500


#: TrialMetrics intervals stored as ``<name>_low`` / ``<name>_high`` trial columns.
INTERVAL_COLUMNS = tuple(name for name in INTERVAL_FIGURES if name not in SPEEDUP_FIGURES)


def insert_ignore(session: Session, model: type[Base], rows: list[dict[str, Any]]) -> None:
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


def trial_sample_speeds(
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
        SampleResultRow.decode_seconds,
        SampleResultRow.drafted,
        SampleResultRow.accepted,
    )
    for start in range(0, len(wanted), ID_CHUNK):
        query = select(*columns).where(
            SampleResultRow.trial_id.in_(wanted[start : start + ID_CHUNK])
        )
        for row_id, trial_id, index, prompt, *values in session.execute(query):
            sample = SampleSpeed(prompt, index, *values)
            speeds.setdefault(trial_id, []).append(sample)
            ids[(trial_id, index)] = row_id
    return speeds, ids


def apply_speedups(session: Session, condition: ColumnElement[bool]) -> int:
    """Set the end-to-end and decode-only speedups and their paired intervals on done trials
    matching ``condition``, and each of their samples' speedups; return how many trials were
    updated. A decode-only figure is None where a side has no decode seconds."""
    baseline = aliased(TrialRow)
    query = (
        select(
            TrialRow.trial_id,
            TrialRow.tokens_per_s,
            TrialRow.decode_tokens_per_s,
            TrialRow.is_baseline,
            TrialRow.metrics,
            baseline.trial_id,
            baseline.tokens_per_s,
            baseline.decode_tokens_per_s,
        )
        .outerjoin(
            baseline,
            and_(baseline.trial_id == TrialRow.baseline_id, baseline.status == "done"),
        )
        .where(TrialRow.status == "done", condition)
    )
    found = list(session.execute(query))
    wanted = {row[0] for row in found} | {row[5] for row in found if row[5]}
    samples, sample_ids = trial_sample_speeds(session, wanted)
    updates, sample_updates = [], []
    for row in found:
        trial_id, tps, decode_tps, is_baseline, metrics, baseline_id, base_tps, base_decode = row
        base_id = trial_id if is_baseline else baseline_id
        mine, theirs = samples.get(trial_id, []), samples.get(base_id, []) if base_id else None
        error = cost_model_error(metrics)
        values: dict[str, Any] = {"trial_id": trial_id}
        end_to_end = _speedup_values(
            "speedup", tps, tps if is_baseline else base_tps, (mine, theirs), error
        )
        decode = _speedup_values(
            "decode_speedup",
            decode_tps,
            decode_tps if is_baseline else base_decode,
            (decode_speeds(mine), decode_speeds(theirs) if theirs is not None else None),
            error,
        )
        values.update(end_to_end[0], **decode[0])
        updates.append(values)
        sample_updates += [
            {
                "id": sample_ids[(trial_id, sample.sample_index)],
                "speedup": end_to_end[1].get(sample.sample_index),
                "decode_speedup": decode[1].get(sample.sample_index),
            }
            for sample in mine
        ]
    if updates:
        session.execute(update(TrialRow), updates)
    if sample_updates:
        session.execute(update(SampleResultRow), sample_updates)
    return len(updates)


def _speedup_values(
    name: str,
    tokens_per_s: float | None,
    baseline_tokens_per_s: float | None,
    paired: tuple[Sequence[SampleSpeed] | None, Sequence[SampleSpeed] | None],
    error: float | None,
) -> tuple[dict[str, Any], dict[int, float | None]]:
    """Return a trial's ``name`` speedup columns (estimate, paired interval) and its per-sample
    speedups, from its tokens/s and samples and its baseline's (``paired``; a side None: not
    paired). A replayed trial's interval is widened by its cost-model ``error``
    (``metrics.widen``, as its tokens/s intervals are: the baseline is live, so the ratio
    carries the replayed side's model error)."""
    samples, baseline = paired
    values: dict[str, Any] = {
        name: speedup(tokens_per_s, baseline_tokens_per_s),
        f"{name}_low": None,
        f"{name}_high": None,
    }
    if samples is None or baseline is None:
        return values, {}
    interval = widen(paired_ratio(samples, baseline).ratio, error)
    if interval is not None:
        values[f"{name}_low"], values[f"{name}_high"] = interval.low, interval.high
    return values, sample_speedups(samples, baseline)


def replace_position_rows(
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
