"""``submit``: validate, plan, preflight and run a sweep, then report what ran."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from orchestrator.analysis import report
from orchestrator.analysis.baseline_agreement import baseline_disagreements
from orchestrator.analysis.costs import estimate
from orchestrator.analysis.costs.estimate import SweepEstimate
from orchestrator.analysis.holdout import SweepSamples, holdout_splits
from orchestrator.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TRIALS_FAILED,
    PROG,
    UserError,
    add_command,
    load_sweep_file,
    non_negative_int,
    opened_store,
    print_failures,
    print_table,
)
from orchestrator.cli.estimates import (
    add_estimate_options,
    print_estimate,
    sweep_estimate,
)
from orchestrator.cli.plan import print_plan, replay_line
from orchestrator.store import (
    StoredTrial,
    display_url,
)
from orchestrator.sweep.planner import Plan, plan_sweep
from orchestrator.sweep.spec import SweepSpec

if TYPE_CHECKING:
    from orchestrator.run.runner import SweepSummary


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``submit``."""
    command = add_command(
        commands,
        "submit",
        handle,
        "validate, plan and run a sweep on Ray, storing each trial as it ends",
        "Trials already done in the store are skipped, so resubmitting a sweep resumes it and\n"
        "retries its failed trials. Exit codes: 0 all trials done, 1 some trials failed,\n"
        "2 invalid sweep file or failed preflight (nothing run, store untouched).\n\n"
        "examples:\n"
        f"  {PROG} submit sweeps/demo.yaml\n"
        f"  {PROG} submit sweeps/demo.yaml --dry-run\n"
        f"  {PROG} --db postgresql://user@host/specsweep submit sweeps/big.yaml "
        "--address auto --retries 3",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file")
    command.add_argument(
        "--dry-run", action="store_true", help="print the plan (like 'plan') and run nothing"
    )
    command.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)",
    )
    command.add_argument(
        "--retries",
        type=non_negative_int,
        metavar="N",
        help="retries per failed trial (default: the sweep's execution.retries)",
    )
    command.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_estimate_options(command)
    command.add_argument(
        "--confirm-above",
        type=float,
        default=24.0,
        metavar="HOURS",
        help="ask before running when the estimated wall time exceeds HOURS (default: 24)",
    )
    command.add_argument(
        "--yes", action="store_true", help="run without asking, whatever the estimate"
    )


def _confirm_estimate(args: argparse.Namespace, result: SweepEstimate) -> bool:
    """Return whether to run: below ``--confirm-above``, with ``--yes``, or a TTY's yes.

    Raises UserError naming ``--yes`` when the estimate is above the threshold and stdin is not
    interactive.
    """
    hours = result.wall_seconds_upper / estimate.SECONDS_PER_HOUR
    if args.yes or hours <= args.confirm_above:
        return True
    if not sys.stdin.isatty():
        raise UserError(
            [
                f"error: {args.sweep} is estimated at up to {hours:,.1f} h of wall time, above "
                f"--confirm-above {args.confirm_above:g} h; pass --yes to run it anyway"
            ]
        )
    answer = input(f"estimated up to {hours:,.1f} h of wall time; run it? [y/N] ")
    return answer.strip().lower() in {"y", "yes"}


def _estimate_and_confirm(
    args: argparse.Namespace, console: Console, spec: SweepSpec, plan: Plan
) -> bool:
    """Print the sweep's estimate and return whether to run (:func:`_confirm_estimate`).

    A sweep that cannot be estimated (a cluster without GPUs, such as a CPU-only Ray cluster)
    runs: the estimate is a warning, not a gate.
    """
    try:
        result = sweep_estimate(args, spec, plan, local=True)
    except UserError as error:
        reason = "; ".join(line.removeprefix("error: ") for line in error.lines)
        console.print(f"no estimate ({reason}): running without one", markup=False)
        return True
    print_estimate(console, result)
    return _confirm_estimate(args, result)


def handle(args: argparse.Namespace, console: Console) -> int:
    """``submit``: validate, plan, preflight, register and run the sweep (``api.run_sweep``)."""
    spec = load_sweep_file(args.sweep)
    plan = plan_sweep(spec)
    if args.dry_run:
        print_plan(console, plan, all_trials=False)
        console.print("dry run: nothing was run and the store was not opened")
        return EXIT_OK
    from orchestrator import api
    from orchestrator.run import runner
    from orchestrator.run.driver_lease import LeaseSettingError, lease_timing

    try:
        lease_timing()
    except LeaseSettingError as error:
        raise UserError(f"error: {error}") from None
    spec_yaml = Path(args.sweep).read_text(encoding="utf-8")
    try:
        prepared = api.prepare(spec, plan, spec_yaml=spec_yaml)
    except runner.PreflightError as error:
        raise UserError(
            [
                f"error: preflight failed for {args.sweep}; nothing was run:",
                *(f"  {problem}" for problem in error.problems),
            ]
        ) from None
    if line := replay_line(plan):
        console.print(line, markup=False)
    # After preflight: the estimate reads stored fits, and a failed preflight leaves the
    # database's files exactly as they were (a SQLite reader leaves -wal/-shm files behind).
    if not _estimate_and_confirm(args, console, spec, plan):
        console.print("not run: nothing was written to the store")
        return EXIT_OK
    shown = display_url(args.db)
    with opened_store(args.db, read_only=False) as store:
        try:
            result = api.run_sweep(
                prepared,
                store,
                address=args.address,
                retries=args.retries,
                progress=not args.no_progress,
            )
        except KeyboardInterrupt:
            print(
                f"interrupted: finished trials are stored in {shown}; resubmit to continue "
                f"({PROG} submit {args.sweep})",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        rows = store.trials(spec.name)
        measured = SweepSamples(
            store.trials_sample_speeds(row.trial_id for row in rows), holdout_splits(spec)
        )
    return report_run(console, result.summary, rows, args.sweep, shown, measured)


def report_run(
    console: Console,
    summary: SweepSummary,
    rows: Sequence[StoredTrial],
    sweep_file: str,
    shown_url: str,
    measured: SweepSamples | None = None,
) -> int:
    """Print the end-of-run table, the one-line summary and any failures; return the exit code.

    ``measured``: the trials' samples and the sweep's dev/test splits, for the best settings
    (without it, the best stored speedups, chosen and measured on the same prompts).
    """
    _print_results(console, rows, summary.sweep, measured)
    for disagreement in baseline_disagreements(rows):
        console.print(disagreement.line(), markup=False)
    for line in getattr(summary, "provenance_notes", []):
        console.print(line, markup=False)
    if summary.ran == 0 and summary.already_done == summary.planned:
        console.print(_nothing_to_run(summary.planned, summary.sweep, shown_url), markup=False)
        return EXIT_OK
    jobs = (
        f", training jobs: {summary.jobs_trained} trained, {summary.jobs_reused} reused"
        if summary.jobs_trained or summary.jobs_reused
        else ""
    )
    others = getattr(summary, "finished_by_others", 0)
    elsewhere = f", {others} finished by another driver" if others else ""
    console.print(
        f"sweep {summary.sweep}: {summary.planned} trials planned, {summary.already_done} "
        f"already done, {summary.ran} ran{elsewhere}, {summary.failed} failed in "
        f"{summary.seconds:.1f} s{jobs} (store: {shown_url})",
        markup=False,
    )
    for line in _shard_lines(summary):
        console.print(line, markup=False)
    for failure in summary.job_failures:
        console.print(failure, markup=False)
    for line in _fit_lines(summary):
        console.print(line, markup=False)
    if not summary.failed:
        return EXIT_OK
    print_failures(console, rows, summary.sweep)
    console.print(
        f"{summary.failed} trial{'s' * (summary.failed != 1)} failed; to retry them, "
        f"resubmit (done trials are skipped): {PROG} submit {sweep_file}",
        markup=False,
    )
    return EXIT_TRIALS_FAILED


def _fit_lines(summary: SweepSummary) -> list[str]:
    """Return the run's lines about traces, cost fits and replay cross-checks.

    Read with defaults, so a summary from an older runner (or a test's stand-in) prints none.
    """
    recorded = getattr(summary, "traces_recorded", 0)
    reused = getattr(summary, "traces_reused", 0)
    lines = [f"traces: {recorded} groups recorded, {reused} reused"] if recorded or reused else []
    return [*lines, *getattr(summary, "fit_notes", []), *getattr(summary, "cross_checks", [])]


def _shard_lines(summary: SweepSummary) -> list[str]:
    """Return the run's line about its live shards: how many it ran, how many another driver
    ran at the same time, how many it took over from a driver that stopped.

    Read with defaults, so a summary without shard counts (a test's stand-in) prints none.
    """
    shards = getattr(summary, "shards", None)
    if shards is None or not shards.left:
        return []
    line = f"ran {shards.ran} of the {shards.left} shard{'s' * (shards.left != 1)} left to run"
    if shards.by_others:
        verb = "was" if shards.by_others == 1 else "were"
        line += f"; {shards.by_others} {verb} run by {_drivers(shards.others)} at the same time"
    if shards.taken_over:
        line += (
            f"; {shards.taken_over} taken over from {_drivers(shards.stopped)}, which stopped "
            "(its lease lapsed or was released)"
        )
    return [line]


def _drivers(names: Sequence[str]) -> str:
    """Return 'another driver (host:pid)' or 'other drivers (host:pid, host:pid)'."""
    shown = ", ".join(names) or "host:pid unknown"
    return f"{'other drivers' if len(names) > 1 else 'another driver'} ({shown})"


def _nothing_to_run(n_trials: int, sweep: str, shown_url: str) -> str:
    """Return the message for a submission whose trials are all done already."""
    return f"nothing to run: all {n_trials} trials of sweep {sweep} are already in DB ({shown_url})"


def _print_results(
    console: Console,
    rows: Sequence[StoredTrial],
    sweep: str,
    measured: SweepSamples | None,
) -> None:
    """Print the end-of-run summary table of a sweep's trial rows, then how its best settings
    were chosen."""
    group, columns = report.summary_layout(rows)
    summary = report.summary_rows(rows, group, measured=measured)
    print_table(
        console,
        summary,
        columns,
        f"sweep {sweep}: means over done trials (speedups vs the AR baseline; decode-only "
        "excludes prefill, e2e includes it)",
    )
    for note in dict.fromkeys(row["best_note"] for row in summary if row["best_note"]):
        console.print(f"best speedup: {note}", markup=False)
