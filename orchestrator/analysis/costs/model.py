"""The speculative-decoding cost model T = t_draft·N_draft + t_target·N_target (pure).

SpecDec++ fits the per-forward costs t_draft and t_target by least squares over measured runs
and reports R²; the fit explains a measured time by the number of draft and target forward
passes. The model has no intercept (no forwards, no time). R² here is the usual centred one,
1 − SS_res / SS_tot with SS_tot = Σ(T − mean T)², so it compares the fit with predicting the
mean time. Both quantities come from the rounds table: a round's N_draft is its draft forwards,
its N_target is 1 (one verify call), its T is draft seconds + verify seconds.

:func:`fit_round_costs` is the block-aware variant the replay projection uses (the target's
verify time grows with the block); :data:`HARDWARE_PROFILES` holds published per-forward costs
that :func:`project_onto_profile` projects a trial's hardware-independent counts onto.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

FloatArray = np.ndarray
Numbers = Sequence[float] | np.ndarray


class CostModelError(ValueError):
    """The data cannot identify both costs (too few observations, or N_draft ∝ N_target)."""


@dataclass(frozen=True)
class CostFit:
    """Fitted seconds per draft forward and per target forward, and the fit's R²."""

    t_draft: float
    t_target: float
    r2: float
    n_observations: int

    def predict(self, n_draft: Numbers, n_target: Numbers) -> FloatArray:
        """Return the predicted seconds t_draft·N_draft + t_target·N_target, elementwise."""
        draft = np.asarray(n_draft, dtype=float)
        target = np.asarray(n_target, dtype=float)
        return self.t_draft * draft + self.t_target * target


def fit_cost_model(n_draft: Numbers, n_target: Numbers, seconds: Numbers) -> CostFit:
    """Return the least-squares CostFit of ``seconds ≈ t_draft·n_draft + t_target·n_target``.

    Exists so the dashboard and the CLI report the same hardware profile of a pair. Raises
    CostModelError when the inputs differ in length, hold fewer than two observations or a
    non-finite value, or when N_draft and N_target are collinear (e.g. only static-K rounds),
    since then the split between the two costs is not determined by the data.
    """
    draft = np.asarray(n_draft, dtype=float)
    target = np.asarray(n_target, dtype=float)
    measured = np.asarray(seconds, dtype=float)
    if not draft.shape == target.shape == measured.shape or draft.ndim != 1:
        raise CostModelError("n_draft, n_target and seconds must be 1-D and of equal length")
    if len(measured) < 2:
        raise CostModelError(f"need at least 2 observations, got {len(measured)}")
    if not (np.isfinite(draft).all() and np.isfinite(target).all() and np.isfinite(measured).all()):
        raise CostModelError("n_draft, n_target and seconds must be finite")
    design = np.column_stack([draft, target])
    if np.linalg.matrix_rank(design) < 2:
        raise CostModelError(
            "N_draft and N_target are proportional in these observations: "
            "the draft and target costs cannot be separated"
        )
    (t_draft, t_target), *_ = np.linalg.lstsq(design, measured, rcond=None)
    residuals = measured - design @ np.array([t_draft, t_target])
    return CostFit(
        t_draft=float(t_draft),
        t_target=float(t_target),
        r2=r_squared(measured, residuals),
        n_observations=len(measured),
    )


def r_squared(measured: Numbers, residuals: Numbers) -> float:
    """Return the centred R² = 1 − Σresidual² / Σ(measured − mean)².

    When every measurement is equal (SS_tot = 0) it returns 1.0 for an exact fit and 0.0
    otherwise, instead of dividing by zero.
    """
    values = np.asarray(measured, dtype=float)
    ss_res = float(np.sum(np.square(np.asarray(residuals, dtype=float))))
    ss_tot = float(np.sum(np.square(values - values.mean())))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


class RoundTimings(Protocol):
    """What the block-aware fit reads of a round (``workers.records.RoundRecord``, a store row)."""

    drafted: int
    draft_forwards: int


@dataclass(frozen=True)
class RoundCostFit:
    """The block-aware per-round cost model, fit on measured rounds.

    A round's draft seconds are t_draft · draft forwards; its verify seconds are t_target +
    t_per_verified · drafted (the target's forward grows with the block it verifies, which the
    two-cost model leaves out). ``r2_draft`` and ``r2_verify`` are the R² of the two fits,
    ``r2_round`` that of their sum against each round's draft + verify seconds.
    """

    t_draft: float
    t_target: float
    t_per_verified: float
    r2_draft: float
    r2_verify: float
    r2_round: float
    n_rounds: int

    def draft_seconds(self, draft_forwards: Numbers) -> FloatArray:
        """Return the predicted draft seconds of rounds with these draft forwards."""
        return self.t_draft * np.asarray(draft_forwards, dtype=float)

    def verify_seconds(self, drafted: Numbers) -> FloatArray:
        """Return the predicted verify seconds of rounds that drafted these many tokens."""
        return self.t_target + self.t_per_verified * np.asarray(drafted, dtype=float)

    def predict(self, draft_forwards: Numbers, drafted: Numbers) -> FloatArray:
        """Return each round's predicted draft + verify seconds, elementwise."""
        return self.draft_seconds(draft_forwards) + self.verify_seconds(drafted)

    def project_seconds(self, rounds: Iterable[RoundTimings]) -> float:
        """Return the predicted total round seconds of ``rounds`` (no prefill, no overhead)."""
        listed = list(rounds)
        if not listed:
            return 0.0
        forwards = [r.draft_forwards for r in listed]
        return float(np.sum(self.predict(forwards, [r.drafted for r in listed])))


def fit_round_costs(
    draft_forwards: Numbers,
    drafted: Numbers,
    draft_seconds: Numbers,
    verify_seconds: Numbers,
    lookup: bool = False,
) -> RoundCostFit:
    """Return the block-aware :class:`RoundCostFit` of measured rounds (one entry per round).

    Draft seconds are fit on draft forwards (no intercept), verify seconds on (1, drafted) by
    least squares: two separate fits, since draft forwards and drafted tokens are nearly
    collinear and one joint fit cannot split them. Autoregressive rounds (drafted 0, no draft
    forward) pin t_target. Raises CostModelError when the inputs differ in length, hold fewer
    than two rounds or a non-finite value, no round has a draft forward, or every round
    drafted the same number of tokens (then t_target and t_per_verified are not separable).
    A ``lookup`` draft (n-gram prompt lookup) runs no draft forward: its t_draft is 0.
    """
    forwards, blocks, draft_s, verify_s = (
        np.asarray(values, dtype=float)
        for values in (draft_forwards, drafted, draft_seconds, verify_seconds)
    )
    if forwards.ndim != 1 or not forwards.shape == blocks.shape == draft_s.shape == verify_s.shape:
        raise CostModelError(
            "draft_forwards, drafted, draft_seconds and verify_seconds must be 1-D and of equal "
            "length"
        )
    if len(forwards) < 2:
        raise CostModelError(f"need at least 2 rounds, got {len(forwards)}")
    if not all(np.isfinite(a).all() for a in (forwards, blocks, draft_s, verify_s)):
        raise CostModelError("round counts and seconds must be finite")
    if not forwards.any() and not lookup:
        raise CostModelError("no round ran a draft forward: t_draft is not determined")
    verify_design = np.column_stack([np.ones_like(blocks), blocks])
    if np.linalg.matrix_rank(verify_design) < 2:
        raise CostModelError(
            "every round drafted the same number of tokens: t_target and t_per_verified "
            "cannot be separated (add the AR baseline's rounds or vary the draft length)"
        )
    t_draft = float(forwards @ draft_s / (forwards @ forwards)) if forwards.any() else 0.0
    (t_target, t_per_verified), *_ = np.linalg.lstsq(verify_design, verify_s, rcond=None)
    draft_fit = t_draft * forwards
    verify_fit = verify_design @ np.array([t_target, t_per_verified])
    total = draft_s + verify_s
    return RoundCostFit(
        t_draft=t_draft,
        t_target=float(t_target),
        t_per_verified=float(t_per_verified),
        r2_draft=r_squared(draft_s, draft_s - draft_fit),
        r2_verify=r_squared(verify_s, verify_s - verify_fit),
        r2_round=r_squared(total, total - draft_fit - verify_fit),
        n_rounds=len(forwards),
    )


@dataclass(frozen=True)
class HardwareProfile:
    """Published per-forward costs of a draft/target pair on named hardware.

    ``ar_tokens_per_s`` is the standalone target's published throughput, the baseline that
    projected speedups divide by.
    """

    name: str
    description: str
    t_draft: float
    t_target: float
    ar_tokens_per_s: float


#: Named profiles a trial's counts are projected onto (docs/methods.md, "Metrics").
HARDWARE_PROFILES: dict[str, HardwareProfile] = {
    profile.name: profile
    for profile in (
        HardwareProfile(
            name="specdecpp-70b-7b-2xa100",
            description="SpecDec++: 7B draft, 70B target on 2×A100-80G",
            t_draft=0.0234,
            t_target=0.112,
            ar_tokens_per_s=9.26,
        ),
    )
}


def hardware_profile(name: str) -> HardwareProfile:
    """Return the registered profile ``name``; raises KeyError listing the known names."""
    try:
        return HARDWARE_PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(HARDWARE_PROFILES))
        raise KeyError(f"unknown hardware profile {name!r}; known: {known}") from None


@dataclass(frozen=True)
class ProfileProjection:
    """A trial's throughput projected onto a hardware profile, and its speedup over the AR one."""

    profile: str
    seconds: float
    tokens_per_s: float
    speedup: float


def project_onto_profile(
    profile: HardwareProfile, n_draft: float, n_target: float, tokens: float
) -> ProfileProjection:
    """Return ``tokens`` over t_draft·N_draft + t_target·N_target seconds on ``profile``.

    The counts are hardware-independent (N_draft: draft forwards, N_target: target calls, one
    per round; tokens generated), so a trial measured on any machine projects onto published
    hardware. Raises CostModelError for negative counts or a projection of zero seconds.
    """
    if min(n_draft, n_target, tokens) < 0:
        raise CostModelError("counts must be non-negative")
    seconds = profile.t_draft * n_draft + profile.t_target * n_target
    if seconds <= 0:
        raise CostModelError("no forward passes: the projected time is zero")
    tokens_per_s = tokens / seconds
    return ProfileProjection(
        profile=profile.name,
        seconds=seconds,
        tokens_per_s=tokens_per_s,
        speedup=tokens_per_s / profile.ar_tokens_per_s,
    )
