"""Split overhead: the same trials in one process, in two plain processes and on Ray actors.

Runs target-only AR and static-K speculative decoding on one pair and prompt set, greedy, in
three placements (``bench/placements.py``), each after decoding the prompts once untimed:

- ``in_process``: draft and target in this process, one torch thread (as each actor has);
- ``processes``: the actors' own classes without Ray, in two spawned processes, the draft
  calling the target over the same direct channel: what any two-process split costs;
- ``actors``: the target in a TargetWorker and the draft in a DraftWorker, as sweeps run them.

The placements take turns prompt by prompt (each prompt one trial, the order rotating from
prompt to prompt and from repeat to repeat), over ``--repeats`` passes: on this repository's
2-core machine the same prompt's cost drifts by up to ±20% over tens of seconds, and turns a
whole trial long left that drift in the ratio (two runs of 6-prompt trials on SmolLM2 gave
static K = 4 0.884× and 0.962×, each interval excluding the other's figure). Checks that
outputs and accepted counts are identical and reports each placement's tokens/s and three
ratios: actors over in process (the split's whole cost, the figure the ≤ 5% bound is on),
processes over in process (the split without Ray) and actors over processes (Ray's share), each
with a paired 95% interval (jackknife t) over (prompt, repeat) samples, and every sample's seconds,
as JSON.

Per round, each placement's time is split into drafting, verifying and the rest, and what its
processes used is reported beside it (``getrusage`` around each sample's call: this process in
process; both workers' processes otherwise): CPU ms, voluntary switches (blocking: a socket, a
lock, the GIL, a device), involuntary ones (preemption) and minor page faults (memory mapped
afresh, as when freed memory went back to the system). A placement that is slower with the
same CPU ms per round waits more; one with more CPU ms does more work or runs its work slower.
Beside them, the whole machine's busy and stolen CPU ms per round (``/proc/stat``, read around
the same calls; ``None`` where there is none): busy beyond the placement's own processes is
work other processes (Ray's, the driver's) did meanwhile, steal is time the hypervisor withheld.

    python bench/actors.py --target zoo:smol/target --draft zoo:smol/draft-s --out bench-actors.json

Prompts go through the target's chat template when its tokenizer has one, as in sweeps.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import ray
import torch
from common import (
    add_device_arguments,
    add_out_argument,
    add_pair_arguments,
    add_prompt_arguments,
    add_warmup_argument,
    bench_parser,
    prepare,
    warmup_seconds,
)
from placements import PLACEMENTS, start_placements
from tqdm import tqdm

from orchestrator.analysis.metrics import TrialMetrics, trial_metrics
from orchestrator.analysis.stats import paired_speed_ratio
from workers.actors import ModelSpec
from workers.json_files import write_json
from workers.process_usage import MachineUsage, ProcessUsage, machine_usage
from workers.records import GenerationResult, SamplingConfig
from workers.trial import BASELINE_POLICY, TrialRequest

#: The ratios reported, (numerator, denominator) placements.
RATIOS = (("actors", "in_process"), ("processes", "in_process"), ("actors", "processes"))


@dataclass
class PlacementRuns:
    """One method's samples in one placement, and what its processes used while they ran."""

    results: list[GenerationResult] = field(default_factory=list)
    usage: ProcessUsage = field(default_factory=ProcessUsage)
    machine: MachineUsage | None = field(default_factory=MachineUsage)


def _tokens_per_s(results: list[GenerationResult]) -> float:
    """Return generated tokens per second over all samples."""
    return sum(r.n_generated for r in results) / sum(r.seconds for r in results)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = bench_parser(__doc__)
    add_pair_arguments(parser)
    add_prompt_arguments(parser, samples=6, max_new_tokens=48)
    parser.add_argument("--k", type=int, default=4, help="static draft length")
    parser.add_argument("--repeats", type=int, default=6, help="turns of both placements")
    add_device_arguments(
        parser, device_help="cpu, or cuda: in process on cuda, each actor a GPU share"
    )
    add_warmup_argument(parser, "untimed decoding in each placement first", "one pass")
    add_out_argument(parser, "bench-actors.json")
    return parser.parse_args(argv)


def _round_split(metrics: TrialMetrics) -> dict[str, float]:
    """Return the mean ms per round spent drafting, verifying, and the rest (both models'
    prefills and the loop around the rounds), over every round of a placement's samples.

    A round's verify time is what the round's caller waited for its verdict (for target-only
    AR, where the loop runs inside the target, the target's own step).
    """
    rest = metrics.seconds - metrics.draft_seconds - metrics.verify_seconds
    return {
        "draft_ms": 1000 * metrics.draft_seconds / metrics.n_rounds,
        "verify_ms": 1000 * metrics.verify_seconds / metrics.n_rounds,
        "rest_ms": 1000 * rest / metrics.n_rounds,
    }


def _usage_per_round(runs: PlacementRuns, metrics: TrialMetrics) -> dict[str, float | None]:
    """Return a placement's CPU ms (and the kernel's part), context switches and minor page
    faults per round, its CPU seconds per second of its samples' wall time, and the machine's
    busy and stolen CPU ms per round (None without ``/proc/stat``).

    The usage is read around each sample's call, so it also holds the call's own work outside
    the sample's timed seconds (for actors: Ray's call and reply).
    """
    rounds, usage, machine = metrics.n_rounds, runs.usage, runs.machine
    return {
        "machine_busy_ms": None if machine is None else 1000 * machine.busy_seconds / rounds,
        "machine_steal_ms": None if machine is None else 1000 * machine.steal_seconds / rounds,
        "cpu_ms": 1000 * usage.cpu_seconds / rounds,
        "system_ms": 1000 * usage.system_seconds / rounds,
        "voluntary_switches": usage.voluntary_switches / rounds,
        "involuntary_switches": usage.involuntary_switches / rounds,
        "minor_faults": usage.minor_faults / rounds,
        "cpu_over_wall": usage.cpu_seconds / metrics.seconds,
    }


def _ratio(runs: dict[str, PlacementRuns], over: str, under: str) -> dict:
    """Return placement ``over``'s tokens/s over ``under``'s, with its paired 95% interval."""
    a, b = runs[over].results, runs[under].results
    interval = paired_speed_ratio(
        [r.n_generated for r in a],
        [r.seconds for r in a],
        [r.n_generated for r in b],
        [r.seconds for r in b],
    )
    return {
        "ratio": _tokens_per_s(a) / _tokens_per_s(b),
        "ci95": None if interval is None else [interval.low, interval.high],
    }


def _method_report(runs: dict[str, PlacementRuns]) -> dict:
    """Return one method's figures in every placement and whether their rounds agree.

    Each ratio's 95% interval is paired over (prompt, repeat) samples (jackknife t), each listed
    with its tokens and seconds in every placement; ``per_round_ms`` splits each placement's
    rounds into drafting, verifying and the rest (``_round_split``), ``usage_per_round`` says
    what its processes used (``_usage_per_round``).
    """
    metrics = {place: trial_metrics(placed.results) for place, placed in runs.items()}
    reference = runs["in_process"].results
    samples = zip(*(placed.results for placed in runs.values()), strict=True)
    return {
        "tokens_per_s": {place: _tokens_per_s(placed.results) for place, placed in runs.items()},
        "ratios": {f"{a}/{b}": _ratio(runs, a, b) for a, b in RATIOS},
        "per_sample": [
            {"tokens": row[0].n_generated}
            | {f"{place}_s": r.seconds for place, r in zip(runs, row, strict=True)}
            for row in samples
        ],
        "per_round_ms": {place: _round_split(metrics[place]) for place in runs},
        "usage_per_round": {
            place: _usage_per_round(placed, metrics[place]) for place, placed in runs.items()
        },
        "same_outputs": all(
            [r.output_ids for r in placed.results] == [r.output_ids for r in reference]
            for placed in runs.values()
        ),
        "same_accepted_counts": all(
            [r.n_accepted for r in placed.results] == [r.n_accepted for r in reference]
            for placed in runs.values()
        ),
    }


def _warm_all(args: argparse.Namespace, placements: list, request: TrialRequest) -> float:
    """Decode ``request`` untimed in every placement for the warm-up time; return that time."""
    warmup = warmup_seconds(args)
    for placement in placements:
        placement.warm_up(request, warmup)
    return warmup


def _padding(calibrations: dict) -> str:
    """Return which models pad their one-token steps in each placement, as text."""
    return "; ".join(
        f"{place} " + ", ".join(f"{model} {bool(c and c['padded'])}" for model, c in models.items())
        for place, models in calibrations.items()
    )


def _splits(figures: dict) -> str:
    """Return every placement's per-round time split as text."""
    return "; ".join(
        f"{place} "
        + " / ".join(f"{split[part]:.2f}" for part in ("draft_ms", "verify_ms", "rest_ms"))
        for place, split in figures["per_round_ms"].items()
    )


def _usages(figures: dict) -> str:
    """Return every placement's CPU ms, context switches and page faults per round as text."""
    return "; ".join(
        f"{place} {usage['cpu_ms']:.2f} ms ({usage['system_ms']:.2f} in the kernel), "
        f"{usage['voluntary_switches']:.1f} + {usage['involuntary_switches']:.1f}, "
        f"{usage['minor_faults']:.1f} page faults, machine busy "
        f"{_optional_ms(usage['machine_busy_ms'])}, "
        f"steal {_optional_ms(usage['machine_steal_ms'])}"
        for place, usage in figures["usage_per_round"].items()
    )


def _optional_ms(value: float | None) -> str:
    """Return milliseconds as text ("n/a" for None)."""
    return "n/a" if value is None else f"{value:.2f} ms"


def _ci(bounds: list[float] | None) -> str:
    """Return an interval as text ("n/a" when there is none)."""
    return "n/a" if bounds is None else f"{bounds[0]:.3f}-{bounds[1]:.3f}"


def _run_one(runs: PlacementRuns, request: TrialRequest, placement) -> None:
    """Run ``request`` in ``placement``; add its results to ``runs``, and what the placement's
    processes and the machine used meanwhile."""
    before, machine_before = placement.usage(), machine_usage()
    runs.results.extend(placement.run(request))
    machine_after = machine_usage()  # None on every read or on none: /proc/stat is there or not
    runs.usage += placement.usage() - before
    runs.machine = (
        None if machine_before is None else runs.machine + (machine_after - machine_before)
    )


def _take_turns(
    placements: list,
    requests: dict[str, TrialRequest],
    repeats: int,
    after_turn: Callable[[dict, int], None],
) -> dict[str, dict[str, PlacementRuns]]:
    """Run every (repeat, prompt, method) in every placement back to back, the one that goes
    first rotating from prompt to prompt and from repeat to repeat; return each method's runs
    per placement, the results in the same order. ``after_turn(runs, turns_done)`` runs after
    each (repeat, prompt) turn."""
    runs = {name: {p.name: PlacementRuns() for p in placements} for name in requests}
    prompts = next(iter(requests.values())).prompts
    turns = [(repeat, index) for repeat in range(repeats) for index in range(len(prompts))]
    progress = tqdm(turns, desc="prompts in every placement, in turns")
    for done, (repeat, index) in enumerate(progress, start=1):
        shift = (repeat + index) % len(placements)
        order = placements[shift:] + placements[:shift]
        for name, request in requests.items():
            one = replace(request, prompts=[prompts[index]], warmup_samples=0)
            for placement in order:
                _run_one(runs[name][placement.name], one, placement)
        after_turn(runs, done)
    return runs


def _save_so_far(out: Path, report: dict, runs: dict, done: int) -> None:
    """Write ``report`` with the methods' figures over the first ``done`` turns, marked
    incomplete, so a run stopped early (a GPU lease ending, say) still leaves its figures."""
    methods = {name: _method_report(placed) for name, placed in runs.items()}
    write_json(out, {**report, "complete": False, "turns_done": done, "methods": methods})


def _print_method(name: str, figures: dict) -> None:
    """Print one method's tokens/s, ratios, round splits and usage."""
    speeds = "  ".join(f"{place} {v:7.1f}" for place, v in figures["tokens_per_s"].items())
    print(f"{name:14} tok/s: {speeds}")
    ratios = "  ".join(
        f"{key} {r['ratio']:.3f} (95% CI {_ci(r['ci95'])})" for key, r in figures["ratios"].items()
    )
    print(f"{'':14} {ratios}")
    print(
        f"{'':14} same outputs {figures['same_outputs']}, "
        f"same accepted {figures['same_accepted_counts']}"
    )
    print(f"{'':14} ms per round (draft / verify / rest): {_splits(figures)}")
    print(f"{'':14} per round (CPU, voluntary + involuntary switches): {_usages(figures)}")


def main(argv: list[str] | None = None) -> int:
    """Run the placements in turns, print the comparison and write JSON; return exit code."""
    args = _parse_args(argv)
    torch.set_num_threads(1)  # as Ray sets it for each one-CPU actor
    inputs = prepare(args)
    prompts, target_path, draft_path = inputs.prompts, inputs.target_path, inputs.draft_path
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens)
    requests = {
        "ar": TrialRequest(prompts, sampling, BASELINE_POLICY, warmup_samples=1),
        f"static K={args.k}": TrialRequest(
            prompts, sampling, "static", max_draft_len=args.k, warmup_samples=1
        ),
    }
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    models = ModelSpec(str(draft_path), args.dtype), ModelSpec(str(target_path), args.dtype)
    placements = start_placements(*models, args.device)
    warmup = _warm_all(args, placements, requests[f"static K={args.k}"])
    report = {
        "target": str(target_path),
        "draft": str(draft_path),
        "samples": len(prompts),
        "repeats": args.repeats,
        "max_new_tokens": args.max_new_tokens,
        "device": args.device,
        "warmup_seconds": warmup,
        "dtype": args.dtype,
        "placements": list(PLACEMENTS),
    }
    save_so_far = partial(_save_so_far, args.out, report)
    runs = _take_turns(placements, requests, args.repeats, save_so_far)
    report["complete"], report["turns_done"] = True, args.repeats * len(prompts)
    report["methods"] = {name: _method_report(placed) for name, placed in runs.items()}
    report["single_step_calibration"] = {p.name: p.calibrations() for p in placements}
    ray.shutdown()
    for name, figures in report["methods"].items():
        _print_method(name, figures)
    write_json(args.out, report)
    padded = _padding(report["single_step_calibration"])
    print(f"one-token steps padded: {padded}; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
