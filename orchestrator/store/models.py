"""The results schema as SQLAlchemy 2.0 typed ORM classes (migrations: ``migrations/``).

Plain columns hold what people filter and plot; JSON holds the rest. A trial may belong to
several sweeps (``sweep_trials``), since its id is the hash of its measurement, not its sweep.
Changing a class here needs a new Alembic revision; ``tests/test_store.py`` checks that the
migrated schema matches these classes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

TRIAL_STATUSES = ("pending", "running", "done", "failed")
#: How a trial was measured: run on the models, or replayed from a greedy trace (timing
#: projected by the group's cost fit).
TRIAL_MODES = ("live", "replay")
JOB_STATUSES = ("pending", "running", "done", "failed")
#: A shard of a trial's prompts: sent to a replica, stored, or given up after its retries.
SHARD_STATUSES = ("running", "done", "failed")
#: 64-bit ids on PostgreSQL; on SQLite only INTEGER PRIMARY KEY auto-increments.
BigId = BigInteger().with_variant(Integer, "sqlite")


def utc_now() -> datetime:
    """Return the current time in UTC (timestamps are stored timezone-aware)."""
    return datetime.now(UTC)


def _status_check(name: str, statuses: tuple[str, ...]) -> CheckConstraint:
    """Return a CHECK constraint limiting ``status`` to ``statuses``."""
    allowed = ", ".join(f"'{status}'" for status in statuses)
    return CheckConstraint(f"status IN ({allowed})", name=name)


class Base(DeclarativeBase):
    """Declarative base with the JSON and timestamp type mapping used by every table."""

    type_annotation_map = {  # noqa: RUF012
        dict[str, Any]: JSON,
        list[Any]: JSON,
        datetime: DateTime(timezone=True),
    }


class SweepRow(Base):
    """A submitted sweep: its name and the validated spec it was submitted with."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    spec: Mapped[dict[str, Any]]
    spec_yaml: Mapped[str | None] = mapped_column(Text)
    code_version: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
    updated_at: Mapped[datetime] = mapped_column(default=utc_now)


class SweepTrialRow(Base):
    """Membership of a trial in a sweep, with its position in that sweep's plan."""

    __tablename__ = "sweep_trials"

    sweep_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True
    )
    trial_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("trials.trial_id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer)

    __table_args__ = (Index("ix_sweep_trials_trial_id", "trial_id"),)


class TrialRow(Base):
    """One trial: its configuration, status and aggregate metrics."""

    __tablename__ = "trials"

    trial_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    pair: Mapped[str] = mapped_column(String(128))
    target: Mapped[str] = mapped_column(String(1024))
    draft: Mapped[str | None] = mapped_column(String(1024))
    draft_job: Mapped[str | None] = mapped_column(String(128))
    #: How the draft proposes: ``lm`` (a draft model), ``ngram`` (prompt lookup), ``eagle``.
    draft_kind: Mapped[str] = mapped_column(String(16), default="lm", server_default="lm")
    backend: Mapped[str] = mapped_column(String(32))
    tp_size: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    dataset: Mapped[str] = mapped_column(String(256))
    split: Mapped[str | None] = mapped_column(String(64))
    samples: Mapped[int] = mapped_column(Integer)
    max_new_tokens: Mapped[int] = mapped_column(Integer)
    temperature: Mapped[float] = mapped_column(Float)
    top_k: Mapped[int] = mapped_column(Integer)
    top_p: Mapped[float] = mapped_column(Float)
    policy: Mapped[str] = mapped_column(String(64))
    threshold: Mapped[float | None] = mapped_column(Float)
    max_draft_len: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger)
    is_baseline: Mapped[bool]
    mode: Mapped[str] = mapped_column(String(16), default="live", server_default="live")
    baseline_id: Mapped[str | None] = mapped_column(String(32), index=True)
    code_version: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]]
    config: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    #: One entry per failed attempt, oldest first; kept when a later attempt succeeds.
    attempt_errors: Mapped[list[Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    n_samples: Mapped[int | None] = mapped_column(Integer)
    generated_tokens: Mapped[int | None] = mapped_column(Integer)
    seconds: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    speedup: Mapped[float | None] = mapped_column(Float)
    acceptance_rate: Mapped[float | None] = mapped_column(Float)
    mean_accepted: Mapped[float | None] = mapped_column(Float)
    mean_drafted: Mapped[float | None] = mapped_column(Float)
    discard_rate: Mapped[float | None] = mapped_column(Float)
    verification_rate: Mapped[float | None] = mapped_column(Float)
    n_rounds: Mapped[int | None] = mapped_column(Integer)
    n_drafted: Mapped[int | None] = mapped_column(Integer)
    n_accepted: Mapped[int | None] = mapped_column(Integer)
    n_draft_forwards: Mapped[int | None] = mapped_column(Integer)
    draft_seconds: Mapped[float | None] = mapped_column(Float)
    verify_seconds: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any] | None]
    #: 95% intervals over prompts (``orchestrator.analysis.stats``, over ``n_samples``); the
    #: speedup's is paired with the AR baseline's same prompts. None below
    #: ``stats.MIN_PROMPTS`` samples.
    tokens_per_s_low: Mapped[float | None] = mapped_column(Float)
    tokens_per_s_high: Mapped[float | None] = mapped_column(Float)
    speedup_low: Mapped[float | None] = mapped_column(Float)
    speedup_high: Mapped[float | None] = mapped_column(Float)
    acceptance_rate_low: Mapped[float | None] = mapped_column(Float)
    acceptance_rate_high: Mapped[float | None] = mapped_column(Float)
    mean_accepted_low: Mapped[float | None] = mapped_column(Float)
    mean_accepted_high: Mapped[float | None] = mapped_column(Float)
    #: The ``runs`` row (provenance) of the sweep run that measured this trial.
    run_id: Mapped[int | None] = mapped_column(BigId, index=True)
    #: Prefill and decode apart (revision 0008; None for trials stored before): the samples'
    #: summed prefill and decode seconds, decode-only tokens/s (generated tokens over decode
    #: seconds, the headline) and its speedup over the baseline's decode-only tokens/s, with
    #: their 95% intervals. ``tokens_per_s`` and ``speedup`` above are end to end.
    prefill_seconds: Mapped[float | None] = mapped_column(Float)
    decode_seconds: Mapped[float | None] = mapped_column(Float)
    decode_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    decode_speedup: Mapped[float | None] = mapped_column(Float)
    decode_tokens_per_s_low: Mapped[float | None] = mapped_column(Float)
    decode_tokens_per_s_high: Mapped[float | None] = mapped_column(Float)
    decode_speedup_low: Mapped[float | None] = mapped_column(Float)
    decode_speedup_high: Mapped[float | None] = mapped_column(Float)
    #: Batches (revision 0010): how many prompts decoded together (1 for trials stored before),
    #: and the throughput, generated tokens over the samples' shares of the batch's wall time,
    #: with its 95% interval. ``tokens_per_s`` and ``decode_tokens_per_s`` are per sequence.
    batch_size: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    total_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    total_tokens_per_s_low: Mapped[float | None] = mapped_column(Float)
    total_tokens_per_s_high: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (
        _status_check("ck_trials_status", TRIAL_STATUSES),
        Index("ix_trials_lookup", "dataset", "temperature", "policy"),
    )


#: TrialMetrics fields stored as plain ``trials`` columns (the rest goes to the ``metrics`` JSON).
TRIAL_METRIC_COLUMNS = (
    "n_samples",
    "generated_tokens",
    "seconds",
    "tokens_per_s",
    "acceptance_rate",
    "mean_accepted",
    "mean_drafted",
    "discard_rate",
    "verification_rate",
    "n_rounds",
    "n_drafted",
    "n_accepted",
    "n_draft_forwards",
    "draft_seconds",
    "verify_seconds",
    "prefill_seconds",
    "decode_seconds",
    "decode_tokens_per_s",
    "total_tokens_per_s",
)
#: The headline figures of a trial (people filter and plot these): TrialMetrics' and the
#: speedups, decode-only first (the seed papers' measure), then end to end.
HEADLINE_METRICS = (
    "decode_tokens_per_s",
    "decode_speedup",
    "tokens_per_s",
    "speedup",
    "acceptance_rate",
    "mean_accepted",
    "mean_drafted",
    "discard_rate",
    "verification_rate",
)
#: Figures stored with a 95% interval as ``<name>_low`` / ``<name>_high`` columns.
INTERVAL_FIGURES = (
    "decode_tokens_per_s",
    "decode_speedup",
    "tokens_per_s",
    "speedup",
    "acceptance_rate",
    "mean_accepted",
    "total_tokens_per_s",
)
#: The speedups among them: the store computes them against the baseline (not TrialMetrics).
SPEEDUP_FIGURES = ("decode_speedup", "speedup")
INTERVAL_COLUMNS = tuple(
    f"{figure}_{end}" for figure in INTERVAL_FIGURES for end in ("low", "high")
)


class SampleResultRow(Base):
    """One generated sample of a trial.

    ``prompt_id`` is the dataset's prompt id when the runner passes it, else a hash of the
    prompt's token ids; either way baseline and policy trials can be matched sample by sample.
    """

    __tablename__ = "sample_results"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    trial_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("trials.trial_id", ondelete="CASCADE")
    )
    sample_index: Mapped[int] = mapped_column(Integer)
    prompt_id: Mapped[str] = mapped_column(String(512))
    prompt_len: Mapped[int] = mapped_column(Integer)
    generated_tokens: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Float)
    output_ids: Mapped[list[Any]]
    output_text: Mapped[str | None] = mapped_column(Text)
    drafted: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    n_rounds: Mapped[int] = mapped_column(Integer)
    stopped_on_eos: Mapped[bool]
    #: generated tokens / seconds of this sample, and that over the AR baseline's same prompt.
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    speedup: Mapped[float | None] = mapped_column(Float)
    #: ``seconds`` split into prefill and decode (revision 0008; None for older samples), and
    #: the decode-only tokens/s and speedup (``tokens_per_s`` and ``speedup`` are end to end).
    prefill_seconds: Mapped[float | None] = mapped_column(Float)
    decode_seconds: Mapped[float | None] = mapped_column(Float)
    decode_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    decode_speedup: Mapped[float | None] = mapped_column(Float)
    #: The sample's share of its batch's wall time (revision 0010; None when decoded alone).
    batch_seconds: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (UniqueConstraint("trial_id", "sample_index", name="uq_sample_results"),)


class TrialShardRow(Base):
    """One shard of a live trial's prompts: its status, attempts, where it ran, its results,
    and the lease of the driver running it.

    ``prompts`` are the shard's sample indices (positions in the trial's prompt list); its
    samples are stored in ``sample_results`` with those indices when the shard ends.
    ``results`` keeps the shard's full results (rounds included) until the trial's last shard
    is stored and the trial's metrics are computed from all of them; then it is cleared.
    """

    __tablename__ = "trial_shards"

    trial_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("trials.trial_id", ondelete="CASCADE"), primary_key=True
    )
    shard: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    status: Mapped[str] = mapped_column(String(16), default="running")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    prompts: Mapped[list[Any]]
    node_id: Mapped[str | None] = mapped_column(String(64))
    seconds: Mapped[float | None] = mapped_column(Float)
    results: Mapped[list[Any] | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    #: The lease of the driver running (or that stored) the shard: its random id, its
    #: ``host:pid`` for people, and when the lease lapses unless the driver renews it (None
    #: once released). Another driver takes a running shard only once its lease has lapsed.
    driver_id: Mapped[str | None] = mapped_column(String(32), index=True)
    driver: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None]

    __table_args__ = (_status_check("ck_trial_shards_status", SHARD_STATUSES),)


class RoundRow(Base):
    """One speculative round of one sample."""

    __tablename__ = "rounds"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    trial_id: Mapped[str] = mapped_column(String(32))
    sample_index: Mapped[int] = mapped_column(Integer)
    round_index: Mapped[int] = mapped_column(Integer)
    drafted: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    bonus: Mapped[bool]
    draft_forwards: Mapped[int] = mapped_column(Integer)
    draft_seconds: Mapped[float] = mapped_column(Float)
    verify_seconds: Mapped[float] = mapped_column(Float)
    mean_entropy: Mapped[float | None] = mapped_column(Float)
    min_max_prob: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (
        ForeignKeyConstraint(
            ["trial_id", "sample_index"],
            ["sample_results.trial_id", "sample_results.sample_index"],
            name="fk_rounds_sample",
            ondelete="CASCADE",
        ),
        UniqueConstraint("trial_id", "sample_index", "round_index", name="uq_rounds"),
    )


class PositionAcceptanceRow(Base):
    """Per trial and draft position i (1-based): rounds that drafted a token at i, and how many
    of those had it accepted (vLLM's per-position acceptance rate = accepted / drafted)."""

    __tablename__ = "position_acceptance"

    trial_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("trials.trial_id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    drafted: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    rate: Mapped[float] = mapped_column(Float)


class AcceptedLengthRow(Base):
    """Per trial: the number of rounds that accepted exactly ``length`` draft tokens."""

    __tablename__ = "accepted_lengths"

    trial_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("trials.trial_id", ondelete="CASCADE"), primary_key=True
    )
    length: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    rounds: Mapped[int] = mapped_column(Integer)


class RunRow(Base):
    """The provenance of one sweep run: code, library versions, device, threads.

    ``fingerprint`` hashes everything but the time and the sweep, so two runs under the same
    provenance have the same fingerprint.
    """

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    sweep: Mapped[str] = mapped_column(String(128), index=True)
    fingerprint: Mapped[str] = mapped_column(String(32))
    commit: Mapped[str | None] = mapped_column(String(64))
    dirty: Mapped[bool | None]
    specsweep_version: Mapped[str | None] = mapped_column(String(64))
    torch_version: Mapped[str | None] = mapped_column(String(64))
    transformers_version: Mapped[str | None] = mapped_column(String(64))
    ray_version: Mapped[str | None] = mapped_column(String(64))
    deepspeed_version: Mapped[str | None] = mapped_column(String(64))
    python_version: Mapped[str] = mapped_column(String(64))
    cpu: Mapped[str] = mapped_column(String(256))
    gpu_name: Mapped[str | None] = mapped_column(String(256))
    gpu_driver: Mapped[str | None] = mapped_column(String(64))
    gpu_count: Mapped[int] = mapped_column(Integer)
    torch_threads: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utc_now)


class TrainingJobRow(Base):
    """A training job (KD draft, SpecDec++ head, EESD exit, Cali-TS predictor)."""

    __tablename__ = "training_jobs"

    job_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    #: One entry per failed attempt, oldest first; kept when a later attempt succeeds.
    attempt_errors: Mapped[list[Any] | None]
    metrics: Mapped[dict[str, Any] | None]
    seconds: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
    updated_at: Mapped[datetime] = mapped_column(default=utc_now)

    __table_args__ = (_status_check("ck_training_jobs_status", JOB_STATUSES),)


class ArtifactRow(Base):
    """A file a training job produced (draft checkpoint, head, predictor)."""

    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("training_jobs.job_id", ondelete="CASCADE")
    )
    kind: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(2048))
    created_at: Mapped[datetime] = mapped_column(default=utc_now)

    __table_args__ = (UniqueConstraint("job_id", "kind", "path", name="uq_artifacts"),)


class CostFitRow(Base):
    """The block-aware cost model fit over one trial group's live rounds, per sweep.

    A group is (pair, dataset slice, sampling, max_new_tokens); the fit is
    ``orchestrator.analysis.costs.model.fit_round_costs`` over the rounds of the group's live trials
    (the AR baseline included). ``overhead_seconds`` is the mean time per sample outside the
    rounds (prefill, bookkeeping) of its live speculative trials. The ``check_*`` columns hold
    a replay sweep's cross-check: its live speculative trial replayed over the traces, the
    share of its rounds replay reproduces, and its projected vs measured tokens/s.
    """

    __tablename__ = "cost_fits"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    sweep: Mapped[str] = mapped_column(String(128))
    group_key: Mapped[str] = mapped_column(String(32))
    pair: Mapped[str] = mapped_column(String(128))
    dataset: Mapped[str] = mapped_column(String(256))
    split: Mapped[str | None] = mapped_column(String(64))
    samples: Mapped[int] = mapped_column(Integer)
    max_new_tokens: Mapped[int] = mapped_column(Integer)
    temperature: Mapped[float] = mapped_column(Float)
    t_draft: Mapped[float] = mapped_column(Float)
    t_target: Mapped[float] = mapped_column(Float)
    t_per_verified: Mapped[float] = mapped_column(Float)
    r2_draft: Mapped[float] = mapped_column(Float)
    r2_verify: Mapped[float] = mapped_column(Float)
    r2_round: Mapped[float] = mapped_column(Float)
    n_rounds: Mapped[int] = mapped_column(Integer)
    n_trials: Mapped[int] = mapped_column(Integer)
    overhead_seconds: Mapped[float] = mapped_column(Float)
    check_trial_id: Mapped[str | None] = mapped_column(String(32))
    check_same_rounds: Mapped[float | None] = mapped_column(Float)
    check_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    check_projected_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    check_error: Mapped[float | None] = mapped_column(Float)
    #: The run-level fit in SpecDec++'s form over the group's done trials: trial seconds ≈
    #: run_t_draft·N_draft + run_t_target·N_target; its R² and mean relative error on trial
    #: seconds, beside the same two figures of the round-level fit (plus the overhead per
    #: sample); ``projection_fit`` ("round" or "run") is the one with the lower error (the run
    #: fit only over more than two trials: ``run_fit.RUN_FIT_PARAMETERS``).
    run_t_draft: Mapped[float | None] = mapped_column(Float)
    run_t_target: Mapped[float | None] = mapped_column(Float)
    run_r2: Mapped[float | None] = mapped_column(Float)
    run_mre: Mapped[float | None] = mapped_column(Float)
    round_trial_r2: Mapped[float | None] = mapped_column(Float)
    round_trial_mre: Mapped[float | None] = mapped_column(Float)
    projection_fit: Mapped[str | None] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
    #: The per-step model replay projects with (``costs.step_costs.StepCostFit`` as JSON), each
    #: live check's leave-one-trial-out projection (trial id, label, policy class, measured and
    #: projected seconds, error, share of rounds beyond the verify table), and their mean
    #: absolute error, which widens every replayed trial's interval in the group.
    step_model: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    checks: Mapped[list[Any] | None] = mapped_column(JSON)
    out_of_sample_error: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (UniqueConstraint("sweep", "group_key", name="uq_cost_fits"),)


class TraceRow(Base):
    """The greedy traces of one (pair, prompt set, max_new_tokens) at one cap, one per prompt.

    ``trace_key`` hashes everything the traces depend on (models, prompts, output length,
    cap), so a resubmitted sweep, or another sweep on the same group, reuses them.
    """

    __tablename__ = "traces"

    trace_key: Mapped[str] = mapped_column(String(32), primary_key=True)
    cap: Mapped[int] = mapped_column(Integer)
    n_samples: Mapped[int] = mapped_column(Integer)
    traces: Mapped[list[Any]]
    seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
