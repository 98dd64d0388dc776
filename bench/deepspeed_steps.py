"""t_target(n) on the DeepSpeed AutoTP path: a target sharded over ``--ranks`` ranks as a sweep's
target group loads it, and whether its one-token step costs no more than a two-token block.

Each rank is a process of its own (this script again, with ``--rank``). It joins the group
(gloo on CPU, with the process-group all-reduce; NCCL on CUDA), loads and shards the target
and calibrates its one-token step exactly as a sweep's rank does
(``workers.tensor_parallel.TensorParallelTarget``: every rank times, rank 0's choice holds).
Then all ranks run, in lockstep, blocks of n = 1 .. ``--max-block`` tokens after a context as
long as a generation's middle, and one-token steps both ways (plain and padded to two tokens),
taking turns, each timing started right after a barrier. Rank 0 writes the JSON: the medians,
the calibration, and ``one_token_not_dearer`` (t_target(1) <= t_target(2)).

    python bench/deepspeed_steps.py --target zoo:smol/target --ranks 2 --out ds-steps.json

On a machine with one GPU only ``--ranks 1`` runs (NCCL takes one GPU per rank).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from common import add_device_arguments, add_out_argument, add_threads_argument
from tqdm import tqdm

from orchestrator.run.preflight import resolve_model_path
from workers.json_files import write_json
from workers.lm import CachedLM, synchronize
from workers.model_spec import ModelSpec, RankSpec, free_port
from workers.tensor_parallel import (
    DEEPSPEED_LAUNCH_ENV,
    TensorParallelTarget,
    leave_tp_group,
    use_process_group_allreduce_on_cpu,
    wait_for_ranks,
)

WARMUP_REPEATS = 2


@dataclass(frozen=True)
class RankTimings:
    """Rank 0's medians: per block size n, and a one-token step run plain and padded."""

    t_target: dict[int, float]
    t_one_token: dict[str, float]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="model directory or zoo:PROFILE/NAME")
    parser.add_argument("--ranks", type=int, default=2, help="tensor-parallel size (default 2)")
    add_device_arguments(parser, device=False)
    add_threads_argument(parser, 1, "per rank")
    parser.add_argument("--context", type=int, default=160, help="tokens before each block")
    parser.add_argument("--max-block", type=int, default=9, help="largest block timed")
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds (median)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds before giving up")
    add_out_argument(parser, "deepspeed-steps.json")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.max_block < 2:
        parser.error("--max-block must be at least 2 (a one-token step is compared with two)")
    return args


def time_blocks(lm: CachedLM, max_block: int, context_len: int, repeats: int) -> RankTimings:
    """Return this rank's medians over ``repeats`` rounds (after ``WARMUP_REPEATS``) of blocks
    of 1 .. ``max_block`` tokens with the calibrated one-token step, and of one-token steps
    plain and padded; every rank must call it with the same arguments (collectives pair up)."""
    context = torch.arange(context_len, dtype=torch.long, device=lm.device) % 1000 + 10
    lm.reset()
    lm.forward(context, last_only=True)
    chosen = lm.pad_single_step
    cases = [(str(n), n, chosen) for n in range(1, max_block + 1)]
    cases += [("plain", 1, False), ("padded", 1, True)]
    times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    rounds = tqdm(range(WARMUP_REPEATS + repeats), desc="blocks", disable=dist.get_rank() != 0)
    for repeat in rounds:
        for name, n, padded in cases:
            lm.pad_single_step = padded
            dist.barrier()
            synchronize(lm.device)
            start = time.perf_counter()
            lm.forward(context[-n:])
            lm.crop(context_len)
            synchronize(lm.device)
            if repeat >= WARMUP_REPEATS:
                times[name].append(time.perf_counter() - start)
    lm.pad_single_step = chosen
    medians = {name: statistics.median(values) for name, values in times.items()}
    return RankTimings(
        {n: medians[str(n)] for n in range(1, max_block + 1)},
        {"plain": medians["plain"], "padded": medians["padded"]},
    )


def run_rank(args: argparse.Namespace) -> int:
    """Be rank ``args.rank``: shard, calibrate, time; rank 0 writes the report."""
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model = ModelSpec(path=args.model_path, dtype=args.dtype)
    place = RankSpec(args.rank, args.ranks, "127.0.0.1", args.port)
    target = TensorParallelTarget(model, place)
    timings = time_blocks(target.lm, args.max_block, args.context, args.repeats)
    if args.rank == 0:
        calibration = target.lm.calibration
        report = {
            "target": args.target,
            "ranks": args.ranks,
            "backend": dist.get_backend(),
            "device": str(target.lm.device),
            "cpu_process_group_allreduce": use_process_group_allreduce_on_cpu(),
            "dtype": args.dtype,
            "threads_per_rank": args.threads,
            "context_tokens": args.context,
            "repeats": args.repeats,
            "calibration": None if calibration is None else asdict(calibration),
            "padded_single_step": target.lm.pad_single_step,
            **asdict(timings),
            "one_token_not_dearer": timings.t_target[1] <= timings.t_target[2],
            "seconds": time.perf_counter() - started,
        }
        write_json(args.out, report)
    leave_tp_group()
    return 0


def launch_ranks(args: argparse.Namespace, argv: list[str]) -> list[int | None]:
    """Start every rank as a process of this script on the resolved target (a zoo model is
    built here, once); return their exit codes (None: killed at the deadline, or when a peer
    failed and it would wait for it forever)."""
    env = {key: value for key, value in os.environ.items() if key not in DEEPSPEED_LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = str(args.threads)
    port = free_port("127.0.0.1")
    path = str(resolve_model_path(args.target))
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--model-path", path]
    command += ["--port", str(port)]
    procs = [
        subprocess.Popen([*command, "--rank", str(rank)], env=env) for rank in range(args.ranks)
    ]
    codes = wait_for_ranks(procs, args.timeout)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return codes


def _print_report(out: Path) -> None:
    """Print the report's block costs and verdict."""
    report = json.loads(out.read_text())
    costs = ", ".join(f"{1000 * t:.1f}" for t in report["t_target"].values())
    one = report["t_one_token"]
    print(f"DeepSpeed AutoTP, {report['ranks']} rank(s), {report['backend']}, {report['dtype']}")
    print(f"t_target(n), ms, n = 1..{len(report['t_target'])}: {costs}")
    print(
        f"one-token step plain {1000 * one['plain']:.1f} ms, padded {1000 * one['padded']:.1f} "
        f"ms; calibrated: {'padded' if report['padded_single_step'] else 'plain'}"
    )
    verdict = "no more" if report["one_token_not_dearer"] else "MORE"
    print(f"a one-token step costs {verdict} than a two-token block; report: {out}")


def main(argv: list[str] | None = None) -> int:
    """Run the ranks (or be one of them); print the report's summary."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parse_args(argv)
    if args.rank is not None:
        return run_rank(args)
    try:
        codes = launch_ranks(args, argv)
    except ValueError as error:  # the target is no model (resolve_model_path says why)
        print(f"deepspeed_steps: error: {error}", file=sys.stderr)
        return 2
    if codes != [0] * args.ranks:
        print(f"deepspeed_steps: ranks ended with {codes} (None: killed)", file=sys.stderr)
        return 1
    _print_report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
