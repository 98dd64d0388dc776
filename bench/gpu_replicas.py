"""Replicas on one GPU: the same small live sweep with one replica and with two side by side.

Takes a sweep file's first pair (on a one-GPU machine: ``sweeps/gpu_smoke.yaml``, whose groups
take half a GPU), keeps its first policy and runs the sweep twice into fresh SQLite files: with
the runner's default replica count (a group's GPUs count whole, so one replica per GPU) and
with ``execution.replicas: 2`` (two groups time-sharing the GPU). For every trial it reports
each sample's seconds per token and the spread (slowest / fastest sample), as JSON. A wide
spread with one replica points at the process itself (on the H200 it was a fresh process's
warm-up spell, see bench/gpu_warmup.py), one only with two at the GPU being shared.

    python bench/gpu_replicas.py sweeps/gpu_smoke.yaml --out runs/gpu/replicas.json

The ``replicas`` step of ``bench/gpu_check.sh`` runs it; findings: docs/lab/gpu-run-2-h200.md.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

from common import add_out_argument, bench_parser, write_report

from orchestrator.api import run_sweep
from orchestrator.sweep.spec import load_sweep

SAMPLE_QUERY = """
    SELECT t.temperature, t.policy, t.started_at, t.finished_at, s.sample_index,
           s.seconds / s.generated_tokens
    FROM sample_results s JOIN trials t ON t.trial_id = s.trial_id
    WHERE t.status = 'done' ORDER BY t.started_at, s.sample_index
"""


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = bench_parser(__doc__)
    parser.add_argument("sweep", type=Path, help="sweep file (its first pair and policy run)")
    add_out_argument(parser, "gpu-replicas.json")
    return parser.parse_args(argv)


def _trials(db_path: Path) -> list[dict]:
    """Return each done trial's per-sample seconds per token and their spread."""
    trials: dict[tuple, dict] = {}
    for temperature, policy, started, finished, index, per_token in sqlite3.connect(
        db_path
    ).execute(SAMPLE_QUERY):
        trial = trials.setdefault(
            (temperature, policy, started),
            {
                "temperature": temperature,
                "policy": policy,
                "started_at": started,
                "finished_at": finished,
                "seconds_per_token": {},
            },
        )
        trial["seconds_per_token"][index] = per_token
    for trial in trials.values():
        costs = trial["seconds_per_token"].values()
        trial["spread"] = max(costs) / min(costs)
    return list(trials.values())


def main(argv: list[str] | None = None) -> int:
    """Run the sweep with one and with two replicas, print each trial's spread, write JSON."""
    args = _parse_args(argv)
    spec = load_sweep(args.sweep)
    small = spec.model_copy(update={"pairs": spec.pairs[:1], "policies": spec.policies[:1]})
    report: dict[str, list[dict]] = {}
    for label, replicas in (("default", None), ("two replicas", 2)):
        execution = small.execution.model_copy(update={"replicas": replicas})
        db_path = args.out.with_name(f"{args.out.stem}-{replicas or 'default'}.db")
        db_path.unlink(missing_ok=True)
        run_sweep(
            small.model_copy(update={"execution": execution}),
            f"sqlite:///{db_path}",
            progress=False,
        )
        report[label] = _trials(db_path)
        for trial in report[label]:
            costs = ", ".join(f"{1000 * c:.1f}" for c in trial["seconds_per_token"].values())
            print(
                f"{label:13} T={trial['temperature']} {trial['policy']:8} "
                f"ms/token {costs}  spread {trial['spread']:.2f}"
            )
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
