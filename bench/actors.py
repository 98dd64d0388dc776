"""Actor overhead: the same trials in one process and split across Ray actors, side by side.

Runs target-only AR and static-K speculative decoding on one pair and prompt set, greedy, in
process (draft and target in this process, one torch thread, as each actor has) and with the
target in a TargetWorker and the draft in a DraftWorker, after both placements have decoded the
prompts once untimed. The placements take turns prompt by prompt (each prompt one trial, the
placement that goes first alternating), over ``--repeats`` passes: on this repository's 2-core
machine the same prompt's cost drifts by up to ±20% over tens of seconds, and turns a whole
trial long left that drift in the ratio (two runs of 6-prompt trials on SmolLM2 gave static
K = 4 0.884× and 0.962×, each interval excluding the other's figure). Checks that outputs and
accepted counts are identical and reports tokens/s of both and their ratio, with a paired
bootstrap 95% interval over (prompt, repeat) samples and every sample's seconds, as JSON.

Per round, each placement's time is split into drafting, verifying and the rest, and what its
processes used is reported beside it (``getrusage`` around each sample's call: this process in
process; both actors' processes on actors): CPU ms, voluntary switches (blocking: a socket, a
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
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import ray
import torch
from tqdm import tqdm
from transformers import AutoTokenizer

from orchestrator.metrics import TrialMetrics, trial_metrics
from orchestrator.preflight import resolve_model_path
from orchestrator.stats import paired_speed_ratio
from workers.actors import DraftWorker, ModelSpec, TargetWorker
from workers.json_files import write_json
from workers.lm import DTYPES, CachedLM, SingleStepCalibration, load_causal_lm
from workers.process_usage import (
    MachineUsage,
    ProcessUsage,
    actor_process_usage,
    machine_usage,
    process_usage,
)
from workers.prompt_format import encode_dataset
from workers.records import GenerationResult, SamplingConfig
from workers.target import LocalTarget
from workers.trial import BASELINE_POLICY, GPU_WARMUP_SECONDS, TrialRequest, run_trial, warm_up


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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--target", default="zoo:smol/target")
    parser.add_argument("--draft", default="zoo:smol/draft-s")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--k", type=int, default=4, help="static draft length")
    parser.add_argument("--repeats", type=int, default=6, help="turns of both placements")
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda: in process on cuda, each actor a GPU share"
    )
    parser.add_argument(
        "--dtype", default="float32", choices=sorted(DTYPES), help="both models' weights"
    )
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=None,
        help=f"untimed decoding in each placement first (default {GPU_WARMUP_SECONDS:g} on cuda, "
        "else one pass)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-actors.json"))
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


def _method_report(local_runs: PlacementRuns, split_runs: PlacementRuns) -> dict:
    """Return one method's figures in both placements and whether their rounds agree.

    The ratio's 95% interval is a paired bootstrap over (prompt, repeat) samples, each listed
    with its tokens and seconds in both placements; ``per_round_ms`` splits each placement's
    rounds into drafting, verifying and the rest (``_round_split``), ``usage_per_round`` says
    what its processes used (``_usage_per_round``).
    """
    local, split = local_runs.results, split_runs.results
    places = {"in_process": local_runs, "actors": split_runs}
    metrics = {place: trial_metrics(runs.results) for place, runs in places.items()}
    in_process, actors = _tokens_per_s(local), _tokens_per_s(split)
    ratio = paired_speed_ratio(
        [r.n_generated for r in split],
        [r.seconds for r in split],
        [r.n_generated for r in local],
        [r.seconds for r in local],
    )
    return {
        "in_process_tokens_per_s": in_process,
        "actors_tokens_per_s": actors,
        "actors_over_in_process": actors / in_process,
        "ratio_ci95": None if ratio is None else [ratio.low, ratio.high],
        "per_sample": [
            {"tokens": a.n_generated, "in_process_s": a.seconds, "actors_s": b.seconds}
            for a, b in zip(local, split, strict=True)
        ],
        "per_round_ms": {place: _round_split(metrics[place]) for place in places},
        "usage_per_round": {
            place: _usage_per_round(runs, metrics[place]) for place, runs in places.items()
        },
        "same_outputs": [r.output_ids for r in local] == [r.output_ids for r in split],
        "same_accepted_counts": [r.n_accepted for r in local] == [r.n_accepted for r in split],
    }


def _asdict(calibration: SingleStepCalibration | None) -> dict | None:
    """Return a one-token step calibration as JSON-ready fields (None when there is none)."""
    return None if calibration is None else asdict(calibration)


def _warm_both(
    args: argparse.Namespace, draft: CachedLM, target: LocalTarget, draft_actor, request
) -> float:
    """Decode ``request`` untimed in both placements for the warm-up time; return that time."""
    warmup = args.warmup_seconds
    if warmup is None:
        warmup = GPU_WARMUP_SECONDS if torch.device(args.device).type == "cuda" else 0.0
    warm_up(draft, target, request, warmup)
    ray.get(draft_actor.warm_up.remote(request, warmup))
    return warmup


def _calibrations(draft: CachedLM, target: LocalTarget, draft_actor, target_actor) -> dict:
    """Return the one-token step calibrations of both models in both placements."""
    return {
        "in_process": {
            "draft": _asdict(draft.calibration),
            "target": _asdict(target.lm.calibration),
        },
        "actors": {
            "draft": _asdict(ray.get(draft_actor.single_step_calibration.remote())),
            "target": _asdict(ray.get(target_actor.single_step_calibration.remote())),
        },
    }


def _padding(calibrations: dict) -> str:
    """Return which models pad their one-token steps in each placement, as text."""
    return "; ".join(
        f"{place} " + ", ".join(f"{model} {bool(c and c['padded'])}" for model, c in models.items())
        for place, models in calibrations.items()
    )


def _splits(figures: dict) -> str:
    """Return both placements' per-round time splits as text."""
    return "; ".join(
        f"{place} "
        + " / ".join(f"{split[part]:.2f}" for part in ("draft_ms", "verify_ms", "rest_ms"))
        for place, split in figures["per_round_ms"].items()
    )


def _usages(figures: dict) -> str:
    """Return both placements' CPU ms, context switches and page faults per round as text."""
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


def _actors_usage(actors: list) -> ProcessUsage:
    """Return the summed usage of the actors' processes so far."""
    usages = ray.get([actor.__ray_call__.remote(actor_process_usage) for actor in actors])
    return sum(usages, ProcessUsage())


def _run_one(
    runs: PlacementRuns, request: TrialRequest, in_process: bool, models: tuple, actors: list
) -> None:
    """Run ``request`` in process (``models``: draft and target) or on ``actors`` (the draft
    actor first); add its results to ``runs``, and what the placement's processes used."""
    usage = process_usage if in_process else partial(_actors_usage, actors)
    before, machine_before = usage(), machine_usage()
    if in_process:
        runs.results.extend(run_trial(*models, request))
    else:
        runs.results.extend(ray.get(actors[0].run_trial.remote(request)))
    machine_after = machine_usage()  # None on every read or on none: /proc/stat is there or not
    runs.usage += usage() - before
    runs.machine = (
        None if machine_before is None else runs.machine + (machine_after - machine_before)
    )


def _take_turns(
    draft: CachedLM,
    target: LocalTarget,
    actors: list,
    requests: dict,
    repeats: int,
    after_turn: Callable[[dict, dict, int], None],
) -> tuple[dict[str, PlacementRuns], dict[str, PlacementRuns]]:
    """Run every (repeat, prompt, method) in both placements back to back, the one that goes
    first alternating from prompt to prompt and from repeat to repeat; return each method's
    runs in process and on the actors (``actors``: the draft actor, then the target's), with
    the results in the same order. ``after_turn(local, split, turns_done)`` runs after each
    (repeat, prompt) turn."""
    local = {name: PlacementRuns() for name in requests}
    split = {name: PlacementRuns() for name in requests}
    prompts = next(iter(requests.values())).prompts
    turns = [(repeat, index) for repeat in range(repeats) for index in range(len(prompts))]
    progress = tqdm(turns, desc="prompts in both placements, in turns")
    for done, (repeat, index) in enumerate(progress, start=1):
        prompt = prompts[index]
        order = (True, False) if (repeat + index) % 2 == 0 else (False, True)
        for name, request in requests.items():
            one = replace(request, prompts=[prompt], warmup_samples=0)
            for in_process in order:
                runs = (local if in_process else split)[name]
                _run_one(runs, one, in_process, (draft, target), actors)
        after_turn(local, split, done)
    return local, split


def _save_so_far(out: Path, report: dict, local: dict, split: dict, done: int) -> None:
    """Write ``report`` with the methods' figures over the first ``done`` turns, marked
    incomplete, so a run stopped early (a GPU lease ending, say) still leaves its figures."""
    methods = {name: _method_report(local[name], split[name]) for name in local}
    write_json(out, {**report, "complete": False, "turns_done": done, "methods": methods})


def _start_actors(args: argparse.Namespace, target_path: Path, draft_path: Path) -> list:
    """Start the target actor, then, once it is ready, the draft actor; return [draft, target].

    One after the other, as a sweep's worker group starts them
    (``orchestrator.replica.GroupReplica``): each model's one-token step calibration
    (``CachedLM.calibrate_single_step``) then runs while the other actor is idle. Started
    together, the draft's calibration ran while the target loaded, measured 7.3 ms for one
    token against 6.0 for two (3.7 against 4.1 in process) and padded the draft's steps.
    """
    # An actor loads on cuda when Ray gives it a GPU share (workers.actors._device).
    gpus = 0.25 if torch.device(args.device).type == "cuda" else 0
    target_actor = TargetWorker.options(num_cpus=1, num_gpus=gpus).remote(
        ModelSpec(str(target_path), args.dtype)
    )
    ray.get(target_actor.node_id.remote())
    draft_actor = DraftWorker.options(num_cpus=1, num_gpus=gpus).remote(
        ModelSpec(str(draft_path), args.dtype), [target_actor]
    )
    ray.get(draft_actor.node_id.remote())
    return [draft_actor, target_actor]


def main(argv: list[str] | None = None) -> int:
    """Run both placements in turns, print the comparison and write JSON; return exit code."""
    args = _parse_args(argv)
    torch.set_num_threads(1)
    target_path, draft_path = resolve_model_path(args.target), resolve_model_path(args.draft)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    prompts = encode_dataset(tokenizer, args.dataset, args.samples, 256)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens)
    requests = {
        "ar": TrialRequest(prompts, sampling, BASELINE_POLICY, warmup_samples=1),
        f"static K={args.k}": TrialRequest(
            prompts, sampling, "static", max_draft_len=args.k, warmup_samples=1
        ),
    }
    draft = CachedLM(load_causal_lm(draft_path, args.dtype, args.device))
    target = LocalTarget(CachedLM(load_causal_lm(target_path, args.dtype, args.device)))
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    actors = _start_actors(args, target_path, draft_path)
    draft_actor, target_actor = actors
    warmup = _warm_both(args, draft, target, draft_actor, requests[f"static K={args.k}"])
    report = {
        "target": str(target_path),
        "draft": str(draft_path),
        "samples": len(prompts),
        "repeats": args.repeats,
        "max_new_tokens": args.max_new_tokens,
        "device": args.device,
        "warmup_seconds": warmup,
        "dtype": args.dtype,
    }
    save_so_far = partial(_save_so_far, args.out, report)
    local, split = _take_turns(draft, target, actors, requests, args.repeats, save_so_far)
    report["complete"], report["turns_done"] = True, args.repeats * len(prompts)
    report["methods"] = {name: _method_report(local[name], split[name]) for name in requests}
    report["single_step_calibration"] = _calibrations(draft, target, draft_actor, target_actor)
    ray.shutdown()
    for name, figures in report["methods"].items():
        print(
            f"{name:14} in-process {figures['in_process_tokens_per_s']:7.1f} tok/s  actors "
            f"{figures['actors_tokens_per_s']:7.1f} tok/s  ratio "
            f"{figures['actors_over_in_process']:.3f} (95% CI {_ci(figures['ratio_ci95'])})  "
            f"same outputs {figures['same_outputs']}  "
            f"same accepted {figures['same_accepted_counts']}"
        )
        print(f"{'':14} ms per round (draft / verify / rest): {_splits(figures)}")
        print(f"{'':14} per round (CPU, voluntary + involuntary switches): {_usages(figures)}")
    write_json(args.out, report)
    padded = _padding(report["single_step_calibration"])
    print(f"one-token steps padded: {padded}; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
