"""Projected wall time and GPU-hours of a planned sweep on a hardware profile (pure).

Assumptions, stated once:
- An AR trial generates samples × max_new_tokens tokens at the profile's AR tokens/s.
- A live speculative trial runs at worst at AR speed (the upper bound); the lower bound is full
  acceptance: every round of K drafts yields K + 1 tokens for K·t_draft + t_target seconds.
- A replayed trial costs no model time; its group pays one trace recording, about one live
  static run per prompt (bounded above at AR speed). What replay saves is the live cost of
  the replayed trials minus those recordings.
- Warm-up samples, model loading and training jobs are not counted.
- Each pair runs on one worker group (tp_size × target GPUs + draft GPUs, on one node); pairs
  run at once up to ``execution.max_concurrent_pairs`` and as many groups as the nodes hold.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.cost_model import HardwareProfile
from orchestrator.planner import Plan, Trial, replay_groups

SECONDS_PER_HOUR = 3600.0


class EstimateError(ValueError):
    """The cluster description cannot be used for an estimate (the message names the source)."""


@dataclass(frozen=True)
class Cluster:
    """The GPUs per node that worker groups are packed onto, and where that came from."""

    node_gpus: tuple[float, ...]
    source: str

    @property
    def gpus(self) -> float:
        """Total GPUs over all nodes."""
        return sum(self.node_gpus)


@dataclass(frozen=True)
class PairEstimate:
    """One pair's projected work on one worker group: seconds at worst and at best."""

    pair: str
    trials: int
    group_gpus: float
    seconds_upper: float
    seconds_lower: float
    replay_saved_seconds: float

    @property
    def gpu_hours_upper(self) -> float:
        """GPU-hours at the upper bound (seconds × the group's GPUs)."""
        return self.seconds_upper * self.group_gpus / SECONDS_PER_HOUR


@dataclass(frozen=True)
class SweepEstimate:
    """Per-pair estimates, the number of pairs run at once, and the projected wall times."""

    profile: str
    cluster: Cluster
    slots: int
    groups_held: int
    pairs: tuple[PairEstimate, ...]
    wall_seconds_upper: float
    wall_seconds_lower: float

    @property
    def gpu_hours_upper(self) -> float:
        """Total GPU-hours at the upper bound."""
        return sum(pair.gpu_hours_upper for pair in self.pairs)

    @property
    def replay_saved_seconds_total(self) -> float:
        """Worker-group seconds that replay mode saves (upper bound, summed over pairs)."""
        return sum(p.replay_saved_seconds for p in self.pairs)

    @property
    def replay_saved_gpu_hours(self) -> float:
        """GPU-hours that replay mode saves against running every trial live (upper bound)."""
        return sum(p.replay_saved_seconds * p.group_gpus for p in self.pairs) / SECONDS_PER_HOUR


def trial_tokens(trial: Trial) -> int:
    """Return the tokens a trial generates at most: samples × max_new_tokens."""
    return trial.samples * trial.max_new_tokens


def full_acceptance_tokens_per_s(profile: HardwareProfile, max_draft_len: int) -> float:
    """Return (K + 1) / (K·t_draft + t_target): the speed when every drafted token is accepted."""
    k = max_draft_len
    return (k + 1) / (k * profile.t_draft + profile.t_target)


def trial_seconds(trial: Trial, profile: HardwareProfile) -> tuple[float, float]:
    """Return (upper, lower) model seconds of one trial; a replayed trial costs (0, 0)."""
    if trial.mode == "replay":
        return 0.0, 0.0
    upper = trial_tokens(trial) / profile.ar_tokens_per_s
    if trial.is_baseline:
        return upper, upper
    return upper, trial_tokens(trial) / full_acceptance_tokens_per_s(profile, trial.max_draft_len)


def _trace_seconds(plan: Plan, profile: HardwareProfile) -> dict[str, tuple[float, float]]:
    """Return per pair the trace recordings' (seconds, live cost of the trials they replace)."""
    result: dict[str, tuple[float, float]] = {}
    for group in replay_groups(plan):
        first = group.trials[0]
        record = trial_tokens(first) / profile.ar_tokens_per_s
        replaced = sum(trial_tokens(t) for t in group.replayed) / profile.ar_tokens_per_s
        done, saved = result.get(first.pair, (0.0, 0.0))
        result[first.pair] = (done + record, saved + replaced)
    return result


def pair_estimates(plan: Plan, profile: HardwareProfile) -> list[PairEstimate]:
    """Return each pair's projected seconds (upper and lower) and what replay saves, plan order."""
    traces = _trace_seconds(plan, profile)
    estimates = []
    for resources in plan.resources():
        trials = [trial for trial in plan.trials if trial.pair == resources.pair]
        bounds = [trial_seconds(trial, profile) for trial in trials]
        record, replaced = traces.get(resources.pair, (0.0, 0.0))
        estimates.append(
            PairEstimate(
                pair=resources.pair,
                trials=len(trials),
                group_gpus=resources.gpus,
                seconds_upper=sum(upper for upper, _ in bounds) + record,
                seconds_lower=sum(lower for _, lower in bounds) + record,
                replay_saved_seconds=replaced - record,
            )
        )
    return estimates


def groups_held(cluster: Cluster, group_gpus: Sequence[float]) -> int:
    """Return how many worker groups of the largest size fit, each packed on one node."""
    need = max(group_gpus, default=0.0)
    if need <= 0:
        return len(group_gpus)
    return sum(math.floor(gpus / need + 1e-9) for gpus in cluster.node_gpus)


def makespan(durations: Sequence[float], slots: int) -> float:
    """Return the wall time of running ``durations`` longest first on ``slots`` parallel slots."""
    if not durations:
        return 0.0
    loads = [0.0] * max(1, slots)
    for duration in sorted(durations, reverse=True):
        heapq.heapreplace(loads, loads[0] + duration)
    return max(loads)


def estimate_sweep(
    plan: Plan, profile: HardwareProfile, cluster: Cluster, max_concurrent_pairs: int
) -> SweepEstimate:
    """Return the sweep's estimate; raises EstimateError when no worker group fits a node."""
    pairs = pair_estimates(plan, profile)
    held = groups_held(cluster, [pair.group_gpus for pair in pairs])
    if held < 1:
        need = max(pair.group_gpus for pair in pairs)
        raise EstimateError(
            f"{cluster.source}: no node holds a worker group of {need:g} GPUs "
            f"(nodes have {', '.join(f'{g:g}' for g in cluster.node_gpus) or 'none'})"
        )
    slots = max(1, min(max_concurrent_pairs, held, len(pairs)))
    return SweepEstimate(
        profile=profile.name,
        cluster=cluster,
        slots=slots,
        groups_held=held,
        pairs=tuple(pairs),
        wall_seconds_upper=makespan([p.seconds_upper for p in pairs], slots),
        wall_seconds_lower=makespan([p.seconds_lower for p in pairs], slots),
    )


def gpus_cluster(gpus: float, source: str = "--gpus") -> Cluster:
    """Return a cluster of ``gpus`` GPUs taken as one node (``--gpus N`` or a Ray cluster)."""
    if gpus <= 0:
        raise EstimateError(f"{source}: need a positive number of GPUs, got {gpus:g}")
    return Cluster(node_gpus=(float(gpus),), source=source)


def parse_cluster_yaml(path: Path) -> Cluster:
    """Return the GPU nodes a Ray cluster-launcher file allows at most (max workers per type).

    Each worker node type gives ``max_workers`` nodes of ``resources.GPU`` GPUs, all types
    together capped by the top-level ``max_workers``. Raises EstimateError naming the file.
    """
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise EstimateError(f"{path}: cannot read the cluster file: {error}") from None
    types = config.get("available_node_types") if isinstance(config, dict) else None
    if not isinstance(types, dict):
        raise EstimateError(f"{path}: no available_node_types mapping")
    cap = config.get("max_workers")
    nodes: list[float] = []
    for name, node_type in types.items():
        if name == config.get("head_node_type") or not isinstance(node_type, dict):
            continue
        gpus = float((node_type.get("resources") or {}).get("GPU", 0))
        if gpus > 0:
            nodes.extend([gpus] * int(node_type.get("max_workers", 0)))
    nodes.sort(reverse=True)
    if isinstance(cap, int):
        nodes = nodes[:cap]
    if not nodes:
        raise EstimateError(f"{path}: no worker node type with GPUs and max_workers > 0")
    return Cluster(node_gpus=tuple(nodes), source=str(path))


def format_hours(seconds: float) -> str:
    """Return ``seconds`` as hours, or days when at least two days."""
    hours = seconds / SECONDS_PER_HOUR
    return f"{hours / 24:,.1f} d" if hours >= 48 else f"{hours:,.2f} h"


def estimate_lines(estimate: SweepEstimate) -> list[str]:
    """Return the estimate as printable lines: one per pair, then the totals."""
    cluster = estimate.cluster
    lines = [
        f"estimate on profile {estimate.profile}, {cluster.gpus:g} GPUs ({cluster.source}): "
        f"{estimate.slots} pair(s) at once (the nodes hold {estimate.groups_held} worker "
        "groups; execution.max_concurrent_pairs caps it)",
        "  live speculation between full acceptance (lower) and AR speed (upper); "
        "warm-up, loading and training not counted",
    ]
    for pair in estimate.pairs:
        lines.append(
            f"  {pair.pair}: {pair.trials} trials on {pair.group_gpus:g} GPUs, "
            f"{format_hours(pair.seconds_lower)} .. {format_hours(pair.seconds_upper)}, "
            f"<= {pair.gpu_hours_upper:,.0f} GPU-h"
        )
    lines.append(
        f"total: wall {format_hours(estimate.wall_seconds_lower)} .. "
        f"{format_hours(estimate.wall_seconds_upper)}, <= {estimate.gpu_hours_upper:,.0f} GPU-h"
    )
    if any(pair.replay_saved_seconds for pair in estimate.pairs):
        lines.append(
            f"replay mode saves about {format_hours(estimate.replay_saved_seconds_total)} of "
            f"worker-group time ({estimate.replay_saved_gpu_hours:,.0f} GPU-h) against running "
            "the replayed trials live at AR speed"
        )
    return lines
