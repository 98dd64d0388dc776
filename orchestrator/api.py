"""The Python entry point: run a sweep, and read a sweep's results as a DataFrame.

``run_sweep`` does what ``python -m orchestrator submit`` does (the CLI calls it): load the
sweep file, plan it, preflight models and datasets, register the sweep in the store and run
the trials the store does not have yet::

    from orchestrator.api import load_results, run_sweep

    result = run_sweep("sweeps/demo.yaml", db="sqlite:///results.db")
    print(result.summary.ran, result.summary.failed)
    frame = result.to_dataframe()  # one row per trial of the sweep
    same = load_results("sqlite:///results.db", "demo")
    for schedule in draft_schedules("sqlite:///results.db", "batches"):
        print(schedule_snippet(schedule, "vllm"))  # or "trtllm"

The runner (and with it Ray) is imported when a sweep is prepared, not when this module is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from orchestrator.analysis import draft_schedule
from orchestrator.analysis.draft_schedule import DraftSchedule, schedule_snippet
from orchestrator.store import Store, open_store
from orchestrator.sweep.planner import Plan, plan_sweep
from orchestrator.sweep.spec import SweepSpec, load_sweep
from workers.accelerator_probe import name_cpu_accelerator_when_no_cuda

if TYPE_CHECKING:
    from orchestrator.run.preflight import PreparedInputs
    from orchestrator.run.runner import SweepSummary

__all__ = [
    "DraftSchedule",
    "PreparedSweep",
    "SweepResult",
    "draft_schedules",
    "load_results",
    "prepare",
    "run_sweep",
    "schedule_snippet",
]


@dataclass(frozen=True)
class PreparedSweep:
    """A sweep checked and ready to run: its spec, plan, preflighted inputs and source text."""

    spec: SweepSpec
    plan: Plan
    inputs: PreparedInputs = field(repr=False)
    spec_yaml: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class SweepResult:
    """What a call of :func:`run_sweep` did (``summary``) and every trial of the sweep."""

    summary: SweepSummary
    trials: pd.DataFrame = field(repr=False)

    def to_dataframe(self) -> pd.DataFrame:
        """Return every trial of the sweep (all statuses), one row each, in plan order."""
        return self.trials.copy()

    @property
    def failed_trials(self) -> pd.DataFrame:
        """Return the sweep's failed trials with their errors (``error`` column)."""
        return self.trials[self.trials["status"] == "failed"].reset_index(drop=True)


def prepare(
    sweep: SweepSpec | str | Path, plan: Plan | None = None, spec_yaml: str | None = None
) -> PreparedSweep:
    """Load (when given a path), plan and preflight a sweep; nothing is run or stored.

    Raises :class:`orchestrator.sweep.spec.SweepError` for an invalid sweep file and
    :class:`orchestrator.run.preflight.PreflightError` listing every model or dataset problem.
    """
    from orchestrator.run import runner

    if isinstance(sweep, SweepSpec):
        spec = sweep
    else:
        spec = load_sweep(sweep)
        spec_yaml = spec_yaml or Path(sweep).read_text(encoding="utf-8")
    plan = plan or plan_sweep(spec)
    return PreparedSweep(spec, plan, runner.preflight(spec, plan), spec_yaml)


def run_sweep(
    sweep: SweepSpec | str | Path | PreparedSweep,
    db: str | Store | None = None,
    *,
    address: str | None = None,
    retries: int | None = None,
    progress: bool = True,
) -> SweepResult:
    """Run a sweep (a file, a spec, or one :func:`prepare` returned) into the store ``db``.

    ``db`` is a database URL (default ``$SPECSWEEP_DB`` or ``sqlite:///results.db``) or an open
    :class:`Store`. Trials already done in the store are skipped; when all are, nothing starts.
    ``address`` is the Ray cluster (default ``$RAY_ADDRESS``, else a local Ray), ``retries``
    overrides the sweep's ``execution.retries``, ``progress`` shows the progress bar.
    """
    from orchestrator.run import runner

    name_cpu_accelerator_when_no_cuda()
    prepared = sweep if isinstance(sweep, PreparedSweep) else prepare(sweep)
    options = runner.RunOptions(address=address, retries=retries, progress=progress)
    if isinstance(db, Store):
        return _run_prepared(prepared, db, options)
    with open_store(db) as store:
        return _run_prepared(prepared, store, options)


def load_results(db: str | None, sweep: str) -> pd.DataFrame:
    """Return the trials of the stored sweep ``sweep`` (one row each, in plan order).

    Opens the store read-only; raises LookupError naming the stored sweeps when there is none
    called ``sweep``.
    """
    with open_store(db, read_only=True) as store:
        names = store.sweep_names()
        if sweep not in names:
            raise LookupError(f"no sweep named {sweep!r} (stored: {', '.join(names) or 'none'})")
        return store.trials_dataframe(sweep)


def draft_schedules(db: str | None, sweep: str | None = None) -> list[DraftSchedule]:
    """Return the best static K per measured batch size of the stored sweep ``sweep`` (of the
    whole store when None), one schedule per pair, dataset and temperature
    (:mod:`orchestrator.analysis.draft_schedule`; :func:`schedule_snippet` writes one for vLLM
    or TensorRT-LLM). Raises LookupError when there is no sweep called ``sweep``."""
    with open_store(db, read_only=True) as store:
        names = store.sweep_names()
        if sweep is not None and sweep not in names:
            raise LookupError(f"no sweep named {sweep!r} (stored: {', '.join(names) or 'none'})")
        return draft_schedule.draft_schedules(store.trials(sweep))


def _run_prepared(prepared: PreparedSweep, store: Store, options: object) -> SweepResult:
    """Register the sweep in ``store``, run what it lacks, return the summary and trials."""
    from orchestrator.run import runner

    spec, plan = prepared.spec, prepared.plan
    store.register_sweep(spec, plan, spec_yaml=prepared.spec_yaml)
    done = store.completed_trial_ids(trial.trial_id for trial in plan.trials)
    if len(done) == len(plan.trials):
        summary = _all_done_summary(store, plan, done)
    else:
        summary = runner.execute_plan(spec, plan, store, options, inputs=prepared.inputs)
    return SweepResult(summary, store.trials_dataframe(spec.name))


def _all_done_summary(store: Store, plan: Plan, done: set[str]) -> SweepSummary:
    """Return the summary of a run with nothing to do, without starting Ray.

    Notes the done trials measured under another provenance than this machine's.
    """
    from orchestrator.run import runner
    from orchestrator.run.provenance import collect_provenance, stored_provenance_notes

    planned = len(plan.trials)
    summary = runner.SweepSummary(
        sweep=plan.sweep, planned=planned, already_done=len(done), ran=0, failed=0, seconds=0.0
    )
    summary.provenance_notes = stored_provenance_notes(store, done, collect_provenance())
    return summary
