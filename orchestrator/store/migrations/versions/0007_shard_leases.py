"""Shard leases (``trial_shards.driver_id``, ``driver``, ``lease_expires_at``): one driver per
shard while it runs, taken over once its driver stops renewing the lease.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("trial_shards", sa.Column("driver_id", sa.String(length=32), nullable=True))
    op.add_column("trial_shards", sa.Column("driver", sa.String(length=255), nullable=True))
    op.add_column(
        "trial_shards",
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_trial_shards_driver_id", "trial_shards", ["driver_id"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_trial_shards_driver_id", table_name="trial_shards")
    with op.batch_alter_table("trial_shards") as batch:
        batch.drop_column("lease_expires_at")
        batch.drop_column("driver")
        batch.drop_column("driver_id")
