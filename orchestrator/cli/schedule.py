"""``schedule``: the best static K per batch size a sweep measured, as a serving engine's
draft-length schedule (``orchestrator.analysis.draft_schedule``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.analysis import report
from orchestrator.cli.common import (
    EXIT_OK,
    PROG,
    UserError,
    add_command,
    opened_store,
    print_table,
    require_sweep,
)

SCHEDULE_COLUMNS = (
    "batch_size",
    "draft_len",
    "best_speedup",
    "best_speedup_ci",
    "figure",
    "best_trial",
)


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``schedule``."""
    from orchestrator.analysis.draft_schedule import FORMATS

    command = add_command(
        commands,
        "schedule",
        handle,
        "write the best static draft length per measured batch size as a vLLM or TensorRT-LLM "
        "schedule",
        "For each pair, dataset and temperature, and each batch size the sweep measured\n"
        "(batch_sizes), the static trial with the largest decode-only speedup over the AR\n"
        "baseline at that batch size gives K (0 where even it is below 1). Written as vLLM's\n"
        "speculative_config.num_speculative_tokens_per_batch_size ([start, end, K] ranges) or\n"
        "TensorRT-LLM's speculative_config.draft_len_schedule ({upper bound: K}).\n\n"
        "examples:\n"
        f"  {PROG} schedule batches --format vllm\n"
        f"  {PROG} schedule results.db --format trtllm",
        db,
    )
    command.add_argument(
        "source",
        metavar="SWEEP_OR_DB",
        help="a sweep name in --db, or a store (a database URL or an SQLite file) to read whole",
    )
    command.add_argument("--format", required=True, choices=FORMATS, help="the serving engine")


def handle(args: argparse.Namespace, console: Console) -> int:
    """``schedule``: print each schedule's choices, then its snippet."""
    from orchestrator.analysis.draft_schedule import draft_schedules, schedule_snippet

    url, sweep = _source(args.source, args.db)
    with opened_store(url, read_only=True) as store:
        if sweep is not None:
            require_sweep(store, sweep)
        trials = store.trials(sweep)
    schedules = draft_schedules(trials)
    if not schedules:
        raise UserError(f"error: {args.source} has no done static trials to choose K from")
    for schedule in schedules:
        title = (
            f"{schedule.pair}, {schedule.dataset}, temperature {schedule.temperature:g}: "
            "best static K per batch size"
        )
        rows = [
            {
                "batch_size": choice.batch_size,
                "draft_len": choice.draft_len,
                "best_speedup": choice.speedup,
                "best_speedup_ci": _interval(choice.low, choice.high),
                "figure": choice.figure,
                "best_trial": choice.trial_id,
            }
            for choice in schedule.choices
        ]
        print_table(console, rows, SCHEDULE_COLUMNS, title)
        try:
            console.print(schedule_snippet(schedule, args.format), markup=False, soft_wrap=True)
        except ValueError as error:
            console.print(f"note: {error}", markup=False, soft_wrap=True)
    return EXIT_OK


def _source(source: str, db: str | None) -> tuple[str | None, str | None]:
    """Return (store URL, sweep name or None for the whole store) of ``SWEEP_OR_DB``."""
    if "://" in source:
        return source, None
    if Path(source).is_file():
        return f"sqlite:///{source}", None
    return db, source


def _interval(low: float | None, high: float | None) -> str:
    """Return "[low, high]" or "-" when there is no interval."""
    if low is None or high is None:
        return report.MISSING
    return f"[{report.format_value(float(low))}, {report.format_value(float(high))}]"
