"""The cost-model page's data: the fits the runner stored (``cost_fits``), never a refit.

Each stored group holds the round-level block-aware fit and the run-level fit in SpecDec++'s
form; :func:`fit_totals` predicts every trial's seconds with both, for the measured vs predicted
chart (pure once loaded).
"""

from __future__ import annotations

import pandas as pd

from dashboard.data import reader
from orchestrator.analysis.report import fit_batch_size, fit_seconds, trial_fit

FIT_COLUMNS = (
    "sweep",
    "pair",
    "dataset",
    "temperature",
    "max_new_tokens",
    "t_draft",
    "t_target",
    "t_per_verified",
    "r2_round",
    "round_trial_r2",
    "round_trial_mre",
    "run_t_draft",
    "run_t_target",
    "run_r2",
    "run_mre",
    "projection_fit",
    "n_rounds",
    "n_trials",
)


def load_cost_fits(url: str, sweep: str | None) -> pd.DataFrame:
    """Return the stored cost fits (of one sweep, or all) with every ``cost_fits`` column."""
    with reader(url) as store:
        return store.cost_fits_dataframe(sweep)


def fit_totals(fits: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Return per live trial and fit ("round", "run"): measured and predicted seconds.

    A trial is matched to its group's stored fit (its draft kind and batch size included);
    batch cost tables (batch size above 1) price queues, not a trial's counts, and are left
    out. Columns trial_id, policy, fit, measured_s, predicted_s, relative_error.
    """
    columns = ["trial_id", "policy", "fit", "measured_s", "predicted_s", "relative_error"]
    rows = []
    live = trials[trials["mode"] != "replay"]
    stored = list(fits.itertuples(index=False))
    for trial in live.itertuples(index=False):
        fit = trial_fit(stored, trial.fit_group)
        if fit is None or fit_batch_size(fit) > 1 or not trial.seconds:
            continue
        for which in ("round", "run"):
            if which == "run" and pd.isna(fit.run_t_draft):
                continue
            predicted = fit_seconds(fit, trial, which)
            rows.append(
                {
                    "trial_id": trial.trial_id,
                    "policy": trial.policy,
                    "fit": which,
                    "measured_s": trial.seconds,
                    "predicted_s": predicted,
                    "relative_error": (predicted - trial.seconds) / trial.seconds,
                }
            )
    return pd.DataFrame(rows, columns=columns)
