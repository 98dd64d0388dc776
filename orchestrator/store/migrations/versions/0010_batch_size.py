"""Batches: each trial's ``batch_size`` (1 for trials stored before), its total tokens/s
(throughput) with its interval, and each sample's share of its batch's wall time
(``batch_seconds``). Nullable figures: rows stored before have none.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TRIAL_FIGURES = ("total_tokens_per_s", "total_tokens_per_s_low", "total_tokens_per_s_high")


def upgrade() -> None:
    """Apply this revision."""
    op.add_column(
        "trials", sa.Column("batch_size", sa.Integer(), nullable=False, server_default="1")
    )
    for name in TRIAL_FIGURES:
        op.add_column("trials", sa.Column(name, sa.Float(), nullable=True))
    op.add_column("sample_results", sa.Column("batch_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    """Revert this revision (plain DROP COLUMN: recreating ``trials`` on SQLite, as a batch
    would, cascade-deletes its samples)."""
    op.drop_column("sample_results", "batch_seconds")
    for name in reversed(TRIAL_FIGURES):
        op.drop_column("trials", name)
    op.drop_column("trials", "batch_size")
