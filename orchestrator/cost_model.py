"""The speculative-decoding cost model T = t_draft·N_draft + t_target·N_target (pure).

SpecDec++ fits the per-forward costs t_draft and t_target by least squares over measured runs
and reports R²; the fit explains a measured time by the number of draft and target forward
passes. The model has no intercept (no forwards, no time). R² here is the usual centred one,
1 − SS_res / SS_tot with SS_tot = Σ(T − mean T)², so it compares the fit with predicting the
mean time. Both quantities come from the rounds table: a round's N_draft is its draft forwards,
its N_target is 1 (one verify call), its T is draft seconds + verify seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
