"""``report``: a sweep's reproduction report by one rule, as markdown."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.cli.common import (
    EXIT_OK,
    PROG,
    UserError,
    add_command,
    load_sweep_file,
    opened_store,
    require_sweep,
)


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``report``."""
    command = add_command(
        commands,
        "report",
        handle,
        "write a sweep's reproduction report: every claim a paired, Holm-adjusted comparison",
        "Every claim compares, in one cell (pair, draft kind, dataset, sampling, seed), a\n"
        "policy's best setting with the best static K, each chosen on the dev prompts\n"
        "(datasets[].holdout) and measured on the test prompts: A's tokens/s over B's on the\n"
        "same prompts, a t interval on the log ratio with the jackknife standard error (as\n"
        "compare), Holm over all claims of the report; a claim with a replayed side is\n"
        "widened by its cost model's measured error (as compare). The static grid must\n"
        "include K = 1 and 2. The sweep's report section declares further claims of the same\n"
        "family: policy against policy (report.policies) and draft against draft on speed and\n"
        "acceptance (report.drafts). Each claim names its n (test prompts x repeats x new\n"
        "tokens). Reads the store; measures nothing.\n\n"
        "examples:\n"
        f"  {PROG} report --sweep sweeps/reproduce.yaml --db sqlite:///results.db\n"
        f"  {PROG} report --sweep sweeps/reproduce.yaml --out reproduction.md",
        db,
    )
    command.add_argument("--sweep", required=True, metavar="FILE", help="the sweep file")
    command.add_argument(
        "--out", metavar="FILE.md", help="write the markdown here (default: print)"
    )


def handle(args: argparse.Namespace, console: Console) -> int:
    """``report``: the reproduction report of the sweep in ``--sweep`` from the store."""
    from orchestrator.analysis.reproduction import (
        ReproductionError,
        report_markdown,
        reproduction_report,
    )
    from orchestrator.sweep.planner import plan_sweep

    spec = load_sweep_file(args.sweep)
    planned = {trial.trial_id for trial in plan_sweep(spec).trials}
    with opened_store(args.db, read_only=True) as store:
        require_sweep(store, spec.name)
        rows = [row for row in store.trials(spec.name) if row.trial_id in planned]
        samples = store.trials_sample_speeds(row.trial_id for row in rows if row.status == "done")
        fits = store.side_fits(row for row in rows if row.status == "done")
    try:
        text = report_markdown(reproduction_report(spec, rows, samples, fits))
    except ReproductionError as error:
        raise UserError(f"error: {args.sweep}: {error}") from None
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        console.print(f"wrote the reproduction report of {spec.name} to {args.out}", markup=False)
    else:
        console.print(text, markup=False, end="", soft_wrap=True, highlight=False)
    return EXIT_OK
