"""Pair two trials' samples on their prompts; per-prompt speedups and the paired ratio (pure).

A speedup or a comparison is only meaningful on the same prompts: samples are matched on their
``prompt_id`` (a prompt that occurs twice in a slice is matched occurrence by occurrence), and
prompts only one trial holds are left out. Repeats of a prompt (``execution.repeats``: samples
with the same ``prompt_id``) pair repeat by repeat and are then summed within the prompt, so the
interval's unit stays the prompt (a prompt that occurs twice in a slice counts once). Several
comparisons made together (:func:`compare_family`) control the family-wise error with Holm's method.
A ratio with a replayed side is widened by the cost model's error it carries
(``metrics.paired_model_error``): its interval and its p-value, the estimate unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from orchestrator.analysis.metrics import ModelError, ratio, widen
from orchestrator.analysis.stats import (
    CONFIDENCE,
    Interval,
    Verdict,
    family_confidence,
    holm_adjusted,
    p_verdict,
    paired_log_ratio,
    verdict,
)


@dataclass(frozen=True)
class SampleSpeed:
    """One stored sample: its prompt, its sample index, generated tokens and seconds (end to
    end), its decode seconds (None when stored without them), and its drafted and accepted draft
    tokens (None when not read)."""

    prompt_id: str
    sample_index: int
    tokens: int
    seconds: float
    decode_seconds: float | None = None
    drafted: int | None = None
    accepted: int | None = None

    @property
    def tokens_per_s(self) -> float | None:
        """Generated tokens over seconds (None for zero seconds)."""
        return ratio(self.tokens, self.seconds)


@dataclass(frozen=True)
class Comparison:
    """A's tokens/s over B's on their shared prompts, its interval and the verdict.

    In a family of ``family_size`` comparisons made together, ``ratio`` is at the family's
    per-interval level (Bonferroni, 1 − α/m: the intervals hold simultaneously) and the verdict
    comes from ``adjusted_p``, Holm's adjustment of ``ratio.p_value`` over the family. With a
    replayed side, ``model_error`` is the cost-model error ``ratio`` and its p-value include.
    """

    n_prompts: int
    ratio: Interval | None
    verdict: Verdict | None
    family_size: int = 1
    adjusted_p: float | None = None
    model_error: ModelError | None = None


def decode_speeds(samples: Sequence[SampleSpeed]) -> list[SampleSpeed] | None:
    """Return ``samples`` timed by their decode seconds alone, for the decode-only figures
    (the functions here then compare decode speeds); None when a sample has none."""
    if any(sample.decode_seconds is None for sample in samples):
        return None
    return [replace(sample, seconds=sample.decode_seconds) for sample in samples]


def acceptance_counts(samples: Sequence[SampleSpeed]) -> list[SampleSpeed] | None:
    """Return ``samples`` with their accepted draft tokens as ``tokens`` and their drafted ones
    as ``seconds``, so that the functions here compare acceptance rates (Σ accepted / Σ
    drafted) by the same paired interval as speeds; None when a sample has no counts."""
    if any(sample.drafted is None or sample.accepted is None for sample in samples):
        return None
    return [
        replace(sample, tokens=sample.accepted, seconds=sample.drafted, decode_seconds=None)
        for sample in samples
    ]


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


#: Signs of (tokens, seconds) of A, B, A's baseline and B's baseline in a paired ratio: A's
#: tokens/s over B's, and with the baselines, A's speedup over B's.
RATIO_SIGNS = (1, -1, -1, 1)
SPEEDUP_RATIO_SIGNS = (1, -1, -1, 1, -1, 1, 1, -1)


def _prompt_sums(sides: Sequence[Sequence[SampleSpeed]]) -> list[list[float]]:
    """Return, over the prompts every side holds (in the first side's sample order), each
    side's tokens and seconds summed within the prompt: columns tokens, seconds of each side."""
    keyed = [_keyed(side) for side in sides]
    sums: dict[str, list[float]] = {}
    for key in keyed[0]:
        if not all(key in other for other in keyed[1:]):
            continue
        total = sums.setdefault(key[0], [0.0] * (2 * len(sides)))
        for index, side in enumerate(keyed):
            total[2 * index] += side[key].tokens
            total[2 * index + 1] += side[key].seconds
    return [[total[column] for total in sums.values()] for column in range(2 * len(sides))]


def _paired_interval(
    sides: Sequence[Sequence[SampleSpeed]],
    confidence: float,
    model_error: ModelError | None = None,
) -> tuple[int, Interval | None]:
    """Return the number of prompts every side shares and, on them, A's tokens/s over B's
    (sides A, B) or A's speedup over its baseline over B's (sides A, B, A's and B's
    baselines), with its interval widened by ``model_error`` (``metrics.widen``)."""
    signs = RATIO_SIGNS if len(sides) == 2 else SPEEDUP_RATIO_SIGNS
    columns = _prompt_sums(sides)
    interval = paired_log_ratio(columns, signs, confidence)
    return len(columns[0]), widen(interval, model_error.error if model_error else None)


def paired_ratio(
    a: Sequence[SampleSpeed], b: Sequence[SampleSpeed], model_error: ModelError | None = None
) -> Comparison:
    """Return A's tokens/s over B's on their shared prompts with its paired 95% interval,
    widened by the cost-model error it carries (``model_error``; None: both sides live)."""
    n_prompts, interval = _paired_interval((a, b), CONFIDENCE, model_error)
    return Comparison(
        n_prompts=n_prompts,
        ratio=interval,
        verdict=verdict(interval) if interval is not None else None,
        adjusted_p=interval.p_value if interval is not None else None,
        model_error=model_error,
    )


def compare_family(
    pairs: Sequence[Sequence[Sequence[SampleSpeed]]],
    model_errors: Sequence[ModelError | None] = (),
) -> list[Comparison]:
    """Return each comparison of a family made together, family-wise error ≤ 5%: an entry
    (A, B) compares A's tokens/s with B's, an entry (A, B, A's baseline, B's baseline) A's
    speedup over its baseline with B's over its own (both on the prompts all four share).

    Intervals are at 1 − 0.05/m (m comparisons that have an interval); verdicts come from
    Holm-adjusted p-values, which decide at least as often as the intervals exclude 1 (a
    verdict can be "faster" while its simultaneous interval still touches 1, never the reverse).
    ``model_errors`` (one per pair, or none) widen each interval and its p-value before Holm,
    so a verdict that only the cost model's error could explain is not made.
    """
    errors = list(model_errors) or [None] * len(pairs)
    found = [
        _paired_interval(sides, CONFIDENCE, error)
        for sides, error in zip(pairs, errors, strict=True)
    ]
    m = sum(interval is not None for _, interval in found)
    level = family_confidence(m)
    tested = [
        1.0 if interval.p_value is None else interval.p_value
        for _, interval in found
        if interval is not None
    ]
    adjusted = iter(holm_adjusted(tested))
    family = []
    for sides, (n_prompts, interval), error in zip(pairs, found, errors, strict=True):
        if interval is None:
            family.append(Comparison(n_prompts, None, None, m, model_error=error))
            continue
        _, wide = _paired_interval(sides, level, error)
        p = next(adjusted)
        family.append(Comparison(n_prompts, wide, p_verdict(interval.estimate, p), m, p, error))
    return family
