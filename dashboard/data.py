"""The dashboard's data: read-only loading from the store, filters and aggregates (pure).

Loading opens the store read-only (``open_store(url, read_only=True)``), so the dashboard can
never write; every loader turns a store that cannot be read into :class:`StoreUnavailable`
with a message fit for the page. Everything after loading is a pure function of DataFrames.

Conventions: a "setting" of a policy is its (threshold, max_draft_len); a metric of a setting
is the mean over the trials that share it (pairs, datasets, temperatures and seeds left in by
the filters); "best" is the setting with the largest mean. Baseline trials (``is_baseline``)
are kept by the max-draft-length filter, since they are every view's reference.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

import pandas as pd
from sqlalchemy.exc import SQLAlchemyError

from dashboard.pareto import pareto_mask
from orchestrator.analysis.holdout import SweepSamples, stored_splits
from orchestrator.analysis.report import record_fit_group_key, summary_rows
from orchestrator.store import (
    BASELINE_POLICY,
    Store,
    StoreError,
    default_url,
    display_url,
    open_store,
)
from orchestrator.store.models import (
    HEADLINE_METRICS,
    INTERVAL_COLUMNS,
    INTERVAL_FIGURES,
    TRIAL_METRIC_COLUMNS,
)
from orchestrator.store.records import StoredTrial

__all__ = [
    "BASELINE_POLICY",
    "CACHE_TTL_S",
    "CONTEXT_KEY",
    "DECODE_ONLY",
    "END_TO_END",
    "FILL_COMMAND",
    "METRIC_COLUMNS",
    "DashboardContext",
    "Speed",
    "StoreUnavailable",
    "TrialFilters",
    "apply_filters",
    "best_setting_table",
    "best_settings",
    "compare_sweeps",
    "config_points",
    "db_argument",
    "default_url",
    "display_url",
    "done_trials",
    "fill_hint",
    "filter_options",
    "load_draft_job_kinds",
    "load_round_counts",
    "load_sweep_names",
    "load_sweep_samples",
    "load_trials",
    "mark_frontiers",
    "round_length_distribution",
    "setting_means",
    "speeds",
    "speedup_vs_temperature",
    "throughput_vs_threshold",
]

#: Where the main script leaves the DashboardContext for the pages.
CONTEXT_KEY = "specsweep_dashboard"
#: How long the pages reuse what they read from the store, so new trials show up soon.
CACHE_TTL_S = 30
FILL_COMMAND = "python -m orchestrator submit sweeps/demo.yaml"
ORACLE_POLICY = "oracle"
#: The figures the pages compare settings by (the store's headline trial metrics).
METRIC_COLUMNS = HEADLINE_METRICS
SETTING_COLUMNS = ("threshold", "max_draft_len")
#: What a Pareto point and frontier belong to: a policy on drafts of one kind (or the baseline).
FRONTIER_KEYS = ["policy", "draft_kind", "is_baseline"]


def policy_kind_label(policy: object, kind: object) -> str:
    """Return how a policy is named where trials hold several draft kinds: ``policy (kind)``."""
    return f"{policy} ({kind})"


#: Trial columns the dashboard keeps (JSON columns other than params are dropped).
TRIAL_COLUMNS = (
    "trial_id",
    "pair",
    "target",
    "draft",
    "draft_job",
    "draft_kind",
    "dataset",
    "split",
    "samples",
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "policy",
    "threshold",
    "max_draft_len",
    "seed",
    "batch_size",
    "is_baseline",
    "mode",
    "baseline_id",
    "status",
    *TRIAL_METRIC_COLUMNS,
    "speedup",
    "decode_speedup",
    "params",
    *INTERVAL_COLUMNS,
    "run_id",
)
_NUMERIC_COLUMNS = (
    *INTERVAL_COLUMNS,
    "temperature",
    "threshold",
    "seconds",
    *METRIC_COLUMNS,
    "draft_seconds",
    "verify_seconds",
    "prefill_seconds",
    "decode_seconds",
    "total_tokens_per_s",
)


@dataclass(frozen=True)
class Speed:
    """A measure of speed: its tokens/s and speedup columns and its name in captions."""

    tokens_per_s: str
    speedup: str
    label: str


DECODE_ONLY = Speed("decode_tokens_per_s", "decode_speedup", "decode-only")
END_TO_END = Speed("tokens_per_s", "speedup", "end-to-end")
#: What the best-setting table shows: one row per policy and cell of the grid.
BEST_GROUP = ("pair", "draft_kind", "dataset", "temperature", "policy")


def speeds(trials: pd.DataFrame) -> list[Speed]:
    """Return the measures these trials can be shown by, the headline first: decode-only
    (prefill left out, the seed papers' measure) when every done trial has it, then end to end.
    """
    done = trials[trials["status"] == "done"]
    decode = not done.empty and bool(done["decode_tokens_per_s"].notna().all())
    return [DECODE_ONLY, END_TO_END] if decode else [END_TO_END]


class StoreUnavailable(RuntimeError):
    """The store at a URL cannot be read (missing, never written, unreachable, bad URL)."""


@dataclass(frozen=True)
class TrialFilters:
    """The sidebar's choices; an empty tuple means no restriction on that column."""

    pairs: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    temperatures: tuple[float, ...] = ()
    max_draft_lens: tuple[int, ...] = ()
    batch_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class DashboardContext:
    """What the main script hands every page: the store URL, the sweep and filtered trials."""

    url: str
    sweep: str | None
    sweeps: tuple[str, ...]
    filters: TrialFilters
    trials: pd.DataFrame = field(repr=False)


def db_argument(argv: Sequence[str]) -> str | None:
    """Return the value of ``--db URL`` / ``--db=URL`` in ``argv`` (None when absent)."""
    for index, argument in enumerate(argv):
        if argument.startswith("--db="):
            return argument.removeprefix("--db=")
        if argument == "--db" and index + 1 < len(argv):
            return argv[index + 1]
    return None


def fill_hint(url: str) -> str:
    """Return the shell command that fills the store at ``url`` with the demo sweep."""
    if url == default_url():
        return FILL_COMMAND
    return f"{FILL_COMMAND} --db {display_url(url)}"


@contextmanager
def reader(url: str) -> Iterator[Store]:
    """Yield the store at ``url`` opened read-only; failures become StoreUnavailable."""
    try:
        store = open_store(url, read_only=True)
    except (StoreError, SQLAlchemyError, ValueError, OSError) as error:
        raise StoreUnavailable(str(error).splitlines()[0]) from error
    try:
        yield store
    except SQLAlchemyError as error:
        raise StoreUnavailable(str(error).splitlines()[0]) from error
    finally:
        store.close()


def load_sweep_names(url: str) -> list[str]:
    """Return the names of the stored sweeps, oldest first (the sidebar's sweep choices)."""
    with reader(url) as store:
        return store.sweep_names()


def load_trials(url: str, sweep: str | None = None) -> pd.DataFrame:
    """Return the trials (all statuses) of ``sweep``, or of the whole store, as a DataFrame.

    Keeps :data:`TRIAL_COLUMNS`, with ``params`` rendered as text for hover labels, missing
    metrics as NaN, and ``fit_group``: the key of the trial's cost-fit group.
    """
    with reader(url) as store:
        stored = store.trials_dataframe(sweep)
    frame = stored[list(TRIAL_COLUMNS)].copy()
    frame["fit_group"] = [record_fit_group_key(config) for config in stored["config"]]
    frame["params"] = [_params_text(params) for params in frame["params"]]
    for column in _NUMERIC_COLUMNS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    frame["is_baseline"] = frame["is_baseline"].astype(bool)
    frame["mode"] = frame["mode"].fillna("live")
    return frame


def _params_text(params: Any) -> str:
    """Return a policy's parameters as ``k=v, ...`` text (empty for none)."""
    if not isinstance(params, dict):
        return ""
    return ", ".join(f"{key}={value}" for key, value in sorted(params.items()))


def load_round_counts(url: str, trial_ids: Sequence[str]) -> pd.DataFrame:
    """Return the number of rounds per (trial_id, drafted, accepted) of the given trials.

    Counted in the database, so the distribution views never pull every round.
    """
    with reader(url) as store:
        return store.round_counts(trial_ids)


def load_sweep_samples(url: str, sweeps: Sequence[str], trial_ids: Sequence[str]) -> SweepSamples:
    """Return the samples of these trials and the dev/test splits of these sweeps' dataset
    entries, what best settings are chosen from."""
    with reader(url) as store:
        samples = store.trials_sample_speeds(trial_ids)
        specs = store.sweep_specs(sweeps)
    return SweepSamples(samples, stored_splits(specs.values()))


def best_setting_table(trials: pd.DataFrame, measured: SweepSamples) -> pd.DataFrame:
    """Return each policy's best trial per pair × dataset × temperature, chosen on the dev
    prompts and measured on the test prompts (``orchestrator.analysis.report.summary_rows``):
    its speedup, paired 95% interval, the prompts it was chosen and measured on, and the mean
    decode-only and end-to-end figures of the policy's trials beside."""
    done = trials[trials["status"] == "done"]
    rows = [_stored_row(row) for row in done.to_dict("records")]
    table = pd.DataFrame(summary_rows(rows, BEST_GROUP, measured))
    if table.empty:
        return table
    labels = {
        trial_id: f"K {int(length)}" + (f", {params}" if params else "")
        for trial_id, length, params in zip(
            done["trial_id"], done["max_draft_len"], done["params"], strict=True
        )
    }
    table["best_setting"] = [labels.get(trial_id, "") for trial_id in table["best_trial"]]
    return table.drop(columns=["trials", "done"])


def _stored_row(values: dict[str, Any]) -> StoredTrial:
    """Return a dashboard trial row as the store's record (NaN metrics as None)."""
    return StoredTrial(
        **{
            name: None if _is_missing(values.get(name)) else values.get(name)
            for name in (f.name for f in fields(StoredTrial))
        }
    )


def _is_missing(value: Any) -> bool:
    """True for None and NaN (a DataFrame's missing metric)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def load_draft_job_kinds(url: str) -> dict[str, str]:
    """Return {training job name: kind} (e.g. ``adaspec``), to label KD drafts by method."""
    with reader(url) as store:
        return store.training_job_kinds()


def done_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Return the trials whose status is ``done`` (the only ones with metrics)."""
    return trials[trials["status"] == "done"].reset_index(drop=True)


def filter_options(trials: pd.DataFrame) -> dict[str, list[Any]]:
    """Return the sorted choices of each sidebar filter found in ``trials``.

    Max draft lengths come from non-baseline trials only (a baseline drafts nothing).
    """
    drafting = trials[~trials["is_baseline"]]
    return {
        "pairs": sorted(trials["pair"].dropna().unique().tolist()),
        "datasets": sorted(trials["dataset"].dropna().unique().tolist()),
        "temperatures": sorted(float(t) for t in trials["temperature"].dropna().unique()),
        "max_draft_lens": sorted(int(k) for k in drafting["max_draft_len"].dropna().unique()),
        "batch_sizes": sorted(int(b) for b in trials["batch_size"].dropna().unique()),
    }


def apply_filters(trials: pd.DataFrame, filters: TrialFilters) -> pd.DataFrame:
    """Return the trials matching every non-empty filter; baselines pass the length filter."""
    keep = pd.Series(True, index=trials.index)
    if filters.pairs:
        keep &= trials["pair"].isin(filters.pairs)
    if filters.datasets:
        keep &= trials["dataset"].isin(filters.datasets)
    if filters.temperatures:
        keep &= trials["temperature"].isin(filters.temperatures)
    if filters.max_draft_lens:
        keep &= trials["is_baseline"] | trials["max_draft_len"].isin(filters.max_draft_lens)
    if filters.batch_sizes:
        keep &= trials["batch_size"].isin(filters.batch_sizes)
    return trials[keep].reset_index(drop=True)


def setting_means(
    trials: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str]
) -> pd.DataFrame:
    """Return the mean of ``metrics`` per ``keys`` + setting, with the number of trials.

    A policy without a threshold (static, oracle, the baseline) has a NaN threshold; it still
    forms its own setting.
    """
    group = list(dict.fromkeys([*keys, *SETTING_COLUMNS]))
    columns = [*group, *metrics]
    if trials.empty:
        return pd.DataFrame(columns=[*columns, "n_trials"])
    grouped = trials.groupby(group, dropna=False, sort=True)
    means = grouped[list(metrics)].mean()
    means["n_trials"] = grouped.size()
    return means.reset_index()


def best_settings(trials: pd.DataFrame, keys: Sequence[str], metric: str) -> pd.DataFrame:
    """Return, per ``keys``, the setting with the largest mean ``metric`` (one row each).

    Columns: ``keys``, threshold, max_draft_len, the metric and n_trials. Settings whose
    metric is NaN everywhere are left out.
    """
    means = setting_means(trials, keys, [metric]).dropna(subset=[metric])
    if means.empty:
        return means.reset_index(drop=True)
    best = means.loc[means.groupby(list(keys), sort=True)[metric].idxmax()]
    return best.reset_index(drop=True)


def config_points(trials: pd.DataFrame) -> pd.DataFrame:
    """Return one point per policy setting: mean metrics over the trials that share it.

    These are the points of the Pareto views: a policy's threshold sweep gives one point per
    (threshold, max draft length) and draft kind, averaged over the selected pairs, datasets,
    temperatures.
    Each point carries a 95% interval (``<metric>_low/_high``, its error bars): a point of one
    trial keeps that trial's interval bounds; a mean of k trials gets mean ± √(Σ h_i²)/k, h_i
    a trial's half-width (the trials measured independently, normal approximation). NaN when
    a trial of the point has no interval.
    """
    means = setting_means(trials, FRONTIER_KEYS, METRIC_COLUMNS)
    group = [*FRONTIER_KEYS, *SETTING_COLUMNS]
    for figure in INTERVAL_FIGURES:
        bounds = pooled_intervals(trials, group, figure)
        means = means.merge(bounds, on=group, how="left")
    order = ["policy", "draft_kind", "max_draft_len", "threshold"]
    return means.sort_values(order).reset_index(drop=True)


def pooled_intervals(trials: pd.DataFrame, group: list[str], figure: str) -> pd.DataFrame:
    """Return per ``group`` the interval of the mean of ``figure`` over its trials.

    One trial: its stored bounds. Several: mean ± √(Σ h_i²)/k with h_i = (high_i − low_i)/2.
    Columns: ``group``, ``<figure>_low``, ``<figure>_high``.
    """
    low, high = f"{figure}_low", f"{figure}_high"
    frame = trials[[*group, figure, low, high]].assign(
        half_sq=((trials[high] - trials[low]) / 2) ** 2
    )
    grouped = frame.groupby(group, dropna=False, sort=False)
    result = grouped.agg(
        mean=(figure, "mean"),
        k=(figure, "size"),
        missing=(low, lambda bounds: bounds.isna().sum()),
        half=("half_sq", "sum"),
        only_low=(low, "first"),
        only_high=(high, "first"),
    ).reset_index()
    half = result["half"] ** 0.5 / result["k"]
    single = result["k"] == 1
    result[low] = (result["mean"] - half).where(~single, result["only_low"])
    result[high] = (result["mean"] + half).where(~single, result["only_high"])
    result.loc[result["missing"] > 0, [low, high]] = float("nan")
    return result[[*group, low, high]]


def mark_frontiers(
    points: pd.DataFrame, x: str, y: str, maximise_x: bool, maximise_y: bool
) -> pd.DataFrame:
    """Return ``points`` with an ``on_front`` column: Pareto-optimal within its policy and
    draft kind on (x, y).

    Exists to draw one frontier per policy and draft kind from its threshold sweep.
    """
    marked = points.copy()
    marked["on_front"] = False
    for _key, rows in marked.groupby(["policy", "draft_kind"], sort=False, dropna=False):
        mask = pareto_mask(rows[[x, y]].to_numpy(dtype=float), [maximise_x, maximise_y])
        marked.loc[rows.index, "on_front"] = mask
    return marked


def speedup_vs_temperature(trials: pd.DataFrame) -> pd.DataFrame:
    """Return each drafting policy's best mean speedup at each temperature (and its setting)."""
    drafting = trials[~trials["is_baseline"]]
    best = best_settings(drafting, ["policy", "temperature"], "speedup")
    return best.sort_values(["policy", "temperature"]).reset_index(drop=True)


def throughput_vs_threshold(trials: pd.DataFrame) -> pd.DataFrame:
    """Return mean tokens/s per (policy, max draft length, threshold) of threshold policies."""
    with_threshold = trials[trials["threshold"].notna() & ~trials["is_baseline"]]
    means = setting_means(with_threshold, ["policy"], ["tokens_per_s"])
    return means.sort_values(["policy", "max_draft_len", "threshold"]).reset_index(drop=True)


def round_length_distribution(round_counts: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Return drafted and accepted lengths per round as (policy, kind, length, rounds, fraction).

    ``kind`` is ``drafted`` or ``accepted``; ``fraction`` is the share of that policy's rounds
    with that length. Baseline rounds (nothing drafted) are left out.
    """
    columns = ["policy", "kind", "length", "rounds", "fraction"]
    drafting = trials.loc[~trials["is_baseline"], ["trial_id", "policy"]]
    counts = round_counts.merge(drafting, on="trial_id")
    if counts.empty:
        return pd.DataFrame(columns=columns)
    parts = []
    for kind in ("drafted", "accepted"):
        part = counts.groupby(["policy", kind], as_index=False)["rounds"].sum()
        part = part.rename(columns={kind: "length"})
        part["kind"] = kind
        parts.append(part)
    long = pd.concat(parts, ignore_index=True)
    long["fraction"] = long["rounds"] / long.groupby(["policy", "kind"])["rounds"].transform("sum")
    return long[columns].sort_values(["kind", "policy", "length"]).reset_index(drop=True)


def compare_sweeps(
    trials_a: pd.DataFrame,
    trials_b: pd.DataFrame,
    metrics: Sequence[str],
    keys: Sequence[str] = ("policy", "dataset"),
) -> pd.DataFrame:
    """Return per ``keys`` the mean of each metric in sweep A, in sweep B and B − A.

    Columns: keys, ``n A``, ``n B`` (trials per cell), then ``<metric> A``, ``<metric> B``,
    ``<metric> Δ`` per metric. A cell present in one sweep only has NaN for the other.
    """
    sides = []
    for label, trials in (("A", trials_a), ("B", trials_b)):
        grouped = trials.groupby(list(keys), dropna=False)
        side = grouped[list(metrics)].mean().add_suffix(f" {label}")
        side[f"n {label}"] = grouped.size()
        sides.append(side)
    merged = sides[0].join(sides[1], how="outer")
    merged[["n A", "n B"]] = merged[["n A", "n B"]].fillna(0).astype(int)
    columns = ["n A", "n B"]
    for metric in metrics:
        merged[f"{metric} Δ"] = merged[f"{metric} B"] - merged[f"{metric} A"]
        columns += [f"{metric} A", f"{metric} B", f"{metric} Δ"]
    return merged[columns].reset_index()
