"""Per-position acceptance and accepted-length histograms from the store's per-trial tables.

vLLM's definition: the rate of position i is the share of rounds that drafted a token at i in
which that token was accepted. Rates of a policy pool the counts of its selected trials (sums,
then the ratio), so a trial with more rounds weighs more (pure once loaded).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from dashboard.data import reader


def load_position_acceptance(url: str, trial_ids: Sequence[str]) -> pd.DataFrame:
    """Return trial_id, position, drafted, accepted, rate rows of these trials."""
    with reader(url) as store:
        return store.position_acceptance(trial_ids)


def load_accepted_lengths(url: str, trial_ids: Sequence[str]) -> pd.DataFrame:
    """Return trial_id, length, rounds rows of these trials."""
    with reader(url) as store:
        return store.accepted_lengths(trial_ids)


def _with_policy(frame: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Join each row to its trial's policy, drafting trials only."""
    drafting = trials.loc[~trials["is_baseline"], ["trial_id", "policy"]]
    return frame.merge(drafting, on="trial_id")


def position_rates(positions: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Return per (policy, position) the pooled drafted, accepted and rate = accepted/drafted."""
    columns = ["policy", "position", "drafted", "accepted", "rate"]
    joined = _with_policy(positions, trials)
    if joined.empty:
        return pd.DataFrame(columns=columns)
    pooled = joined.groupby(["policy", "position"], as_index=False)[["drafted", "accepted"]].sum()
    pooled["rate"] = pooled["accepted"] / pooled["drafted"]
    return pooled[columns].sort_values(["policy", "position"]).reset_index(drop=True)


def accepted_length_shares(lengths: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Return per (policy, accepted length) the rounds and their share of the policy's rounds."""
    columns = ["policy", "length", "rounds", "fraction"]
    joined = _with_policy(lengths, trials)
    if joined.empty:
        return pd.DataFrame(columns=columns)
    pooled = joined.groupby(["policy", "length"], as_index=False)["rounds"].sum()
    pooled["fraction"] = pooled["rounds"] / pooled.groupby("policy")["rounds"].transform("sum")
    return pooled[columns].sort_values(["policy", "length"]).reset_index(drop=True)
