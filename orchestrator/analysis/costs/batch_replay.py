"""Greedy replay at a batch size above 1 (pure): replayed queues, and the batch fit's
out-of-sample error.

A replayed trial at batch size B is its prompts' batch-1 replayed rounds
(``costs.replay.replay_rounds``, exact per sequence under greedy decoding for a policy not told
the batch size) decoded as the live run's queues (``costs.batch_queue.simulate_queue``, one
queue per group shard) and timed by the cost table fit on the group's live trials at B
(``costs.batch_costs``): :func:`replayed_queue_results` gives per prompt what a live batched
run stores (rounds with their batch round's seconds, seconds from joining to leaving, prefill,
share of the wall time). The fit's error is measured as at batch 1: each live check at B is
projected by the table fit on the group's other live trials at B (:func:`held_out_batch`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from orchestrator.analysis.costs.batch_costs import (
    BatchCostTable,
    LiveQueue,
    LiveSequence,
    TimedRound,
    fit_batch_costs,
)
from orchestrator.analysis.costs.batch_queue import QueueTimes, Unpriced, run_queue, simulate_queue
from orchestrator.analysis.costs.model import CostModelError
from orchestrator.analysis.costs.replay import (
    CrossCheck,
    replayed_result,
    same_round_share,
    timed_rounds,
)
from orchestrator.analysis.costs.validation import summarise
from orchestrator.sweep.planner import Trial
from policies import make_policy
from policies.replay import GreedyTrace, ReplayedRound, SequenceReplay
from workers.records import GenerationResult
from workers.trial import sample_seed

if TYPE_CHECKING:
    from orchestrator.store.records import StoredRound


class IndexedRound(TimedRound, Protocol):
    """A stored round with the sample it belongs to (``StoredRound``)."""

    sample_index: int
    round_index: int


class TimedSample(Protocol):
    """What a queue reads of a stored sample (``StoredSample``)."""

    sample_index: int
    seconds: float
    prefill_seconds: float | None
    batch_seconds: float | None


def live_queues(
    trial_id: str,
    slots: int,
    rounds: Sequence[IndexedRound],
    samples: Sequence[TimedSample],
    queues: Sequence[Sequence[int]],
) -> list[LiveQueue]:
    """Return a live trial's ``queues`` (each its sample indices in queue order: one per group
    shard) with each sample's stored rounds and times; samples not stored are left out."""
    by_sample: dict[int, list[IndexedRound]] = {}
    for row in sorted(rounds, key=lambda r: (r.sample_index, r.round_index)):
        by_sample.setdefault(row.sample_index, []).append(row)
    stored = {sample.sample_index: sample for sample in samples}
    result = []
    for queue in queues:
        sequences = tuple(
            LiveSequence(
                rounds=tuple(by_sample.get(index, [])),
                prefill_seconds=stored[index].prefill_seconds or 0.0,
                seconds=stored[index].seconds,
                batch_seconds=stored[index].batch_seconds,
            )
            for index in queue
            if index in stored
        )
        if sequences:
            result.append(LiveQueue(trial_id, slots, sequences))
    return result


def batch_replayed_rounds(
    trial: Trial, traces: Sequence[GreedyTrace], queues: Sequence[Sequence[int]], slots: int
) -> list[list[ReplayedRound]]:
    """Return per prompt (trace order) the rounds ``trial``'s sequences run when decoded as
    ``queues`` of ``slots`` rows: each sequence with its own policy, as ``workers.batch_engine``
    starts each with a fresh one, and a policy told the batch size (``BatchAware``:
    ``batch_schedule``) told the rows of every round it runs in, as the engine tells it. A
    policy not told the batch size runs its batch-1 rounds here."""
    setting = trial.setting
    rounds: dict[int, list[ReplayedRound]] = {}
    for queue in queues:
        runs = [
            SequenceReplay(
                make_policy(setting.policy, setting.max_draft_len, **setting.params_dict),
                traces[index],
                sample_seed(trial.seed, index),
            )
            for index in queue
        ]
        run_queue(runs, slots, Unpriced())
        rounds.update((index, run.rounds) for index, run in zip(queue, runs, strict=True))
    return [rounds[index] for index in sorted(rounds)]


def replayed_queue_results(
    rounds: Sequence[Sequence[ReplayedRound]],
    traces: Sequence[GreedyTrace],
    table: BatchCostTable,
    queues: Sequence[Sequence[int]],
) -> list[GenerationResult]:
    """Return per prompt (``rounds`` and ``traces`` index order) the result of decoding the
    replayed ``rounds`` as ``queues`` of ``table.batch_size`` rows, timed by ``table``."""
    results: dict[int, GenerationResult] = {}
    for queue in queues:
        times = simulate_queue([rounds[i] for i in queue], table.batch_size, table)
        shares = times.batch_seconds
        for position, index in enumerate(queue):
            result = _queue_result(rounds[index], traces[index], times, position, table)
            result.batch_seconds = shares[position]
            results[index] = result
    return [results[index] for index in sorted(results)]


def _queue_result(
    rounds: Sequence[ReplayedRound],
    trace: GreedyTrace,
    times: QueueTimes,
    position: int,
    table: BatchCostTable,
) -> GenerationResult:
    """Return the result of the sequence at ``position`` of a simulated queue: its replayed
    rounds with the seconds of the batch rounds they ran in, its output and its times (its
    share of the wall time left to the caller, which computes the queue's at once)."""
    batch_rounds = [r for r in times.rounds if position in r.members]
    records = timed_rounds(
        rounds,
        [
            (
                table.draft_seconds(len(b.members), b.draft_steps),
                table.verify_seconds(len(b.members), b.block),
            )
            for b in batch_rounds
        ],
    )
    return replayed_result(
        trace,
        rounds,
        records,
        seconds=times.seconds[position],
        prefill_seconds=times.prefill_seconds[position],
        decode_seconds=times.decode_seconds[position],
    )


@dataclass(frozen=True)
class BatchHeldOut:
    """One live trial at batch size B projected by the table fit on the others at B.

    ``error`` is measured / projected − 1 of the summed per-sequence seconds (what
    ``tokens_per_s`` divides by), ``wall_error`` the same of the queues' wall time (what
    ``total_tokens_per_s`` divides by; None without stored shares); None when the other
    trials cannot fit the table (``note`` says why).
    """

    trial_id: str
    measured_seconds: float
    projected_seconds: float | None
    error: float | None
    measured_wall: float | None = None
    projected_wall: float | None = None
    wall_error: float | None = None
    note: str = ""


def project_queues(table: BatchCostTable, queues: Sequence[LiveQueue]) -> tuple[float, float]:
    """Return (summed per-sequence seconds, summed wall time) of ``queues`` simulated with
    their own rounds and timed by ``table``."""
    seconds = wall = 0.0
    for queue in queues:
        times = simulate_queue([seq.rounds for seq in queue.sequences], queue.slots, table)
        seconds += sum(times.seconds)
        wall += times.wall_seconds
    return seconds, wall


def held_out_batch(batch_size: int, queues: Sequence[LiveQueue], trial_id: str) -> BatchHeldOut:
    """Return live trial ``trial_id``'s queues projected by the table fit on the other
    trials' ``queues`` at ``batch_size``."""
    mine = [q for q in queues if q.trial_id == trial_id]
    measured = sum(seq.seconds for q in mine for seq in q.sequences)
    shares = [seq.batch_seconds for q in mine for seq in q.sequences]
    known = [share for share in shares if share is not None]
    wall = sum(known) if len(known) == len(shares) else None
    try:
        table = fit_batch_costs(batch_size, [q for q in queues if q.trial_id != trial_id])
        projected, projected_wall = project_queues(table, mine)
    except CostModelError as error:
        return BatchHeldOut(trial_id, measured, None, None, wall, note=str(error))
    return BatchHeldOut(
        trial_id=trial_id,
        measured_seconds=measured,
        projected_seconds=projected,
        error=measured / projected - 1 if projected > 0 else None,
        measured_wall=wall,
        projected_wall=projected_wall,
        wall_error=None if wall is None or projected_wall <= 0 else wall / projected_wall - 1,
    )


@dataclass(frozen=True)
class BatchGroupFit:
    """A group's cost table at one batch size, its live checks held out in turn, and their
    mean absolute errors (per-sequence seconds and wall time; None when none was held out)."""

    table: BatchCostTable
    checks: tuple[BatchHeldOut, ...]
    out_of_sample_error: float | None
    wall_error: float | None
    n_trials: int = 0


def fit_batch_group(
    batch_size: int, queues: Sequence[LiveQueue], check_ids: Collection[str] = ()
) -> BatchGroupFit:
    """Return the table fit on every live queue at ``batch_size``, each of ``check_ids`` held
    out in turn (in the queues' trial order). Raises CostModelError when the queues cannot fit
    it."""
    table = fit_batch_costs(batch_size, queues)
    present = list(dict.fromkeys(queue.trial_id for queue in queues))
    checks = tuple(
        held_out_batch(batch_size, queues, trial_id)
        for trial_id in present
        if trial_id in check_ids
    )
    return BatchGroupFit(
        table=table,
        checks=checks,
        out_of_sample_error=summarise([c.error for c in checks]).mean_abs_error,
        wall_error=summarise([c.wall_error for c in checks]).mean_abs_error,
        n_trials=len(present),
    )


def batch_cross_check(
    trial: Trial,
    live_rounds: Sequence[StoredRound],
    live_tokens_per_s: float,
    traces: Sequence[GreedyTrace],
    table: BatchCostTable,
    queues: Sequence[Sequence[int]],
) -> CrossCheck:
    """Return live check ``trial`` at its batch size replayed as its own ``queues``: the
    share of its live rounds replay reproduces, and its projected per-sequence tokens/s
    against the measured ``live_tokens_per_s``."""
    replayed = batch_replayed_rounds(trial, traces, queues, table.batch_size)
    results = replayed_queue_results(replayed, traces, table, queues)
    projected = sum(r.n_generated for r in results) / sum(r.seconds for r in results)
    same = same_round_share(replayed, live_rounds)
    return CrossCheck(trial.trial_id, same, live_tokens_per_s, projected)
