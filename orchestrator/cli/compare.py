"""``compare``: two done trials' tokens/s ratio on their shared prompts, with its verdict."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from orchestrator.analysis import report
from orchestrator.cli.common import (
    EXIT_OK,
    PROG,
    UserError,
    add_command,
    opened_store,
)


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``compare``."""
    command = add_command(
        commands,
        "compare",
        handle,
        "compare two done trials on their shared prompts: tokens/s ratio, interval, verdict",
        "The ratio is A's tokens/s over B's on the shared prompts; its interval is a seeded\n"
        "bootstrap over those prompts, resampling the same prompts for both trials (paired).\n"
        "Verdict: faster (interval above 1), slower (below 1), or not distinguishable.\n\n"
        "examples:\n"
        f"  {PROG} compare 3f2a9c01d4e5b6a7 9e8d7c6b5a4f3e2d\n"
        f'  {PROG} query "SELECT trial_id, policy, speedup FROM trials"  # find trial ids',
        db,
    )
    command.add_argument("trial_a", metavar="TRIAL_A", help="trial id (the numerator)")
    command.add_argument("trial_b", metavar="TRIAL_B", help="trial id (the denominator)")
    command.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")


def handle(args: argparse.Namespace, console: Console) -> int:
    """``compare``: A's tokens/s over B's on their shared prompts, with interval and verdict."""
    from orchestrator.analysis.pairing import paired_ratio

    with opened_store(args.db, read_only=True) as store:
        rows = {row.trial_id: row for row in store.trial_rows([args.trial_a, args.trial_b])}
        for trial_id in (args.trial_a, args.trial_b):
            if trial_id not in rows:
                raise UserError(f"error: no trial {trial_id!r} in the store")
            if rows[trial_id].status != "done":
                raise UserError(f"error: trial {trial_id} is {rows[trial_id].status}, not done")
        samples_a = store.sample_speeds(args.trial_a)
        samples_b = store.sample_speeds(args.trial_b)
    compared = paired_ratio(samples_a, samples_b, seed=args.seed)
    row_a, row_b = rows[args.trial_a], rows[args.trial_b]
    if compared.ratio is None:
        raise UserError(report.comparison_refusal(row_a, row_b, compared.n_prompts))
    for line in report.comparison_lines(row_a, row_b, compared, len(samples_a), len(samples_b)):
        console.print(line, markup=False)
    return EXIT_OK
