"""Seconds of a trial decoded at a batch size above 1, for the sweep estimate (pure).

At batch size B an arm decodes its shard's queue of n sequences B at a time (continuous
batching, ``workers.batch_engine``): every round moves each sequence of the batch one round on,
so with every sequence of the queue running to ``max_new_tokens`` (the estimate's assumption
at batch 1 too) the queue takes ceil(n / B) waves of one sequence's rounds, each round costing
what one round of the whole batch costs. The bounds are batch 1's, per round of the batch:

- upper (speculation at AR speed): max_new_tokens AR rounds of the batch;
- lower (full acceptance): max_new_tokens / (K + 1) rounds of K batched draft steps and one
  batched verify.

A round's cost at B is measured when the store holds trials of the pair's models at B
(:class:`BatchMeasurement`, read by ``orchestrator.run.estimate_sources``); else it is the
batch-1 round's cost on the pair's profile, under the stated assumption
:data:`BATCH_ONE_ASSUMPTION` (a forward of B rows costs a forward of one: decoding is bound by
reading the weights, not by the rows), which the estimate prints with the batch size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.analysis.costs.model import HardwareProfile
from orchestrator.sweep.trial import Trial
from orchestrator.sweep.work_units import prompt_shards

#: What a batch size without a measurement is sized by (printed by the estimate).
BATCH_ONE_ASSUMPTION = "a round of the batch assumed to cost a batch-1 round"


@dataclass(frozen=True)
class BatchMeasurement:
    """What stored trials of one pair's models measured at one batch size.

    ``ar_round_seconds``: one AR round of a full batch, everything included (B over the AR
    baselines' total tokens/s); ``t_target``: one batched target forward (the AR baselines'
    verify seconds per round); ``t_draft``: one batched draft step (the speculative trials'
    draft seconds per draft forward), None without a speculative trial at B.
    """

    batch_size: int
    ar_round_seconds: float
    t_target: float
    t_draft: float | None
    n_trials: int


@dataclass(frozen=True)
class BatchRoundCost:
    """Seconds of one round of a batch of ``batch_size`` sequences of ``pair``, and their source.

    ``t_draft``: a batched draft step; ``t_target``: a batched verify; ``ar_round_seconds``: a
    batched AR round with its overhead; ``measured``: whether a stored measurement at this
    batch size gave them; ``source`` says which, for the estimate's lines.
    """

    pair: str
    batch_size: int
    t_draft: float
    t_target: float
    ar_round_seconds: float
    measured: bool
    source: str


def sized_from_batch_one(pair: str, batch_size: int, profile: HardwareProfile) -> BatchRoundCost:
    """Return the batch-1 round's costs on ``profile`` as the round at ``batch_size``
    (:data:`BATCH_ONE_ASSUMPTION`)."""
    return BatchRoundCost(
        pair=pair,
        batch_size=batch_size,
        t_draft=profile.t_draft,
        t_target=profile.t_target,
        ar_round_seconds=1.0 / profile.ar_tokens_per_s,
        measured=False,
        source=(
            f"sized from batch 1: no measurement at B = {batch_size} "
            f"({BATCH_ONE_ASSUMPTION} on {profile.name})"
        ),
    )


def measured_round_cost(
    pair: str, measurement: BatchMeasurement, profile: HardwareProfile
) -> BatchRoundCost:
    """Return the round at the measurement's batch size from what it measured; a draft step
    it did not measure (no speculative trial at B) is the batch-1 one on ``profile``."""
    size = measurement.batch_size
    draft = measurement.t_draft
    note = "" if draft is not None else f"; draft step from batch 1 on {profile.name}"
    return BatchRoundCost(
        pair=pair,
        batch_size=size,
        t_draft=draft if draft is not None else profile.t_draft,
        t_target=measurement.t_target,
        ar_round_seconds=measurement.ar_round_seconds,
        measured=True,
        source=(
            f"measured at B = {size} ({measurement.n_trials} stored trial(s): AR round "
            f"{measurement.ar_round_seconds * 1e3:.3g} ms, verify "
            f"{measurement.t_target * 1e3:.3g} ms{note})"
        ),
    )


def batch_round_costs(
    trials: Sequence[Trial],
    profiles: Mapping[str, HardwareProfile],
    measured: Mapping[tuple[str, int], BatchMeasurement],
) -> dict[tuple[str, int], BatchRoundCost]:
    """Return the round cost of every (pair, batch size > 1) of ``trials``, in plan order: the
    stored measurement when there is one, else sized from batch 1 on the pair's profile."""
    costs: dict[tuple[str, int], BatchRoundCost] = {}
    for trial in trials:
        key = (trial.pair, trial.batch_size)
        if trial.batch_size == 1 or key in costs:
            continue
        found = measured.get(key)
        profile = profiles[trial.pair]
        costs[key] = (
            measured_round_cost(trial.pair, found, profile)
            if found is not None
            else sized_from_batch_one(trial.pair, trial.batch_size, profile)
        )
    return costs


def waves(sequences: int, batch_size: int) -> int:
    """Return ceil(sequences / batch_size): how many times a queue fills its batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return math.ceil(max(sequences, 0) / batch_size)


def wave_seconds(trial: Trial, cost: BatchRoundCost) -> tuple[float, float]:
    """Return (upper, lower) seconds of one wave: one sequence's rounds at the batch's cost.

    Upper: max_new_tokens AR rounds; lower (none for the AR baseline): full acceptance,
    max_new_tokens / (K + 1) rounds of K draft steps and a verify. A lookup draft
    (``ngram``) runs no draft forward.
    """
    tokens = trial.sampling.max_new_tokens
    upper = tokens * cost.ar_round_seconds
    if trial.is_baseline:
        return upper, upper
    k = trial.setting.max_draft_len
    t_draft = 0.0 if trial.served.draft_kind == "ngram" else cost.t_draft
    return upper, tokens / (k + 1) * (k * t_draft + cost.t_target)


def batch_arm_seconds(trial: Trial, sequences: int, cost: BatchRoundCost) -> tuple[float, float]:
    """Return (upper, lower) seconds of an arm decoding a queue of ``sequences`` at the trial's
    batch size: :func:`waves` × :func:`wave_seconds`; a replayed trial costs (0, 0)."""
    if trial.mode == "replay":
        return 0.0, 0.0
    upper, lower = wave_seconds(trial, cost)
    count = waves(sequences, trial.batch_size)
    return count * upper, count * lower


def batch_trial_seconds(
    trial: Trial, cost: BatchRoundCost, shard_prompts: int
) -> tuple[float, float]:
    """Return (upper, lower) seconds of a whole trial at its batch size: its arms over the
    runner's group shards (``max(shard_prompts, B)`` prompts, each with its repeats)."""
    size = max(shard_prompts, trial.batch_size)
    bounds = [
        batch_arm_seconds(trial, len(shard) * trial.repeats, cost)
        for shard in prompt_shards(trial.prompts.samples, size)
    ]
    return sum(upper for upper, _ in bounds), sum(lower for _, lower in bounds)


def source_lines(costs: Sequence[BatchRoundCost], batch_one: bool) -> list[str]:
    """Return the estimate's lines saying where each batch size's round cost came from: one
    per (batch size > 1, pair), after batch 1's (each pair's profile) when ``batch_one``."""
    if not costs:
        return []
    lines = [
        "  at batch size B > 1 a shard's queue of n sequences runs ceil(n / B) waves of one "
        "sequence's rounds, each round costing a round of the batch; round costs by batch size:"
    ]
    if batch_one:
        lines.append("    batch 1: each pair's profile (named on its line below)")
    for cost in sorted(costs, key=lambda cost: (cost.batch_size, cost.pair)):
        lines.append(f"    batch {cost.batch_size}, {cost.pair}: {cost.source}")
    return lines
