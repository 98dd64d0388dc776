"""Projected wall time and GPU-hours of a planned sweep on a hardware profile (pure).

Assumptions, stated once:
- An AR trial generates samples × repeats × max_new_tokens tokens at the profile's AR tokens/s.
- A live speculative trial runs at worst at AR speed (the upper bound); the lower bound is full
  acceptance: every round of K drafts yields K + 1 tokens for K·t_draft + t_target seconds.
- A replayed trial costs no model time; its group pays one trace recording, about one live
  static run per prompt (bounded above at AR speed). What replay saves is the live cost of
  the replayed trials minus those recordings.
- Pairs whose targets are the same (model, backend, tp_size, dtype, trust_remote_code) share
  one target group per replica (``orchestrator.sweep.target_sets``, as the runner groups them),
  which holds the target once and every such pair's draft (tp_size × target GPUs + the
  drafts' GPUs, on one node); as many replicas as the nodes hold (``execution.replicas`` caps
  them when the sweep sets it). A replica starts after loading its models once (the runner
  loads a pair's draft with the replica's first unit of that pair; counted here up front).
- The work units are the runner's (``work_units.live_group_units``, the function the runner
  plans with): a pair's live trials grouped by AR baseline, each group cut into prompt shards
  (``execution.shard_prompts``) that carry every arm of the group; a shard costs its arms'
  shares of their trials' seconds (repeats included). A pair's trace recordings are its one
  replay unit (``work_units.replay_unit``), after its live shards. The wall time is the
  makespan of those units over the replicas, from the discrete-event simulation
  (``orchestrator.analysis.costs.schedule_sim``) of the live dispatch rule.
- A trial at a batch size B above 1 decodes each shard's queue B sequences at a time: its
  arm costs ceil(n / B) waves of one sequence's rounds at the cost of a round of the batch,
  measured at B where the store has it, else the batch-1 round's
  (``orchestrator.analysis.costs.batch_estimate``, which states the assumption).
- Warm-up samples and training jobs are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from orchestrator.analysis.costs.batch_estimate import (
    BatchMeasurement,
    BatchRoundCost,
    batch_arm_seconds,
    batch_round_costs,
    batch_trial_seconds,
    source_lines,
)
from orchestrator.analysis.costs.model import HardwareProfile
from orchestrator.analysis.costs.schedule_sim import Replica, SimResult, one_after_another, simulate
from orchestrator.sweep.bundles import whole_groups
from orchestrator.sweep.planner import Plan, Trial, replay_groups
from orchestrator.sweep.spec import ExecutionSpec, PairSpec
from orchestrator.sweep.target_sets import shared_targets
from orchestrator.sweep.work_units import ArmShard, WorkUnit, live_group_units, replay_unit

SECONDS_PER_HOUR = 3600.0
#: Prompts per work unit when the sweep does not set ``execution.shard_prompts``.
DEFAULT_SHARD_PROMPTS: int = ExecutionSpec.model_fields["shard_prompts"].default
#: Each (pair, batch size > 1)'s round cost (``batch_estimate.batch_round_costs``).
BatchCosts = Mapping[tuple[str, int], BatchRoundCost]


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
class LoadTimes:
    """Assumed seconds to load one model onto a replica (fp16 weights from a local disk cache)."""

    target: float = 600.0
    draft: float = 120.0


@dataclass(frozen=True)
class EstimateOptions:
    """How the sweep runs: replicas cap, shard size, load times, per-pair fitted profiles,
    and per (pair, batch size > 1) what stored trials measured at that batch size."""

    replicas: int | None = None
    max_concurrent_pairs: int = 1
    shard_prompts: int = DEFAULT_SHARD_PROMPTS
    loads: LoadTimes = LoadTimes()
    fitted: Mapping[str, HardwareProfile] = field(default_factory=dict)
    measured: Mapping[tuple[str, int], BatchMeasurement] = field(default_factory=dict)


@dataclass(frozen=True)
class TargetSet:
    """Pairs whose targets are the same (``orchestrator.sweep.target_sets``): a group a replica."""

    target: str
    pairs: tuple[str, ...]
    gpus: float

    def load_seconds(self, loads: LoadTimes) -> float:
        """Seconds a replica spends loading: the shared target once, then each pair's draft."""
        return loads.target + loads.draft * len(self.pairs)


@dataclass(frozen=True)
class PairEstimate:
    """One pair's projected work: seconds at worst and at best, on the profile it used;
    ``draft_kinds`` are the kinds of its trials' drafts, in plan order."""

    pair: str
    profile: str
    trials: int
    group_gpus: float
    seconds_upper: float
    seconds_lower: float
    replay_saved_seconds: float
    draft_kinds: tuple[str, ...] = ("lm",)

    @property
    def gpu_hours_upper(self) -> float:
        """GPU-hours at the upper bound (seconds × the GPUs of the replica it runs on)."""
        return self.seconds_upper * self.group_gpus / SECONDS_PER_HOUR


@dataclass(frozen=True)
class Workload:
    """The sweep's work units in plan order and each unit's seconds at both bounds."""

    units: tuple[WorkUnit, ...]
    upper: Mapping[str, float]
    lower: Mapping[str, float]


@dataclass(frozen=True)
class SweepEstimate:
    """Per-pair estimates, the replicas of each target set, and the simulated wall times."""

    profile: str
    cluster: Cluster
    sets: tuple[TargetSet, ...]
    replicas: tuple[int, ...]
    pairs: tuple[PairEstimate, ...]
    load_seconds: float
    upper: SimResult
    lower: SimResult
    batch_costs: tuple[BatchRoundCost, ...] = ()
    batch_sizes: tuple[int, ...] = (1,)

    @property
    def wall_seconds_upper(self) -> float:
        """Simulated wall time with every unit at its upper bound."""
        return self.upper.makespan

    @property
    def wall_seconds_lower(self) -> float:
        """Simulated wall time with every unit at its lower bound."""
        return self.lower.makespan

    @property
    def gpu_hours_upper(self) -> float:
        """GPU-hours the replicas are busy at the upper bound (loading not counted)."""
        return sum(pair.gpu_hours_upper for pair in self.pairs)

    @property
    def replay_saved_seconds_total(self) -> float:
        """Replica seconds that replay mode saves (upper bound, summed over pairs)."""
        return sum(p.replay_saved_seconds for p in self.pairs)

    @property
    def replay_saved_gpu_hours(self) -> float:
        """GPU-hours that replay mode saves against running every trial live (upper bound)."""
        return sum(p.replay_saved_seconds * p.group_gpus for p in self.pairs) / SECONDS_PER_HOUR


def prompt_tokens(trial: Trial) -> int:
    """Return the tokens one pass over a trial's prompts generates at most: samples ×
    max_new_tokens (a trace recording's)."""
    return trial.prompts.samples * trial.sampling.max_new_tokens


def trial_tokens(trial: Trial) -> int:
    """Return the tokens a trial generates at most: samples × repeats × max_new_tokens."""
    return prompt_tokens(trial) * trial.repeats


def full_acceptance_tokens_per_s(profile: HardwareProfile, max_draft_len: int) -> float:
    """Return (K + 1) / (K·t_draft + t_target): the speed when every drafted token is accepted."""
    k = max_draft_len
    return (k + 1) / (k * profile.t_draft + profile.t_target)


def trial_seconds(trial: Trial, profile: HardwareProfile) -> tuple[float, float]:
    """Return (upper, lower) model seconds of one trial; a replayed trial costs (0, 0), and a
    lookup draft's (``ngram``) draft steps cost nothing (no draft forward)."""
    if trial.mode == "replay":
        return 0.0, 0.0
    upper = trial_tokens(trial) / profile.ar_tokens_per_s
    if trial.is_baseline:
        return upper, upper
    if trial.served.draft_kind == "ngram":
        profile = replace(profile, t_draft=0.0)
    return upper, trial_tokens(trial) / full_acceptance_tokens_per_s(
        profile, trial.setting.max_draft_len
    )


def target_sets(pairs: Sequence[PairSpec]) -> list[TargetSet]:
    """Group ``pairs`` by identical targets as the runner does (``target_sets.shared_targets``,
    keyed by the model reference here: nothing is resolved before submit); each set's GPUs."""
    return [
        TargetSet(
            target=f"{key.model} ({key.backend}, tp {key.tp_size}, {key.dtype})",
            pairs=shared.pair_names,
            gpus=key.tp_size * shared.target.gpus + sum(p.draft.gpus for p in shared.pairs),
        )
        for shared in shared_targets(pairs)
        for key in (shared.key,)
    ]


def replica_counts(
    cluster: Cluster, sets: Sequence[TargetSet], units: Sequence[int], options: EstimateOptions
) -> list[int]:
    """Return each set's replicas as the runner starts them (``runner._replica_count``), given
    each set's number of work ``units``; 0 where no node holds the set.

    ``options.replicas`` (``execution.replicas``) when set, else the whole groups the nodes
    hold (``bundles.whole_groups``: a group's GPUs count whole, so two replicas never
    time-share a GPU) divided among the ``max_concurrent_pairs`` sets run at once; at least
    one, at most one per unit. A set that needs no GPU (a CPU sweep) gets one per node.
    """
    share = min(options.max_concurrent_pairs, len(sets))
    nodes = [{"GPU": gpus} for gpus in cluster.node_gpus]
    counts = []
    for target_set, pending in zip(sets, units, strict=True):
        if target_set.gpus > 0:
            held = whole_groups({"GPU": target_set.gpus}, nodes)
            default = held // share
        else:
            held = default = len(nodes)
        wanted = options.replicas if options.replicas is not None else default
        counts.append(0 if held == 0 else max(1, min(wanted, pending)))
    return counts


def plan_workload(
    plan: Plan,
    profiles: Mapping[str, HardwareProfile],
    options: EstimateOptions,
    batch: BatchCosts | None = None,
) -> Workload:
    """Return the plan's work units as the runner plans them, with their seconds at both bounds.

    Per pair: its live trials' group shards (``work_units.live_group_units``), each costing
    its arms' shares of their trials' seconds (an arm at a batch size above 1: its queue's
    waves at ``batch``'s round cost, by default ``batch_round_costs`` of ``options.measured``),
    then, when it replays, its replay unit costing its trace recordings; replayed trials cost
    nothing.
    """
    trials = {trial.trial_id: trial for trial in plan.trials}
    if batch is None:
        batch = batch_round_costs(plan.trials, profiles, options.measured)
    recordings = _trace_seconds(plan, profiles, batch, options.shard_prompts)
    work: list[tuple[WorkUnit, float, float]] = []
    for pair in plan.pairs:
        mine = [trial for trial in plan.trials if trial.pair == pair.name]
        live = [trial for trial in mine if trial.mode != "replay"]
        units = live_group_units(live, pair.name, options.shard_prompts)
        for unit in units:
            shares = [_arm_seconds(trials[arm.trial_id], arm, profiles, batch) for arm in unit.arms]
            work.append((unit, sum(u for u, _ in shares), sum(lo for _, lo in shares)))
        if len(live) < len(mine):
            record, _ = recordings[pair.name]
            work.append((replay_unit(pair.name, pair.name, [u.key for u in units]), record, record))
    return Workload(
        units=tuple(unit for unit, _, _ in work),
        upper={unit.key: upper for unit, upper, _ in work},
        lower={unit.key: lower for unit, _, lower in work},
    )


def _arm_seconds(
    trial: Trial, arm: ArmShard, profiles: Mapping[str, HardwareProfile], batch: BatchCosts
) -> tuple[float, float]:
    """Return one arm's share of its trial's (upper, lower) seconds: its samples in the shard
    over the trial's samples × repeats; at a batch size above 1, its queue's waves
    (``batch_estimate.batch_arm_seconds``)."""
    if trial.batch_size > 1:
        return batch_arm_seconds(trial, len(arm.samples), batch[(trial.pair, trial.batch_size)])
    upper, lower = trial_seconds(trial, profiles[trial.pair])
    share = len(arm.samples) / max(trial.prompts.samples * trial.repeats, 1)
    return upper * share, lower * share


def _trace_seconds(
    plan: Plan,
    profiles: Mapping[str, HardwareProfile],
    batch: BatchCosts,
    shard_prompts: int = DEFAULT_SHARD_PROMPTS,
) -> dict[str, tuple[float, float]]:
    """Return per pair the trace recordings' (seconds, live cost of the trials they replace,
    upper bound). Groups that share traces (the same prompts at another batch size) record
    them once."""
    result: dict[str, tuple[float, float]] = {}
    recorded: set[str] = set()
    for group in replay_groups(plan):
        first = group.trials[0]
        speed = profiles[first.pair].ar_tokens_per_s
        record = 0.0 if group.trace_key in recorded else prompt_tokens(first) / speed
        recorded.add(group.trace_key)
        replaced = sum(
            trial_bounds(replace(t, mode="live"), profiles, batch, shard_prompts)[0]
            for t in group.replayed
        )
        done, saved = result.get(first.pair, (0.0, 0.0))
        result[first.pair] = (done + record, saved + replaced)
    return result


def pair_profiles(
    plan: Plan, profile: HardwareProfile, fitted: Mapping[str, HardwareProfile] | None = None
) -> dict[str, HardwareProfile]:
    """Return each pair's profile: its fitted one when given, else ``profile``."""
    fitted = fitted or {}
    return {pair.name: fitted.get(pair.name, profile) for pair in plan.pairs}


def trial_bounds(
    trial: Trial,
    profiles: Mapping[str, HardwareProfile],
    batch: BatchCosts,
    shard_prompts: int = DEFAULT_SHARD_PROMPTS,
) -> tuple[float, float]:
    """Return a trial's (upper, lower) seconds: :func:`trial_seconds` at batch size 1, else its
    shards' queues at ``batch``'s round cost (``batch_estimate.batch_trial_seconds``)."""
    if trial.batch_size == 1:
        return trial_seconds(trial, profiles[trial.pair])
    return batch_trial_seconds(trial, batch[(trial.pair, trial.batch_size)], shard_prompts)


def pair_estimates(
    plan: Plan,
    profiles: Mapping[str, HardwareProfile],
    batch: BatchCosts | None = None,
    shard_prompts: int = DEFAULT_SHARD_PROMPTS,
) -> list[PairEstimate]:
    """Return each pair's projected seconds (upper and lower) and what replay saves, plan order
    (trials at a batch size above 1 at ``batch``'s round cost, by default sized from batch 1)."""
    if batch is None:
        batch = batch_round_costs(plan.trials, profiles, {})
    traces = _trace_seconds(plan, profiles, batch, shard_prompts)
    set_gpus = {name: s.gpus for s in target_sets(plan.pairs) for name in s.pairs}
    estimates = []
    for pair in plan.pairs:
        trials = [trial for trial in plan.trials if trial.pair == pair.name]
        bounds = [trial_bounds(trial, profiles, batch, shard_prompts) for trial in trials]
        record, replaced = traces.get(pair.name, (0.0, 0.0))
        estimates.append(
            PairEstimate(
                pair=pair.name,
                profile=profiles[pair.name].name,
                trials=len(trials),
                group_gpus=set_gpus[pair.name],
                seconds_upper=sum(upper for upper, _ in bounds) + record,
                seconds_lower=sum(lower for _, lower in bounds) + record,
                replay_saved_seconds=replaced - record,
                draft_kinds=tuple(dict.fromkeys(t.served.draft_kind for t in trials)),
            )
        )
    return estimates


def replicas_of(
    sets: Sequence[TargetSet], counts: Sequence[int], loads: LoadTimes, first: int = 0
) -> list[Replica]:
    """Return the replicas (each set's ``counts`` of them), each ready after loading its models;
    replica ``i.c`` is copy c of set i, the sets numbered from ``first``."""
    return [
        Replica(f"{index}.{copy}", frozenset(target_set.pairs), target_set.load_seconds(loads))
        for index, (target_set, count) in enumerate(zip(sets, counts, strict=True), start=first)
        for copy in range(count)
    ]


def estimate_sweep(
    plan: Plan, profile: HardwareProfile, cluster: Cluster, options: EstimateOptions
) -> SweepEstimate:
    """Return the sweep's estimate; raises EstimateError when a target set fits no node.

    As the runner does, the target sets run ``max_concurrent_pairs`` at a time (in plan order),
    each batch's replicas (``replica_counts``) loading their models when it starts; the
    batches' simulations follow one another.
    """
    sets = target_sets(plan.pairs)
    profiles = pair_profiles(plan, profile, options.fitted)
    round_costs = batch_round_costs(plan.trials, profiles, options.measured)
    work = plan_workload(plan, profiles, options, round_costs)
    step = options.max_concurrent_pairs
    counts: list[int] = []
    upper, lower, loads = [], [], []
    for start in range(0, len(sets), step):
        batch = sets[start : start + step]
        per_set = [[u for u in work.units if u.group in s.pairs] for s in batch]
        counts += _placed(cluster, batch, [len(units) for units in per_set], options)
        replicas = replicas_of(batch, counts[start:], options.loads, first=start)
        units = [unit for units in per_set for unit in units]
        upper.append(simulate(units, work.upper, replicas))
        lower.append(simulate(units, work.lower, replicas))
        loads.append(max(r.ready_at for r in replicas))
    return SweepEstimate(
        profile=profile.name,
        cluster=cluster,
        sets=tuple(sets),
        replicas=tuple(counts),
        pairs=tuple(pair_estimates(plan, profiles, round_costs, options.shard_prompts)),
        load_seconds=sum(loads),
        upper=one_after_another(upper),
        lower=one_after_another(lower),
        batch_costs=tuple(round_costs.values()),
        batch_sizes=tuple(sorted({trial.batch_size for trial in plan.trials})),
    )


def _placed(
    cluster: Cluster, sets: Sequence[TargetSet], units: Sequence[int], options: EstimateOptions
) -> list[int]:
    """Return ``replica_counts`` of ``sets``; raises EstimateError when one fits no node."""
    counts = replica_counts(cluster, sets, units, options)
    for target_set, count in zip(sets, counts, strict=True):
        if count < 1:
            raise EstimateError(
                f"{cluster.source}: no node holds a worker group of {target_set.gpus:g} GPUs "
                f"(nodes have {', '.join(f'{g:g}' for g in cluster.node_gpus) or 'none'})"
            )
    return counts


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


def _set_lines(estimate: SweepEstimate) -> list[str]:
    """Return one line per target set: its pairs, replica GPUs and replica count."""
    return [
        f"  target {target_set.target}: {count} replica(s) of {target_set.gpus:g} GPUs, "
        f"shared by {len(target_set.pairs)} pair(s) (the target loads once per replica)"
        for target_set, count in zip(estimate.sets, estimate.replicas, strict=True)
    ]


def estimate_lines(estimate: SweepEstimate) -> list[str]:
    """Return the estimate as printable lines: the replicas, one line per pair (with its
    trials' draft kinds), the totals."""
    cluster = estimate.cluster
    lines = [
        f"estimate on profile {estimate.profile}, {cluster.gpus:g} GPUs ({cluster.source}): "
        f"{sum(estimate.replicas)} replica(s)",
        *_set_lines(estimate),
        "  live speculation between full acceptance (lower) and AR speed (upper); wall time "
        "simulated over prompt shards; warm-up and training not counted",
        *source_lines(estimate.batch_costs, 1 in estimate.batch_sizes),
    ]
    for pair in estimate.pairs:
        lines.append(
            f"  {pair.pair} [{', '.join(pair.draft_kinds)}]: {pair.trials} trials, "
            f"{format_hours(pair.seconds_lower)} .. "
            f"{format_hours(pair.seconds_upper)} of replica time on {pair.profile}, "
            f"<= {pair.gpu_hours_upper:,.0f} GPU-h"
        )
    lines.append(
        f"total: wall {format_hours(estimate.wall_seconds_lower)} .. "
        f"{format_hours(estimate.wall_seconds_upper)} (model loading "
        f"{format_hours(estimate.load_seconds)} included, replicas "
        f"{estimate.upper.utilisation:.0%} busy at the upper bound), "
        f"<= {estimate.gpu_hours_upper:,.0f} GPU-h"
    )
    if any(pair.replay_saved_seconds for pair in estimate.pairs):
        lines.append(
            f"replay mode saves about {format_hours(estimate.replay_saved_seconds_total)} of "
            f"replica time ({estimate.replay_saved_gpu_hours:,.0f} GPU-h) against running "
            "the replayed trials live at AR speed"
        )
    return lines
