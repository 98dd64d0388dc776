"""Which stored cost fit projected a replayed trial, and that fit's measured errors (pure).

A replayed trial stores its fit's out-of-sample error e (``metrics.cost_model_error``), not the
fit's key. Its fit is the ``cost_fits`` row of its group (pair, dataset entry, temperature) whose
out-of-sample error is the one the trial stored, the oldest when several are (a fit stored again
by a later sweep over the same trials). The fit's live checks' own errors are in that row's
``checks``; each check's prompts are named by its AR baseline's id, read from its ``trials`` row.
What a paired ratio makes of them is ``orchestrator.analysis.metrics.paired_model_error``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from orchestrator.analysis.metrics import CheckError, FitError
from orchestrator.store.records import StoredCostFit, StoredTrial
from orchestrator.store.row_values import cost_model_error

#: The columns a ``cost_fits`` row shares with the trials of its group.
GROUP_COLUMNS = ("pair", "dataset", "split", "samples", "max_new_tokens", "temperature")


def _same_error(stored: float | None, fitted: float | None) -> bool:
    """True when a trial's stored error is its fit's (both missing, or equal floats)."""
    if stored is None or fitted is None:
        return stored is None and fitted is None
    return math.isclose(stored, fitted, rel_tol=1e-12, abs_tol=1e-15)


def fit_of(row: StoredTrial, fits: Sequence[StoredCostFit]) -> StoredCostFit | None:
    """Return the stored fit replayed ``row`` was projected by (None when none matches): the
    oldest of ``fits`` of its group whose out-of-sample error is the one ``row`` stored."""
    error = cost_model_error(row.metrics)
    matches = [
        fit
        for fit in fits
        if all(getattr(fit, name) == getattr(row, name) for name in GROUP_COLUMNS)
        and _same_error(error, fit.out_of_sample_error)
    ]
    return min(matches, key=lambda fit: fit.id, default=None)


def check_ids(fit: StoredCostFit) -> list[str]:
    """Return the trial ids of ``fit``'s live checks."""
    return [str(check["trial_id"]) for check in fit.checks or [] if check.get("trial_id")]


def check_errors(fit: StoredCostFit, checks: Mapping[str, StoredTrial]) -> tuple[CheckError, ...]:
    """Return ``fit``'s live checks' out-of-sample errors, each named by its prompts (its AR
    baseline); a check without an error, or whose row or baseline is not in ``checks``, is
    left out."""
    found = []
    for check in fit.checks or []:
        row = checks.get(str(check.get("trial_id")))
        if row is not None and row.baseline_id and check.get("error") is not None:
            found.append(CheckError(row.baseline_id, float(check["error"])))
    return tuple(found)


def side_fit(
    row: StoredTrial, fit: StoredCostFit | None, checks: Mapping[str, StoredTrial]
) -> FitError:
    """Return what a paired ratio needs of replayed ``row``'s cost fit ``fit`` (:func:`fit_of`):
    its stored e and its fit's checks' errors (none, and a fit of its own, when its fit is not
    found: any other side then counts as another fit's)."""
    error = cost_model_error(row.metrics)
    if fit is None:
        return FitError(f"trial {row.trial_id}", error)
    return FitError(f"{fit.sweep}/{fit.group_key}", error, check_errors(fit, checks))
