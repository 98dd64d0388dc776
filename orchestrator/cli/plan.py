"""``plan``: print what a sweep expands to (and, with ``--estimate``, what it costs)."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from rich.console import Console

from orchestrator.analysis import report
from orchestrator.cli.common import (
    EXIT_OK,
    PROG,
    add_command,
    load_sweep_file,
    print_table,
)
from orchestrator.cli.estimates import (
    add_estimate_options,
    print_estimate,
    sweep_estimate,
)
from orchestrator.sweep.planner import Plan, plan_sweep


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``plan``."""
    command = add_command(
        commands,
        "plan",
        handle,
        "show the trials, training jobs, skipped groups and resources a sweep expands to",
        "Runs nothing and writes no database; with --estimate it reads the cost fits of the\n"
        "store (--db), when it exists, for pairs with the same models, and its trials at the\n"
        "sweep's batch sizes above 1 (else those are sized from batch 1, as it prints).\n\n"
        "examples:\n"
        f"  {PROG} plan sweeps/demo.yaml\n"
        f"  {PROG} plan sweeps/demo.yaml --all",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file")
    command.add_argument(
        "--all", action="store_true", help="list every trial (default: counts per group)"
    )
    command.add_argument(
        "--estimate",
        action="store_true",
        help="also print the projected wall time and GPU-hours per pair and in total",
    )
    command.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray cluster whose GPUs the estimate counts (default: --gpus, else --cluster)",
    )
    add_estimate_options(command)


def replay_line(plan: Plan) -> str:
    """Return the plan's replay line ("" when nothing replays): the trials replayed from
    greedy traces by draft kind, and what runs live."""
    kinds = Counter(trial.served.draft_kind for trial in plan.trials if trial.mode == "replay")
    if not kinds:
        return ""
    replayed = sum(kinds.values())
    live = [trial for trial in plan.trials if trial.mode != "replay"]
    baselines = sum(trial.is_baseline for trial in live)
    checks = sum(trial.is_check for trial in live)
    others = len(live) - baselines - checks
    by_kind = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
    return (
        f"mode replay: {replayed} trials replayed from greedy traces (by draft kind: "
        f"{by_kind}), {len(live)} run live ({baselines} AR baselines, {checks} live checks, "
        f"{others} that do not replay)"
    )


def print_plan(console: Console, plan: Plan, all_trials: bool) -> None:
    """Print a plan: counts, the replay line, trials (grouped or all), jobs, skipped groups
    and resources."""
    counts = plan.counts()
    console.print(
        f"sweep {plan.sweep}: {counts['trials']} trials ({counts['baselines']} AR baselines + "
        f"{counts['policy_trials']} policy trials), {counts['jobs']} training jobs, "
        f"{counts['skipped']} trials skipped",
        markup=False,
    )
    if line := replay_line(plan):
        console.print(line, markup=False)
    if all_trials:
        print_table(console, report.plan_trial_rows(plan), report.PLAN_TRIAL_COLUMNS, "trials")
    else:
        rows = report.plan_group_rows(plan)
        print_table(console, rows, report.PLAN_GROUP_COLUMNS, "trials per group (--all: each)")
    if plan.jobs:
        print_table(console, report.job_rows(plan), report.JOB_COLUMNS, "training jobs")
    else:
        console.print("training jobs: none")
    if plan.skipped:
        rows = report.skipped_rows(plan)
        print_table(console, rows, report.SKIPPED_COLUMNS, "skipped (not planned)")
    print_table(console, report.resource_rows(plan), report.RESOURCE_COLUMNS, "resources per pair")


def handle(args: argparse.Namespace, console: Console) -> int:
    """``plan``: print what a sweep expands to (and, with ``--estimate``, what it costs)."""
    spec = load_sweep_file(args.sweep)
    plan = plan_sweep(spec)
    print_plan(console, plan, args.all)
    if args.estimate:
        print_estimate(console, sweep_estimate(args, spec, plan))
    return EXIT_OK
