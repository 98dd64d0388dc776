"""Tables the CLI prints: pure functions from stored trials, plans and model cards to row dicts.

Inputs are typed (the store's ``Stored*`` records, plans, model cards); every ``*_rows``
function returns a list of plain dicts (one per table row, keys are column names) so the same
data can be printed with :func:`render_table`, written as CSV, or tested without a terminal.
Only :func:`render_table` knows about ``rich``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar

from rich.table import Table
from rich.text import Text

from orchestrator.analysis.costs.model import (
    CostModelError,
    HardwareProfile,
    RoundCostFit,
    project_onto_profile,
)
from orchestrator.analysis.costs.run_fit import TrialCounts, round_fit_seconds
from orchestrator.analysis.holdout import Candidate, SweepSamples, best_setting, dataset_key
from orchestrator.analysis.stats import MIN_PROMPTS, too_few_prompts
from orchestrator.sweep.planner import Plan
from orchestrator.sweep.trial import ServedPair, Trial, record_fit_group_key

if TYPE_CHECKING:
    from orchestrator.analysis.metrics import ModelError
    from orchestrator.analysis.pairing import Comparison
    from orchestrator.store.records import StoredCostFit, StoredJob, StoredRun, StoredTrial

#: A table row as printed or exported: column name → value.
Row = Mapping[str, Any]

#: How the end-of-run summary groups trials: one row per pair × draft kind × dataset ×
#: temperature × policy × max draft length (threshold settings and seeds of a group are
#: averaged).
SUMMARY_GROUP = ("pair", "draft_kind", "dataset", "temperature", "policy", "max_draft_len")
SUMMARY_COLUMNS = (
    *SUMMARY_GROUP,
    "trials",
    "done",
    "decode_tokens_per_s",
    "decode_speedup",
    "e2e_tokens_per_s",
    "e2e_speedup",
    "best_speedup",
    "best_speedup_ci",
    "best_on",
    "acceptance_rate",
)
#: What a sweep measured at a batch size other than 1 adds to the summary's group and columns.
BATCH_GROUP = ("batch_size",)
BATCH_COLUMNS = ("total_tokens_per_s",)
STATUS_COLUMNS = ("sweep", "planned", "done", "failed", "pending", "running")
FAILED_COLUMNS = (
    "trial_id",
    "pair",
    "draft_kind",
    "dataset",
    "temperature",
    "policy",
    "threshold",
    "max_draft_len",
    "attempts",
    "error",
)
TRAINING_JOB_STATUS_COLUMNS = ("name", "kind", "status", "attempts", "seconds", "error", "job_id")
PLAN_GROUP_COLUMNS = (
    "pair",
    "draft_kind",
    "draft",
    "dataset",
    "temperature",
    "policy",
    "trials",
    "settings",
    "max_draft_lens",
)
PLAN_TRIAL_COLUMNS = (
    "trial_id",
    "pair",
    "draft_kind",
    "draft",
    "dataset",
    "temperature",
    "policy",
    "params",
    "max_draft_len",
    "seed",
    "requires_jobs",
)
JOB_COLUMNS = ("name", "kind", "base", "teacher", "dataset", "samples", "epochs", "job_id")
SKIPPED_COLUMNS = ("pair", "draft", "dataset", "temperature", "seed", "policy", "trials", "reason")
RESOURCE_COLUMNS = (
    "pair",
    "backend",
    "target_actors",
    "gpus_per_target_actor",
    "draft_gpus",
    "cpus",
    "gpus",
)
FIT_COLUMNS = (
    "pair",
    "dataset",
    "temperature",
    "max_new_tokens",
    "batch_size",
    "t_draft_ms",
    "t_target_ms",
    "t_per_verified_ms",
    "r2_draft",
    "r2_verify",
    "r2_round",
    "n_rounds",
    "n_trials",
    "check_same_rounds",
    "check_error",
    "out_of_sample_error",
    "run_t_draft_ms",
    "run_t_target_ms",
    "run_r2",
    "run_mre",
    "round_trial_r2",
    "round_trial_mre",
    "projection_fit",
)
PROJECTION_LEADING_COLUMNS = (
    "trial_id",
    "mode",
    "dataset",
    "policy",
    "threshold",
    "max_draft_len",
    "tokens_per_s",
    "speedup",
    "fit_tokens_per_s",
)
ZOO_LEADING_COLUMNS = ("model", "role", "parameters")
ZOO_TRAILING_COLUMNS = ("greedy_agreement", "entropy_std_nats", "cost_ratio", "static_speedup_code")
VAL_LOSS_PREFIX = "val_loss_"

#: Column headers that read better than the key.
HEADERS = {
    "temperature": "temp",
    "draft_kind": "kind",
    "max_draft_len": "max DL",
    "max_draft_lens": "max DLs",
    "tokens_per_s": "e2e tokens/s",
    "speedup": "e2e speedup",
    "decode_tokens_per_s": "decode tok/s",
    "decode_speedup": "decode speedup",
    "batch_size": "batch",
    "draft_len": "K",
    "total_tokens_per_s": "total tok/s",
    "e2e_tokens_per_s": "e2e tok/s",
    "e2e_speedup": "e2e speedup",
    "best_speedup": "best speedup",
    "best_trial": "best trial",
    "best_on": "best: prompts",
    "acceptance_rate": "acceptance",
    "requires_jobs": "needs jobs",
    "target_actors": "target actors",
    "gpus_per_target_actor": "GPUs/target actor",
    "draft_gpus": "draft GPUs",
    "cpus": "CPUs",
    "gpus": "GPUs",
    "greedy_agreement": "agreement",
    "entropy_std_nats": "entropy std",
    "cost_ratio": "cost ratio",
    "static_speedup_code": "static-K speedup (code)",
    "t_draft_ms": "t_draft ms",
    "t_target_ms": "t_target ms",
    "t_per_verified_ms": "ms/verified token",
    "r2_draft": "R² draft",
    "r2_verify": "R² verify",
    "r2_round": "R² round",
    "check_same_rounds": "check: same rounds",
    "check_error": "check: tok/s error",
    "out_of_sample_error": "checks: out-of-sample error",
    "best_speedup_ci": "best: 95% CI",
    "run_t_draft_ms": "run t_draft ms",
    "run_t_target_ms": "run t_target ms",
    "run_r2": "R² run fit",
    "run_mre": "rel. error run fit",
    "round_trial_r2": "R² round fit (trials)",
    "round_trial_mre": "rel. error round fit",
    "projection_fit": "projects with",
    "fit_tokens_per_s": "e2e tokens/s by fit",
}

MISSING = "-"
T = TypeVar("T")
MAX_ERROR_CHARS = 160


def mean_or_none(values: Iterable[float | None]) -> float | None:
    """Return the mean of the values that are not None (None when there are none).

    Exists because metrics such as the AR baseline's acceptance rate are NULL in the store.
    """
    present = [value for value in values if value is not None]
    return math.fsum(present) / len(present) if present else None


def group_rows(rows: Iterable[T], keys: Sequence[str]) -> dict[tuple[Hashable, ...], list[T]]:
    """Return ``rows`` grouped by their attributes ``keys``, groups in order of first appearance."""
    groups: dict[tuple[Hashable, ...], list[T]] = {}
    for row in rows:
        groups.setdefault(tuple(getattr(row, key) for key in keys), []).append(row)
    return groups


def has_batches(rows: Iterable[StoredTrial]) -> bool:
    """Return whether any of ``rows`` was measured at a batch size other than 1."""
    return any((row.batch_size or 1) != 1 for row in rows)


def summary_layout(rows: Sequence[StoredTrial]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return the summary's group keys and columns for ``rows``: with the batch size and the
    total tokens/s when a trial was measured at a batch size other than 1."""
    if not has_batches(rows):
        return SUMMARY_GROUP, SUMMARY_COLUMNS
    group = (*SUMMARY_GROUP, *BATCH_GROUP)
    return group, (*group, *SUMMARY_COLUMNS[len(SUMMARY_GROUP) :], *BATCH_COLUMNS)


def summary_rows(
    rows: Iterable[StoredTrial],
    group_by: Sequence[str] = SUMMARY_GROUP,
    measured: SweepSamples | None = None,
) -> list[dict[str, Any]]:
    """Return one summary row per group of stored trials (``Store.trials``).

    Columns: the ``group_by`` values, ``trials`` (in the group), ``done``, and over the group's
    done trials the mean decode-only and end-to-end tokens/s and speedups (decode-only first,
    None where a trial was stored without its decode seconds), the best trial's speedup
    (``best_speedup``, its paired 95% interval ``best_speedup_ci``, ``best_trial``,
    ``best_on``: the prompts it was chosen and measured on, ``best_note`` that in words, see
    :func:`best_cells`), the mean ``acceptance_rate`` and, grouped by batch size, the mean
    ``total_tokens_per_s``.
    Exists for the table ``submit`` prints at the end of a run: how each policy did on each
    dataset.
    """
    summary = []
    for values, members in group_rows(rows, group_by).items():
        done = [row for row in members if row.status == "done"]
        summary.append(
            {
                **dict(zip(group_by, values, strict=True)),
                "trials": len(members),
                "done": len(done),
                "decode_tokens_per_s": _mean_of_all(row.decode_tokens_per_s for row in done),
                "decode_speedup": _mean_of_all(row.decode_speedup for row in done),
                "e2e_tokens_per_s": mean_or_none(row.tokens_per_s for row in done),
                "e2e_speedup": mean_or_none(row.speedup for row in done),
                **best_cells(done, measured),
                "acceptance_rate": mean_or_none(row.acceptance_rate for row in done),
                **_batch_cells(group_by, done),
            }
        )
    return summary


def _batch_cells(group_by: Sequence[str], done: Sequence[StoredTrial]) -> dict[str, Any]:
    """Return the mean total tokens/s of a group when the summary groups by batch size."""
    if not set(BATCH_GROUP) <= set(group_by):
        return {}
    return {"total_tokens_per_s": mean_or_none(row.total_tokens_per_s for row in done)}


def _mean_of_all(values: Iterable[float | None]) -> float | None:
    """Return the mean of ``values``, None when any is None (a decode-only mean must not
    quietly leave out the trials stored without decode seconds)."""
    present = list(values)
    return None if not present or None in present else mean_or_none(present)


#: The best-setting cells of a group without a done trial that has a speedup.
NO_BEST = {
    "best_speedup": None,
    "best_speedup_ci": MISSING,
    "best_trial": None,
    "best_on": None,
    "best_note": None,
}


def best_cells(done: Sequence[StoredTrial], measured: SweepSamples | None) -> dict[str, Any]:
    """Return the summary's best-setting cells of a group's done trials.

    With ``measured`` (every trial's samples and the splits) the best trial is chosen on its
    dataset entry's dev prompts and measured on its test prompts
    (:func:`orchestrator.analysis.holdout.best_setting`); without a split for the entry, on the
    same prompts, and ``best_on`` says so. Without ``measured``: the largest stored speedup
    (decode-only where every trial has one), chosen and measured on the same prompts.
    """
    if measured is None:
        return _stored_best(done)
    samples = measured.samples
    candidates = {
        row.trial_id: Candidate(
            samples.get(row.trial_id, []),
            samples.get(row.trial_id if row.is_baseline else row.baseline_id or "", []),
        )
        for row in done
    }
    keys = {dataset_key(row) for row in done}
    split = measured.splits.get(next(iter(keys))) if len(keys) == 1 else None
    best = best_setting(candidates, split)
    if best is None:
        return NO_BEST
    ratio = best.test.ratio
    return {
        "best_speedup": best.test_speedup,
        "best_speedup_ci": MISSING
        if ratio is None
        else f"[{format_value(ratio.low)}, {format_value(ratio.high)}]",
        "best_trial": best.trial_id,
        "best_on": best.cell(),
        "best_note": best.note(),
    }


def _stored_best(done: Sequence[StoredTrial]) -> dict[str, Any]:
    """Return the best-setting cells from the trials' stored speedups (no samples at hand)."""
    figure = "decode_speedup" if all(row.decode_speedup is not None for row in done) else "speedup"
    best = max(
        (row for row in done if getattr(row, figure) is not None),
        key=lambda row: getattr(row, figure),
        default=None,
    )
    if best is None:
        return NO_BEST
    speed = "decode-only" if figure == "decode_speedup" else "end-to-end"
    return {
        "best_speedup": getattr(best, figure),
        "best_speedup_ci": interval_text(best, figure),
        "best_trial": best.trial_id,
        "best_on": "same",
        "best_note": f"best chosen and measured on the same prompts ({speed})",
    }


def interval_text(row: StoredTrial, figure: str) -> str:
    """Return a trial's stored 95% interval of ``figure`` as "[low, high]" ("-" when absent)."""
    low, high = getattr(row, f"{figure}_low"), getattr(row, f"{figure}_high")
    if low is None or high is None:
        return MISSING
    return f"[{format_value(float(low))}, {format_value(float(high))}]"


def trial_label(row: StoredTrial) -> str:
    """Return "id (policy params, max DL n, pair, KIND draft, dataset, temp t)" for messages
    (and ", batch B" when the batch size is not 1)."""
    params = format_params(row.params or {})
    batch = f", batch {row.batch_size}" if (row.batch_size or 1) != 1 else ""
    return (
        f"{row.trial_id} ({row.policy} {params}, max DL {row.max_draft_len}, "
        f"{row.pair}, {row.draft_kind} draft, {row.dataset}, "
        f"temp {format_value(row.temperature)}{batch})"
    )


def comparison_refusal(a: StoredTrial, b: StoredTrial, n_shared: int) -> list[str]:
    """Return why two trials cannot be compared: too few shared prompts, or no time on a side."""
    if n_shared < MIN_PROMPTS:
        what = "share no prompts" if n_shared == 0 else f"share only {n_shared} prompt(s)"
        why = f"no interval is shown ({too_few_prompts(n_shared)} measured by both)"
    else:
        what, why = f"share {n_shared} prompts", "but a trial's samples took no time"
    return [
        f"error: trials {a.trial_id} and {b.trial_id} {what}: {why}",
        f"  A: {trial_label(a)}",
        f"  B: {trial_label(b)}",
    ]


def family_header(family: Sequence[Comparison], measure: str = "end-to-end") -> list[str]:
    """Return the line that says how a family of comparisons (of ``measure`` tokens/s)
    controls its family-wise error."""
    m = sum(compared.ratio is not None for compared in family)
    level = next((c.ratio.confidence for c in family if c.ratio is not None), None)
    shown = f"intervals at {100 * level:.4g}% hold together" if level is not None else "none"
    return [
        f"{measure} tokens/s, Holm-adjusted over {m} comparisons (family-wise error 5%): "
        "verdicts from "
        f"Holm-adjusted p-values; {shown}",
        "",
    ]


#: What each source of a paired ratio's model error means (``metrics.paired_model_error``).
MODEL_ERROR_SOURCES = {
    "one side replayed": "a replayed side against a live one: its cost fit's out-of-sample error",
    "one fit": "two replayed sides of one cost fit: the error of a ratio of two of its "
    "projections, measured on its live checks of the same prompts",
    "one fit, its e": "two replayed sides of one cost fit whose live checks share no "
    "prompts: the fit's out-of-sample error",
    "two fits": "replayed sides of two cost fits: both fits' out-of-sample errors added",
}


def model_error_cell(model_error: ModelError | None) -> str:
    """Return a paired ratio's cost-model error in a table cell: "±2.9% (one fit)", "none
    (both live)" or "not measured (…)"."""
    if model_error is None:
        return "none (both live)"
    if model_error.error is None:
        return f"not measured ({model_error.source})"
    return f"±{abs(model_error.error):.1%} ({model_error.source})"


def model_error_note(model_error: ModelError | None) -> list[str]:
    """Return ``compare``'s note on the cost-model error a ratio includes ([] with none)."""
    if model_error is None:
        return []
    why = MODEL_ERROR_SOURCES[model_error.source]
    if model_error.error is None:
        return [f"note: a side is replayed and its cost model's error is not measured ({why})"]
    return [
        f"note: the interval and p include the cost model's error, ±{abs(model_error.error):.1%} "
        f"({why})"
    ]


def comparison_lines(
    a: StoredTrial,
    b: StoredTrial,
    compared: Comparison,
    n_a: int,
    n_b: int,
    measure: str = "end-to-end",
) -> list[str]:
    """Return the ``compare`` command's output lines for one paired comparison of ``measure``
    tokens/s ("decode-only" or "end-to-end")."""
    lines = [f"A: {trial_label(a)}", f"B: {trial_label(b)}"]
    ratio = compared.ratio
    if ratio is None:
        return [*lines, f"no interval: {too_few_prompts(compared.n_prompts)} shared", ""]
    p_name = "Holm-adjusted p" if compared.family_size > 1 else "p"
    lines += [
        f"{measure} tokens/s A / B = {ratio.estimate:.4g}, {100 * ratio.confidence:.4g}% CI "
        f"[{ratio.low:.4g}, {ratio.high:.4g}], n = {ratio.n} "
        f"(paired t interval over {compared.n_prompts} shared prompts); "
        f"{p_name} = {compared.adjusted_p:.3g}",
        f"verdict: A is {compared.verdict} than B ({measure})"
        if compared.verdict != "not distinguishable"
        else f"verdict: not distinguishable ({measure}: the interval contains 1)",
    ]
    lines += model_error_note(compared.model_error)
    if compared.n_prompts < max(n_a, n_b):
        lines.append(
            f"note: A has {n_a} prompts and B {n_b}; only the {compared.n_prompts} prompts "
            "both measured are compared"
        )
    return lines if compared.family_size == 1 else [*lines, ""]


def status_counts(rows: Iterable[StoredTrial]) -> dict[str, int]:
    """Return how many trials there are (``planned``) and how many have each status.

    Exists for ``status``: a sweep's progress at a glance.
    """
    counts = {"planned": 0, "done": 0, "failed": 0, "pending": 0, "running": 0}
    for row in rows:
        counts["planned"] += 1
        counts[row.status] += 1
    return counts


def error_summary(error: str | None, limit: int = MAX_ERROR_CHARS) -> str:
    """Return the last non-empty line of a stored error (a traceback's message), shortened.

    Exists so a table of failed trials stays one line per trial.
    """
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return MISSING
    last = lines[-1]
    return last if len(last) <= limit else last[: limit - 3] + "..."


def failed_rows(rows: Iterable[StoredTrial]) -> list[dict[str, Any]]:
    """Return the failed trials among ``rows`` with their error's last line.

    Exists so ``status`` and ``submit`` can say which trials failed and why.
    """
    return [
        {
            **{key: getattr(row, key) for key in FAILED_COLUMNS if key != "error"},
            "error": error_summary(row.error),
        }
        for row in rows
        if row.status == "failed"
    ]


def training_job_rows(jobs: Iterable[StoredJob]) -> list[dict[str, Any]]:
    """Return the store's training jobs for ``status``: status, attempts, error's last line.

    Exists so ``status`` shows which jobs are pending (queued for resources), running, done
    or failed, next to the trials that wait for them.
    """
    return [
        {
            **{key: getattr(job, key) for key in TRAINING_JOB_STATUS_COLUMNS if key != "error"},
            "error": error_summary(job.error) if job.error else MISSING,
        }
        for job in jobs
    ]


def format_params(params: Mapping[str, Any]) -> str:
    """Return ``name=value`` pairs sorted by name (``-`` for none), for one-line trial listings."""
    if not params:
        return MISSING
    return ", ".join(f"{name}={format_value(params[name])}" for name in sorted(params))


def plan_group_rows(plan: Plan) -> list[dict[str, Any]]:
    """Return the plan's trial counts per pair × draft × dataset × temperature × policy.

    ``settings`` counts distinct parameter settings and ``max_draft_lens`` lists the caps.
    Exists for ``plan`` without ``--all``: the grid's shape without one line per trial.
    """
    groups: dict[tuple[str, ServedPair, str, float, str], list[Trial]] = {}
    for trial in plan.trials:
        key = (
            trial.pair,
            trial.served,
            trial.prompts.dataset,
            trial.sampling.temperature,
            trial.setting.policy,
        )
        groups.setdefault(key, []).append(trial)
    result = []
    for (pair, served, dataset, temperature, policy), members in groups.items():
        settings = {json.dumps(m.setting.params_dict, sort_keys=True) for m in members}
        caps = sorted({member.setting.max_draft_len for member in members})
        result.append(
            {
                "pair": pair,
                "draft_kind": served.draft_kind,
                "draft": served.draft_label,
                "dataset": dataset,
                "temperature": temperature,
                "policy": policy,
                "trials": len(members),
                "settings": len(settings),
                "max_draft_lens": ", ".join(str(cap) for cap in caps),
            }
        )
    return result


def plan_trial_rows(plan: Plan) -> list[dict[str, Any]]:
    """Return one row per planned trial (``plan --all``)."""
    return [
        {
            "trial_id": trial.trial_id,
            "pair": trial.pair,
            "draft_kind": trial.served.draft_kind,
            "draft": trial.served.draft_label,
            "dataset": trial.prompts.dataset,
            "temperature": trial.sampling.temperature,
            "policy": trial.setting.policy,
            "params": format_params(trial.setting.params_dict),
            "max_draft_len": trial.setting.max_draft_len,
            "seed": trial.seed,
            "requires_jobs": ", ".join(trial.requires_jobs) or MISSING,
        }
        for trial in plan.trials
    ]


def job_rows(plan: Plan) -> list[dict[str, Any]]:
    """Return one row per planned training job."""
    return [{key: getattr(job, key) for key in JOB_COLUMNS} for job in plan.jobs]


def skipped_rows(plan: Plan) -> list[dict[str, Any]]:
    """Return one row per group of trials the planner skipped, with the reason."""
    return [
        {
            "pair": group.pair,
            "draft": group.draft,
            "dataset": group.dataset,
            "temperature": group.temperature,
            "seed": group.seed,
            "policy": group.policy,
            "trials": group.n_trials,
            "reason": group.reason,
        }
        for group in plan.skipped
    ]


def resource_rows(plan: Plan) -> list[dict[str, Any]]:
    """Return what each pair's worker group asks Ray for (``Plan.resources()``), one row each."""
    return [{key: getattr(res, key) for key in RESOURCE_COLUMNS} for res in plan.resources()]


def zoo_card_rows(cards: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return the key figures of each zoo model card: size, held-out losses and realism.

    ``cards`` maps a model name to its parsed ``model_card.json``. Held-out losses become one
    ``val_loss_<set>`` column per held-out set; drafts add their agreement with the target,
    entropy spread, cost ratio and static-K speedup on code (None for the target). Exists for
    ``zoo build``'s report.
    """
    rows = []
    for name, card in cards.items():
        realism = card.get("realism") or {}
        row = {"model": name, "role": card.get("role"), "parameters": card.get("parameters")}
        for held_out, loss in sorted((card.get("val_loss") or {}).items()):
            row[f"{VAL_LOSS_PREFIX}{held_out}"] = loss
        for key in ZOO_TRAILING_COLUMNS:
            row[key] = realism.get(key)
        rows.append(row)
    return rows


def zoo_columns(rows: Sequence[Row]) -> list[str]:
    """Return the columns of a zoo card table: fixed ones around every ``val_loss_*`` present."""
    losses = sorted({key for row in rows for key in row if key.startswith(VAL_LOSS_PREFIX)})
    return [*ZOO_LEADING_COLUMNS, *losses, *ZOO_TRAILING_COLUMNS]


def zoo_headers(columns: Sequence[str]) -> dict[str, str]:
    """Return the headers of a zoo card table: ``HEADERS`` plus ``val loss (code)`` and the like."""
    losses = {
        column: f"val loss ({column.removeprefix(VAL_LOSS_PREFIX)})"
        for column in columns
        if column.startswith(VAL_LOSS_PREFIX)
    }
    return {**HEADERS, **losses}


def export_records(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """Return ``rows`` with dict and list values encoded as JSON text (sorted keys).

    Exists because CSV and Parquet columns hold scalars: ``params``, ``config`` and ``metrics``
    are exported as JSON strings that ``json.loads`` turns back into the stored values.
    """
    return [
        {
            key: json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value
            for key, value in row.items()
        }
        for row in rows
    ]


#: The ``runs`` columns an export (and the dashboard) shows beside each trial, as ``run_<name>``.
PROVENANCE_FIELDS = (
    "commit",
    "dirty",
    "specsweep_version",
    "torch_version",
    "transformers_version",
    "ray_version",
    "deepspeed_version",
    "python_version",
    "cpu",
    "gpu_name",
    "gpu_driver",
    "gpu_count",
    "torch_threads",
    "created_at",
)


def with_provenance(rows: Iterable[StoredTrial], runs: Iterable[StoredRun]) -> list[dict[str, Any]]:
    """Return trials as dicts with their run's provenance as ``run_<field>`` columns (None if
    none)."""
    by_id = {run.id: run for run in runs}
    return [
        {
            **asdict(row),
            **{
                f"run_{name}": getattr(by_id[row.run_id], name) if row.run_id in by_id else None
                for name in PROVENANCE_FIELDS
            },
        }
        for row in rows
    ]


def unique_names(names: Sequence[str]) -> list[str]:
    """Return ``names`` with repeats suffixed ``_2``, ``_3``... so each keys its own column.

    Exists for ``query`` results, where ``SELECT a.x, b.x`` yields two columns named ``x``.
    """
    used: set[str] = set()
    result = []
    for name in names:
        candidate, count = name, 1
        while candidate in used:
            count += 1
            candidate = f"{name}_{count}"
        used.add(candidate)
        result.append(candidate)
    return result


def format_value(value: Any) -> str:
    """Return a cell's text: ``-`` for None, floats to 4 significant digits, others as str."""
    if value is None:
        return MISSING
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) < 1e4:
            return f"{value:.4g}"
        return f"{value:.0f}"
    return str(value)


def _is_number(value: Any) -> bool:
    """True for ints and floats (not bools): their cells are right-aligned."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def render_table(
    rows: Sequence[Row],
    columns: Sequence[str],
    title: str | None = None,
    formatter: Callable[[Any], str] = format_value,
    headers: Mapping[str, str] = HEADERS,
) -> Table:
    """Return a rich Table of ``rows`` restricted to ``columns``.

    A column's header is ``headers[column]`` when given, else the column name. Cells are plain
    text (no rich markup is interpreted, so ``pairs[0]`` prints as written); numeric columns
    are right-aligned.
    """
    table = Table(title=title, title_justify="left")
    for column in columns:
        numeric = any(_is_number(row.get(column)) for row in rows)
        table.add_column(
            headers.get(column, column), justify="right" if numeric else "left", overflow="fold"
        )
    for row in rows:
        table.add_row(*(Text(formatter(row.get(column))) for column in columns))
    return table


def cost_fit_rows(fits: Iterable[StoredCostFit]) -> list[dict[str, Any]]:
    """Return one row per stored cost fit (``Store.cost_fits``), costs in milliseconds.

    Exists for the ``fits`` command: each group's per-forward costs, the fits' R² and, for a
    replay sweep, its live check (share of live rounds replay reproduces, tokens/s error).
    """
    return [
        {
            **{key: getattr(fit, key) for key in FIT_COLUMNS if hasattr(fit, key)},
            "t_draft_ms": fit.t_draft * 1e3,
            "t_target_ms": fit.t_target * 1e3,
            "t_per_verified_ms": fit.t_per_verified * 1e3,
            "run_t_draft_ms": _ms(fit.run_t_draft),
            "run_t_target_ms": _ms(fit.run_t_target),
            "batch_size": fit_batch_size(fit),
        }
        for fit in fits
    ]


BATCH_TABLE_COLUMNS = (
    "pair",
    "dataset",
    "temperature",
    "batch_size",
    "step",
    "rows",
    "block",
    "ms",
)


def batch_table_rows(fits: Iterable[StoredCostFit]) -> list[dict[str, Any]]:
    """Return the measured cells of each batch cost table (a fit at batch size above 1): a draft
    step's and a verification's milliseconds by rows in the batch (and longest block)."""
    rows = []
    for fit in fits:
        if fit_batch_size(fit) == 1:
            continue
        model = fit.step_model or {}
        group = {"pair": fit.pair, "dataset": fit.dataset, "temperature": fit.temperature}
        group["batch_size"] = fit_batch_size(fit)
        for cell_rows, seconds in model.get("draft_step", ()):
            rows.append({**group, "step": "draft", "rows": cell_rows, "block": None})
            rows[-1]["ms"] = seconds * 1e3
        for cell_rows, block, seconds in model.get("verify", ()):
            rows.append({**group, "step": "verify", "rows": cell_rows, "block": block})
            rows[-1]["ms"] = seconds * 1e3
    return rows


def _ms(seconds: float | None) -> float | None:
    """Return seconds in milliseconds (None stays None)."""
    return None if seconds is None else seconds * 1e3


def fit_seconds(fit: StoredCostFit, row: StoredTrial, which: str | None = None) -> float | None:
    """Return a trial's seconds predicted by its group's fit ``which`` ("round" or "run";
    default: the fit's ``projection_fit``).

    Also takes the ``itertuples`` rows of cost-fit and trial DataFrames (the dashboard's).
    """
    counts = TrialCounts.from_row(row)
    if (which or fit.projection_fit) == "run":
        return fit.run_t_draft * counts.draft_forwards + fit.run_t_target * counts.rounds
    round_fit = RoundCostFit(
        **{key: getattr(fit, key) for key in ("t_draft", "t_target", "t_per_verified")},
        **{key: getattr(fit, key) for key in ("r2_draft", "r2_verify", "r2_round", "n_rounds")},
    )
    return round_fit_seconds(round_fit, fit.overhead_seconds, counts)


def fit_batch_size(fit: Any) -> int:
    """Return the batch size a stored fit was made at: a batch cost table's, else 1."""
    model = getattr(fit, "step_model", None)
    if isinstance(model, dict) and model.get("kind") == "batch":
        return int(model["batch_size"])
    return 1


def trial_fit(fits: Iterable[Any], fit_group: str) -> Any | None:
    """Return the stored fit of a trial's cost-fit group (``record_fit_group_key`` of its
    record: its draft kind and batch size included, a lookup's fit is not its worker pair's
    draft model's), None when none was stored."""
    return next((fit for fit in fits if fit.group_key == fit_group), None)


def fit_tokens_per_s(fits: Iterable[StoredCostFit], row: StoredTrial) -> float | None:
    """Return a done trial's tokens/s as its group's better fit projects it (None without, and
    at a batch size above 1, where only replay's queue simulation prices a trial's rounds)."""
    fit = trial_fit(fits, record_fit_group_key(row.config))
    if fit is None or fit_batch_size(fit) > 1:
        return None
    seconds = fit_seconds(fit, row)
    return (row.generated_tokens or 0) / seconds if seconds else None


def profile_column(profile: HardwareProfile, what: str) -> str:
    """Return the column name of a profile's projected ``what`` (tokens_per_s or speedup)."""
    return f"{profile.name} {what}"


def profile_projection_rows(
    rows: Iterable[StoredTrial],
    profiles: Sequence[HardwareProfile],
    fits: Sequence[StoredCostFit] = (),
) -> list[dict[str, Any]]:
    """Return one row per done trial with its tokens/s and speedup projected on ``profiles``.

    ``fit_tokens_per_s`` is the trial's tokens/s as its group's stored fit projects it, with
    the fit that predicts the group's trial seconds better (``projection_fit``).

    The projection uses the trial's hardware-independent counts (draft forwards, target calls
    = rounds, generated tokens), so live and replayed trials project alike; a trial without
    rounds (none recorded) has no projection, nor has one at a batch size above 1 (the
    profiles price one sequence's forwards).
    """
    result = []
    for row in rows:
        if row.status != "done":
            continue
        projected = {key: getattr(row, key, None) for key in PROJECTION_LEADING_COLUMNS}
        projected["fit_tokens_per_s"] = fit_tokens_per_s(fits, row)
        for profile in profiles:
            try:
                if (row.batch_size or 1) > 1:
                    raise CostModelError("a profile's costs are one sequence's")
                projection = project_onto_profile(
                    profile,
                    row.n_draft_forwards or 0,
                    row.n_rounds or 0,
                    row.generated_tokens or 0,
                )
            except CostModelError:
                projection = None
            projected[profile_column(profile, "tokens_per_s")] = (
                projection.tokens_per_s if projection else None
            )
            projected[profile_column(profile, "speedup")] = (
                projection.speedup if projection else None
            )
        result.append(projected)
    return result
