"""The per-step cost model replay projects with: feature costs, verify by size, context (pure).

A round's draft seconds are its draft forwards times the cost of one draft step, which is
t_draft plus t_feature when the policy asks the engine for the step's entropy and max
probability (a softmax and a host read per step), plus t_ask when the policy decides on each
candidate (a host synchronisation per step; static and the HF heuristic keep every candidate),
plus draft_per_context per token of context. A round's verify seconds are the measured cost of
verifying a block of its size (a table over the sizes seen, with no slope across sizes) plus
verify_per_context per token of context. The target-only AR baseline's one-token steps are a
class of their own (t_target_step): its token loop runs inside the target worker, one call per
request (``workers.engine.autoregressive_generate``), without the per-round call a speculative
round pays even when it keeps no candidate, so pooling them with speculative rounds of size 0
priced those rounds too cheaply (measured: the demo's AdaEDL checks, whose rounds are mostly of
size 0, were projected 3-6% too fast). They stand in for size 0 only where no speculative round
of size 0 was measured. A round's context is the prompt plus every token generated before it. A
sample's time outside its rounds (prefill, bookkeeping) is a fitted intercept plus a slope per
prompt token. A lookup draft (n-gram prompt lookup) runs no draft forward: its draft terms are 0
and each of its rounds costs the mean measured seconds of a lookup round instead, t_lookup
(microseconds: a dictionary lookup).

Sizes missing from the table: a size between two measured ones takes the linear interpolation
of its two neighbours; a size beyond the largest (or below the smallest) measured size takes
the nearest measured size's cost. The table is never extrapolated by a slope.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.analysis.costs.model import CostModelError, r_squared

#: Rounds a block size needs to enter the verify table; rarer sizes fall back to the rule above.
MIN_ROUNDS_PER_SIZE = 3


@dataclass(frozen=True)
class StepDemands:
    """What a policy asks of each draft step: the entropy/max-prob features, a decision."""

    features: bool = False
    asks: bool = False


@dataclass(frozen=True)
class RoundObservation:
    """One measured round: its counts, its context, its policy's step demands, its seconds."""

    drafted: int
    draft_forwards: int
    context: int
    demands: StepDemands
    draft_seconds: float
    verify_seconds: float
    target_only: bool = False


@dataclass(frozen=True)
class SampleObservation:
    """One measured sample: its prompt length and its seconds outside its rounds."""

    prompt_len: int
    outside_seconds: float


@dataclass(frozen=True)
class StepCostFit:
    """The fitted per-step cost model (see the module docstring).

    ``verify_table`` maps each measured block size of a speculative round to its verify
    seconds at context 0; ``t_target_step`` is the AR baseline's one-token step at context 0
    (None: no AR round measured); ``unidentified`` names the terms no observation could
    determine (fixed at 0).
    """

    t_draft: float
    t_feature: float
    t_ask: float
    draft_per_context: float
    verify_table: tuple[tuple[int, float], ...]
    verify_per_context: float
    overhead: float
    overhead_per_prompt_token: float
    r2_draft: float
    r2_verify: float
    n_rounds: int
    n_samples: int
    unidentified: tuple[str, ...] = ()
    t_lookup: float = 0.0
    t_target_step: float | None = None

    def step_seconds(self, context: float, demands: StepDemands) -> float:
        """Return the seconds of one draft forward at ``context`` for a policy's demands."""
        return (
            self.t_draft
            + self.t_feature * demands.features
            + self.t_ask * demands.asks
            + self.draft_per_context * context
        )

    def draft_seconds(self, forwards: int, context: float, demands: StepDemands) -> float:
        """Return a round's predicted draft seconds (a round without a draft forward: the
        lookup's ``t_lookup``, 0 for a draft model)."""
        if forwards == 0:
            return self.t_lookup
        return forwards * self.step_seconds(context, demands)

    def block_seconds(self, drafted: int) -> float:
        """Return the verify seconds of a block of ``drafted`` tokens at context 0 (table rule)."""
        sizes = [size for size, _ in self.verify_table]
        costs = [cost for _, cost in self.verify_table]
        return float(np.interp(drafted, sizes, costs))

    def verify_seconds(self, drafted: int, context: float, target_only: bool = False) -> float:
        """Return a round's predicted verify seconds (``target_only``: an AR baseline's step)."""
        if target_only and self.t_target_step is not None:
            return self.t_target_step + self.verify_per_context * context
        return self.block_seconds(drafted) + self.verify_per_context * context

    def sample_overhead(self, prompt_len: int) -> float:
        """Return a sample's predicted seconds outside its rounds."""
        return self.overhead + self.overhead_per_prompt_token * prompt_len


def fit_step_costs(
    rounds: Sequence[RoundObservation],
    samples: Sequence[SampleObservation],
    lookup_rounds: Sequence[RoundObservation] = (),
) -> StepCostFit:
    """Return the least-squares :class:`StepCostFit` of measured rounds and samples.

    Three separate fits: draft seconds on (forwards, forwards·features, forwards·asks,
    forwards·context), verify seconds on one indicator per speculative block size with at
    least :data:`MIN_ROUNDS_PER_SIZE` rounds, one for the AR baseline's steps and context,
    outside seconds on (1, prompt length).
    A term whose column is zero in every observation, or that equals another's, is
    unidentified and fixed at 0. ``lookup_rounds`` are the rounds of a lookup draft's trials:
    t_lookup is their mean draft seconds. Raises CostModelError without a draft forward (or a
    lookup round) or a sample.
    """
    if not any(r.draft_forwards for r in rounds) and not lookup_rounds:
        raise CostModelError("no round ran a draft forward: t_draft is not determined")
    if not samples:
        raise CostModelError("no sample: the per-sample overhead is not determined")
    draft, unknown_draft, r2_draft = _fit_draft(rounds)
    verify = _fit_verify(rounds)
    overhead, per_token, unknown_overhead = _fit_overhead(samples)
    return StepCostFit(
        t_draft=draft[0],
        t_feature=draft[1],
        t_ask=draft[2],
        draft_per_context=draft[3],
        verify_table=verify.table,
        verify_per_context=verify.per_context,
        overhead=overhead,
        overhead_per_prompt_token=per_token,
        r2_draft=r2_draft,
        r2_verify=verify.r2,
        n_rounds=len(rounds),
        n_samples=len(samples),
        unidentified=unknown_draft + unknown_overhead,
        t_lookup=float(np.mean([r.draft_seconds for r in lookup_rounds])) if lookup_rounds else 0.0,
        t_target_step=verify.target_step,
    )


DRAFT_TERMS = ("t_draft", "t_feature", "t_ask", "draft_per_context")


def _fit_draft(rounds: Sequence[RoundObservation]) -> tuple[list[float], tuple[str, ...], float]:
    """Return the draft coefficients (``DRAFT_TERMS`` order), the unidentified ones, R²."""
    forwards = np.array([r.draft_forwards for r in rounds], dtype=float)
    columns = np.column_stack(
        [
            forwards,
            forwards * [r.demands.features for r in rounds],
            forwards * [r.demands.asks for r in rounds],
            forwards * [r.context for r in rounds],
        ]
    )
    measured = np.array([r.draft_seconds for r in rounds], dtype=float)
    coefficients, kept = _solve(columns, measured)
    unknown = tuple(name for i, name in enumerate(DRAFT_TERMS) if i not in kept)
    residuals = measured - columns @ coefficients
    return [float(c) for c in coefficients], unknown, r_squared(measured, residuals)


@dataclass(frozen=True)
class _VerifyFit:
    """The verify fit: speculative block sizes' seconds at context 0, the context slope, the
    AR baseline's step (None: unmeasured), R²."""

    table: tuple[tuple[int, float], ...]
    per_context: float
    target_step: float | None
    r2: float


#: The verify fit's class of the AR baseline's one-token steps (apart from the block sizes).
_TARGET_STEP = "target-only step"


def _verify_class(r: RoundObservation) -> int | str:
    """Return the verify class of a round: its block size, or the AR baseline's step."""
    return _TARGET_STEP if r.target_only else r.drafted


def _fit_verify(rounds: Sequence[RoundObservation]) -> _VerifyFit:
    """Return the verify fit: one indicator per class with at least MIN_ROUNDS_PER_SIZE
    rounds (each speculative block size, the AR baseline's steps) plus context. Without a
    speculative round of size 0, the AR step stands in for size 0 in the table."""
    counts = Counter(_verify_class(r) for r in rounds)
    sizes = sorted(c for c, n in counts.items() if isinstance(c, int) and n >= MIN_ROUNDS_PER_SIZE)
    steps = [_TARGET_STEP] if counts[_TARGET_STEP] >= MIN_ROUNDS_PER_SIZE else []
    classes: list[int | str] = [*sizes, *steps]
    if not classes:
        raise CostModelError(
            f"no block size has {MIN_ROUNDS_PER_SIZE} rounds: the verify cost is not determined"
        )
    used = [r for r in rounds if _verify_class(r) in classes]
    index = {c: i for i, c in enumerate(classes)}
    design = np.zeros((len(used), len(classes) + 1))
    for row, r in enumerate(used):
        design[row, index[_verify_class(r)]] = 1.0
        design[row, -1] = r.context
    measured = np.array([r.verify_seconds for r in used], dtype=float)
    coefficients, _ = _solve(design, measured)
    residuals = measured - design @ coefficients
    cost = {c: float(coefficients[i]) for c, i in index.items()}
    target_step = cost.pop(_TARGET_STEP, None)
    if 0 not in cost and target_step is not None:
        cost[0] = target_step
    table = tuple(sorted((int(size), seconds) for size, seconds in cost.items()))
    return _VerifyFit(table, float(coefficients[-1]), target_step, r_squared(measured, residuals))


def _fit_overhead(samples: Sequence[SampleObservation]) -> tuple[float, float, tuple[str, ...]]:
    """Return the per-sample intercept, the slope per prompt token, the unidentified terms."""
    lengths = np.array([s.prompt_len for s in samples], dtype=float)
    measured = np.array([s.outside_seconds for s in samples], dtype=float)
    design = np.column_stack([np.ones_like(lengths), lengths])
    coefficients, kept = _solve(design, measured)
    unknown = () if 1 in kept else ("overhead_per_prompt_token",)
    return float(coefficients[0]), float(coefficients[1]), unknown


def _solve(design: np.ndarray, measured: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Return least-squares coefficients over the columns that add rank (others 0), and those.

    Columns are taken in order; one that is all zero or lies in the span of the ones before
    it is left out, so a term the data cannot determine is 0 rather than an arbitrary split.
    """
    kept: list[int] = []
    for column in range(design.shape[1]):
        trial = [*kept, column]
        if np.linalg.matrix_rank(design[:, trial]) == len(trial):
            kept.append(column)
    coefficients = np.zeros(design.shape[1])
    if kept:
        solved, *_ = np.linalg.lstsq(design[:, kept], measured, rcond=None)
        coefficients[kept] = solved
    return coefficients, kept
