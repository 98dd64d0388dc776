"""Bootstrap intervals, per-sample speed, per-position acceptance, run provenance, run-level fit.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TRIAL_INTERVALS = ("tokens_per_s", "speedup", "acceptance_rate", "mean_accepted")
_FIT_COLUMNS = ("run_t_draft", "run_t_target", "run_r2", "run_mre", "round_trial_r2")
_FIT_COLUMNS += ("round_trial_mre",)


def _float(name: str) -> sa.Column:
    """Return a nullable float column."""
    return sa.Column(name, sa.Float(), nullable=True)


def upgrade() -> None:
    """Apply this revision."""
    # Plain ADD COLUMNs: a batch (table-recreating) alter of ``trials`` on SQLite would drop the
    # old table under ``foreign_keys = ON`` and cascade-delete its samples (see 0004).
    for name in _TRIAL_INTERVALS:
        op.add_column("trials", _float(f"{name}_low"))
        op.add_column("trials", _float(f"{name}_high"))
    op.add_column("trials", sa.Column("run_id", _BIG_ID, nullable=True))
    op.create_index("ix_trials_run_id", "trials", ["run_id"])
    op.add_column("sample_results", _float("tokens_per_s"))
    op.add_column("sample_results", _float("speedup"))
    for name in _FIT_COLUMNS:
        op.add_column("cost_fits", _float(name))
    op.add_column("cost_fits", sa.Column("projection_fit", sa.String(length=8), nullable=True))
    _create_position_tables()
    _create_runs()


def _create_position_tables() -> None:
    """Create ``position_acceptance`` and ``accepted_lengths``."""
    trial_fk = sa.ForeignKeyConstraint(["trial_id"], ["trials.trial_id"], ondelete="CASCADE")
    op.create_table(
        "position_acceptance",
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("drafted", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("rate", sa.Float(), nullable=False),
        trial_fk,
        sa.PrimaryKeyConstraint("trial_id", "position"),
    )
    op.create_table(
        "accepted_lengths",
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("length", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.trial_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("trial_id", "length"),
    )


def _create_runs() -> None:
    """Create ``runs`` (one row per sweep run: its provenance)."""
    version = sa.String(length=64)
    op.create_table(
        "runs",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("sweep", sa.String(length=128), nullable=False),
        sa.Column("fingerprint", sa.String(length=32), nullable=False),
        sa.Column("commit", version, nullable=True),
        sa.Column("dirty", sa.Boolean(), nullable=True),
        sa.Column("specsweep_version", version, nullable=True),
        sa.Column("torch_version", version, nullable=True),
        sa.Column("transformers_version", version, nullable=True),
        sa.Column("ray_version", version, nullable=True),
        sa.Column("deepspeed_version", version, nullable=True),
        sa.Column("python_version", version, nullable=False),
        sa.Column("cpu", sa.String(length=256), nullable=False),
        sa.Column("gpu_name", sa.String(length=256), nullable=True),
        sa.Column("gpu_driver", version, nullable=True),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("torch_threads", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_runs_sweep", "runs", ["sweep"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_runs_sweep", table_name="runs")
    op.drop_table("runs")
    op.drop_table("accepted_lengths")
    op.drop_table("position_acceptance")
    for table, names in (
        ("cost_fits", [*_FIT_COLUMNS, "projection_fit"]),
        ("sample_results", ["tokens_per_s", "speedup"]),
    ):
        for name in names:
            op.drop_column(table, name)
    op.drop_index("ix_trials_run_id", table_name="trials")
    for name in ("run_id", *(f"{n}_{end}" for n in _TRIAL_INTERVALS for end in ("low", "high"))):
        op.drop_column("trials", name)
