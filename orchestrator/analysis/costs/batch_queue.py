"""The continuous-batching queue of ``workers.batch_engine`` replayed on a cost model (pure).

Given each sequence's rounds (what it drafted and its draft forwards, per round: from
``policies.replay.replay`` of its greedy trace, or a live trial's stored rounds) and a cost
model of a batch round, :func:`simulate_queue` schedules the queue exactly as
``batch_engine._continuous_batching`` does: before every round the free rows take the next
waiting sequences in queue order (their prefill one step for all of them), then one round runs
over every sequence in the batch, and the sequences whose last round it was leave and free
their rows. A batch round costs its longest draft's steps at the batch's row count and one
verify of the batch at its longest block (:class:`RoundPricing`).

Greedy replay at B > 1 is exact per sequence where a sequence's rounds do not depend on its
batch: greedy decoding (each row's logits are batch 1's up to rounding, ``workers.batch_cache``)
and a policy that is not told the batch size (``policies.BatchAware``); each sequence's output
is then its batch-1 output, and only the timing depends on its neighbours.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from workers.batch_time import time_shares


class RoundShape(Protocol):
    """What the queue reads of one round of one sequence (``ReplayedRound``, a stored round)."""

    drafted: int
    draft_forwards: int


class RoundPricing(Protocol):
    """Seconds of a batch's steps: a join's prefill and one round."""

    def prefill_seconds(self, rows: int) -> float:
        """Return the seconds of prefilling ``rows`` joining sequences together."""
        ...

    def round_seconds(self, rows: int, draft_steps: int, block: int) -> float:
        """Return the seconds of one round of ``rows`` sequences whose longest draft ran
        ``draft_steps`` steps and whose longest block holds ``block`` drafted tokens."""
        ...


@dataclass(frozen=True)
class BatchRound:
    """One round of the batch: the sequences in it (queue indices), its longest draft's steps,
    its longest block and its start and end on the queue's clock."""

    members: tuple[int, ...]
    draft_steps: int
    block: int
    start: float
    end: float


@dataclass(frozen=True)
class JoinEvent:
    """Sequences that joined the batch together, prefilled from ``start`` to ``end``."""

    members: tuple[int, ...]
    start: float
    end: float


@dataclass(frozen=True)
class QueueTimes:
    """A simulated queue: per sequence (queue order) its join, prefill end and leave times,
    its seconds (join to leave: what its user waits for) and its share of the wall time
    (``workers.batch_time``); the batch rounds and joins in order; the queue's wall time."""

    joined: tuple[float, ...]
    prefilled: tuple[float, ...]
    left: tuple[float, ...]
    rounds: tuple[BatchRound, ...]
    joins: tuple[JoinEvent, ...]

    @property
    def seconds(self) -> tuple[float, ...]:
        """Each sequence's seconds from joining the batch to leaving it."""
        return tuple(b - a for a, b in zip(self.joined, self.left, strict=True))

    @property
    def prefill_seconds(self) -> tuple[float, ...]:
        """Each sequence's prefill seconds (its join's)."""
        return tuple(b - a for a, b in zip(self.joined, self.prefilled, strict=True))

    @property
    def decode_seconds(self) -> tuple[float, ...]:
        """Each sequence's seconds from the end of its prefill to leaving."""
        return tuple(b - a for a, b in zip(self.prefilled, self.left, strict=True))

    @property
    def batch_seconds(self) -> tuple[float, ...]:
        """Each sequence's share of the batch's wall time (sums to :attr:`wall_seconds`)."""
        return tuple(time_shares(list(zip(self.joined, self.left, strict=True))))

    @property
    def wall_seconds(self) -> float:
        """The queue's wall time: from the first join to the last leave."""
        return max(self.left, default=0.0)


class RoundSource(Protocol):
    """A sequence whose rounds are produced as the queue runs them (``SequenceReplay``)."""

    @property
    def done(self) -> bool:
        """Whether the sequence has run its last round."""
        ...

    def next_round(self, batch_size: int) -> RoundShape:
        """Run and return the next round, in a batch of ``batch_size`` sequences."""
        ...


class _Listed:
    """A sequence's rounds known in advance, as a :class:`RoundSource`."""

    def __init__(self, rounds: Sequence[RoundShape]) -> None:
        self.rounds, self.taken = rounds, 0

    @property
    def done(self) -> bool:
        """Whether every round has been taken."""
        return self.taken >= len(self.rounds)

    def next_round(self, batch_size: int) -> RoundShape:
        """Return the next round (the batch size changes nothing known in advance)."""
        self.taken += 1
        return self.rounds[self.taken - 1]


class Unpriced:
    """A pricing of nothing: the queue's schedule alone."""

    def prefill_seconds(self, rows: int) -> float:
        """Return 0."""
        return 0.0

    def round_seconds(self, rows: int, draft_steps: int, block: int) -> float:
        """Return 0."""
        return 0.0


def simulate_queue(
    sequences: Sequence[Sequence[RoundShape]], slots: int, pricing: RoundPricing
) -> QueueTimes:
    """Return the times of ``sequences`` (queue order, each its rounds) decoded ``slots`` at a
    time, scheduled as ``workers.batch_engine._continuous_batching`` schedules them and timed
    by ``pricing``. A sequence without rounds leaves right after its prefill."""
    return run_queue([_Listed(rounds) for rounds in sequences], slots, pricing)


def run_queue(sources: Sequence[RoundSource], slots: int, pricing: RoundPricing) -> QueueTimes:
    """Return the times of the ``sources`` (queue order) decoded ``slots`` at a time, as
    :func:`simulate_queue`, each source asked for its next round when the batch runs it (with
    the number of sequences in that round)."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    n = len(sources)
    waiting, free = deque(range(n)), slots
    joined, prefilled, left = [0.0] * n, [0.0] * n, [0.0] * n
    active: list[int] = []
    rounds: list[BatchRound] = []
    joins: list[JoinEvent] = []
    clock = 0.0
    while waiting or active:
        members = []
        while waiting and free:
            members.append(waiting.popleft())
            free -= 1
        if members:
            event = JoinEvent(tuple(members), clock, clock + pricing.prefill_seconds(len(members)))
            joins.append(event)
            clock = event.end
            for index in members:
                joined[index], prefilled[index] = event.start, event.end
            active += members
        running = [i for i in active if not sources[i].done]
        if running:
            batch_round = _round(sources, running, clock, pricing)
            rounds.append(batch_round)
            clock = batch_round.end
        for index in active:
            if sources[index].done:
                left[index] = clock
                free += 1
        active = [i for i in active if not sources[i].done]
    return QueueTimes(tuple(joined), tuple(prefilled), tuple(left), tuple(rounds), tuple(joins))


def _round(
    sources: Sequence[RoundSource], running: list[int], clock: float, pricing: RoundPricing
) -> BatchRound:
    """Run one batch round of the ``running`` sequences from ``clock``: each source's next
    round, the longest draft's steps and longest block priced by ``pricing``."""
    shapes = [sources[i].next_round(len(running)) for i in running]
    steps = max(shape.draft_forwards for shape in shapes)
    block = max(shape.drafted for shape in shapes)
    seconds = pricing.round_seconds(len(running), steps, block)
    return BatchRound(tuple(running), steps, block, clock, clock + seconds)
