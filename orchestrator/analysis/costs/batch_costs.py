"""The cost model of a batch round at one batch size, fit on live queues (pure).

A live trial at batch size B stores, per sequence, its rounds; each round's record carries the
seconds of the batch round it ran in (``workers.batch_engine``), and each sequence its prefill
(its join's) and its share of the queue's wall time. :func:`queue_observations` puts the
sequences' rounds back into batch rounds with the queue's own schedule
(``costs.batch_queue.simulate_queue``: who is in the batch depends on the round counts only),
giving per batch round its rows, its longest draft's steps, its longest block and its measured
seconds, and per join its rows and prefill seconds.

:func:`fit_batch_costs` fits :class:`BatchCostTable` on them: a draft step's seconds per row
count (draft seconds over the longest draft's steps; unmeasured counts by a least-squares line
in rows), a verify's seconds per (rows, longest block) cell, measured cells by their mean and
the others by a least-squares plane in (rows, block), a join's prefill per row count
(unmeasured counts: the mean per row times the rows), and the seconds per round outside the
timed steps (the queues' wall time, the sum of the sequences' shares, less the table's
prefills and rounds, over their rounds: in sample the table gives the wall time back).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from orchestrator.analysis.costs.batch_queue import Unpriced, simulate_queue
from orchestrator.analysis.costs.model import CostModelError, r_squared


class TimedRound(Protocol):
    """What the fit reads of a stored round (``StoredRound``, ``RoundRecord``)."""

    drafted: int
    draft_forwards: int
    draft_seconds: float
    verify_seconds: float


@dataclass(frozen=True)
class LiveSequence:
    """One sequence of a live queue: its rounds, its prefill seconds, its measured seconds
    (join to leave) and its share of the queue's wall time (None when not stored)."""

    rounds: tuple[TimedRound, ...]
    prefill_seconds: float
    seconds: float
    batch_seconds: float | None = None


@dataclass(frozen=True)
class LiveQueue:
    """One arm's queue of a live trial at a batch size: its sequences in queue order."""

    trial_id: str
    slots: int
    sequences: tuple[LiveSequence, ...]


@dataclass(frozen=True)
class RoundObservation:
    """One measured batch round: rows in it, longest draft steps and block, its seconds."""

    rows: int
    draft_steps: int
    block: int
    draft_seconds: float
    verify_seconds: float


@dataclass(frozen=True)
class QueueObservations:
    """A live queue's batch rounds and joins (rows, prefill seconds), its wall time (None
    without stored shares), and the share of its rounds whose members agree (``consistent``)."""

    rounds: tuple[RoundObservation, ...]
    joins: tuple[tuple[int, float], ...]
    wall_seconds: float | None
    consistent: float

    @property
    def speculative(self) -> bool:
        """Whether the queue drafted (a speculative trial's, not the AR baseline's)."""
        return any(r.draft_steps for r in self.rounds)


def queue_observations(queue: LiveQueue) -> QueueObservations:
    """Return ``queue``'s batch rounds and joins, rebuilt with its own schedule.

    ``consistent`` is the share of batch rounds whose members' records all carry the same
    seconds (1.0 when the rebuilt schedule is the one that ran).
    """
    sequences = [seq.rounds for seq in queue.sequences]
    schedule = simulate_queue(sequences, queue.slots, Unpriced())
    taken = [0] * len(sequences)
    rounds, agreeing = [], 0
    for batch_round in schedule.rounds:
        records = [sequences[i][taken[i]] for i in batch_round.members]
        for index in batch_round.members:
            taken[index] += 1
        seconds = {(r.draft_seconds, r.verify_seconds) for r in records}
        agreeing += len(seconds) == 1
        rows = len(records)
        draft = statistics.fmean(r.draft_seconds for r in records)
        verify = statistics.fmean(r.verify_seconds for r in records)
        rounds.append(
            RoundObservation(rows, batch_round.draft_steps, batch_round.block, draft, verify)
        )
    joins = tuple(
        (
            len(join.members),
            statistics.fmean(queue.sequences[i].prefill_seconds for i in join.members),
        )
        for join in schedule.joins
    )
    shares = [seq.batch_seconds for seq in queue.sequences if seq.batch_seconds is not None]
    wall = sum(shares) if len(shares) == len(queue.sequences) else None
    return QueueObservations(tuple(rounds), joins, wall, agreeing / len(rounds) if rounds else 1.0)


@dataclass(frozen=True)
class BatchCostTable:
    """Seconds of a batch's steps at one batch size (a :class:`~costs.batch_queue.RoundPricing`).

    ``draft_step``: (rows, seconds of one draft step); ``draft_line``: (a, b) of a draft
    step's a + b·rows for unmeasured row counts; ``verify``: (rows, longest block,
    seconds); ``verify_plane``: (a, b, c) of a + b·rows + c·block for unmeasured cells;
    ``prefill``: (rows joining, seconds); ``prefill_per_row`` for unmeasured counts;
    ``round_overhead``: seconds per round outside the timed steps; ``r2_*`` the R² of the
    table's draft, verify and draft + verify seconds against the rounds it was fit on.
    """

    batch_size: int
    draft_step: tuple[tuple[int, float], ...]
    draft_line: tuple[float, float]
    verify: tuple[tuple[int, int, float], ...]
    verify_plane: tuple[float, float, float]
    prefill: tuple[tuple[int, float], ...]
    prefill_per_row: float
    round_overhead: float
    n_rounds: int
    r2_draft: float = 0.0
    r2_verify: float = 0.0
    r2_round: float = 0.0

    def draft_step_seconds(self, rows: int) -> float:
        """Return one draft step's seconds at ``rows`` rows (unmeasured: ``draft_line``)."""
        if not self.draft_step:
            raise CostModelError(f"no draft round measured at batch size {self.batch_size}")
        found = dict(self.draft_step).get(rows)
        a, b = self.draft_line
        return found if found is not None else max(a + b * rows, 0.0)

    def verify_seconds(self, rows: int, block: int) -> float:
        """Return a verify's seconds at ``rows`` rows and longest block ``block``."""
        for cell_rows, cell_block, seconds in self.verify:
            if (cell_rows, cell_block) == (rows, block):
                return seconds
        a, b, c = self.verify_plane
        return max(a + b * rows + c * block, 0.0)

    def prefill_seconds(self, rows: int) -> float:
        """Return the seconds of prefilling ``rows`` joining sequences together."""
        found = dict(self.prefill).get(rows)
        return found if found is not None else self.prefill_per_row * rows

    def draft_seconds(self, rows: int, draft_steps: int) -> float:
        """Return the seconds of a round's drafting: its longest draft's steps at ``rows``."""
        return draft_steps * self.draft_step_seconds(rows) if draft_steps else 0.0

    def round_seconds(self, rows: int, draft_steps: int, block: int) -> float:
        """Return one round's seconds: its longest draft's steps, its verify, its overhead."""
        return (
            self.draft_seconds(rows, draft_steps)
            + self.verify_seconds(rows, block)
            + self.round_overhead
        )


def fit_batch_costs(batch_size: int, queues: Sequence[LiveQueue]) -> BatchCostTable:
    """Return the :class:`BatchCostTable` fit on the live ``queues`` at ``batch_size``.

    The AR baseline's rounds run another path (its batched loop inside the target worker, a
    speculative verify through the draft worker's channel), so the cells, prefills and
    overhead come from the speculative queues when there are any, and the AR rounds enter the
    verify plane with an offset of their own. Raises CostModelError without a measured round.
    """
    observed = [queue_observations(queue) for queue in queues]
    if not any(obs.rounds for obs in observed):
        raise CostModelError(f"no live round measured at batch size {batch_size}")
    drafting = [obs for obs in observed if obs.speculative] or observed
    rounds = [r for obs in drafting for r in obs.rounds]
    joins = [join for obs in drafting for join in obs.joins]
    table = BatchCostTable(
        batch_size=batch_size,
        draft_step=_draft_steps(rounds),
        draft_line=_draft_line(rounds),
        verify=tuple(
            (rows, block, seconds)
            for (rows, block), seconds in _cell_means(
                [((r.rows, r.block), r.verify_seconds) for r in rounds]
            )
        ),
        verify_plane=_verify_plane(observed),
        prefill=tuple((k, seconds) for (k,), seconds in _cell_means([((k,), s) for k, s in joins])),
        prefill_per_row=sum(s for _, s in joins) / max(sum(k for k, _ in joins), 1),
        round_overhead=0.0,
        n_rounds=len(rounds),
    )
    table = replace(table, round_overhead=_round_overhead(drafting, table))
    return _with_r2(table, rounds)


def _with_r2(table: BatchCostTable, rounds: Sequence[RoundObservation]) -> BatchCostTable:
    """Return ``table`` with the R² of its draft, verify and round seconds on ``rounds``."""
    draft = np.array([r.draft_seconds for r in rounds])
    verify = np.array([r.verify_seconds for r in rounds])
    draft_fit = np.array([table.draft_seconds(r.rows, r.draft_steps) for r in rounds])
    verify_fit = np.array([table.verify_seconds(r.rows, r.block) for r in rounds])
    return replace(
        table,
        r2_draft=r_squared(draft, draft - draft_fit),
        r2_verify=r_squared(verify, verify - verify_fit),
        r2_round=r_squared(draft + verify, draft + verify - draft_fit - verify_fit),
    )


def _draft_steps(rounds: Sequence[RoundObservation]) -> tuple[tuple[int, float], ...]:
    """Return per row count the draft seconds per step of the rounds that drafted."""
    totals: dict[int, list[float]] = {}
    for r in rounds:
        if r.draft_steps:
            seconds, steps = totals.setdefault(r.rows, [0.0, 0.0])
            totals[r.rows] = [seconds + r.draft_seconds, steps + r.draft_steps]
    return tuple((rows, s / n) for rows, (s, n) in sorted(totals.items()))


def _draft_line(rounds: Sequence[RoundObservation]) -> tuple[float, float]:
    """Return (a, b) of draft seconds ≈ steps · (a + b·rows) by least squares over the rounds
    that drafted (b = 0 when their row counts do not vary; (0, 0) without any)."""
    drafted = [r for r in rounds if r.draft_steps]
    if not drafted:
        return 0.0, 0.0
    steps = np.array([r.draft_steps for r in drafted], dtype=float)
    rows = np.array([r.rows for r in drafted], dtype=float)
    seconds = np.array([r.draft_seconds for r in drafted], dtype=float)
    if np.ptp(rows) == 0:
        return float(seconds.sum() / steps.sum()), 0.0
    design = np.column_stack([steps, steps * rows])
    (a, b), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    return float(a), float(b)


def _cell_means(
    values: Sequence[tuple[tuple[int, ...], float]],
) -> list[tuple[tuple[int, ...], float]]:
    """Return (cell, mean seconds) per distinct cell of ``values``, sorted by cell."""
    cells: dict[tuple[int, ...], list[float]] = {}
    for cell, seconds in values:
        cells.setdefault(cell, []).append(seconds)
    return [(cell, statistics.fmean(s)) for cell, s in sorted(cells.items())]


def _verify_plane(observed: Sequence[QueueObservations]) -> tuple[float, float, float]:
    """Return (a, b, c) of a speculative verify ≈ a + b·rows + c·block, by least squares over
    every queue's rounds with an offset for the AR baseline's path; a term the rounds do not
    vary is left out (its coefficient 0); when the terms are collinear the AR offset goes
    first (the paths taken alike), then every term (the mean)."""
    rounds = [(r, obs.speculative) for obs in observed for r in obs.rounds]
    seconds = np.array([r.verify_seconds for r, _ in rounds], dtype=float)
    terms = {
        "rows": np.array([r.rows for r, _ in rounds], dtype=float),
        "block": np.array([r.block for r, _ in rounds], dtype=float),
        "ar": np.array([0.0 if drafted else 1.0 for _, drafted in rounds]),
    }
    varied = [name for name, column in terms.items() if np.ptp(column) > 0]
    for used in (varied, [name for name in varied if name != "ar"], []):
        design = np.column_stack([np.ones_like(seconds), *(terms[name] for name in used)])
        if np.linalg.matrix_rank(design) == design.shape[1]:
            break
    solution, *_ = np.linalg.lstsq(design, seconds, rcond=None)
    found = dict(zip(used, (float(x) for x in solution[1:]), strict=True))
    return float(solution[0]), found.get("rows", 0.0), found.get("block", 0.0)


def _round_overhead(observed: Sequence[QueueObservations], table: BatchCostTable) -> float:
    """Return the seconds per round that ``table``'s steps leave out: over the queues with a
    wall time, their wall time less the table's prefills and rounds (overhead 0), per round
    (0 without such a queue, never negative). In sample the table then gives those queues'
    wall time back."""
    timed = [obs for obs in observed if obs.wall_seconds is not None and obs.rounds]
    if not timed:
        return 0.0
    wall = sum(obs.wall_seconds or 0.0 for obs in timed)
    steps = sum(
        table.round_seconds(r.rows, r.draft_steps, r.block) for obs in timed for r in obs.rounds
    )
    prefill = sum(table.prefill_seconds(rows) for obs in timed for rows, _ in obs.joins)
    return max((wall - steps - prefill) / sum(len(obs.rounds) for obs in timed), 0.0)
