"""``refresh``: recompute the statistics of a sweep's stored trials."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from orchestrator.cli.common import (
    EXIT_OK,
    PROG,
    add_command,
    opened_store,
    require_sweep,
)


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``refresh``."""
    command = add_command(
        commands,
        "refresh",
        handle,
        "recompute a sweep's intervals, per-sample speedups and per-position acceptance",
        "From the stored samples (and rounds, for per-position acceptance): for trials stored\n"
        "before these figures were recorded. Measures nothing; writes to the store.\n\n"
        "examples:\n"
        f"  {PROG} refresh demo --db sqlite:///docs/demo-results.db",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP", help="the sweep name")


def handle(args: argparse.Namespace, console: Console) -> int:
    """``refresh``: recompute the statistics of a sweep's stored trials."""
    with opened_store(args.db, read_only=False) as store:
        require_sweep(store, args.sweep)
        count = store.refresh_statistics(args.sweep)
    console.print(f"refreshed the statistics of {count} done trials of {args.sweep}", markup=False)
    return EXIT_OK
