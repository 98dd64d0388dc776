"""Pure conversions of planned trials, jobs and generated samples into the store's row values."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.analysis.metrics import sample_decode_tokens_per_s, sample_tokens_per_s
from orchestrator.store.models import Base, TrialRow
from workers.records import GenerationResult

if TYPE_CHECKING:
    from orchestrator.analysis.metrics import TrialMetrics
    from orchestrator.sweep.planner import TrainingJob, Trial


def prompt_id(prompt_ids: Sequence[int]) -> str:
    """Return a short hash of a prompt's token ids (the same prompt gets the same id anywhere)."""
    data = json.dumps([int(token) for token in prompt_ids], separators=(",", ":"))
    return hashlib.sha256(data.encode("ascii")).hexdigest()[:16]


def trial_values(trial: Trial) -> dict[str, Any]:
    """Return the trials-table values of a new (pending) trial: the columns the table shares
    with the trial's record (``Trial.columns``), the record itself as ``config``."""
    config = trial.columns()
    config.pop("sweep")
    return {**table_values(TrialRow, config), "config": config, "status": "pending", "attempts": 0}


def table_values(table: type[Base], values: dict[str, Any]) -> dict[str, Any]:
    """Return the entries of ``values`` that ``table`` has a column of, in the table's order."""
    columns = (column.key for column in table.__table__.columns)
    return {name: values[name] for name in columns if name in values}


def job_values(job: TrainingJob) -> dict[str, Any]:
    """Return the training_jobs values of a new (pending) job."""
    return {
        "job_id": job.job_id,
        "name": job.name,
        "kind": job.kind,
        "config": {
            "base": job.base,
            "teacher": job.teacher,
            "dataset": job.dataset,
            "split": job.split,
            "samples": job.samples,
            "local_path": job.local_path,
            "epochs": job.epochs,
            "config": job.config,
        },
        "status": "pending",
        "attempts": 0,
    }


#: The ``metrics`` JSON entry holding a replayed trial's cost-model error (what widened its
#: intervals; ``refresh`` widens them by it again).
COST_MODEL_ERROR = "cost_model_error"


def extra_metrics(metrics: TrialMetrics) -> dict[str, Any]:
    """Return the metrics kept in JSON: EESD's HM, the length histograms and, for a replayed
    trial, the cost-model error its intervals are widened by."""
    error = {} if metrics.cost_model_error is None else {COST_MODEL_ERROR: metrics.cost_model_error}
    return {
        "eesd_hm": metrics.eesd_hm,
        "draft_length_histogram": {str(k): v for k, v in metrics.draft_length_histogram.items()},
        "accepted_length_histogram": {
            str(k): v for k, v in metrics.accepted_length_histogram.items()
        },
        **error,
    }


def cost_model_error(metrics: dict[str, Any] | None) -> float | None:
    """Return the cost-model error stored in a trial's ``metrics`` JSON (None: a live trial,
    or one replayed before the error was stored)."""
    value = (metrics or {}).get(COST_MODEL_ERROR)
    return None if value is None else float(value)


def sample_values(
    trial_id: str,
    index: int,
    result: GenerationResult,
    dataset_prompt_id: str | None,
    output_text: str | None,
) -> dict[str, Any]:
    """Return the sample_results values of one generated sample."""
    return {
        "trial_id": trial_id,
        "sample_index": index,
        "prompt_id": dataset_prompt_id or prompt_id(result.prompt_ids),
        "output_text": output_text,
        "prompt_len": len(result.prompt_ids),
        "generated_tokens": result.n_generated,
        "seconds": result.seconds,
        "output_ids": [int(token) for token in result.output_ids],
        "drafted": result.n_drafted,
        "accepted": result.n_accepted,
        "n_rounds": len(result.rounds),
        "stopped_on_eos": result.stopped_on_eos,
        "tokens_per_s": sample_tokens_per_s(result),
        "prefill_seconds": result.prefill_seconds,
        "decode_seconds": result.decode_seconds,
        "decode_tokens_per_s": sample_decode_tokens_per_s(result),
        "batch_seconds": result.batch_seconds,
    }


def round_values(
    trial_id: str, indices: Sequence[int], results: Sequence[GenerationResult]
) -> list[dict[str, Any]]:
    """Return the rounds-table values of every round of every sample (sample ``indices[i]``)."""
    return [
        {
            "trial_id": trial_id,
            "sample_index": sample_index,
            "round_index": round_index,
            "drafted": record.drafted,
            "accepted": record.accepted,
            "bonus": record.bonus,
            "draft_forwards": record.draft_forwards,
            "draft_seconds": record.draft_seconds,
            "verify_seconds": record.verify_seconds,
            "mean_entropy": record.mean_entropy,
            "min_max_prob": record.min_max_prob,
        }
        for sample_index, result in zip(indices, results, strict=True)
        for round_index, record in enumerate(result.rounds)
    ]
