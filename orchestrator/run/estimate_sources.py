"""Where the estimate's inputs come from: a live Ray cluster's GPUs, the results store's cost fits
and batched trials for the same models, and the sweep's execution settings.

The pure part turns stored fits into a :class:`~orchestrator.analysis.costs.model.HardwareProfile`
(:func:`fitted_profile`) and stored trials at a batch size above 1 into a
:class:`~orchestrator.analysis.costs.batch_estimate.BatchMeasurement` (:func:`batch_measurement`);
:func:`ray_cluster`, :func:`stored_profiles` and :func:`stored_batch_measurements` are the edges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.analysis.costs.batch_estimate import BatchMeasurement
from orchestrator.analysis.costs.estimate import (
    Cluster,
    EstimateError,
    EstimateOptions,
)
from orchestrator.analysis.costs.model import HardwareProfile
from orchestrator.store import Store, StoredTrial
from orchestrator.sweep.planner import Plan
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.trial import ServedPair

#: (target, backend, tp_size, dtype, draft): the models a cost fit belongs to.
ModelsKey = tuple[str, str, int, str, str]


@dataclass(frozen=True)
class StoredFit:
    """The part of a stored ``cost_fits`` row the estimate reads."""

    t_draft: float
    t_target: float
    overhead_seconds: float
    max_new_tokens: int
    n_rounds: int


def models_key(models: ServedPair | StoredTrial) -> ModelsKey:
    """Return the models of a trial (a planned trial's served pair or a stored trial record);
    a draft without a model or job (a lookup) by its kind."""
    draft = models.draft if models.draft is not None else f"job:{models.draft_job}"
    if models.draft is None and models.draft_job is None:
        draft = f"kind:{models.draft_kind}"
    return (models.target, models.backend, int(models.tp_size), models.dtype, draft)


def fitted_profile(name: str, fits: Sequence[StoredFit]) -> HardwareProfile:
    """Return a profile of ``fits`` pooled by their round counts.

    t_draft and t_target are the round-weighted means; the AR speed is one target forward per
    token plus the per-sample overhead spread over the output length.
    """
    weights = [max(fit.n_rounds, 1) for fit in fits]
    total = sum(weights)
    t_draft = sum(w * fit.t_draft for w, fit in zip(weights, fits, strict=True)) / total
    t_target = sum(w * fit.t_target for w, fit in zip(weights, fits, strict=True)) / total
    overhead = sum(
        w * fit.overhead_seconds / max(fit.max_new_tokens, 1)
        for w, fit in zip(weights, fits, strict=True)
    )
    return HardwareProfile(
        name=name,
        description=f"pooled from {len(fits)} stored cost fit(s)",
        t_draft=t_draft,
        t_target=t_target,
        ar_tokens_per_s=1.0 / (t_target + overhead / total),
    )


def match_fits(
    plan: Plan, fits: Iterable[tuple[ModelsKey, StoredFit]]
) -> dict[str, HardwareProfile]:
    """Return a fitted profile for each planned pair that has stored fits of the same models."""
    by_models: dict[ModelsKey, list[StoredFit]] = {}
    for key, fit in fits:
        by_models.setdefault(key, []).append(fit)
    result: dict[str, HardwareProfile] = {}
    for trial in plan.trials:
        found = by_models.get(models_key(trial.served))
        if found and trial.pair not in result:
            result[trial.pair] = fitted_profile(f"stored fit of {trial.pair}", found)
    return result


def stored_profiles(store: Store, plan: Plan) -> dict[str, HardwareProfile]:
    """Return the fitted profiles of ``plan``'s pairs from the fits in ``store`` (any sweep)."""
    rows = store.cost_fits()
    pairs: dict[tuple[str, str], ModelsKey] = {}
    for sweep in dict.fromkeys(row.sweep for row in rows):
        for trial in store.trials(sweep):
            pairs.setdefault((sweep, trial.pair), models_key(trial))
    fits = [
        (
            pairs[(row.sweep, row.pair)],
            StoredFit(
                t_draft=row.t_draft,
                t_target=row.t_target,
                overhead_seconds=row.overhead_seconds,
                max_new_tokens=row.max_new_tokens,
                n_rounds=row.n_rounds,
            ),
        )
        for row in rows
        if (row.sweep, row.pair) in pairs
    ]
    return match_fits(plan, fits)


def batch_measurement(batch_size: int, rows: Sequence[StoredTrial]) -> BatchMeasurement | None:
    """Return what the done ``rows`` at ``batch_size`` measured (None without a done AR
    baseline there that stored its total tokens/s).

    The AR round of a full batch is B × the AR baselines' pooled seconds per token of
    throughput (Σ tokens / Σ tokens / total tokens/s); a batched target forward is their verify
    seconds per round (each sequence's round record carries its batch round's seconds), else
    the AR round; a batched draft step is the speculative trials' draft seconds per draft
    forward (a sequence that drafts fewer steps than its batch's longest counts the batch's
    draft seconds over its own forwards: an over-estimate for adaptive policies).
    """
    done = [row for row in rows if row.status == "done" and row.batch_size == batch_size]
    ar = [
        row for row in done if row.is_baseline and row.total_tokens_per_s and row.generated_tokens
    ]
    if not ar:
        return None
    tokens = sum(row.generated_tokens or 0 for row in ar)
    wall = sum((row.generated_tokens or 0) / (row.total_tokens_per_s or 1.0) for row in ar)
    ar_round = batch_size * wall / tokens
    rounds = sum(row.n_rounds or 0 for row in ar)
    verify = sum(row.verify_seconds or 0.0 for row in ar)
    spec = [
        row for row in done if not row.is_baseline and row.n_draft_forwards and row.draft_seconds
    ]
    forwards = sum(row.n_draft_forwards or 0 for row in spec)
    return BatchMeasurement(
        batch_size=batch_size,
        ar_round_seconds=ar_round,
        t_target=verify / rounds if rounds and verify > 0 else ar_round,
        t_draft=sum(row.draft_seconds or 0.0 for row in spec) / forwards if forwards else None,
        n_trials=len(ar) + len(spec),
    )


def match_batch_rows(
    plan: Plan, rows: Iterable[StoredTrial]
) -> dict[tuple[str, int], BatchMeasurement]:
    """Return per (pair, batch size > 1) of ``plan`` the :func:`batch_measurement` of the
    stored ``rows`` of the same models at that batch size (any sweep), where there is one."""
    by_models: dict[tuple[ModelsKey, int], list[StoredTrial]] = {}
    for row in rows:
        if row.batch_size > 1:
            by_models.setdefault((models_key(row), row.batch_size), []).append(row)
    result: dict[tuple[str, int], BatchMeasurement] = {}
    for trial in plan.trials:
        key = (trial.pair, trial.batch_size)
        if trial.batch_size == 1 or key in result:
            continue
        found = by_models.get((models_key(trial.served), trial.batch_size), [])
        measured = batch_measurement(trial.batch_size, found)
        if measured is not None:
            result[key] = measured
    return result


def stored_batch_measurements(store: Store, plan: Plan) -> dict[tuple[str, int], BatchMeasurement]:
    """Return what the store's trials (any sweep) measured at each of ``plan``'s batch sizes
    above 1 for its pairs' models ({} when the plan has none)."""
    if all(trial.batch_size == 1 for trial in plan.trials):
        return {}
    return match_batch_rows(plan, store.trials())


def ray_cluster(address: str) -> Cluster:
    """Return the GPUs of each alive node of the Ray cluster at ``address``.

    Connects when this process is not connected yet, and disconnects again afterwards.
    """
    import ray

    connected = ray.is_initialized()
    if not connected:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except ConnectionError as error:
            raise EstimateError(f"cannot reach the Ray cluster at {address}: {error}") from None
    try:
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        gpus = sorted((float(n.get("Resources", {}).get("GPU", 0.0)) for n in nodes), reverse=True)
    finally:
        if not connected:
            ray.shutdown()
    source = f"Ray cluster at {address}"
    if not any(gpus):
        raise EstimateError(f"{source}: no node has GPUs")
    return Cluster(node_gpus=tuple(g for g in gpus if g > 0), source=source)


def options_from_spec(
    spec: SweepSpec,
    fitted: Mapping[str, HardwareProfile] | None = None,
    measured: Mapping[tuple[str, int], BatchMeasurement] | None = None,
) -> EstimateOptions:
    """Return the estimate options of ``spec``: ``execution.replicas`` (None: as many as the
    nodes hold), ``execution.max_concurrent_pairs`` and ``execution.shard_prompts``, as the
    runner reads them, with the stored ``fitted`` profiles and batch ``measured`` figures."""
    execution = spec.execution
    return EstimateOptions(
        replicas=execution.replicas,
        max_concurrent_pairs=execution.max_concurrent_pairs,
        shard_prompts=execution.shard_prompts,
        fitted=dict(fitted or {}),
        measured=dict(measured or {}),
    )
