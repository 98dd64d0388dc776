"""``status``: each stored sweep's trial counts, failures and training jobs."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from orchestrator.analysis import report
from orchestrator.cli.common import (
    EXIT_OK,
    PROG,
    add_command,
    opened_store,
    print_failures,
    print_table,
    require_sweep,
)
from orchestrator.store import (
    display_url,
)


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``status``."""
    command = add_command(
        commands,
        "status",
        handle,
        "show each stored sweep's trial counts by status and its failed trials' errors",
        "'running' counts trials a runner has started and not finished; after a crash they stay\n"
        "so until the sweep is resubmitted.\n\n"
        "examples:\n"
        f"  {PROG} status\n"
        f"  {PROG} status demo\n"
        f"  {PROG} --db sqlite:///other.db status",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP", nargs="?", help="a sweep name (default: all)")


def handle(args: argparse.Namespace, console: Console) -> int:
    """``status``: trial counts by status per sweep, the failed trials' errors, and the
    training jobs (pending while Ray queues them, running once a rank starts, done, failed)."""
    with opened_store(args.db, read_only=True) as store:
        if args.sweep is not None:
            require_sweep(store, args.sweep)
            names = [args.sweep]
        else:
            names = store.sweep_names()
        frames = {name: store.trials(name) for name in names}
        jobs = store.training_jobs()
    if not frames:
        console.print(f"no sweeps in {display_url(args.db)} yet", markup=False)
        return EXIT_OK
    counts = [{"sweep": name, **report.status_counts(rows)} for name, rows in frames.items()]
    print_table(console, counts, report.STATUS_COLUMNS, f"sweeps in {display_url(args.db)}")
    for name, rows in frames.items():
        print_failures(console, rows, name)
    if jobs:
        rows = report.training_job_rows(jobs)
        print_table(console, rows, report.TRAINING_JOB_STATUS_COLUMNS, "training jobs")
    return EXIT_OK
