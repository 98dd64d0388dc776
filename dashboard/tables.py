"""The papers' result tables from trial frames (pure; one function per table).

Every table is a DataFrame with the row labels as ordinary leading columns (so it prints, sorts
and downloads as CSV as it looks), rows are policies (the AR baseline first) or drafts, and
columns are datasets. Cell values follow ``dashboard.data``'s conventions: a setting's metric
is the mean over its trials, and a policy's "best" is its setting with the largest mean (chosen
and measured on the same prompts; ``dashboard.data.best_setting_table`` chooses on dev prompts
and measures on test prompts). ``speed`` picks decode-only or end-to-end tokens/s and speedups.
Where the trials hold drafts of several kinds, a row is a policy with one kind, labelled
``policy (kind)`` as in the Pareto view, so no cell takes its best over two kinds of draft.
"""

from __future__ import annotations

import math

import pandas as pd

from dashboard.data import (
    END_TO_END,
    INTERVAL_FIGURES,
    Speed,
    best_settings,
    policy_kind_label,
    setting_means,
)

BASE_DRAFT_METHOD = "none (base draft)"


def setting_label(threshold: float | None, max_draft_len: int) -> str:
    """Return a policy setting as text, e.g. ``threshold 0.3, K 4`` (``K 4`` without threshold)."""
    if threshold is None or (isinstance(threshold, float) and math.isnan(threshold)):
        return f"K {int(max_draft_len)}"
    return f"threshold {threshold:g}, K {int(max_draft_len)}"


def drafting_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """Return the non-baseline trials, each policy labelled ``policy (kind)`` when they hold
    drafts of more than one kind (``draft_kind``), else as they are."""
    drafting = trials[~trials["is_baseline"]]
    if "draft_kind" not in drafting or drafting["draft_kind"].nunique(dropna=False) < 2:
        return drafting
    kinds = zip(drafting["policy"], drafting["draft_kind"], strict=True)
    return drafting.assign(policy=[policy_kind_label(policy, kind) for policy, kind in kinds])


def tokens_per_s_tables(trials: pd.DataFrame, speed: Speed = END_TO_END) -> dict[int, pd.DataFrame]:
    """Return AdaEDL's Table 1: per max draft length, tokens/s of each policy × dataset.

    A cell is the policy's best threshold at that max draft length; the AR baseline row (mean
    tokens/s of the baseline trials) heads every table.
    """
    drafting = drafting_rows(trials)
    tables = {}
    for max_draft_len in sorted(int(k) for k in drafting["max_draft_len"].unique()):
        at_length = drafting[drafting["max_draft_len"] == max_draft_len]
        best = best_settings(at_length, ["policy", "dataset"], speed.tokens_per_s)
        tables[max_draft_len] = _with_baseline(trials, _pivot(best, speed.tokens_per_s), speed)
    return tables


def best_throughput_table(trials: pd.DataFrame, speed: Speed = END_TO_END) -> pd.DataFrame:
    """Return SpecDec++'s Table 1: each policy's best tokens/s per dataset over all its settings.

    Best is taken over threshold and max draft length together; the AR baseline row comes first.
    """
    drafting = drafting_rows(trials)
    best = best_settings(drafting, ["policy", "dataset"], speed.tokens_per_s)
    return _with_baseline(trials, _pivot(best, speed.tokens_per_s), speed)


def speedup_by_domain_table(trials: pd.DataFrame, speed: Speed = END_TO_END) -> pd.DataFrame:
    """Return SVIP's Table 1: speedup per policy × dataset (domain) at one setting per policy.

    Like the paper, each policy uses a single setting for every domain: the one with the best
    speedup averaged over the datasets it ran on. Columns: policy, setting, datasets, mean.
    """
    drafting = drafting_rows(trials)
    figure = speed.speedup
    means = setting_means(drafting, ["policy", "dataset"], [figure]).dropna(subset=[figure])
    if means.empty:
        return pd.DataFrame(columns=["policy", "setting", "mean"])
    means["setting"] = [
        setting_label(t, k) for t, k in zip(means["threshold"], means["max_draft_len"], strict=True)
    ]
    overall = means.groupby(["policy", "setting"], as_index=False)[figure].mean()
    chosen = overall.loc[overall.groupby("policy")[figure].idxmax(), ["policy", "setting"]]
    cells = means.merge(chosen, on=["policy", "setting"])
    table = cells.pivot(index=["policy", "setting"], columns="dataset", values=figure)
    table["mean"] = table.mean(axis=1)
    table.columns.name = None
    return table.reset_index()


def trial_interval_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Return one row per trial: its configuration and each figure with its 95% interval.

    Columns: policy, setting, pair, draft kind, dataset, temperature, then per figure the
    estimate and ``<figure> low`` / ``<figure> high`` (the stored interval bounds; speedup's
    paired with the AR baseline's prompts), best speedup first.
    """
    table = pd.DataFrame(
        {
            "policy": trials["policy"],
            "setting": [
                setting_label(t, k)
                for t, k in zip(trials["threshold"], trials["max_draft_len"], strict=True)
            ],
            "pair": trials["pair"],
            "draft kind": trials["draft_kind"],
            "dataset": trials["dataset"],
            "temperature": trials["temperature"],
        }
    )
    for figure in INTERVAL_FIGURES:
        table[figure] = trials[figure]
        table[f"{figure} low"] = trials[f"{figure}_low"]
        table[f"{figure} high"] = trials[f"{figure}_high"]
    return table.sort_values("speedup", ascending=False, na_position="last").reset_index(drop=True)


def has_kd_drafts(trials: pd.DataFrame) -> bool:
    """Return True when some drafting trial uses a draft made by a training (KD) job."""
    return bool(trials.loc[~trials["is_baseline"], "draft_job"].notna().any())


def kd_acceptance_table(
    trials: pd.DataFrame, job_kinds: dict[str, str], policy: str | None = None
) -> pd.DataFrame:
    """Return AdaSPEC's Table 1: acceptance rate per draft (grouped by KD method) × dataset.

    Rows are labelled by ``method`` (the training job's kind, e.g. ``adaspec``, or
    ``none (base draft)`` for a draft model used as is) and ``draft`` (job name or model ref),
    base drafts first. A cell pools the trials: accepted draft tokens / drafted tokens. With
    ``policy`` only that policy's trials count (AdaSPEC measures with one fixed drafting rule).
    """
    drafting = trials[~trials["is_baseline"] & (trials["n_drafted"].fillna(0) > 0)]
    if policy is not None:
        drafting = drafting[drafting["policy"] == policy]
    if drafting.empty:
        return pd.DataFrame(columns=["method", "draft"])
    is_kd = drafting["draft_job"].notna()
    labelled = drafting.assign(
        method=[
            job_kinds.get(job, "kd") if kd else BASE_DRAFT_METHOD
            for job, kd in zip(drafting["draft_job"], is_kd, strict=True)
        ],
        draft=drafting["draft_job"].where(is_kd, drafting["draft"]),
        is_kd=is_kd,
    )
    sums = labelled.groupby(["is_kd", "method", "draft", "dataset"], as_index=False)[
        ["n_accepted", "n_drafted"]
    ].sum()
    sums["acceptance_rate"] = sums["n_accepted"] / sums["n_drafted"]
    table = sums.pivot(
        index=["is_kd", "method", "draft"], columns="dataset", values="acceptance_rate"
    )
    table.columns.name = None
    return table.reset_index().drop(columns="is_kd")


def table_csv(table: pd.DataFrame) -> bytes:
    """Return ``table`` as UTF-8 CSV bytes (no index column), for the download buttons."""
    return table.to_csv(index=False).encode("utf-8")


def _pivot(best: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Return ``best`` as a policy × dataset table of ``metric`` (policy as a column)."""
    if best.empty:
        return pd.DataFrame(columns=["policy"])
    table = best.pivot(index="policy", columns="dataset", values=metric)
    table.columns.name = None
    return table.reset_index()


def _with_baseline(
    trials: pd.DataFrame, table: pd.DataFrame, speed: Speed = END_TO_END
) -> pd.DataFrame:
    """Return ``table`` with the AR baseline's mean tokens/s per dataset as its first row."""
    baselines = trials[trials["is_baseline"]]
    if baselines.empty:
        return table
    grouped = baselines.groupby(["policy", "dataset"])[speed.tokens_per_s]
    rows = grouped.mean().unstack("dataset")
    rows.columns.name = None
    return pd.concat([rows.reset_index(), table], ignore_index=True)
