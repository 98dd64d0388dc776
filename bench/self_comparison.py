"""How often the runner calls a setting faster or slower than itself.

One sweep on the pair (by default the micro zoo's, on the CPU) enters the same setting twice
(SVIP at thresholds so high it never stops a round, with max draft length K: two trial ids
that draft K tokens every round, so identical rounds) under ``--repetitions`` seeds: each seed
is one group of three interleaved arms (AR baseline and the two trials), with its own rotation.
Greedy decoding, so the seeds change nothing but the ids and the arms' order. The sweep runs
through ``execute_plan`` on a local Ray (real actors), then each seed's two trials are compared
as ``compare`` does (``orchestrator.analysis.pairing.paired_ratio``). The goal: a verdict
("faster" or "slower") in at most 5% of the comparisons. Writes JSON.

    python bench/self_comparison.py --out docs/lab/data/self-comparison.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import yaml
from common import (
    add_out_argument,
    add_pair_arguments,
    add_prompt_arguments,
    bench_parser,
    checkout_commit,
    write_report,
)

from orchestrator.analysis.pairing import paired_ratio
from orchestrator.run.runner import RunOptions, arm_groups, execute_plan
from orchestrator.store import Store, open_store
from orchestrator.sweep.planner import Plan, plan_sweep
from orchestrator.sweep.spec import parse_sweep

#: SVIP stops when sqrt(entropy) exceeds its threshold: never, at these.
THRESHOLDS = (50.0, 60.0)
GOAL = 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the options (defaults: the micro pair, 12 code prompts of 32 tokens, 20 seeds;
    12 prompts are two whole cycles of three arms' order)."""
    parser = bench_parser(__doc__)
    add_pair_arguments(parser)
    add_prompt_arguments(parser, samples=12, max_new_tokens=32)
    parser.set_defaults(
        target="zoo:micro/target", draft="zoo:micro/draft-s", dataset="builtin:code"
    )
    parser.add_argument("--repetitions", type=int, default=20, help="self-comparisons (seeds)")
    parser.add_argument("--max-draft-len", type=int, default=3, help="K of both trials")
    parser.add_argument("--repeats", type=int, default=1, help="execution.repeats")
    parser.add_argument("--shard-prompts", type=int, default=4, help="execution.shard_prompts")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray")
    add_out_argument(parser, "self-comparison.json")
    return parser.parse_args(argv)


def sweep_text(args: argparse.Namespace) -> str:
    """Return the sweep: one pair, one dataset, greedy, SVIP twice, ``--repetitions`` seeds."""
    sweep = {
        "name": "self-comparison",
        "pairs": [{"name": "pair", "target": args.target, "draft": args.draft}],
        "datasets": [
            {"name": args.dataset, "samples": args.samples, "max_new_tokens": args.max_new_tokens}
        ],
        "temperatures": [0],
        "policies": [{"name": "svip", "grid": {"threshold": list(THRESHOLDS)}}],
        "max_draft_lens": [args.max_draft_len],
        "seeds": list(range(args.repetitions)),
        "execution": {
            "repeats": args.repeats,
            "shard_prompts": args.shard_prompts,
            "warmup_samples": 1,
        },
    }
    return yaml.safe_dump(sweep, sort_keys=False)


def comparisons(plan: Plan, store: Store) -> list[dict[str, Any]]:
    """Return each seed's comparison of its two trials (the first over the second)."""
    found = []
    for base, first, second in arm_groups(plan.trials):
        a, b = store.sample_speeds(first.trial_id), store.sample_speeds(second.trial_id)
        same = [s.output_ids for s in store.sample_outputs(first.trial_id)] == [
            s.output_ids for s in store.sample_outputs(second.trial_id)
        ]
        compared = paired_ratio(a, b)
        ratio = compared.ratio
        found.append(
            {
                "seed": base.seed,
                "trials": [first.trial_id, second.trial_id],
                "n_prompts": compared.n_prompts,
                "ratio": None if ratio is None else ratio.estimate,
                "low": None if ratio is None else ratio.low,
                "high": None if ratio is None else ratio.high,
                "p_value": compared.adjusted_p,
                "verdict": compared.verdict,
                "same_outputs": same,
            }
        )
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the sweep in a temporary store and return the report."""
    spec = parse_sweep(sweep_text(args), "self-comparison.yaml")
    plan = plan_sweep(spec)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(f"sqlite:///{Path(folder) / 'results.db'}")
        store.register_sweep(spec, plan)
        ray.init(
            address="local", num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR"
        )
        try:
            summary = execute_plan(spec, plan, store, RunOptions(progress=False))
        finally:
            ray.shutdown()
        found = comparisons(plan, store)
        store.close()
    verdicts = sum(c["verdict"] in ("faster", "slower") for c in found)
    return {
        "commit": checkout_commit(),
        "settings": {key: str(value) for key, value in vars(args).items()},
        "failed_trials": summary.failed,
        "seconds": time.perf_counter() - start,
        "repetitions": len(found),
        "verdicts": verdicts,
        "verdict_rate": verdicts / max(len(found), 1),
        "goal": GOAL,
        "all_same_outputs": all(c["same_outputs"] for c in found),
        "comparisons": found,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the self-comparisons, print the verdict rate, write the JSON report."""
    args = parse_args(argv)
    report = run(args)
    print(
        f"{report['verdicts']} verdict(s) in {report['repetitions']} self-comparisons "
        f"({report['verdict_rate']:.0%}; goal <= {GOAL:.0%}); identical outputs: "
        f"{report['all_same_outputs']}; {report['seconds']:.0f} s"
    )
    write_report(args.out, report)
    return 0 if report["failed_trials"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
