"""Prompt shards of live trials (``trial_shards``): a trial spreads over replicas, resumes by shard.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "trial_shards",
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("shard", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("prompts", sa.JSON(), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("results", sa.JSON(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'done', 'failed')", name="ck_trial_shards_status"
        ),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.trial_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("trial_id", "shard"),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("trial_shards")
