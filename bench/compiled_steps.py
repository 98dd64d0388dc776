"""Eager against torch.compile'd static-shape steps of the fast Llama path, per block size.

For each block size: the fastest of ``--repeats`` eager forwards on each layout
(``LlamaFastDecoder.forward``), the uncompiled static forward (``workers.compiled_step``), the
compiled one, the seconds of its first call (the compile, or the load from inductor's cache
under the SpecSweep cache: run the script twice to see both), and the largest absolute
difference of its hidden states from the eager unpacked forward's. Blocks run after a cached
context of ``--context`` tokens and are cropped off again (a rollback).

    python bench/compiled_steps.py --target zoo:micro/target --sizes 1 2 4
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from common import (
    add_out_argument,
    add_pair_arguments,
    add_threads_argument,
    bench_parser,
    checkout_commit,
    write_report,
)

from orchestrator.run.preflight import resolve_model_path
from training.zoo.cache import default_cache_dir
from workers.compiled_step import StaticSteps, use_compile_cache
from workers.llama_fast import LlamaFastDecoder
from workers.lm import load_causal_lm

Forward = Callable[[torch.Tensor], torch.Tensor]


def timed(
    decoder: LlamaFastDecoder, forward: Forward, ids: torch.Tensor
) -> tuple[float, torch.Tensor]:
    """Return the seconds and output of ``forward(ids)`` after the cached context (cropped
    back to it)."""
    length = decoder.length
    start = time.perf_counter()
    out = forward(ids)
    seconds = time.perf_counter() - start
    decoder.crop(length)
    return seconds, out


def measure_size(
    decoder: LlamaFastDecoder, forwards: dict[str, Forward], n: int, repeats: int
) -> dict[str, float]:
    """Return the fastest seconds of each forward at block size ``n``, the compile seconds and
    the compiled output's largest difference from the eager unpacked one."""
    ids = torch.arange(2, 2 + n)
    compile_s, compiled_out = timed(decoder, forwards["compiled"], ids)
    _, reference = timed(decoder, forwards["eager_unpacked"], ids)
    seconds: dict[str, list[float]] = {name: [] for name in forwards}
    for _ in range(repeats):
        for name, forward in forwards.items():
            seconds[name].append(timed(decoder, forward, ids)[0])
    row = {f"{name}_s": min(times) for name, times in seconds.items()}
    row["compile_s"] = compile_s
    row["max_abs_diff"] = float((compiled_out - reference).abs().max())
    return row


def main(argv: list[str] | None = None) -> None:
    """Time eager and compiled steps per block size and write the JSON report."""
    parser = bench_parser(__doc__)
    add_pair_arguments(parser, draft=False)
    add_threads_argument(parser, None, "torch's default")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--capacity", type=int, default=256)
    add_out_argument(parser, "bench-compiled-steps.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cache = use_compile_cache(default_cache_dir() / "inductor")
    model = load_causal_lm(resolve_model_path(args.target))
    decoder = LlamaFastDecoder(model)
    static = StaticSteps(decoder, args.capacity, compiled=False)
    compiled = StaticSteps(decoder, args.capacity, compiled=True)
    forwards: dict[str, Forward] = {
        "compiled": compiled.forward,
        "eager_unpacked": lambda ids: decoder.forward(ids, packed=False),
        "eager_packed": lambda ids: decoder.forward(ids, packed=True),
        "static_uncompiled": static.forward,
    }
    rows = {}
    with torch.inference_mode():
        decoder.forward(torch.zeros(args.context, dtype=torch.long))
        for n in args.sizes:
            rows[n] = measure_size(decoder, forwards, n, args.repeats)
            print(n, rows[n], flush=True)
    report = {
        "commit": checkout_commit(),
        "target": args.target,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "inductor_cache": str(cache),
        "sizes": rows,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
