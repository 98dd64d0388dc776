"""The draft kind of each trial (``trials.draft_kind``: ``lm``, ``ngram`` or ``eagle``), so
the store, its readers and the dashboard tell a pair's drafts apart; rows stored before it
are draft models (``lm``).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column(
        "trials",
        sa.Column("draft_kind", sa.String(length=16), nullable=False, server_default="lm"),
    )


def downgrade() -> None:
    """Revert this revision (in place: recreating ``trials`` on SQLite would cascade-delete
    the samples and links that reference it)."""
    op.drop_column("trials", "draft_kind")
