"""Per-step cost model and out-of-sample checks (``cost_fits.step_model``, ``checks``,
``out_of_sample_error``): what replay projects with and its measured error on live checks.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("cost_fits", sa.Column("step_model", sa.JSON(), nullable=True))
    op.add_column("cost_fits", sa.Column("checks", sa.JSON(), nullable=True))
    op.add_column("cost_fits", sa.Column("out_of_sample_error", sa.Float(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("cost_fits") as batch:
        batch.drop_column("out_of_sample_error")
        batch.drop_column("checks")
        batch.drop_column("step_model")
