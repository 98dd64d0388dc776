"""What the batch-size page plots (pure: DataFrames in, DataFrames out).

A sweep with ``batch_sizes`` measures each setting at several batch sizes, each against the AR
baseline at the same batch size. :func:`speedup_by_batch` gives each policy's best setting per
pair and batch size (where its speedup falls below 1, speculation stops paying: the
crossover); :func:`batch_frontier` gives every setting's per-sequence tokens/s (what a user
waits for) against its total tokens/s (the throughput), one point per batch size.
"""

from __future__ import annotations

import pandas as pd

from dashboard.data import best_settings, setting_means

FRONTIER_METRICS = ("tokens_per_s", "total_tokens_per_s")


def has_batches(trials: pd.DataFrame) -> bool:
    """Return whether any of ``trials`` was measured at a batch size other than 1."""
    return bool((trials["batch_size"].fillna(1) != 1).any())


def speedup_by_batch(trials: pd.DataFrame, speedup: str) -> pd.DataFrame:
    """Return each drafting policy's best mean ``speedup`` per (pair, batch size), with its
    setting and number of trials, sorted by pair, policy and batch size."""
    drafting = trials[~trials["is_baseline"]]
    best = best_settings(drafting, ["pair", "policy", "batch_size"], speedup)
    return best.sort_values(["pair", "policy", "batch_size"]).reset_index(drop=True)


def batch_frontier(trials: pd.DataFrame) -> pd.DataFrame:
    """Return the mean per-sequence and total tokens/s per (pair, policy, setting, batch size),
    with ``setting`` a label of the policy's setting (AR baselines included, as ``ar``)."""
    means = setting_means(
        trials, ["pair", "policy", "is_baseline", "batch_size"], FRONTIER_METRICS
    ).dropna(subset=list(FRONTIER_METRICS))
    labels = [
        _setting_label(policy, pair, length, threshold)
        for policy, pair, length, threshold in zip(
            means["policy"], means["pair"], means["max_draft_len"], means["threshold"], strict=True
        )
    ]
    means = means.assign(setting=labels)
    return means.sort_values(["pair", "policy", "setting", "batch_size"]).reset_index(drop=True)


def _setting_label(policy: str, pair: str, length: float, threshold: float) -> str:
    """Return "policy K k[, threshold t] (pair)" for a legend and hover label."""
    text = f"{policy} K {int(length)}"
    if not pd.isna(threshold):
        text += f", threshold {threshold:g}"
    return f"{text} ({pair})"
