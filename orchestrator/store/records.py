"""Typed rows the store's reads return: frozen dataclasses, one field per table column.

Each ``Stored*`` class mirrors one ORM class of :mod:`orchestrator.store.models`, its fields
in the table's column order (``tests/test_store.py`` checks that they stay in step);
:func:`record_of` builds one from an ORM row. :class:`SweepInfo` is a summary, not a row;
:class:`QueryResult` is what a hand-written read-only statement returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from datetime import datetime
from typing import Any, TypeVar

import pandas as pd

#: The ``policy`` stored for an AR-baseline trial: the store's readers pick baselines by it.
from workers.records import BASELINE_POLICY as BASELINE_POLICY

R = TypeVar("R")


def record_of(record_type: type[R], row: object) -> R:
    """Return ``row`` (an ORM object) as ``record_type``, copying the fields it names."""
    return record_type(**{f.name: getattr(row, f.name) for f in fields(record_type)})


def records_frame(record_type: type, records: Sequence[Any]) -> pd.DataFrame:
    """Return ``records`` (of ``record_type``) as a DataFrame, one column per field.

    The columns are there also when there is no record.
    """
    columns = [field.name for field in fields(record_type)]
    return pd.DataFrame([astuple(record) for record in records], columns=columns)


@dataclass(frozen=True)
class SweepInfo:
    """A stored sweep: name, description, times and how many trials its plan holds."""

    name: str
    description: str
    created_at: datetime
    updated_at: datetime
    n_trials: int


@dataclass(frozen=True)
class QueryResult:
    """The result set of one hand-written statement: its column names, as the database named
    them (repeats included), and its rows in order."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


@dataclass(frozen=True)
class StoredTrial:
    """One trial (a ``trials`` row): configuration, status, metrics and their intervals."""

    trial_id: str
    pair: str
    target: str
    draft: str | None
    draft_job: str | None
    draft_kind: str
    backend: str
    tp_size: int
    dtype: str
    dataset: str
    split: str | None
    samples: int
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    policy: str
    threshold: float | None
    max_draft_len: int
    seed: int
    is_baseline: bool
    mode: str
    baseline_id: str | None
    code_version: str
    params: dict[str, Any]
    config: dict[str, Any]
    status: str
    attempts: int
    error: str | None
    attempt_errors: list[Any] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    n_samples: int | None
    generated_tokens: int | None
    seconds: float | None
    tokens_per_s: float | None
    speedup: float | None
    acceptance_rate: float | None
    mean_accepted: float | None
    mean_drafted: float | None
    discard_rate: float | None
    verification_rate: float | None
    n_rounds: int | None
    n_drafted: int | None
    n_accepted: int | None
    n_draft_forwards: int | None
    draft_seconds: float | None
    verify_seconds: float | None
    metrics: dict[str, Any] | None
    tokens_per_s_low: float | None
    tokens_per_s_high: float | None
    speedup_low: float | None
    speedup_high: float | None
    acceptance_rate_low: float | None
    acceptance_rate_high: float | None
    mean_accepted_low: float | None
    mean_accepted_high: float | None
    run_id: int | None
    prefill_seconds: float | None
    decode_seconds: float | None
    decode_tokens_per_s: float | None
    decode_speedup: float | None
    decode_tokens_per_s_low: float | None
    decode_tokens_per_s_high: float | None
    decode_speedup_low: float | None
    decode_speedup_high: float | None
    batch_size: int = 1
    total_tokens_per_s: float | None = None
    total_tokens_per_s_low: float | None = None
    total_tokens_per_s_high: float | None = None


@dataclass(frozen=True)
class StoredSample:
    """One generated sample of a trial (a ``sample_results`` row)."""

    id: int
    trial_id: str
    sample_index: int
    prompt_id: str
    prompt_len: int
    generated_tokens: int
    seconds: float
    output_ids: list[Any]
    output_text: str | None
    drafted: int
    accepted: int
    n_rounds: int
    stopped_on_eos: bool
    tokens_per_s: float | None
    speedup: float | None
    prefill_seconds: float | None
    decode_seconds: float | None
    decode_tokens_per_s: float | None
    decode_speedup: float | None
    batch_seconds: float | None = None


@dataclass(frozen=True)
class StoredRound:
    """One speculative round of one sample (a ``rounds`` row)."""

    id: int
    trial_id: str
    sample_index: int
    round_index: int
    drafted: int
    accepted: int
    bonus: bool
    draft_forwards: int
    draft_seconds: float
    verify_seconds: float
    mean_entropy: float | None
    min_max_prob: float | None


@dataclass(frozen=True)
class StoredRun:
    """The provenance of one sweep run (a ``runs`` row)."""

    id: int
    sweep: str
    fingerprint: str
    commit: str | None
    dirty: bool | None
    specsweep_version: str | None
    torch_version: str | None
    transformers_version: str | None
    ray_version: str | None
    deepspeed_version: str | None
    python_version: str
    cpu: str
    gpu_name: str | None
    gpu_driver: str | None
    gpu_count: int
    torch_threads: int
    created_at: datetime


@dataclass(frozen=True)
class StoredJob:
    """A training job and its outcome (a ``training_jobs`` row)."""

    job_id: str
    name: str
    kind: str
    config: dict[str, Any]
    status: str
    attempts: int
    error: str | None
    attempt_errors: list[Any] | None
    metrics: dict[str, Any] | None
    seconds: float | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class StoredArtifact:
    """A file a training job produced (an ``artifacts`` row)."""

    id: int
    job_id: str
    kind: str
    path: str
    created_at: datetime


@dataclass(frozen=True)
class StoredCostFit:
    """One group's stored cost fits and replay cross-check (a ``cost_fits`` row)."""

    id: int
    sweep: str
    group_key: str
    pair: str
    dataset: str
    split: str | None
    samples: int
    max_new_tokens: int
    temperature: float
    t_draft: float
    t_target: float
    t_per_verified: float
    r2_draft: float
    r2_verify: float
    r2_round: float
    n_rounds: int
    n_trials: int
    overhead_seconds: float
    check_trial_id: str | None
    check_same_rounds: float | None
    check_tokens_per_s: float | None
    check_projected_tokens_per_s: float | None
    check_error: float | None
    run_t_draft: float | None
    run_t_target: float | None
    run_r2: float | None
    run_mre: float | None
    round_trial_r2: float | None
    round_trial_mre: float | None
    projection_fit: str | None
    created_at: datetime
    step_model: dict[str, Any] | None = None
    checks: list[Any] | None = None
    out_of_sample_error: float | None = None


@dataclass(frozen=True)
class StoredShard:
    """One prompt shard of a live trial (a ``trial_shards`` row, its held results left out)."""

    trial_id: str
    shard: int
    status: str
    attempts: int
    prompts: list[Any]
    node_id: str | None
    seconds: float | None
    started_at: datetime | None
    finished_at: datetime | None
    driver_id: str | None
    driver: str | None
    lease_expires_at: datetime | None


@dataclass(frozen=True)
class LeaseHolder:
    """A sweep driver as the shard leases name it: a random id, and ``host:pid`` for people."""

    driver_id: str
    name: str


#: What :meth:`Store.claim_shard` found: the shard is now leased to the caller, was stored
#: already, or is leased to another driver whose lease has not lapsed.
CLAIM_OUTCOMES = ("acquired", "done", "held")


@dataclass(frozen=True)
class ShardClaim:
    """The outcome of claiming a shard (one of :data:`CLAIM_OUTCOMES`) and who else is involved.

    ``driver`` is the other driver's ``host:pid``: the one holding the lease (``held``), the
    one that stored the shard (``done``; None when it was the caller), or the one whose lapsed
    or released lease the caller took over (``acquired``; None for a fresh shard).
    ``expires_in`` is the seconds left on a ``held`` lease.
    """

    outcome: str
    driver: str | None = None
    expires_in: float | None = None


@dataclass(frozen=True)
class StoredTraces:
    """One group's greedy traces at one cap, as JSON-ready dicts (a ``traces`` row)."""

    trace_key: str
    cap: int
    n_samples: int
    traces: list[Any]
    seconds: float
    created_at: datetime
