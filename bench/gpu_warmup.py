"""A fresh process's first seconds of decoding: per-request cost per token over time.

Loads the target alone (``--device``, ``--dtype``), then decodes the dataset's prompts greedily
(the target alone, as the AR baseline does) in turns for ``--seconds``, printing for each
request the time since the model was loaded, its milliseconds per token and, timed just
before it, a fixed pure-Python loop (a probe of the host CPU's speed). How the warm-up
default ``workers.trial.GPU_WARMUP_SECONDS`` was chosen (docs/gpu/warmup-transient-h200.log).

    python bench/gpu_warmup.py --target zoo:smol/target --device cuda --dtype bfloat16

The ``warmup`` step of ``bench/gpu_check.sh`` runs it; findings: docs/lab/gpu-run-2-h200.md.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from common import (
    add_device_arguments,
    add_out_argument,
    add_pair_arguments,
    add_prompt_arguments,
    bench_parser,
    prepare,
    write_report,
)

from workers.lm import CachedLM
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget


def _cpu_probe_ms() -> float:
    """Return the milliseconds a fixed pure-Python loop takes (the host's speed right now)."""
    start = time.perf_counter()
    total = 0
    for i in range(200_000):
        total += i * i
    return 1000 * (time.perf_counter() - start)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = bench_parser(__doc__)
    add_pair_arguments(parser, draft=False)
    add_prompt_arguments(parser, samples=4, max_new_tokens=48)
    parser.add_argument("--seconds", type=float, default=75.0, help="how long to keep decoding")
    add_device_arguments(parser)
    add_out_argument(parser, "gpu-warmup.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Decode in turns for the given time, print each request's cost, write JSON."""
    args = _parse_args(argv)
    inputs = prepare(args)
    prompts, path = inputs.prompts, inputs.target_path
    target = LocalTarget(CachedLM(inputs.load(path)))
    settings = RequestSettings(SamplingConfig(max_new_tokens=args.max_new_tokens), seed=1)
    start, requests = time.perf_counter(), []
    while time.perf_counter() - start < args.seconds:
        for index, prompt in enumerate(prompts):
            probe = _cpu_probe_ms()
            result = target.generate(torch.tensor(prompt), settings)
            row = {
                "since_load_s": time.perf_counter() - start,
                "prompt": index,
                "ms_per_token": 1000 * result.seconds / max(result.n_generated, 1),
                "cpu_probe_ms": probe,
            }
            requests.append(row)
            print(
                f"t={row['since_load_s']:5.1f}s prompt {index} ms/token "
                f"{row['ms_per_token']:5.1f} cpu-probe {probe:5.1f} ms",
                flush=True,
            )
    report = {"target": str(path), "device": args.device, "dtype": args.dtype}
    write_report(args.out, {**report, "requests": requests})
    return 0


if __name__ == "__main__":
    sys.exit(main())
