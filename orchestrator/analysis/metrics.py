"""Trial metrics from the engine's per-sample results (pure; docs/methods.md, "Metrics").

Conventions: totals are summed over samples before dividing (a trial's tokens/s is total
generated tokens over total seconds, not a mean of per-sample rates). A ratio whose denominator
is zero is None (e.g. the acceptance rate of the AR baseline, which drafts nothing), stored as
SQL NULL. ``mean_accepted`` is accepted draft tokens per round; the block efficiency including
the target's token is ``mean_accepted + 1`` (= 1 / verification_rate when no round is cut short).

Two speeds (docs/methods.md, "Prefill and decode"): ``decode_tokens_per_s`` divides by the
samples' decode seconds alone (the seed papers' measure, the headline), ``tokens_per_s`` by their
whole seconds, prefill included (end-to-end). The decode figures are None when a sample has no
decode seconds (results stored before they were recorded).

At a batch size above 1 both are per sequence (each sequence's time runs from joining the batch
to leaving it, its neighbours' turns included: what a user waits for), and
``total_tokens_per_s`` is the throughput: tokens over the samples' shares of the batch's wall
time (``GenerationResult.batch_seconds``; a sample decoded alone has its whole ``seconds``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from orchestrator.analysis.stats import Interval, band_p_value, ratio_interval
from workers.records import GenerationResult


@dataclass(frozen=True)
class PositionAcceptance:
    """Draft position ``position`` (1-based) over a trial's rounds, vLLM's definition.

    ``drafted`` counts rounds that drafted a token at this position, ``accepted`` those in which
    it was accepted (verification keeps a prefix, so: rounds that accepted ``position`` or more).
    """

    position: int
    drafted: int
    accepted: int

    @property
    def rate(self) -> float:
        """The acceptance rate of this position given it was drafted."""
        return self.accepted / self.drafted


@dataclass(frozen=True)
class TrialMetrics:
    """Aggregate measurements of one trial; histograms map a length to its number of rounds."""

    n_samples: int
    generated_tokens: int
    seconds: float
    n_rounds: int
    n_drafted: int
    n_accepted: int
    n_draft_forwards: int
    draft_seconds: float
    verify_seconds: float
    tokens_per_s: float | None
    acceptance_rate: float | None
    mean_accepted: float | None
    mean_drafted: float | None
    discard_rate: float | None
    verification_rate: float | None
    eesd_hm: float | None
    draft_length_histogram: dict[int, int]
    accepted_length_histogram: dict[int, int]
    position_acceptance: tuple[PositionAcceptance, ...] = ()
    tokens_per_s_interval: Interval | None = None
    acceptance_rate_interval: Interval | None = None
    mean_accepted_interval: Interval | None = None
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    decode_tokens_per_s: float | None = None
    decode_tokens_per_s_interval: Interval | None = None
    total_tokens_per_s: float | None = None
    total_tokens_per_s_interval: Interval | None = None
    cost_model_error: float | None = None


def ratio(numerator: float, denominator: float) -> float | None:
    """Return numerator / denominator, or None when the denominator is zero."""
    return numerator / denominator if denominator else None


def speedup(tokens_per_s: float | None, baseline_tokens_per_s: float | None) -> float | None:
    """Return tokens/s over the AR baseline's tokens/s; None when either is missing or zero."""
    if tokens_per_s is None or not baseline_tokens_per_s:
        return None
    return tokens_per_s / baseline_tokens_per_s


def eesd_harmonic_mean(accepted: int, drafted: int, generated: int) -> float | None:
    """Return EESD's HM = 2·v·r/(v + r), v = accepted/drafted, r = accepted/generated.

    None when drafted or generated is zero; 0.0 when nothing was accepted.
    """
    if not drafted or not generated:
        return None
    v_d, r_d = accepted / drafted, accepted / generated
    return 2 * v_d * r_d / (v_d + r_d) if v_d + r_d else 0.0


def draft_length_histogram(results: Sequence[GenerationResult]) -> dict[int, int]:
    """Return {tokens drafted in a round: number of rounds}, sorted by length."""
    counts = Counter(r.drafted for result in results for r in result.rounds)
    return dict(sorted(counts.items()))


def accepted_length_histogram(results: Sequence[GenerationResult]) -> dict[int, int]:
    """Return {draft tokens accepted in a round: number of rounds}, sorted by length."""
    counts = Counter(r.accepted for result in results for r in result.rounds)
    return dict(sorted(counts.items()))


class RoundCounts(Protocol):
    """What per-position acceptance reads of a round (a RoundRecord, or a stored round row)."""

    drafted: int
    accepted: int


def position_acceptance(results: Sequence[GenerationResult]) -> tuple[PositionAcceptance, ...]:
    """Return the per-position acceptance of every drafted position, position 1 first."""
    return rounds_position_acceptance([r for result in results for r in result.rounds])


def rounds_position_acceptance(rounds: Sequence[RoundCounts]) -> tuple[PositionAcceptance, ...]:
    """Return the per-position acceptance of these rounds, position 1 first."""
    longest = max((r.drafted for r in rounds), default=0)
    return tuple(
        PositionAcceptance(
            position=i,
            drafted=sum(r.drafted >= i for r in rounds),
            accepted=sum(r.accepted >= i for r in rounds),
        )
        for i in range(1, longest + 1)
    )


@dataclass(frozen=True)
class SampleCounts:
    """One stored sample's counts, what a trial's intervals are recomputed from
    (``decode_seconds`` None when the sample was stored without it)."""

    tokens: int
    seconds: float
    drafted: int
    accepted: int
    rounds: int
    decode_seconds: float | None = None
    batch_seconds: float | None = None

    @property
    def share_seconds(self) -> float:
        """The sample's share of its batch's wall time (its own seconds when decoded alone)."""
        return self.seconds if self.batch_seconds is None else self.batch_seconds


@dataclass(frozen=True)
class TrialIntervals:
    """The 95% intervals of a trial's end-to-end, decode-only and total tokens/s, acceptance
    rate and mean accepted."""

    tokens_per_s: Interval | None
    acceptance_rate: Interval | None
    mean_accepted: Interval | None
    decode_tokens_per_s: Interval | None = None
    total_tokens_per_s: Interval | None = None


def all_or_none(values: Sequence[float | None]) -> list[float] | None:
    """Return ``values`` when none is None (and there are some), else None.

    Exists because a decode-only figure over a trial needs every sample's decode seconds.
    """
    if not values or any(value is None for value in values):
        return None
    return [float(value) for value in values if value is not None]


def widen(interval: Interval | None, error: float | None) -> Interval | None:
    """Return ``interval`` widened by the cost model's out-of-sample ``error`` e.

    The bounds become low·(1 − e) and high·(1 + e), the estimate stays; a paired ratio's
    p-value becomes the one of the widened interval (``stats.band_p_value``), so it still
    falls below 1 − confidence exactly when the interval excludes 1.

    A replayed trial's speed carries the sampling spread over its prompts and the cost model's
    own error, which the prompts' spread does not show; None or 0 leaves it as is.
    """
    if interval is None or not error:
        return interval
    return replace(
        interval,
        low=interval.low * (1 - abs(error)),
        high=interval.high * (1 + abs(error)),
        p_value=band_p_value(interval, error),
    )


@dataclass(frozen=True)
class CheckError:
    """One live check of a cost fit: the prompts it ran (its AR baseline's id: same prompts,
    same sampling) and its out-of-sample error (measured / projected seconds − 1)."""

    prompts: str
    error: float


@dataclass(frozen=True)
class FitError:
    """The cost fit a replayed side was projected by: ``fit`` names it (two sides with the same
    name share it), ``error`` is its out-of-sample error e (None: not measured), ``checks`` its
    live checks' own errors (empty when they are not known)."""

    fit: str
    error: float | None
    checks: tuple[CheckError, ...] = ()


#: Why a paired ratio carries the model error it does (:func:`paired_model_error`).
ModelErrorSource = Literal["one side replayed", "one fit", "one fit, its e", "two fits"]


@dataclass(frozen=True)
class ModelError:
    """The cost-model error a paired ratio is widened by (``error``; None: not measured) and
    where it comes from (``source``)."""

    error: float | None
    source: ModelErrorSource


def same_fit_ratio_error(fit: FitError) -> ModelError:
    """Return the error of a ratio of two trials both projected by ``fit``, on the same prompts.

    A ratio of two projections of one fit carries only the part of the fit's error that
    differs between the two trials: what the fit gets wrong for both on those prompts (the
    dataset's context terms, the machine's speed that day) cancels. Two live checks of the fit
    that ran the same prompts measure exactly that: their projected tokens/s ratio over their
    live one is (1 + e_i) / (1 + e_j), e = measured / projected seconds − 1 (each check
    projected by the fit without it). The error is that ratio's distance from 1 (the larger of
    it and its inverse, so the order does not matter), averaged over every such pair of checks
    of the fit: a mean absolute error, as the fit's e is. With no two checks on the same
    prompts the ratio's error is not measured and the fit's e, the error of one projection,
    stands in for it.
    """
    by_prompts: dict[str, list[float]] = {}
    for check in fit.checks:
        by_prompts.setdefault(check.prompts, []).append(check.error)
    gaps = [
        math.exp(abs(math.log1p(x) - math.log1p(y))) - 1
        for errors in by_prompts.values()
        for i, x in enumerate(errors)
        for y in errors[i + 1 :]
    ]
    if not gaps:
        return ModelError(fit.error, "one fit, its e")
    return ModelError(sum(gaps) / len(gaps), "one fit")


def paired_model_error(a: FitError | None, b: FitError | None) -> ModelError | None:
    """Return the cost-model error a paired ratio A / B carries (None: both sides live).

    A replayed side against a live one carries its fit's e (as a replayed trial's speedup over
    its live AR baseline does); two sides of one fit the error of a ratio of two projections
    (:func:`same_fit_ratio_error`); two sides of different fits both fits' e added, a bound on
    the mean absolute error of the difference of two errors.
    """
    if a is None or b is None:
        side = a if b is None else b
        return None if side is None else ModelError(side.error, "one side replayed")
    if a.fit == b.fit:
        return same_fit_ratio_error(a)
    known = [e for e in (a.error, b.error) if e is not None]
    return ModelError(sum(abs(e) for e in known) if known else None, "two fits")


def trial_intervals(
    samples: Sequence[SampleCounts], cost_model_error: float | None = None
) -> TrialIntervals:
    """Return the trial's intervals over its samples (ratios of sums, resampled by prompt).

    A replayed trial's timed figures (tokens/s end to end and decode-only) are widened by
    ``cost_model_error``, its cost fit's out-of-sample error (:func:`widen`); its counts
    (acceptance, mean accepted) are exact and stay. The runner and ``refresh`` both call this,
    so a refresh keeps the widening (the error is stored with the trial, ``metrics`` JSON).
    """
    tokens = [s.tokens for s in samples]
    decode = all_or_none([s.decode_seconds for s in samples])
    return TrialIntervals(
        tokens_per_s=widen(ratio_interval(tokens, [s.seconds for s in samples]), cost_model_error),
        acceptance_rate=ratio_interval([s.accepted for s in samples], [s.drafted for s in samples]),
        mean_accepted=ratio_interval([s.accepted for s in samples], [s.rounds for s in samples]),
        decode_tokens_per_s=(
            widen(ratio_interval(tokens, decode), cost_model_error) if decode is not None else None
        ),
        total_tokens_per_s=ratio_interval(tokens, [s.share_seconds for s in samples]),
    )


def sample_tokens_per_s(result: GenerationResult) -> float | None:
    """Return one sample's generated tokens over its seconds, end to end (None for zero)."""
    return ratio(result.n_generated, result.seconds)


def sample_decode_tokens_per_s(result: GenerationResult) -> float | None:
    """Return one sample's generated tokens over its decode seconds (None without them)."""
    if result.decode_seconds is None:
        return None
    return ratio(result.n_generated, result.decode_seconds)


def per_prompt(samples: Sequence[SampleCounts], blocks: Sequence[int]) -> list[SampleCounts]:
    """Return the counts summed per prompt: ``blocks[i]`` is sample i's prompt (repeats of a
    prompt are replicates within it, so an interval's unit stays the prompt)."""
    summed: dict[int, SampleCounts] = {}
    for sample, block in zip(samples, blocks, strict=True):
        seen = summed.get(block)
        summed[block] = (
            sample
            if seen is None
            else SampleCounts(
                seen.tokens + sample.tokens,
                seen.seconds + sample.seconds,
                seen.drafted + sample.drafted,
                seen.accepted + sample.accepted,
                seen.rounds + sample.rounds,
                _sum_or_none(seen.decode_seconds, sample.decode_seconds),
                seen.share_seconds + sample.share_seconds,
            )
        )
    return list(summed.values())


def _sum_or_none(a: float | None, b: float | None) -> float | None:
    """Return a + b, or None when either is missing."""
    return None if a is None or b is None else a + b


def sample_counts(results: Sequence[GenerationResult]) -> list[SampleCounts]:
    """Return each result's counts (tokens, seconds, drafted, accepted, rounds, decode and
    batch-share seconds), as the intervals read them."""
    return [
        SampleCounts(
            r.n_generated,
            r.seconds,
            r.n_drafted,
            r.n_accepted,
            len(r.rounds),
            r.decode_seconds,
            r.batch_seconds,
        )
        for r in results
    ]


def trial_metrics(
    results: Sequence[GenerationResult],
    blocks: Sequence[int] | None = None,
    cost_model_error: float | None = None,
) -> TrialMetrics:
    """Return the trial's aggregate metrics; raises ValueError for an empty list of results.

    ``blocks`` (one per result: its prompt) sums repeats of a prompt before the intervals.
    ``cost_model_error`` (a replayed trial: its cost fit's out-of-sample error) widens the
    timed intervals (:func:`trial_intervals`) and is kept with the metrics.
    """
    if not results:
        raise ValueError("a trial needs at least one sample result")
    generated = sum(result.n_generated for result in results)
    seconds = sum(result.seconds for result in results)
    rounds = [r for result in results for r in result.rounds]
    n_rounds = len(rounds)
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    counts = sample_counts(results)
    shares = math.fsum(count.share_seconds for count in counts)
    intervals = trial_intervals(
        counts if blocks is None else per_prompt(counts, blocks), cost_model_error
    )
    prefill = all_or_none([r.prefill_seconds for r in results])
    decode = all_or_none([r.decode_seconds for r in results])
    return TrialMetrics(
        n_samples=len(results),
        generated_tokens=generated,
        seconds=seconds,
        n_rounds=n_rounds,
        n_drafted=drafted,
        n_accepted=accepted,
        n_draft_forwards=sum(r.draft_forwards for r in rounds),
        draft_seconds=sum(r.draft_seconds for r in rounds),
        verify_seconds=sum(r.verify_seconds for r in rounds),
        tokens_per_s=ratio(generated, seconds),
        acceptance_rate=ratio(accepted, drafted),
        mean_accepted=ratio(accepted, n_rounds),
        mean_drafted=ratio(drafted, n_rounds),
        discard_rate=ratio(drafted - accepted, generated),
        verification_rate=ratio(n_rounds, generated),
        eesd_hm=eesd_harmonic_mean(accepted, drafted, generated),
        draft_length_histogram=draft_length_histogram(results),
        accepted_length_histogram=accepted_length_histogram(results),
        position_acceptance=position_acceptance(results),
        tokens_per_s_interval=intervals.tokens_per_s,
        acceptance_rate_interval=intervals.acceptance_rate,
        mean_accepted_interval=intervals.mean_accepted,
        prefill_seconds=math.fsum(prefill) if prefill is not None else None,
        decode_seconds=math.fsum(decode) if decode is not None else None,
        decode_tokens_per_s=ratio(generated, math.fsum(decode)) if decode is not None else None,
        decode_tokens_per_s_interval=intervals.decode_tokens_per_s,
        total_tokens_per_s=ratio(generated, shares),
        total_tokens_per_s_interval=intervals.total_tokens_per_s,
        cost_model_error=cost_model_error,
    )
