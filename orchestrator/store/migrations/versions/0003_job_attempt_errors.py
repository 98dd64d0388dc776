"""Training jobs keep the error of every failed attempt (``attempt_errors``), also once done.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("training_jobs", sa.Column("attempt_errors", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("training_jobs") as batch:
        batch.drop_column("attempt_errors")
