"""Initial schema: sweeps, trials and their membership, samples, rounds, jobs, artifacts.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "sweeps",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("spec_yaml", sa.Text(), nullable=True),
        sa.Column("code_version", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "training_jobs",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'done', 'failed')", name="ck_training_jobs_status"
        ),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_table(
        "trials",
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("pair", sa.String(length=128), nullable=False),
        sa.Column("target", sa.String(length=1024), nullable=False),
        sa.Column("draft", sa.String(length=1024), nullable=True),
        sa.Column("draft_job", sa.String(length=128), nullable=True),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("tp_size", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("dataset", sa.String(length=256), nullable=False),
        sa.Column("split", sa.String(length=64), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("max_new_tokens", sa.Integer(), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("top_k", sa.Integer(), nullable=False),
        sa.Column("top_p", sa.Float(), nullable=False),
        sa.Column("policy", sa.String(length=64), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=True),
        sa.Column("max_draft_len", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("is_baseline", sa.Boolean(), nullable=False),
        sa.Column("baseline_id", sa.String(length=32), nullable=True),
        sa.Column("code_version", sa.String(length=32), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("n_samples", sa.Integer(), nullable=True),
        sa.Column("generated_tokens", sa.Integer(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("speedup", sa.Float(), nullable=True),
        sa.Column("acceptance_rate", sa.Float(), nullable=True),
        sa.Column("mean_accepted", sa.Float(), nullable=True),
        sa.Column("mean_drafted", sa.Float(), nullable=True),
        sa.Column("discard_rate", sa.Float(), nullable=True),
        sa.Column("verification_rate", sa.Float(), nullable=True),
        sa.Column("n_rounds", sa.Integer(), nullable=True),
        sa.Column("n_drafted", sa.Integer(), nullable=True),
        sa.Column("n_accepted", sa.Integer(), nullable=True),
        sa.Column("n_draft_forwards", sa.Integer(), nullable=True),
        sa.Column("draft_seconds", sa.Float(), nullable=True),
        sa.Column("verify_seconds", sa.Float(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'done', 'failed')", name="ck_trials_status"
        ),
        sa.PrimaryKeyConstraint("trial_id"),
    )
    op.create_index("ix_trials_baseline_id", "trials", ["baseline_id"])
    op.create_index("ix_trials_lookup", "trials", ["dataset", "temperature", "policy"])
    op.create_index("ix_trials_status", "trials", ["status"])

    op.create_table(
        "artifacts",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("path", sa.String(length=2048), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["training_jobs.job_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "kind", "path", name="uq_artifacts"),
    )
    op.create_table(
        "sample_results",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("sample_index", sa.Integer(), nullable=False),
        sa.Column("prompt_id", sa.String(length=512), nullable=False),
        sa.Column("prompt_len", sa.Integer(), nullable=False),
        sa.Column("generated_tokens", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("output_ids", sa.JSON(), nullable=False),
        sa.Column("output_text", sa.Text(), nullable=True),
        sa.Column("drafted", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("n_rounds", sa.Integer(), nullable=False),
        sa.Column("stopped_on_eos", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.trial_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("trial_id", "sample_index", name="uq_sample_results"),
    )
    op.create_table(
        "sweep_trials",
        sa.Column("sweep_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.trial_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("sweep_id", "trial_id"),
    )
    op.create_index("ix_sweep_trials_trial_id", "sweep_trials", ["trial_id"])

    op.create_table(
        "rounds",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("trial_id", sa.String(length=32), nullable=False),
        sa.Column("sample_index", sa.Integer(), nullable=False),
        sa.Column("round_index", sa.Integer(), nullable=False),
        sa.Column("drafted", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("bonus", sa.Boolean(), nullable=False),
        sa.Column("draft_forwards", sa.Integer(), nullable=False),
        sa.Column("draft_seconds", sa.Float(), nullable=False),
        sa.Column("verify_seconds", sa.Float(), nullable=False),
        sa.Column("mean_entropy", sa.Float(), nullable=True),
        sa.Column("min_max_prob", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["trial_id", "sample_index"],
            ["sample_results.trial_id", "sample_results.sample_index"],
            name="fk_rounds_sample",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("trial_id", "sample_index", "round_index", name="uq_rounds"),
    )


def downgrade() -> None:
    """Revert this revision (drop every table, children first)."""
    for table in (
        "rounds",
        "sweep_trials",
        "sample_results",
        "artifacts",
        "trials",
        "training_jobs",
        "sweeps",
    ):
        op.drop_table(table)
