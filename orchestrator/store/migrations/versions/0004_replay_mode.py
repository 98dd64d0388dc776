"""Replay mode: ``trials.mode``, per-group cost fits (``cost_fits``) and greedy ``traces``.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Apply this revision."""
    # A plain ADD COLUMN: on SQLite a batch (table-recreating) alter of ``trials`` would drop
    # the old table under ``foreign_keys = ON`` and cascade-delete its samples and memberships.
    op.add_column(
        "trials", sa.Column("mode", sa.String(length=16), nullable=False, server_default="live")
    )
    op.create_table(
        "cost_fits",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("sweep", sa.String(length=128), nullable=False),
        sa.Column("group_key", sa.String(length=32), nullable=False),
        sa.Column("pair", sa.String(length=128), nullable=False),
        sa.Column("dataset", sa.String(length=256), nullable=False),
        sa.Column("split", sa.String(length=64), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("max_new_tokens", sa.Integer(), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("t_draft", sa.Float(), nullable=False),
        sa.Column("t_target", sa.Float(), nullable=False),
        sa.Column("t_per_verified", sa.Float(), nullable=False),
        sa.Column("r2_draft", sa.Float(), nullable=False),
        sa.Column("r2_verify", sa.Float(), nullable=False),
        sa.Column("r2_round", sa.Float(), nullable=False),
        sa.Column("n_rounds", sa.Integer(), nullable=False),
        sa.Column("n_trials", sa.Integer(), nullable=False),
        sa.Column("overhead_seconds", sa.Float(), nullable=False),
        sa.Column("check_trial_id", sa.String(length=32), nullable=True),
        sa.Column("check_same_rounds", sa.Float(), nullable=True),
        sa.Column("check_tokens_per_s", sa.Float(), nullable=True),
        sa.Column("check_projected_tokens_per_s", sa.Float(), nullable=True),
        sa.Column("check_error", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sweep", "group_key", name="uq_cost_fits"),
    )
    op.create_table(
        "traces",
        sa.Column("trace_key", sa.String(length=32), nullable=False),
        sa.Column("cap", sa.Integer(), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        sa.Column("traces", sa.JSON(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("trace_key"),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("traces")
    op.drop_table("cost_fits")
    op.drop_column("trials", "mode")
