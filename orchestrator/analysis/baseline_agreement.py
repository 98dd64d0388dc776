"""Whether the AR baselines of one target on one prompt set agree (pure).

A pair that lists several draft models runs one worker pair per model (``PairSpec.worker_pairs``),
each with its own AR baseline, its arms interleaved with that baseline prompt by prompt but not
with the other worker pairs', which run before or after it. Each speedup is paired with its own
baseline, so it is right within its worker pair; across worker pairs (one draft kind against
another) the speedups compare only if the baselines measured the same speed. Where their 95%
intervals of decode tokens/s do not overlap, the machine was in different states while they
ran, and the end-of-run summary says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.sweep.trial import record_baseline_work_key


@dataclass(frozen=True)
class BaselineRate:
    """One AR baseline's decode tokens/s and its 95% interval."""

    pair: str
    tokens_per_s: float
    low: float
    high: float


@dataclass(frozen=True)
class BaselineDisagreement:
    """AR baselines of the same work whose intervals do not all overlap."""

    dataset: str
    temperature: float
    max_new_tokens: int
    rates: tuple[BaselineRate, ...]

    def line(self) -> str:
        """Return the summary's line about it."""
        rates = ", ".join(
            f"{r.pair} {r.tokens_per_s:.1f} [{r.low:.1f}, {r.high:.1f}]" for r in self.rates
        )
        return (
            f"AR baselines disagree on {self.dataset} (temperature {self.temperature:g}, "
            f"{self.max_new_tokens} new tokens), decode tokens/s: {rates}. Their worker pairs "
            "ran at different times and machine states, so a speedup on one does not compare "
            "with a speedup on another (one draft model or kind against another); compare "
            "within a worker pair, or rerun on a quieter machine."
        )


def baseline_disagreements(rows: Sequence[Any]) -> list[BaselineDisagreement]:
    """Return the sets of done AR baselines (stored trial rows) that measure the same work
    (``trial.record_baseline_work_key``) on different worker pairs and whose decode tokens/s
    intervals do not all overlap, in the rows' order."""
    groups: dict[str, list[Any]] = {}
    for row in rows:
        if row.is_baseline and row.status == "done" and row.decode_tokens_per_s_low is not None:
            groups.setdefault(record_baseline_work_key(row.config), []).append(row)
    found = []
    for members in groups.values():
        rates = tuple(
            BaselineRate(
                r.pair, r.decode_tokens_per_s, r.decode_tokens_per_s_low, r.decode_tokens_per_s_high
            )
            for r in members
        )
        if len({r.pair for r in rates}) > 1 and max(r.low for r in rates) > min(
            r.high for r in rates
        ):
            first = members[0]
            found.append(
                BaselineDisagreement(first.dataset, first.temperature, first.max_new_tokens, rates)
            )
    return found
