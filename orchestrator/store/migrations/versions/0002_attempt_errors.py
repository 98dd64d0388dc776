"""Trials keep the error of every failed attempt (``attempt_errors``), also once done.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("trials", sa.Column("attempt_errors", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("attempt_errors")
