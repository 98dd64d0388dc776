"""The run-level cost fit of a trial group beside its round-level fit, and which one projects.

SpecDec++ fits trial seconds ≈ t_draft·N_draft + t_target·N_target over whole runs (N_draft:
draft forwards, N_target: target calls, one per round). The runner's stored fit is round-level
and block-aware (``cost_model.fit_round_costs``) plus a per-sample overhead. Both predict a
trial's seconds; on the group's trials each gets an R² and a mean relative error, and the one
with the lower error is the projection fit. The run-level fit competes only when the group has
more trials than its two costs: on two trials (a replay group's AR baseline and live check) it
matches both exactly whatever the costs, an error of zero that says nothing (pure functions; the
runner stores the result).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from orchestrator.analysis.costs.model import (
    CostModelError,
    RoundCostFit,
    fit_cost_model,
    fit_round_costs,
    r_squared,
)

if TYPE_CHECKING:
    from orchestrator.store.records import StoredRound, StoredTrial

FitName = Literal["round", "run"]

#: The run-level fit's free parameters (t_draft, t_target): with no more trials than this it
#: interpolates them and cannot be scored on them.
RUN_FIT_PARAMETERS = 2


@dataclass(frozen=True)
class TrialCounts:
    """A done trial's hardware-independent counts and its measured seconds."""

    draft_forwards: int
    rounds: int
    drafted: int
    samples: int
    tokens: int
    seconds: float

    @classmethod
    def from_row(cls, row: StoredTrial) -> TrialCounts:
        """Read the counts of a stored trial (or of a trials DataFrame's ``itertuples`` row)."""
        return cls(
            draft_forwards=row.n_draft_forwards or 0,
            rounds=row.n_rounds or 0,
            drafted=row.n_drafted or 0,
            samples=row.n_samples or 0,
            tokens=row.generated_tokens or 0,
            seconds=row.seconds or 0.0,
        )


@dataclass(frozen=True)
class FitComparison:
    """The run-level fit and how both fits predict the group's trial seconds."""

    run_t_draft: float
    run_t_target: float
    run_r2: float
    run_mre: float
    round_trial_r2: float
    round_trial_mre: float
    n_trials: int

    @property
    def projection_fit(self) -> FitName:
        """The fit with the lower mean relative error on trial seconds (round on a tie).

        The run-level fit is a candidate only over more trials than its two parameters.
        """
        over_determined = self.n_trials > RUN_FIT_PARAMETERS
        return "run" if over_determined and self.run_mre < self.round_trial_mre else "round"

    def columns(self) -> dict[str, Any]:
        """Return the ``cost_fits`` columns of this comparison."""
        return {
            "run_t_draft": self.run_t_draft,
            "run_t_target": self.run_t_target,
            "run_r2": self.run_r2,
            "run_mre": self.run_mre,
            "round_trial_r2": self.round_trial_r2,
            "round_trial_mre": self.round_trial_mre,
            "projection_fit": self.projection_fit,
        }


def mean_relative_error(measured: Sequence[float], predicted: Sequence[float]) -> float:
    """Return mean |predicted − measured| / measured (measured must be positive)."""
    values = np.asarray(measured, dtype=float)
    return float(np.mean(np.abs(np.asarray(predicted, dtype=float) - values) / values))


def round_fit_seconds(fit: RoundCostFit, overhead_seconds: float, trial: TrialCounts) -> float:
    """Return the round-level fit's prediction of a trial's seconds (rounds plus overhead)."""
    return (
        fit.t_draft * trial.draft_forwards
        + fit.t_target * trial.rounds
        + fit.t_per_verified * trial.drafted
        + overhead_seconds * trial.samples
    )


def compare_fits(
    round_fit: RoundCostFit, overhead_seconds: float, trials: Sequence[TrialCounts]
) -> FitComparison:
    """Fit the run-level model over ``trials`` and score both fits on their seconds.

    Raises CostModelError when the trials cannot identify the run-level costs (fewer than two,
    or N_draft proportional to N_target).
    """
    measured = [t.seconds for t in trials]
    run = fit_cost_model([t.draft_forwards for t in trials], [t.rounds for t in trials], measured)
    run_pred = run.predict([t.draft_forwards for t in trials], [t.rounds for t in trials])
    round_pred = np.array([round_fit_seconds(round_fit, overhead_seconds, t) for t in trials])
    return FitComparison(
        run_t_draft=run.t_draft,
        run_t_target=run.t_target,
        run_r2=run.r2,
        run_mre=mean_relative_error(measured, run_pred),
        round_trial_r2=r_squared(measured, np.asarray(measured) - round_pred),
        round_trial_mre=mean_relative_error(measured, round_pred),
        n_trials=len(trials),
    )


def drafts_by_lookup(trial: StoredTrial) -> bool:
    """True for a speculative trial whose draft is an n-gram lookup (no draft forward)."""
    return trial.draft_kind == "ngram" and not trial.is_baseline


def fit_round_group(
    rounds: Sequence[StoredRound], trials: Sequence[StoredTrial]
) -> tuple[RoundCostFit, float]:
    """Return the block-aware round fit of stored ``rounds`` and the mean overhead per sample.

    The overhead is the mean of seconds − draft seconds − verify seconds per sample over the
    speculative trials (the AR baselines when there is none). Raises CostModelError when the
    rounds cannot identify the costs (``fit_round_costs``) or no trial is given.
    """
    if not trials:
        raise CostModelError("no done live trial in the group")
    fit = fit_round_costs(
        [r.draft_forwards for r in rounds],
        [r.drafted for r in rounds],
        [r.draft_seconds for r in rounds],
        [r.verify_seconds for r in rounds],
        lookup=any(drafts_by_lookup(t) for t in trials),
    )
    speculative = [t for t in trials if not t.is_baseline] or list(trials)
    outside = sum(t.seconds - t.draft_seconds - t.verify_seconds for t in speculative)
    return fit, outside / sum(t.n_samples for t in speculative)
