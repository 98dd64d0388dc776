"""Work units of a sweep and the scheduler's dispatch rule (pure: no Ray, no I/O).

A live unit is a shard of a group's prompts carrying every arm of the group (its AR baseline
and live trials, :func:`group_units`), so one group spreads over several replicas of its pair's
worker group and each replica interleaves the arms prompt by prompt; a pair's replayed trials
are one unit after its live shards (:func:`replay_unit`); a training job is one unit. The
runner and the cost estimate both plan a pair's live units with :func:`live_group_units`, and
the live scheduler and the scheduling simulation (``bench/scheduler.py``) both dispatch with
:func:`pick_next`. (:func:`trial_units` is a shard of one trial alone.)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.sweep.trial import Trial

JOB_GROUP = "training"


@dataclass(frozen=True)
class WorkUnit:
    """One schedulable piece of work.

    ``group`` names the kind of replica that can run it (a pair's worker group, or
    :data:`JOB_GROUP` for training jobs); ``after`` holds the keys of units that must be done
    first (a trial's training jobs). For a trial shard, ``prompts`` are the indices into the
    trial's prompt list and ``shard``/``shards`` its position among the trial's shards. A
    group shard has ``arms`` (each trial and its sample indices in the shard) and no
    ``trial_id``; its ``prompts`` are the prompt indices it covers.
    """

    key: str
    group: str
    trial_id: str | None = None
    job: str | None = None
    shard: int = 0
    shards: int = 1
    prompts: tuple[int, ...] = ()
    after: tuple[str, ...] = ()
    arms: tuple[ArmShard, ...] = ()


@dataclass(frozen=True)
class ArmShard:
    """One arm of a group shard: a trial and its sample indices there (repeat r of prompt i
    is sample r * prompts + i); the trial's shard row has the group shard's index."""

    trial_id: str
    samples: tuple[int, ...]


def shard_key(trial_id: str, shard: int) -> str:
    """Return the unit key of shard ``shard`` of trial ``trial_id``."""
    return f"{trial_id}/{shard}"


def job_key(name: str) -> str:
    """Return the unit key of the training job ``name``."""
    return f"job:{name}"


def prompt_shards(samples: int, shard_prompts: int) -> list[tuple[int, ...]]:
    """Split prompt indices 0..samples-1 into consecutive shards of at most ``shard_prompts``.

    Every index appears in exactly one shard, in order; ``samples == 0`` gives no shard.
    """
    if shard_prompts < 1:
        raise ValueError(f"shard_prompts must be >= 1, got {shard_prompts}")
    return [
        tuple(range(start, min(start + shard_prompts, samples)))
        for start in range(0, samples, shard_prompts)
    ]


def trial_units(
    trial_id: str,
    group: str,
    samples: int,
    shard_prompts: int,
    after: Iterable[str] = (),
    ordered: bool = False,
) -> list[WorkUnit]:
    """Return the shard units of one trial.

    ``ordered`` trials (a policy whose state persists across requests) are one unit: their
    prompts must run in order through one policy object, so they cannot be spread.
    """
    size = max(samples, 1) if ordered else shard_prompts
    shards = prompt_shards(samples, size) or [()]
    deps = tuple(after)
    return [
        WorkUnit(
            key=shard_key(trial_id, index),
            group=group,
            trial_id=trial_id,
            shard=index,
            shards=len(shards),
            prompts=prompts,
            after=deps,
        )
        for index, prompts in enumerate(shards)
    ]


def pick_next(
    pending: Sequence[WorkUnit], done: Collection[str], serves: Collection[str]
) -> WorkUnit | None:
    """Return the first pending unit a replica serving ``serves`` groups may start, else None.

    Units are taken in plan order (``pending`` keeps it); a unit is ready when every key in its
    ``after`` is in ``done``.
    """
    for unit in pending:
        if unit.group in serves and all(key in done for key in unit.after):
            return unit
    return None


def missing_units(units: Sequence[WorkUnit], stored: Collection[int]) -> list[WorkUnit]:
    """Return ``units`` left to run when the prompt indices in ``stored`` are already stored.

    A shard whose prompts are all stored is dropped; one partly stored (after a change of
    shard size) keeps only its missing prompts.
    """
    left = []
    for unit in units:
        prompts = tuple(index for index in unit.prompts if index not in stored)
        if prompts:
            left.append(replace(unit, prompts=prompts))
    return left


def group_units(
    group_id: str,
    group: str,
    arms: Sequence[str],
    prompts: int,
    shard_prompts: int,
    repeats: int = 1,
    ordered: bool = False,
) -> list[WorkUnit]:
    """Return the shard units of one group of arms (trial ids) over ``prompts`` prompts.

    Every unit carries every arm, each with the samples of the unit's prompts: prompt i's
    repeats r = 0..repeats-1 are samples r * prompts + i. ``ordered`` groups (an arm whose
    policy keeps state across requests) are one unit, as in :func:`trial_units`.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    size = max(prompts, 1) if ordered else shard_prompts
    shards = prompt_shards(prompts, size) or [()]
    units = []
    for index, shard in enumerate(shards):
        samples = tuple(r * prompts + i for r in range(repeats) for i in shard)
        units.append(
            WorkUnit(
                key=shard_key(group_id, index),
                group=group,
                shard=index,
                shards=len(shards),
                prompts=shard,
                arms=tuple(ArmShard(trial_id, samples) for trial_id in arms),
            )
        )
    return units


def missing_arms(
    units: Sequence[WorkUnit], stored: Mapping[str, Collection[int]]
) -> list[WorkUnit]:
    """Return group ``units`` left to run when ``stored`` holds each trial's stored samples.

    An arm whose samples in a unit are all stored leaves that unit (a crashed group shard
    reruns only the arms not stored), an arm partly stored keeps its missing samples, and a
    unit with no arm left is dropped.
    """
    left = []
    for unit in units:
        arms = []
        for arm in unit.arms:
            done = stored.get(arm.trial_id, ())
            samples = tuple(index for index in arm.samples if index not in done)
            if samples:
                arms.append(ArmShard(arm.trial_id, samples))
        if arms:
            left.append(replace(unit, arms=tuple(arms)))
    return left


def arm_groups(trials: Sequence[Trial]) -> list[list[Trial]]:
    """Return live ``trials`` grouped by AR baseline (a baseline and the trials measured
    against it: one pair, prompt set, sampling and seed), each group in plan order."""
    grouped: dict[str, list[Trial]] = {}
    for trial in trials:
        grouped.setdefault(trial.baseline_id or trial.trial_id, []).append(trial)
    return list(grouped.values())


def live_group_units(trials: Sequence[Trial], group: str, shard_prompts: int) -> list[WorkUnit]:
    """Return the group shards of a pair's live ``trials`` run by replicas of worker group
    ``group``: per :func:`arm_groups` group, :func:`group_units` over its prompts and repeats
    (one unit when an arm's policy keeps state across requests; a shard holds at least the
    group's batch size of prompts)."""
    units: list[WorkUnit] = []
    for arms in arm_groups(trials):
        first = arms[0]
        ordered = any(bool(t.setting.params_dict.get("persist_across_requests")) for t in arms)
        units += group_units(
            first.baseline_id or first.trial_id,
            group,
            [trial.trial_id for trial in arms],
            first.prompts.samples,
            max(shard_prompts, first.batch_size),
            repeats=first.repeats,
            ordered=ordered,
        )
    return units


def replay_unit(pair: str, group: str, after: Iterable[str]) -> WorkUnit:
    """Return the unit that replays ``pair``'s replay groups on a replica of ``group``, after
    the units ``after`` (the pair's live shards, whose rounds its cost fit reads)."""
    return WorkUnit(key=f"replay:{pair}", group=group, after=tuple(after))
