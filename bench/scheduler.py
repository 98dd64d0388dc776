"""Scheduler simulation: a sweep's planned work over 1 / 2 / 4 / 8 replicas against the ideal.

Plans the sweep, cuts its live trials and trace recordings into prompt shards and gives each
unit its seconds at the estimate's upper bound
(``orchestrator.analysis.costs.estimate.plan_workload``, the cost model ``plan --estimate`` uses),
then runs the discrete-event simulation (``orchestrator.analysis.costs.schedule_sim``, which
dispatches with the live rule
``work_units.pick_next``) over N replicas that each serve every pair (shared targets), with no
loading time. For each N it reports the makespan, total work / N, their ratio and the replicas'
utilisation. This is a simulation of the dispatch rule, not a measurement of a cluster.

    python bench/scheduler.py                       # sweeps/table1.yaml, 1 2 4 8 replicas
    python bench/scheduler.py sweeps/demo.yaml --replicas 1 3 --shard-prompts 1
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.analysis.costs.estimate import (
    EstimateOptions,
    format_hours,
    pair_profiles,
    plan_workload,
)
from orchestrator.analysis.costs.model import HARDWARE_PROFILES
from orchestrator.analysis.costs.schedule_sim import Replica, simulate
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import load_sweep

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROFILE = "specdecpp-70b-7b-2xa100"


@dataclass(frozen=True)
class Row:
    """One replica count's simulated makespan beside total work / replicas."""

    replicas: int
    makespan_s: float
    ideal_s: float
    ratio: float
    utilisation: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "sweep", nargs="?", default=str(REPO / "sweeps" / "table1.yaml"), help="the sweep file"
    )
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8], metavar="N")
    parser.add_argument(
        "--shard-prompts",
        type=int,
        default=None,
        metavar="P",
        help="prompts per unit (default: the sweep's execution.shard_prompts)",
    )
    parser.add_argument("--profile", choices=sorted(HARDWARE_PROFILES), default=DEFAULT_PROFILE)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, object]:
    """Simulate the sweep's units over each replica count; return the JSON-ready report."""
    spec = load_sweep(args.sweep)
    plan = plan_sweep(spec)
    shard_prompts = args.shard_prompts or spec.execution.shard_prompts
    options = EstimateOptions(shard_prompts=shard_prompts)
    profiles = pair_profiles(plan, HARDWARE_PROFILES[args.profile])
    work = plan_workload(plan, profiles, options)
    serves = frozenset(pair.name for pair in plan.pairs)
    total = sum(work.upper.values())
    rows = []
    for count in args.replicas:
        replicas = [Replica(f"r{i}", serves) for i in range(count)]
        result = simulate(work.units, work.upper, replicas)
        ideal = total / count
        rows.append(Row(count, result.makespan, ideal, result.makespan / ideal, result.utilisation))
    return {
        "sweep": spec.name,
        "profile": args.profile,
        "shard_prompts": shard_prompts,
        "units": len(work.units),
        "longest_unit_s": max(work.upper.values(), default=0.0),
        "total_work_s": total,
        "rows": [asdict(row) for row in rows],
    }


def summary_table(report: dict[str, object]) -> str:
    """Return the report as a fixed-width table."""
    lines = [
        f"{report['sweep']}: {report['units']} units of <= {report['shard_prompts']} prompts, "
        f"total work {format_hours(float(report['total_work_s']))} (simulation)",
        f"{'replicas':>8} {'makespan':>12} {'work/replicas':>14} {'ratio':>7} {'busy':>6}",
    ]
    for row in report["rows"]:  # type: ignore[attr-defined]
        lines.append(
            f"{row['replicas']:>8} {format_hours(row['makespan_s']):>12} "
            f"{format_hours(row['ideal_s']):>14} {row['ratio']:>7.3f} {row['utilisation']:>6.1%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the summary table on stderr and the JSON report on stdout."""
    report = run(parse_args(argv))
    print(summary_table(report), file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
