"""Eager against compiled steps of the fast Llama path, per block size (issue #45 point 4).

Loads the target, compiles ``workers.compiled_step.CompiledSteps`` (its ``warm``: the seconds
are the compile, or the load from inductor's cache under the SpecSweep cache: run the script
twice to see both), then, after a cached context of ``--context`` tokens, times the forward
of each block size on each layout (eager packed, eager unpacked, compiled), the layouts taking
turns and the sizes rotating in every round, and reports the median and the fastest of
``--repeats`` and whether the compiled hidden states equal the eager unpacked ones bit for bit
(and their largest difference). Each block is cropped off again (a rollback). Then, as a
sweep's worker would, ``CachedLM(compiled_steps=True)`` calibrates and prints the step plan it
chooses. Run it with nothing else on the cores.

    python bench/compiled_steps.py --target zoo:smol/target --sizes 1 2 3 4 6 8
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict

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
from workers.compiled_step import CompiledSteps, use_compile_cache
from workers.llama_fast import LlamaFastDecoder
from workers.lm import CachedLM, load_causal_lm

Forward = Callable[[torch.Tensor], torch.Tensor]


def timed(decoder: LlamaFastDecoder, forward: Forward, ids: torch.Tensor) -> float:
    """Return the seconds of ``forward(ids)`` after the cached context (cropped back to it)."""
    length = decoder.length
    start = time.perf_counter()
    forward(ids)
    seconds = time.perf_counter() - start
    decoder.crop(length)
    return seconds


def equality(decoder: LlamaFastDecoder, compiled: Forward, n: int) -> dict[str, float | bool]:
    """Return whether the compiled forward of an ``n``-token block equals the eager unpacked
    one bit for bit, and their largest absolute difference."""
    ids = torch.arange(2, 2 + n)
    length = decoder.length
    eager = decoder.forward(ids, packed=False)
    decoder.crop(length)
    mine = compiled(ids)
    decoder.crop(length)
    difference = float((mine - eager).abs().max())
    return {"bit_equal": bool(torch.equal(mine, eager)), "max_abs_diff": difference}


def measure(
    decoder: LlamaFastDecoder, forwards: dict[str, Forward], sizes: list[int], repeats: int
) -> dict[int, dict[str, float]]:
    """Return each layout's median and fastest seconds at each block size (layouts in turns,
    sizes rotating from round to round)."""
    seconds: dict[tuple[str, int], list[float]] = {(a, n): [] for a in forwards for n in sizes}
    for repeat in range(repeats):
        order = list(forwards) if repeat % 2 == 0 else list(forwards)[::-1]
        for name in order:
            for n in sizes[repeat % len(sizes) :] + sizes[: repeat % len(sizes)]:
                seconds[name, n].append(timed(decoder, forwards[name], torch.arange(2, 2 + n)))
    return {
        n: {
            **{f"{a}_median_s": statistics.median(seconds[a, n]) for a in forwards},
            **{f"{a}_fastest_s": min(seconds[a, n]) for a in forwards},
        }
        for n in sizes
    }


def main(argv: list[str] | None = None) -> None:
    """Time eager and compiled steps per block size and write the JSON report."""
    parser = bench_parser(__doc__)
    add_pair_arguments(parser, draft=False)
    add_threads_argument(parser, None, "torch's default")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    parser.add_argument("--context", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=15)
    add_out_argument(parser, "bench-compiled-steps.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cache = use_compile_cache(default_cache_dir() / "inductor")
    model = load_causal_lm(resolve_model_path(args.target))
    with torch.inference_mode():
        decoder = LlamaFastDecoder(model)
        decoder.forward(torch.zeros(args.context, dtype=torch.long))
        compiled = CompiledSteps(decoder)
        warm_s = compiled.warm()
        warm_graphs = compiled.graphs
        print(f"compiled {warm_graphs} graphs in {warm_s:.1f} s", flush=True)
        forwards: dict[str, Forward] = {
            "packed": lambda ids: decoder.forward(ids, packed=True),
            "unpacked": lambda ids: decoder.forward(ids, packed=False),
            "compiled": compiled.forward,
        }
        rows = measure(decoder, forwards, args.sizes, args.repeats)
        for n in args.sizes:
            rows[n].update(equality(decoder, compiled.forward, n))
            print(n, rows[n], flush=True)
        calibration = CachedLM(model, compiled_steps=True).calibration
    report = {
        "commit": checkout_commit(),
        "target": args.target,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "context": args.context,
        "repeats": args.repeats,
        "inductor_cache": str(cache),
        "compile_seconds": warm_s,
        "graphs": warm_graphs,
        "graphs_compiled_while_timing": compiled.graphs - warm_graphs,
        "sizes": rows,
        "calibration": asdict(calibration) if calibration else None,
    }
    print("CachedLM(compiled_steps=True) chose", calibration.plan if calibration else None)
    write_report(args.out, report)


if __name__ == "__main__":
    main()
