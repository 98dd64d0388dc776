"""A batch-level draft length: K as a function of the number of sequences decoding together.

In a batch, a round's verification costs what its longest block costs and every extra drafted
token is paid for by all rows, so serving engines shorten K as the batch grows.
TensorRT-LLM's ``speculative_config.draft_len_schedule`` maps upper bounds of the batch size to
a draft length (``{4: 4, 8: 2, 32: 1}``: batches of 1–4 draft 4, 5–8 draft 2, 9–32 draft 1,
larger ones do not speculate); vLLM's ``num_speculative_tokens_per_batch_size`` lists inclusive
ranges as ``[range_start, range_end, K]`` entries starting at 1 (``[[1, 16, 3], [64, 128, 2],
[256, 4096, 0]]``, gaps and sizes above the last range taking the previous range's K, clamped
to ``num_speculative_tokens``). ``schedule`` here takes TensorRT-LLM's shape, written
``"BOUND:K BOUND:K ..."`` (``"4:4 8:2 32:1"``; a mapping {bound: K} or (bound, K) pairs are
taken too); a vLLM table without gaps is the same table with each range's upper end as its
bound (``[[1, 16, 3], [17, 128, 2]]`` is ``"16:3 128:2"`` up to 128). Above the last bound K is 0
(speculation off); K never exceeds the policy's ``max_draft_len``. The batched engine
(``workers.batch_engine``) tells the policy the batch size before every round
(``observe_batch``); a batch-1 engine never does, so it runs the schedule's K for a batch of one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

from policies.base import Decision, DraftPolicy, DraftStep

#: The default schedule: largest batch size:K pairs.
DEFAULT_SCHEDULE = "1:4 4:3 8:2 32:1"


@runtime_checkable
class BatchAware(Protocol):
    """A policy that wants the number of sequences in the batch before each round."""

    def observe_batch(self, batch_size: int) -> None:
        """Take the size of the batch the next round drafts in."""


def scheduled_draft_len(schedule: tuple[tuple[int, int], ...], batch_size: int) -> int:
    """Return K for ``batch_size`` under ``schedule``: the K of the smallest bound ≥ the batch
    size, 0 above the last bound."""
    return next((k for bound, k in schedule if batch_size <= bound), 0)


def normalise_schedule(schedule: object) -> tuple[tuple[int, int], ...]:
    """Return ``schedule`` ("BOUND:K ..." text, a mapping bound → K or (bound, K) pairs) as
    sorted pairs; raise ValueError naming the field when a bound or K is not a valid integer."""
    if isinstance(schedule, str):
        pairs = [item.split(":") for item in schedule.split()]
    else:
        pairs = schedule.items() if isinstance(schedule, dict) else schedule
    try:
        result = tuple(sorted((int(bound), int(k)) for bound, k in pairs))
    except (TypeError, ValueError):
        raise ValueError(
            f"batch_schedule.schedule must map batch-size bounds to draft lengths, e.g. "
            f"'4:4 8:2 32:1'; got {schedule!r}"
        ) from None
    bounds = [bound for bound, _ in result]
    if not result or bounds[0] < 1 or len(set(bounds)) != len(bounds):
        raise ValueError(f"batch_schedule.schedule needs distinct bounds ≥ 1; got {schedule!r}")
    if any(k < 0 for _, k in result):
        raise ValueError(f"batch_schedule.schedule's draft lengths must be ≥ 0; got {schedule!r}")
    return result


@dataclass
class BatchSchedulePolicy(DraftPolicy):
    """Draft K = schedule(batch size) tokens every round, capped by ``max_draft_len``."""

    name: ClassVar[str] = "batch_schedule"
    keeps_every_candidate: ClassVar[bool] = True

    schedule: str | dict | tuple = DEFAULT_SCHEDULE
    table: tuple[tuple[int, int], ...] = field(default=(), init=False, repr=False)
    batch_size: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        self.table = normalise_schedule(self.schedule)

    def observe_batch(self, batch_size: int) -> None:
        """Take the size of the batch the next round drafts in."""
        self.batch_size = batch_size

    def round_cap(self) -> int:
        """Return the schedule's K for the current batch size, at most ``max_draft_len``."""
        return min(self.max_draft_len, scheduled_draft_len(self.table, self.batch_size))

    def decide(self, step: DraftStep) -> Decision:
        """Return KEEP_CONTINUE: the round stops at ``round_cap()``."""
        return Decision.KEEP_CONTINUE
