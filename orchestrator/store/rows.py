"""SQL the store's writer, reader and refresh share: insert-or-ignore, speedups, position tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from orchestrator.analysis.metrics import PositionAcceptance, speedup
from orchestrator.analysis.pairing import SampleSpeed, paired_ratio, sample_speedups
from orchestrator.store.models import (
    INTERVAL_FIGURES,
    AcceptedLengthRow,
    Base,
    PositionAcceptanceRow,
    SampleResultRow,
    TrialRow,
)

ID_CHUNK = 500


#: TrialMetrics intervals stored as ``<name>_low`` / ``<name>_high`` trial columns.
INTERVAL_COLUMNS = tuple(name for name in INTERVAL_FIGURES if name != "speedup")


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
    )
    for start in range(0, len(wanted), ID_CHUNK):
        query = select(*columns).where(
            SampleResultRow.trial_id.in_(wanted[start : start + ID_CHUNK])
        )
        for row_id, trial_id, index, prompt, tokens, seconds in session.execute(query):
            speeds.setdefault(trial_id, []).append(SampleSpeed(prompt, index, tokens, seconds))
            ids[(trial_id, index)] = row_id
    return speeds, ids


def apply_speedups(session: Session, condition: ColumnElement[bool]) -> int:
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
    samples, sample_ids = trial_sample_speeds(session, wanted)
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
