"""Paired comparison of two trials on their shared prompts, and the runs' provenance.

Both read the store read-only; the statistics are ``orchestrator.analysis.pairing`` (the same as the
``compare`` command), so the page and the CLI give the same ratio, interval and verdict.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from dashboard.data import reader
from orchestrator.analysis.metrics import paired_model_error
from orchestrator.analysis.pairing import Comparison, decode_speeds, paired_ratio
from orchestrator.analysis.report import PROVENANCE_FIELDS


def compare_trials(url: str, trial_a: str, trial_b: str) -> dict[str, Comparison]:
    """Return A's tokens/s over B's on their shared prompts (interval None: not comparable)
    by measure: ``decode-only`` first where both trials stored decode seconds, then
    ``end-to-end``; with a replayed side widened by its cost model's error, as ``compare``."""
    with reader(url) as store:
        samples_a = store.sample_speeds(trial_a)
        samples_b = store.sample_speeds(trial_b)
        fits = store.side_fits(store.trial_rows([trial_a, trial_b]))
    error = paired_model_error(fits.get(trial_a), fits.get(trial_b))
    decode_a, decode_b = decode_speeds(samples_a), decode_speeds(samples_b)
    compared = {}
    if decode_a is not None and decode_b is not None:
        compared["decode-only"] = paired_ratio(decode_a, decode_b, error)
    compared["end-to-end"] = paired_ratio(samples_a, samples_b, error)
    return compared


def load_runs(url: str, run_ids: Iterable[int]) -> pd.DataFrame:
    """Return the provenance of these runs: id, sweep and every provenance field."""
    ids = sorted({int(run_id) for run_id in run_ids})
    with reader(url) as store:
        runs = store.runs(ids) if ids else []
    columns = ["id", "sweep", *PROVENANCE_FIELDS]
    return pd.DataFrame(
        [[getattr(run, column) for column in columns] for run in runs], columns=columns
    )


def trial_choices(trials: pd.DataFrame) -> dict[str, str]:
    """Return {trial_id: "policy params K=… pair dataset T=…"} labels for the pickers."""
    labels = {}
    for row in trials.to_dict("records"):
        params = f" {row['params']}" if row["params"] else ""
        labels[row["trial_id"]] = (
            f"{row['policy']}{params} K={row['max_draft_len']} · {row['pair']} · "
            f"{row['dataset']} · T={row['temperature']:g} · {row['trial_id'][:8]}"
        )
    return labels
