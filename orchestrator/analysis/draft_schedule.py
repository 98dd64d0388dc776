"""A serving engine's draft-length schedule from the batch sizes a sweep measured (pure).

For each (pair, dataset, temperature) and each batch size measured, the best static K is the
done ``static`` trial with the largest decode-only speedup over the AR baseline at the same
batch size (end to end where a trial has no decode figure); when even that speedup is below 1
speculation does not pay there, and K is 0. The schedule is written for the engine that runs it:

- vLLM: ``speculative_config.num_speculative_tokens_per_batch_size``, a list of
  ``[range_start, range_end, K]`` entries over inclusive batch-size ranges starting at 1
  (batch sizes in a gap or above the last range take the previous range's K, and every K is
  clamped to ``num_speculative_tokens``, which must be at least 1);
- TensorRT-LLM: ``speculative_config.draft_len_schedule``, a mapping from upper bounds of the
  batch size to K (``{4: 4, 8: 2}``: batches of 1–4 draft 4, 5–8 draft 2, larger ones do not
  speculate), beside ``max_draft_len``.

A measured batch size B covers the batch sizes above the previous measured one up to B, so an
unmeasured size takes the K of the next larger measured one (the shorter K, as K shrinks with
the batch).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from orchestrator.store.records import StoredTrial

STATIC_POLICY = "static"
FORMATS = ("vllm", "trtllm")
Format = Literal["vllm", "trtllm"]


@dataclass(frozen=True)
class BatchChoice:
    """The draft length chosen at one batch size and the measurement behind it.

    ``draft_len`` is 0 when no static K beat the AR baseline; ``speedup`` (with its paired
    95% interval ``low``–``high``, None below two prompts) is the best static trial's either
    way, ``figure`` which speedup it is, ``trial_id`` that trial (None without one).
    """

    batch_size: int
    draft_len: int
    speedup: float | None
    low: float | None
    high: float | None
    figure: str
    trial_id: str | None


@dataclass(frozen=True)
class DraftSchedule:
    """The choices of one (pair, dataset, temperature), by ascending batch size."""

    pair: str
    dataset: str
    temperature: float
    choices: tuple[BatchChoice, ...]

    @property
    def speculates(self) -> bool:
        """Whether speculation pays at any batch size measured."""
        return any(choice.draft_len > 0 for choice in self.choices)

    @property
    def max_draft_len(self) -> int:
        """The longest K of the schedule."""
        return max((choice.draft_len for choice in self.choices), default=0)


def draft_schedules(trials: Sequence[StoredTrial]) -> list[DraftSchedule]:
    """Return one schedule per (pair, dataset, temperature) that has done static trials, in
    the order the trials come."""
    groups: dict[tuple[str, str, float], list[StoredTrial]] = {}
    for row in trials:
        if row.status == "done" and row.policy == STATIC_POLICY:
            groups.setdefault((row.pair, row.dataset, row.temperature), []).append(row)
    schedules = []
    for (pair, dataset, temperature), rows in groups.items():
        sizes = sorted({row.batch_size or 1 for row in rows})
        choices = tuple(
            best_static(size, [row for row in rows if (row.batch_size or 1) == size])
            for size in sizes
        )
        schedules.append(DraftSchedule(pair, dataset, temperature, choices))
    return schedules


def best_static(batch_size: int, rows: Sequence[StoredTrial]) -> BatchChoice:
    """Return the choice at ``batch_size`` among its static trials ``rows``: the largest
    decode-only speedup (end to end when any trial lacks one), K 0 when it is below 1."""
    figure = "decode_speedup" if all(r.decode_speedup is not None for r in rows) else "speedup"
    measured = [row for row in rows if getattr(row, figure) is not None]
    if not measured:
        return BatchChoice(batch_size, 0, None, None, None, figure, None)
    best = max(measured, key=lambda row: (getattr(row, figure), -row.max_draft_len))
    speedup = float(getattr(best, figure))
    return BatchChoice(
        batch_size=batch_size,
        draft_len=best.max_draft_len if speedup > 1.0 else 0,
        speedup=speedup,
        low=getattr(best, f"{figure}_low"),
        high=getattr(best, f"{figure}_high"),
        figure=figure,
        trial_id=best.trial_id,
    )


def vllm_ranges(schedule: DraftSchedule) -> list[list[int]]:
    """Return vLLM's ``num_speculative_tokens_per_batch_size`` entries of ``schedule``."""
    ranges, start = [], 1
    for choice in schedule.choices:
        ranges.append([start, choice.batch_size, choice.draft_len])
        start = choice.batch_size + 1
    return ranges


def trtllm_bounds(schedule: DraftSchedule) -> dict[int, int]:
    """Return TensorRT-LLM's ``draft_len_schedule`` of ``schedule`` (trailing zeros left out:
    above the last bound speculation is off anyway)."""
    bounds = {choice.batch_size: choice.draft_len for choice in schedule.choices}
    while bounds and bounds[max(bounds)] == 0:
        del bounds[max(bounds)]
    return bounds


def schedule_snippet(schedule: DraftSchedule, engine: Format) -> str:
    """Return ``schedule`` as the engine's configuration snippet: vLLM's ``--speculative-config``
    JSON, or TensorRT-LLM's ``speculative_config`` YAML (its ``extra_llm_api_options`` file).

    Raises ValueError for an unknown engine, or when speculation pays at no batch size (then
    serve without speculative decoding).
    """
    if engine not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {engine!r}")
    if not schedule.speculates:
        raise ValueError(
            f"no static K beat the AR baseline at any batch size measured for pair "
            f"{schedule.pair!r}, {schedule.dataset}, temperature {schedule.temperature:g}: "
            "serve it without speculative decoding"
        )
    if engine == "vllm":
        config = {
            "num_speculative_tokens": schedule.max_draft_len,
            "num_speculative_tokens_per_batch_size": vllm_ranges(schedule),
        }
        return json.dumps(config)
    lines = [
        "speculative_config:",
        f"  max_draft_len: {schedule.max_draft_len}",
        "  draft_len_schedule:",
    ]
    lines += [f"    {bound}: {k}" for bound, k in trtllm_bounds(schedule).items()]
    return "\n".join(lines)
