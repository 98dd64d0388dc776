"""Which pairs share one target group: those whose targets are identical (pure).

Two pairs share when their targets have the same model (the path it resolves to, or the
reference when unresolved), backend, tp_size, dtype and trust_remote_code. A shared group
holds the target once and one draft actor per pair; the runner names its work units' group
after the set (:attr:`SharedTarget.name`): the pair's own name when a pair has its target to
itself, so a sweep without shared targets keeps its pair-named groups. A set whose group
(the target's ranks and one draft actor per pair) no node could hold is split into consecutive
smaller sets that fit (``split_to_fit``), each loading the target once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.sweep.bundles import bundle_totals, fits_on_node, worker_group_bundles
from orchestrator.sweep.spec import PairSpec, TargetSpec

#: Joins the pair names of a shared set into its name (pair names never contain it).
NAME_SEPARATOR = "+"


@dataclass(frozen=True)
class TargetKey:
    """What makes two targets the same model served the same way."""

    model: str
    backend: str
    tp_size: int
    dtype: str
    trust_remote_code: bool


@dataclass(frozen=True)
class SharedTarget:
    """The pairs (plan order) one target group serves; ``name`` is the units' group."""

    name: str
    key: TargetKey
    pairs: tuple[PairSpec, ...]

    @property
    def target(self) -> TargetSpec:
        """The target every pair of the set names (the first pair's, which places the ranks)."""
        return self.pairs[0].target

    @property
    def pair_names(self) -> tuple[str, ...]:
        """The names of the set's pairs, in order."""
        return tuple(pair.name for pair in self.pairs)


def target_key(pair: PairSpec, model: str | Path) -> TargetKey:
    """Return the key of ``pair``'s target, whose model is ``model`` (resolved path or ref)."""
    target = pair.target
    return TargetKey(
        str(model), target.backend, target.tp_size, target.dtype, target.trust_remote_code
    )


def shared_targets(
    pairs: Sequence[PairSpec], models: Mapping[str, str | Path] | None = None
) -> list[SharedTarget]:
    """Group ``pairs`` by identical targets, in order of first appearance.

    ``models`` gives each pair's target model as resolved (a local path, by pair name); a pair
    missing from it is keyed by its spec's model reference.
    """
    models = models or {}
    grouped: dict[TargetKey, list[PairSpec]] = {}
    for pair in pairs:
        key = target_key(pair, models.get(pair.name, pair.target.model))
        grouped.setdefault(key, []).append(pair)
    return [_set_of(members, key) for key, members in grouped.items()]


def solo(pair: PairSpec) -> SharedTarget:
    """Return the set of ``pair`` alone (its own target group)."""
    (only,) = shared_targets([pair])
    return only


def _set_of(pairs: Sequence[PairSpec], key: TargetKey) -> SharedTarget:
    """Return the set serving ``pairs`` (same target ``key``), named after them."""
    return SharedTarget(NAME_SEPARATOR.join(p.name for p in pairs), key, tuple(pairs))


def _fits_a_node(pairs: Sequence[PairSpec], nodes: Sequence[Mapping[str, float]]) -> bool:
    """True when some node's total resources hold the group serving ``pairs``."""
    need = bundle_totals(worker_group_bundles(pairs))
    return any(fits_on_node(need, node) for node in nodes)


def split_to_fit(
    sets: Sequence[SharedTarget], nodes: Sequence[Mapping[str, float]]
) -> list[SharedTarget]:
    """Return ``sets`` with each set whose group no node holds cut into consecutive sets.

    ``nodes`` are the alive nodes' total resources. A cut set takes pairs in plan order while
    its group still fits a node (one pair at least, so a pair too large on its own is left for
    placement to report); sets that fit, or any set when ``nodes`` is empty, stay whole.
    """
    result: list[SharedTarget] = []
    for shared in sets:
        if not nodes or _fits_a_node(shared.pairs, nodes):
            result.append(shared)
            continue
        chunk: list[PairSpec] = []
        for pair in shared.pairs:
            if chunk and not _fits_a_node([*chunk, pair], nodes):
                result.append(_set_of(chunk, shared.key))
                chunk = []
            chunk.append(pair)
        result.append(_set_of(chunk, shared.key))
    return result
