"""A fresh process's first seconds of decoding: per-request cost per token over time.

Loads the target alone (``--device``, ``--dtype``), then decodes the dataset's prompts greedily
(the target alone, as the AR baseline does) in turns for ``--seconds``, printing for each
request the time since the model was loaded, its milliseconds per token and, timed just
before it, a fixed pure-Python loop (a probe of the host CPU's speed). How the warm-up
default ``workers.trial.GPU_WARMUP_SECONDS`` was chosen (docs/gpu/warmup-transient-h200.log).

    python bench/gpu_warmup.py --target zoo:smol/target --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from orchestrator.preflight import resolve_model_path
from workers.lm import DTYPES, CachedLM, load_causal_lm
from workers.prompt_format import encode_dataset
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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--target", default="zoo:smol/target")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=75.0, help="how long to keep decoding")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--out", type=Path, default=Path("gpu-warmup.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Decode in turns for the given time, print each request's cost, write JSON."""
    args = _parse_args(argv)
    path = resolve_model_path(args.target)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = encode_dataset(tokenizer, args.dataset, args.samples, 256)
    target = LocalTarget(CachedLM(load_causal_lm(path, args.dtype, args.device)))
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
    args.out.write_text(json.dumps({**report, "requests": requests}, indent=2))
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
