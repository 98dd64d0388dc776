"""Throughput against batch size: our batched AR and static-K speculative decoding
(workers.batch_engine) against transformers' batched generate() on the same target.

For each batch size B, every method decodes the same --samples prompts greedily to exactly
--max-new-tokens tokens each (EOS ignored, so every method emits the same number of tokens):
ours with B rows decoding together and continuous batching, transformers with the prompts in
groups of B, left-padded, one generate() call per group. Throughput is generated tokens over
wall seconds, prefill included (generate() includes it). Methods take turns within each repeat
and the fastest repeat counts (a busy machine only adds time), after one untimed pass of each
method at the first batch size. The batch-1 engine
(workers.engine) runs too, as the reference for the batched engine at B = 1.

Reported: tokens/s per method and B; ours / generate() at each B; the speculative speedup
(static K over our AR) at each B; batched AR at the largest B over B = 1; whether our greedy
output equals generate()'s for each prompt. --draft none measures AR alone.

    python bench/batch.py --target zoo:micro/target --draft zoo:micro/draft-s
    python bench/batch.py --target zoo:smol/target --draft zoo:smol/draft-s --samples 8 \\
        --max-new-tokens 32 --out bench-batch-smol.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from common import (
    add_device_arguments,
    add_out_argument,
    add_pair_arguments,
    add_prompt_arguments,
    add_threads_argument,
    bench_parser,
    checkout_commit,
    prepare,
    write_report,
)

from policies import make_policy
from workers.batch_cache import BatchedLM
from workers.batch_engine import (
    BatchRequest,
    batch_autoregressive_generate,
    batch_speculative_generate,
)
from workers.engine import autoregressive_generate, speculative_generate
from workers.lm import CachedLM
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget


@dataclass(frozen=True)
class Row:
    """One method at one batch size: tokens generated, fastest wall seconds and tokens/s, and
    the process CPU seconds of that fastest repeat and tokens per CPU second (with one torch
    thread, a measure that other processes on the machine disturb less than wall time)."""

    method: str
    batch_size: int
    tokens: int
    seconds: float
    tokens_per_s: float
    cpu_seconds: float
    tokens_per_cpu_s: float


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = bench_parser(__doc__)
    add_pair_arguments(parser)
    add_prompt_arguments(parser, samples=8, max_new_tokens=32)
    add_threads_argument(parser, None, "default: all")
    add_device_arguments(parser)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--k", type=int, default=4, help="static draft length")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats (fastest counts)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="each prompt's budget")
    add_out_argument(parser, "bench-batch.json")
    return parser.parse_args(argv)


def _timed(run: Callable[[], list[list[int]]]) -> tuple[tuple[float, float], list[list[int]]]:
    """Return the (wall, process CPU) seconds of ``run()`` and its outputs."""
    start, cpu = time.perf_counter(), time.process_time()
    outputs = run()
    return (time.perf_counter() - start, time.process_time() - cpu), outputs


def _hf_batched(model, prompts: list[list[int]], batch_size: int, max_new: int) -> list[list[int]]:
    """Run ``model.generate`` greedily on groups of ``batch_size`` left-padded prompts; return
    each prompt's generated ids."""
    pad = model.config.pad_token_id
    pad = pad if pad is not None else model.config.eos_token_id
    pad = pad if isinstance(pad, int) else 0
    outputs = []
    for first in range(0, len(prompts), batch_size):
        group = prompts[first : first + batch_size]
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        out = model.generate(
            ids,
            attention_mask=mask.to(model.device),
            do_sample=False,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            eos_token_id=None,
            pad_token_id=pad,
        )
        outputs.extend(out[:, width:].tolist())
    return outputs


def _methods(
    target_model, draft: CachedLM | None, target: CachedLM, args, prompts: list[list[int]]
) -> dict[str, Callable[[int], list[list[int]]]]:
    """Return each method as a function of the batch size to its outputs."""
    settings = RequestSettings(SamplingConfig(max_new_tokens=args.max_new_tokens))
    requests = [BatchRequest(torch.tensor(p), settings) for p in prompts]
    local = LocalTarget(target)

    def ours_ar(b: int) -> list[list[int]]:
        results = batch_autoregressive_generate(BatchedLM(target, b), requests)
        return [r.output_ids for r in results]

    def ours_static(b: int) -> list[list[int]]:
        results = batch_speculative_generate(
            BatchedLM(draft, b),
            BatchedLM(target, b),
            lambda: make_policy("static", args.k),
            requests,
        )
        return [r.output_ids for r in results]

    def engine_ar(b: int) -> list[list[int]]:
        return [autoregressive_generate(local, r.prompt_ids, settings).output_ids for r in requests]

    def engine_static(b: int) -> list[list[int]]:
        policy = make_policy("static", args.k)
        return [
            speculative_generate(draft, local, policy, r.prompt_ids, settings).output_ids
            for r in requests
        ]

    methods = {
        "transformers generate()": lambda b: _hf_batched(
            target_model, prompts, b, args.max_new_tokens
        ),
        "ours AR": ours_ar,
        "batch-1 engine AR": engine_ar,
    }
    if draft is not None:
        methods[f"ours static K={args.k}"] = ours_static
        methods[f"batch-1 engine static K={args.k}"] = engine_static
    return methods


def _measure(methods, batch_sizes: list[int], repeats: int) -> tuple[list[Row], dict]:
    """Time every method at every batch size (batch-1 engine rows at B = 1 only), taking turns
    within each repeat; return the rows and, per B, the prompts where ours AR equals generate()."""
    best: dict[tuple[str, int], tuple[float, float]] = {}
    tokens: dict[tuple[str, int], int] = {}
    agreement = {}
    for b in batch_sizes:
        names = [n for n in methods if b == 1 or not n.startswith("batch-1")]
        if b == batch_sizes[0]:  # one untimed pass of each method first
            for name in names:
                methods[name](b)
        for repeat in range(repeats):
            outputs = {}
            for name in names if repeat % 2 == 0 else names[::-1]:
                seconds, outputs[name] = _timed(lambda name=name, b=b: methods[name](b))
                best[name, b] = min(best.get((name, b), seconds), seconds)  # by wall time
                tokens[name, b] = sum(len(out) for out in outputs[name])
            reference = outputs["transformers generate()"]
            agreement[b] = [o == r for o, r in zip(outputs["ours AR"], reference, strict=True)]
        print(f"B={b}: " + ", ".join(f"{n} {tokens[n, b] / best[n, b][0]:.1f}" for n in names))
    rows = [
        Row(n, b, tokens[n, b], wall, tokens[n, b] / wall, cpu, tokens[n, b] / cpu)
        for (n, b), (wall, cpu) in best.items()
    ]
    return rows, agreement


def _summary(rows: list[Row], k: int, batch_sizes: list[int], cpu: bool = False) -> dict:
    """Return the ratios the issue asks for from the rows' tokens per wall second (per CPU
    second with ``cpu``)."""
    tps = {(r.method, r.batch_size): r.tokens_per_cpu_s if cpu else r.tokens_per_s for r in rows}
    summary = {
        "ours_ar_over_generate": {
            b: tps["ours AR", b] / tps["transformers generate()", b] for b in batch_sizes
        },
        "ar_throughput_largest_b_over_b1": tps["ours AR", max(batch_sizes)] / tps["ours AR", 1],
    }
    if 1 in batch_sizes:
        summary["batched_over_batch1_engine_ar_at_b1"] = (
            tps["ours AR", 1] / tps["batch-1 engine AR", 1]
        )
    static = f"ours static K={k}"
    if (static, batch_sizes[0]) in tps:
        summary["speculative_speedup"] = {
            b: tps[static, b] / tps["ours AR", b] for b in batch_sizes
        }
        if 1 in batch_sizes:
            summary["batched_over_batch1_engine_static_at_b1"] = (
                tps[static, 1] / tps[f"batch-1 engine static K={k}", 1]
            )
    return summary


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the ratios and write JSON; return the exit code."""
    args = _parse_args(argv)
    commit = checkout_commit()  # before the run: the code measured
    no_draft = args.draft == "none"
    if no_draft:
        args.draft = None
    inputs = prepare(args, prompt_tokens=args.prompt_tokens)
    target_model = inputs.load(inputs.target_path)
    target = CachedLM(target_model)
    draft = None if no_draft else CachedLM(inputs.load(inputs.draft_path))
    methods = _methods(target_model, draft, target, args, inputs.prompts)
    rows, agreement = _measure(methods, args.batch_sizes, args.repeats)
    report = {
        "commit": commit,
        "target": str(inputs.target_path),
        "draft": None if no_draft else str(inputs.draft_path),
        "dataset": args.dataset,
        "samples": len(inputs.prompts),
        "prompt_lengths": [len(p) for p in inputs.prompts],
        "max_new_tokens": args.max_new_tokens,
        "k": args.k,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "target_plan": repr(target.plan),
        "rows": [asdict(row) for row in rows],
        "greedy_equal_to_generate": {b: sum(a) for b, a in agreement.items()},
        "summary": _summary(rows, args.k, args.batch_sizes),
        "summary_cpu_time": _summary(rows, args.k, args.batch_sizes, cpu=True),
    }
    print(report["summary"], report["summary_cpu_time"], sep="\n")
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
