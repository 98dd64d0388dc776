"""Where the estimate's inputs come from: a live Ray cluster's GPUs, the results store's cost fits
for the same models, and the sweep's execution settings.

The pure part turns stored fits into a :class:`~orchestrator.analysis.costs.model.HardwareProfile`
(:func:`fitted_profile`); :func:`ray_cluster` and :func:`stored_profiles` are the edges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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
    spec: SweepSpec, fitted: Mapping[str, HardwareProfile] | None = None
) -> EstimateOptions:
    """Return the estimate options of ``spec``: ``execution.replicas`` (None: as many as the
    nodes hold), ``execution.max_concurrent_pairs`` and ``execution.shard_prompts``, as the
    runner reads them."""
    execution = spec.execution
    return EstimateOptions(
        replicas=execution.replicas,
        max_concurrent_pairs=execution.max_concurrent_pairs,
        shard_prompts=execution.shard_prompts,
        fitted=dict(fitted or {}),
    )
