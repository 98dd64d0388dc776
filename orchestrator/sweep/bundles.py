"""The resources a worker group reserves, as Ray placement bundles (pure: no Ray).

A worker group serves the pairs that share one target. Bundles ``0 .. tp_size - 1`` are the
target ranks, ``{"CPU": 1, "GPU": g}`` with ``g`` the first pair's ``target.gpus`` (no ``GPU``
key when 0); then one bundle per pair for its draft actor. The planner's estimate, the target
sets and the runner's default replica count all count groups with these functions;
``orchestrator.run.placement`` reserves them on the cluster.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from orchestrator.sweep.spec import PairSpec

#: Every worker actor (target rank or draft) reserves one CPU, as ``Plan.resources()`` counts.
CPUS_PER_ACTOR = 1

Bundle = dict[str, float]


def _bundle(gpus: float) -> Bundle:
    """Return one actor's bundle: one CPU, plus ``gpus`` GPUs when positive."""
    bundle: Bundle = {"CPU": float(CPUS_PER_ACTOR)}
    if gpus > 0:
        bundle["GPU"] = float(gpus)
    return bundle


def target_bundles(pair: PairSpec) -> list[Bundle]:
    """Return one bundle per target rank (``tp_size`` of them), in rank order.

    Exists so the runner and the tests agree on what each rank reserves.
    """
    return [_bundle(pair.target.gpus) for _ in range(pair.target.tp_size)]


def draft_bundle(pair: PairSpec) -> Bundle:
    """Return the draft actor's bundle (one CPU and the draft's possibly fractional GPU)."""
    return _bundle(pair.draft.gpus)


def worker_group_bundles(pairs: Sequence[PairSpec]) -> list[Bundle]:
    """Return the group serving ``pairs`` (one target): the first pair's target ranks' bundles,
    then one draft bundle per pair, in order."""
    return [*target_bundles(pairs[0]), *(draft_bundle(pair) for pair in pairs)]


def bundle_totals(bundles: Iterable[Mapping[str, float]]) -> Bundle:
    """Return the sum of each resource over ``bundles`` (what one node must hold)."""
    totals: Bundle = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            totals[name] = totals.get(name, 0.0) + amount
    return totals


def fits_on_node(need: Mapping[str, float], node: Mapping[str, float]) -> bool:
    """True when ``node``'s total resources cover ``need`` (ignoring what is in use)."""
    return all(node.get(name, 0.0) >= amount for name, amount in need.items())


def groups_held(pairs: Sequence[PairSpec], node_resources: Iterable[Mapping[str, float]]) -> int:
    """Return how many worker groups serving ``pairs`` the nodes hold in total, each on one node.

    Counts each node's total resources (not what is in use); the runner's default replica
    count starts from this. A group's GPUs count whole (0.5 of a GPU counts as one), so the
    default never starts two replicas that would time-share a GPU: two processes on one GPU
    interleave their kernels, and each one's timings then depend on what the other runs.
    """
    return whole_groups(bundle_totals(worker_group_bundles(pairs)), node_resources)


def whole_groups(need: Mapping[str, float], node_resources: Iterable[Mapping[str, float]]) -> int:
    """Return how many groups needing ``need`` in all (resource name → amount) the nodes hold,
    each on one node, a fractional GPU need rounded up to whole GPUs (``groups_held``)."""
    need = dict(need)
    if "GPU" in need:
        need["GPU"] = float(math.ceil(need["GPU"] - 1e-9))
    return sum(
        min(math.floor(node.get(name, 0.0) / amount + 1e-9) for name, amount in need.items())
        for node in node_resources
    )
