"""Ray placement of a worker group: target ranks and draft actors on one node.

A worker group serves the pairs that share one target (``orchestrator.sweep.target_sets``; a pair
with a target of its own is a set of one). Its workers share one placement group with strategy
``STRICT_PACK`` (every bundle on the same node). Bundles ``0 .. tp_size - 1`` are the target
ranks, ``{"CPU": 1, "GPU": g}`` with ``g`` the first pair's ``target.gpus`` (no ``GPU`` key when
0); then one bundle per pair for its draft actor, ``{"CPU": 1, "GPU": d}`` with ``d`` that
pair's ``draft.gpus`` (fractional allowed). For one pair the totals are the planner's
``PairResources``: ``tp_size + 1`` CPUs and ``tp_size·g + d`` GPUs; each further pair sharing
the target adds its draft's bundle only.

Why the draft sits in the same group rather than being a free-floating actor:
- the reservation is atomic: a pair either gets all its workers or none, so pairs running at
  once (``execution.max_concurrent_pairs``) cannot each hold half a group and wait forever;
- the draft calls the target once per round, so keeping it on the target's node keeps a
  network hop out of every timed round.
The cost: the whole group must fit on one node. A target using every GPU of a node
(``tp_size`` 8 with ``gpus: 1`` on an 8-GPU node) leaves none for a GPU draft; give the ranks
``gpus: 0.9`` and the draft ``gpus: 0.1`` so the draft shares a GPU with a rank.

Only :func:`create_worker_group` (and :func:`remove_worker_group`, :func:`group_node`) talk to
the Ray cluster; the message builders are pure, and the bundles themselves are built (and
counted against nodes) in ``orchestrator.sweep.bundles``, which needs no Ray.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.sweep.bundles import (
    bundle_totals,
    draft_bundle,
    fits_on_node,
    target_bundles,
    worker_group_bundles,
)
from orchestrator.sweep.spec import PairSpec

#: All bundles of a pair's group on one node: tensor-parallel ranks talk over NVLink/shared
#: memory, and the draft sits next to the target it calls every round.
GROUP_STRATEGY = "STRICT_PACK"


class PlacementError(RuntimeError):
    """Ray could not reserve a worker group (the message names the pairs and resources)."""


def alive_node_resources() -> list[dict[str, float]]:
    """Return the total resources of each alive node of the connected Ray cluster."""
    return [node["Resources"] for node in ray.nodes() if node.get("Alive")]


def unplaceable_message(
    pairs: Sequence[PairSpec], timeout_s: float, node_resources: list[Mapping[str, float]]
) -> str:
    """Return why the group serving ``pairs`` was not placed: what it needs, what nodes have.

    ``node_resources`` are the alive nodes' total resources. Exists so that a sweep that cannot
    start says which pair, which resources and whether any node could ever hold them.
    """
    need = bundle_totals(worker_group_bundles(pairs))
    ranks = pairs[0].target.tp_size
    names = ", ".join(repr(pair.name) for pair in pairs)
    who = f"pair {names}" if len(pairs) == 1 else f"pairs {names} (sharing one target)"
    drafts = " + ".join(_format(draft_bundle(pair)) for pair in pairs)
    lines = [
        f"{who}: Ray could not reserve its worker group within {timeout_s:g} s.",
        f"It needs, all on ONE node ({GROUP_STRATEGY}): {ranks} target rank(s) × "
        f"{_format(target_bundles(pairs[0])[0])} + draft{'s' if len(pairs) > 1 else ''} "
        f"{drafts} = {_format(need)}.",
    ]
    largest = {
        name: max((node.get(name, 0.0) for node in node_resources), default=0.0) for name in need
    }
    summary = f"The cluster has {len(node_resources)} alive node(s); the largest per resource: "
    lines.append(summary + _format(largest) + ".")
    if any(fits_on_node(need, node) for node in node_resources):
        lines.append(
            "A node is large enough in total, so either other work holds its resources (wait, "
            "lower max_concurrent_pairs, or raise the timeout) or the fractional GPU shares do "
            "not pack onto whole GPUs (each share below 1 must fit within one GPU)."
        )
    else:
        lines.append(
            "No node is that large: add a larger node type (or let the autoscaler start one), "
            "or lower this pair's tp_size / gpus."
        )
    return "\n".join(lines)


def _format(resources: Mapping[str, float]) -> str:
    """Return ``{CPU: 3, GPU: 2.5}``-style text for messages."""
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in resources.items()) + "}"


def create_worker_group(pairs: Sequence[PairSpec], timeout_s: float) -> PlacementGroup:
    """Reserve the worker group serving ``pairs`` and return its ready placement group.

    Waits up to ``timeout_s`` seconds for Ray to place every bundle; otherwise removes the
    pending group (so it cannot grab resources later) and raises :class:`PlacementError`
    naming the pairs and the resources. Needs a connected Ray driver.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 (got {timeout_s!r})")
    group = placement_group(worker_group_bundles(pairs), strategy=GROUP_STRATEGY)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if ready:
        return group
    remove_placement_group(group)
    raise PlacementError(unplaceable_message(pairs, timeout_s, alive_node_resources()))


def remove_worker_group(group: PlacementGroup) -> None:
    """Release a group made by :func:`create_worker_group` (kill its actors first)."""
    remove_placement_group(group)


def group_node(group: PlacementGroup) -> str:
    """Return the Ray node id of a ready group made by :func:`create_worker_group` (all its
    bundles are on one node)."""
    return placement_group_table(group)["bundles_to_node_id"][0]


def _options_for_bundle(group: PlacementGroup, index: int) -> dict[str, Any]:
    """Return ``.options()`` kwargs that run an actor in bundle ``index`` with its resources.

    The actor asks for exactly its bundle's CPU and GPU so Ray assigns it the GPU ids (and sets
    ``CUDA_VISIBLE_DEVICES``) that the bundle reserved.
    """
    bundle = group.bundle_specs[index]
    return {
        "num_cpus": bundle.get("CPU", 0.0),
        "num_gpus": bundle.get("GPU", 0.0),
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index
        ),
    }


def actor_options_for_rank(group: PlacementGroup, rank: int, drafts: int = 1) -> dict[str, Any]:
    """Return the ``Actor.options(**...)`` kwargs that put target rank ``rank`` in its bundle.

    ``drafts`` is how many draft bundles follow the ranks (the pairs the group serves).
    """
    ranks = group.bundle_count - drafts
    if not 0 <= rank < ranks:
        raise ValueError(f"rank must be in 0..{ranks - 1} for this group (got {rank})")
    return _options_for_bundle(group, rank)


def draft_actor_options(group: PlacementGroup, index: int = 0, drafts: int = 1) -> dict[str, Any]:
    """Return the ``Actor.options(**...)`` kwargs that put the draft actor of the group's
    ``index``-th pair (of ``drafts``) in its bundle, after the target ranks."""
    if not 0 <= index < drafts:
        raise ValueError(f"draft index must be in 0..{drafts - 1} (got {index})")
    return _options_for_bundle(group, group.bundle_count - drafts + index)
