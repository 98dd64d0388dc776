"""What does an EAGLE head's draft step cost against a target step?

Times one draft step of an EAGLE head (``workers.eagle.step.EagleStep``: one pair through the
fusion fc and the decoder layer over its KV cache, then its LM-head row) and one ``CachedLM``
token step of the target, in turns after the same cached context, on the prepacked (oneDNN)
weights and on the plain ones (``training.eagle_training.step_cost``). ``--head`` is a trained
head (this project's artifact or a speculators checkpoint); without it a fresh head of the
target's layer shape is timed (the cost does not depend on the weights), its LM head cut to the
first ``--head-vocab`` rows (0: all). JSON: both timings and their ratio per layout, the
machine's load average.

    python bench/eagle_step.py --target zoo:smol/target --head-vocab 8192 --threads 2
"""

from __future__ import annotations

import sys
from dataclasses import asdict

from common import add_out_argument, add_threads_argument, bench_parser, write_report

from orchestrator.run.preflight import resolve_model_path
from training.eagle_training import step_cost
from workers.eagle.artifact import load_eagle_head
from workers.eagle.head import EagleConfig, EagleHead, TargetParts
from workers.lm import load_causal_lm


def main(argv: list[str] | None = None) -> int:
    """Time the head's and the target's steps; write the JSON report."""
    parser = bench_parser(__doc__)
    parser.add_argument("--target", default="zoo:smol/target", help="model directory or zoo ref")
    parser.add_argument(
        "--head", default=None, help="EAGLE head directory or zoo ref (default: fresh)"
    )
    parser.add_argument("--head-vocab", type=int, default=8192, help="rows of a fresh head")
    parser.add_argument("--context", type=int, default=128, help="cached tokens before a step")
    parser.add_argument("--repeats", type=int, default=30, help="timed steps of each model")
    add_threads_argument(parser, 2, "default 2")
    add_out_argument(parser, "bench-eagle-step.json")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    target_path = resolve_model_path(args.target)
    target = load_causal_lm(target_path)
    if args.head is not None:
        head = load_eagle_head(resolve_model_path(args.head), target)
    else:
        vocab = tuple(range(args.head_vocab)) if args.head_vocab > 0 else None
        config = EagleConfig.for_target(target, head_vocab=vocab)
        head = EagleHead(config, TargetParts.of(target)).eval()
    layouts = {
        name: asdict(step_cost(target, head, args.context, args.repeats, prepack))
        for name, prepack in (("prepacked", True), ("unpacked", False))
    }
    for name, cost in layouts.items():
        print(
            f"{name}: head {cost['t_head_s'] * 1e3:.2f} ms, target "
            f"{cost['t_target_s'] * 1e3:.2f} ms, ratio {cost['cost_ratio']:.3f}"
        )
    report = {
        "target": str(target_path),
        "head": args.head,
        "head_vocab": None if head.config.head_vocab is None else len(head.config.head_vocab),
        "hidden_size": head.config.hidden_size,
        "layouts": layouts,
    }
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
