"""Which pairs share one target group: those whose targets are identical (pure).

Two pairs share when their targets have the same model (the path it resolves to, or the
reference when unresolved), backend, tp_size, dtype and trust_remote_code. A shared group
holds the target once and one draft actor per pair; the runner names its work units' group
after the set (:attr:`SharedTarget.name`): the pair's own name when a pair has its target to
itself, so a sweep without shared targets keeps its pair-named groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.spec import PairSpec, TargetSpec

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
    return [
        SharedTarget(NAME_SEPARATOR.join(p.name for p in members), key, tuple(members))
        for key, members in grouped.items()
    ]


def solo(pair: PairSpec) -> SharedTarget:
    """Return the set of ``pair`` alone (its own target group)."""
    (only,) = shared_targets([pair])
    return only
