"""The SQL of shard leases: shard rows, the lease clock and which driver may take a shard."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session

from orchestrator.store.models import TrialShardRow, utc_now
from orchestrator.store.records import LeaseHolder
from orchestrator.store.rows import insert_ignore


def _new_shard(trial_id: str, shard: int, prompts: Sequence[int]) -> dict[str, Any]:
    """Return the trial_shards values of a shard not run yet (running, no attempt, no lease)."""
    return {
        "trial_id": trial_id,
        "shard": shard,
        "status": "running",
        "attempts": 0,
        "prompts": [int(index) for index in prompts],
    }


def locked_shard(
    session: Session, trial_id: str, shard: int, prompts: Sequence[int]
) -> TrialShardRow:
    """Return a shard row, inserted as running if missing and locked for this transaction."""
    insert_ignore(session, TrialShardRow, [_new_shard(trial_id, shard, prompts)])
    return _shard_row(session, trial_id, shard)


def _shard_row(session: Session, trial_id: str, shard: int) -> TrialShardRow:
    """Return an existing shard row as the database has it now, locked for this transaction."""
    row = session.get(
        TrialShardRow, (trial_id, shard), with_for_update=True, populate_existing=True
    )
    assert row is not None
    return row


def shard_key(trial_id: str, shard: int) -> tuple[ColumnElement[bool], ...]:
    """Return the conditions selecting one shard's row."""
    return (TrialShardRow.trial_id == trial_id, TrialShardRow.shard == shard)


def lease_clock(session: Session) -> datetime:
    """Return the time leases are measured by: the PostgreSQL server's clock (one clock for
    drivers on any host), else this host's (a SQLite store is a local file)."""
    if session.get_bind().dialect.name == "postgresql":
        now = session.scalar(select(func.clock_timestamp()))
        assert isinstance(now, datetime)
        return now
    return utc_now()


def lease_values(holder: LeaseHolder, now: datetime, lease_s: float) -> dict[str, Any]:
    """Return the trial_shards values of a lease to ``holder`` lapsing ``lease_s`` after ``now``."""
    return {
        "driver_id": holder.driver_id,
        "driver": holder.name,
        "lease_expires_at": now + timedelta(seconds=lease_s),
    }


def free_for(holder: LeaseHolder, now: datetime) -> ColumnElement[bool]:
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


def held_by(holder: LeaseHolder) -> tuple[ColumnElement[bool], ...]:
    """Return the conditions selecting the running shards whose lease ``holder`` holds."""
    return (
        TrialShardRow.driver_id == holder.driver_id,
        TrialShardRow.status == "running",
        TrialShardRow.lease_expires_at.is_not(None),
    )


def other_driver(row: TrialShardRow, holder: LeaseHolder) -> str | None:
    """Return the ``host:pid`` of the driver named on ``row`` unless it is ``holder``."""
    return None if row.driver_id in (None, holder.driver_id) else row.driver


def seconds_left(row: TrialShardRow, now: datetime) -> float:
    """Return the seconds from ``now`` until ``row``'s lease lapses (0 when it has)."""
    expires = row.lease_expires_at
    if expires is None:
        return 0.0
    if expires.tzinfo is None:  # SQLite keeps UTC timestamps without their zone
        expires = expires.replace(tzinfo=UTC)
    return max(0.0, (expires - now).total_seconds())
