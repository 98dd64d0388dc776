"""Pair two trials' samples on their prompts; per-prompt speedups and the paired ratio (pure).

A speedup or a comparison is only meaningful on the same prompts: samples are matched on their
``prompt_id`` (a prompt that occurs twice in a slice is matched occurrence by occurrence), and
prompts only one trial holds are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.analysis.metrics import ratio
from orchestrator.analysis.stats import Interval, Verdict, paired_speed_ratio, verdict


@dataclass(frozen=True)
class SampleSpeed:
    """One stored sample: its prompt, its sample index, generated tokens and seconds."""

    prompt_id: str
    sample_index: int
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens over seconds (None for zero seconds)."""
        return ratio(self.tokens, self.seconds)


@dataclass(frozen=True)
class Comparison:
    """A's tokens/s over B's on their shared prompts, its interval and the verdict."""

    n_prompts: int
    ratio: Interval | None
    verdict: Verdict | None


def _keyed(samples: Iterable[SampleSpeed]) -> dict[tuple[str, int], SampleSpeed]:
    """Key samples by (prompt id, occurrence of that prompt), in sample order."""
    seen: dict[str, int] = {}
    keyed = {}
    for sample in sorted(samples, key=lambda s: s.sample_index):
        occurrence = seen.get(sample.prompt_id, 0)
        seen[sample.prompt_id] = occurrence + 1
        keyed[(sample.prompt_id, occurrence)] = sample
    return keyed


def pair_samples(
    a: Iterable[SampleSpeed], b: Iterable[SampleSpeed]
) -> list[tuple[SampleSpeed, SampleSpeed]]:
    """Return (a, b) sample pairs on the same prompt, in a's sample order."""
    keyed_b = _keyed(b)
    return [(sa, keyed_b[key]) for key, sa in _keyed(a).items() if key in keyed_b]


def sample_speedups(
    samples: Iterable[SampleSpeed], baseline: Iterable[SampleSpeed]
) -> dict[int, float | None]:
    """Return {sample index: its tokens/s over the baseline's on the same prompt}."""
    speedups: dict[int, float | None] = {}
    for sample, base in pair_samples(samples, baseline):
        mine, theirs = sample.tokens_per_s, base.tokens_per_s
        speedups[sample.sample_index] = mine / theirs if mine is not None and theirs else None
    return speedups


def paired_ratio(a: Sequence[SampleSpeed], b: Sequence[SampleSpeed], seed: int = 0) -> Comparison:
    """Return A's tokens/s over B's on their shared prompts with its paired bootstrap interval."""
    pairs = pair_samples(a, b)
    interval = paired_speed_ratio(
        [x.tokens for x, _ in pairs],
        [x.seconds for x, _ in pairs],
        [y.tokens for _, y in pairs],
        [y.seconds for _, y in pairs],
        seed=seed,
    )
    return Comparison(
        n_prompts=len(pairs),
        ratio=interval,
        verdict=verdict(interval) if interval is not None else None,
    )
