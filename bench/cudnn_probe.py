"""Does a decoding step cost more the first time its key length is met? With and without cuDNN.

Loads a model with ``CachedLM`` (which takes cuDNN out of attention on CUDA), optionally puts
cuDNN back (``--cudnn on``), then decodes over a range of key lengths twice: steps of one token
and blocks of five (each block's cache rolled back to one new token, as after a verification).
The first pass meets every length for the first time, the second meets them again. Prints and
writes (``--out``) each pass's median, 90th percentile and maximum step in ms.

    python bench/cudnn_probe.py --model zoo:smol/target --device cuda --cudnn on --out on.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from orchestrator.preflight import resolve_model_path
from workers.lm import CachedLM, load_causal_lm, synchronize

#: (block size, first key length) of each probe; each covers LENGTHS lengths.
PROBES = ((1, 300), (5, 500))
LENGTHS = 80


def step_costs(lm: CachedLM, ids: torch.Tensor, start: int, block: int) -> list[float]:
    """Return the ms of each step over key lengths start..start+LENGTHS, from a fresh cache."""
    lm.reset()
    lm.forward(ids[:start], last_only=True)
    synchronize(lm.device)
    costs = []
    for position in range(start, start + LENGTHS):
        began = time.perf_counter()
        out = lm.forward(ids[position : position + block])
        out.logits.argmax(-1).tolist()
        costs.append(1000 * (time.perf_counter() - began))
        lm.crop(position + 1)
    return costs


def summary(costs: list[float]) -> dict[str, float]:
    """Return the median, 90th percentile and maximum of ``costs``."""
    ordered = sorted(costs)
    return {
        "median_ms": statistics.median(ordered),
        "p90_ms": ordered[int(0.9 * len(ordered))],
        "max_ms": ordered[-1],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the probe (command line ``argv``); return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:smol/target", help="model path or zoo ref")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--cudnn", choices=("on", "off"), default="off", help="cuDNN attention")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    model = load_causal_lm(resolve_model_path(args.model), args.dtype, args.device)
    lm = CachedLM(model)
    torch.backends.cuda.enable_cudnn_sdp(args.cudnn == "on")
    high = min(5000, model.config.vocab_size)
    ids = torch.randint(high // 50, high, (1200,), generator=torch.Generator().manual_seed(0))
    results = []
    for block, start in PROBES:
        for repeat in range(2):
            row = {"block": block, "pass": repeat, "lengths": [start, start + LENGTHS]}
            row |= summary(step_costs(lm, ids, start, block))
            print(json.dumps(row), flush=True)
            results.append(row)
    report = {"model": args.model, "device": args.device, "dtype": args.dtype}
    report |= {"cudnn": args.cudnn, "padded_one_token_steps": lm.pad_single_step}
    if args.out:
        args.out.write_text(json.dumps(report | {"passes": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
