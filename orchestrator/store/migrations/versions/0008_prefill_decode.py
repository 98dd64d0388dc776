"""Prefill and decode timed apart: ``prefill_seconds``, ``decode_seconds``, decode-only
tokens/s and speedup on ``sample_results`` and ``trials`` (with the trials' intervals). Nullable:
rows stored before have no split.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SAMPLE_COLUMNS = ("prefill_seconds", "decode_seconds", "decode_tokens_per_s", "decode_speedup")
TRIAL_COLUMNS = (
    *SAMPLE_COLUMNS,
    "decode_tokens_per_s_low",
    "decode_tokens_per_s_high",
    "decode_speedup_low",
    "decode_speedup_high",
)


def upgrade() -> None:
    """Apply this revision."""
    for name in TRIAL_COLUMNS:
        op.add_column("trials", sa.Column(name, sa.Float(), nullable=True))
    for name in SAMPLE_COLUMNS:
        op.add_column("sample_results", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    """Revert this revision (plain DROP COLUMN: recreating ``trials`` on SQLite, as a batch
    would, cascade-deletes its samples)."""
    for table, columns in (("sample_results", SAMPLE_COLUMNS), ("trials", TRIAL_COLUMNS)):
        for name in reversed(columns):
            op.drop_column(table, name)
