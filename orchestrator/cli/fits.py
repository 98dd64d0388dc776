"""``fits``: a sweep's stored cost fits and its trials projected on hardware profiles."""

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
    print_table,
    require_sweep,
)


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``fits``."""
    from orchestrator.analysis.costs.model import HARDWARE_PROFILES

    command = add_command(
        commands,
        "fits",
        handle,
        "show a sweep's cost-model fits and each trial's tokens/s projected on hardware profiles",
        "A fit per trial group (pair, dataset, temperature, output length) over its live rounds:\n"
        "draft seconds = t_draft x draft forwards, verify seconds = t_target + t/token x drafted.\n"
        "Beside it the run-level fit (SpecDec++): trial seconds = t_draft x N_draft + t_target x\n"
        "N_target over the group's trials; both are scored on trial seconds (R², relative error)\n"
        "and 'tokens/s by fit' projects each trial with the better one.\n"
        "Projections use a trial's counts: tokens / (t_draft x N_draft + t_target x N_target).\n\n"
        "examples:\n"
        f"  {PROG} fits replay_demo\n"
        f"  {PROG} fits demo --profile specdecpp-70b-7b-2xa100",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP", help="the sweep name")
    command.add_argument(
        "--profile",
        action="append",
        choices=sorted(HARDWARE_PROFILES),
        help="hardware profile to project onto (repeatable; default: all)",
    )


def handle(args: argparse.Namespace, console: Console) -> int:
    """``fits``: the sweep's stored cost fits and its trials' projections on hardware profiles."""
    from orchestrator.analysis.costs.model import HARDWARE_PROFILES

    with opened_store(args.db, read_only=True) as store:
        require_sweep(store, args.sweep)
        fits = store.cost_fits(args.sweep)
        rows = store.trials(args.sweep)
    if fits:
        print_table(
            console, report.cost_fit_rows(fits), report.FIT_COLUMNS, f"cost fits of {args.sweep}"
        )
    else:
        console.print(
            f"no cost fits stored for sweep {args.sweep}: it ran with record_rounds: false, its "
            "rounds could not identify the costs, or it ran before fits were stored",
            markup=False,
        )
    cells = report.batch_table_rows(fits)
    if cells:
        title = (
            f"cost tables of {args.sweep} at batch sizes above 1: measured milliseconds of a "
            "draft step and of a verification by rows in the batch and longest block (cells "
            "not measured come from the table's line and plane; replay prices a trial's queue "
            "with them, so its trials have no per-trial projection below)"
        )
        print_table(console, cells, report.BATCH_TABLE_COLUMNS, title)
    profiles = [HARDWARE_PROFILES[name] for name in args.profile or sorted(HARDWARE_PROFILES)]
    projected = report.profile_projection_rows(rows, profiles, fits)
    columns = [
        *report.PROJECTION_LEADING_COLUMNS,
        *(report.profile_column(p, what) for p in profiles for what in ("tokens_per_s", "speedup")),
    ]
    title = (
        f"trials of {args.sweep}: tokens/s here (mode replay: projected by the group's fit), "
        "by the group's better fit, and projected on hardware profiles"
    )
    print_table(console, projected, columns, title)
    return EXIT_OK
