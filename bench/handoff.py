"""Hand-off cost: one round's draft and verify steps back to back, with gaps, in two processes.

A draft/target split (``bench/actors.py``) runs each model in its own process, so each one
waits while the other computes and resumes after it. This bench asks what the machine alone
charges for that, with no Ray and no engine: it repeats one round's work, ``--k`` one-token
draft steps then a ``k + 1``-token target block (each cache rolled back after), in three ways:

- ``back_to_back``: both models in this process and thread, one piece right after the other
  (what the in-process placement does);
- ``idle_between``: the same thread, but sleeping after each piece for as long as the other
  piece takes (each side idles as it would while the other process computes; no process switch);
- ``two_processes``: the draft here, the target in a child process that loads its own copy,
  the pieces handed over through a pipe (what the actor split does, without Ray).

Each piece is timed inside the process that runs it, so the pipe's own latency is not counted.
The ways take turns in bursts of ``--rounds`` rounds (order shuffled per cycle, seeded), over
``--cycles`` cycles, because this repository's 2-core VM drifts by up to ±20% over tens of
seconds; each way's round time is compared with ``back_to_back``'s in the same cycles (ratio of
sums, jackknife t 95% interval over cycles). Writes JSON.

    python bench/handoff.py --target zoo:smol/target --draft zoo:smol/draft-s --out handoff.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import chain
from multiprocessing.connection import Connection

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

from orchestrator.analysis.stats import ratio_interval
from workers.lm import CachedLM, load_causal_lm

WAYS = ("back_to_back", "idle_between", "two_processes")
#: Rounds at the start of each burst left out (the first after a switch of way settle it).
SETTLE_ROUNDS = 3


@dataclass
class WayTimes:
    """One way's piece times: per burst, the draft and verify seconds of each kept round."""

    draft: list[list[float]] = field(default_factory=list)
    verify: list[list[float]] = field(default_factory=list)

    def round_sums(self) -> list[float]:
        """Return each burst's summed round seconds (draft plus verify)."""
        return [sum(d) + sum(v) for d, v in zip(self.draft, self.verify, strict=True)]


class RoundPieces:
    """One model's piece of a round, repeatable: run it from a prefilled prompt, roll back."""

    def __init__(self, lm: CachedLM, prompt: torch.Tensor, block: int, one_by_one: bool) -> None:
        self.lm, self.block, self.one_by_one = lm, block, one_by_one
        self.ids = prompt[-1:].repeat(block)
        with torch.inference_mode():
            lm.reset()
            lm.forward(prompt, last_only=True)
        self.length = lm.cached_len

    @torch.inference_mode()
    def run(self) -> float:
        """Run the piece (``block`` one-token steps, or one ``block``-token forward); return its
        seconds."""
        start = time.perf_counter()
        if self.one_by_one:
            for index in range(self.block):
                self.lm.forward(self.ids[index : index + 1], last_only=True)
        else:
            self.lm.forward(self.ids, last_only=False)
        seconds = time.perf_counter() - start
        self.lm.crop(self.length)
        return seconds


def _load_pieces(path: str, dtype: str, prompt: list[int], block: int, draft: bool) -> RoundPieces:
    """Load the model at ``path`` in this process and return its round piece."""
    torch.set_num_threads(1)
    lm = CachedLM(load_causal_lm(path, dtype))
    return RoundPieces(lm, torch.tensor(prompt, dtype=torch.long), block, one_by_one=draft)


def _serve_target(connection: Connection, path: str, dtype: str, prompt: list[int], k: int) -> None:
    """Child process: load the target, then run a verify piece for each message until None."""
    target = _load_pieces(path, dtype, prompt, k + 1, draft=False)
    connection.send(target.run())
    while connection.recv() is not None:
        connection.send(target.run())


def _burst(run_round: Callable[[], tuple[float, float]], rounds: int, times: WayTimes) -> None:
    """Run ``rounds`` rounds; keep all but the first ``SETTLE_ROUNDS`` in ``times``."""
    kept = [run_round() for _ in range(rounds)][SETTLE_ROUNDS:]
    times.draft.append([draft for draft, _ in kept])
    times.verify.append([verify for _, verify in kept])


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = bench_parser(__doc__)
    add_pair_arguments(parser)
    add_prompt_arguments(
        parser, samples=None, max_new_tokens=None, dataset_help="its first prompt is the prefix"
    )
    parser.add_argument("--k", type=int, default=4, help="draft steps per round")
    parser.add_argument("--rounds", type=int, default=30, help="rounds per burst")
    parser.add_argument("--cycles", type=int, default=12, help="bursts of each way")
    add_device_arguments(parser, device=False)
    add_out_argument(parser, "bench-handoff.json")
    args = parser.parse_args(argv)
    if args.rounds <= SETTLE_ROUNDS:
        parser.error(f"--rounds must be above {SETTLE_ROUNDS} (the settling rounds left out)")
    if args.cycles < 2:
        parser.error("--cycles must be at least 2 (the interval is over cycles)")
    return args


def _way_report(times: WayTimes, base: WayTimes) -> dict:
    """Return a way's median piece ms and its round time over ``back_to_back``'s, by cycle."""
    ratio = ratio_interval(times.round_sums(), base.round_sums())
    if ratio is None:
        raise ValueError("a ratio interval needs at least 2 cycles")
    return {
        "draft_ms_median": 1000 * statistics.median(chain.from_iterable(times.draft)),
        "verify_ms_median": 1000 * statistics.median(chain.from_iterable(times.verify)),
        "round_over_back_to_back": ratio.estimate,
        "ratio_ci95": [ratio.low, ratio.high],
    }


def measure(args: argparse.Namespace) -> dict[str, WayTimes]:
    """Run every way in turns, bursts of ``args.rounds``; return each way's times."""
    inputs = prepare(args, samples=1)
    prompt, target_path, draft_path = inputs.prompts[0], inputs.target_path, inputs.draft_path
    draft = _load_pieces(str(draft_path), args.dtype, prompt, args.k, draft=True)
    target = _load_pieces(str(target_path), args.dtype, prompt, args.k + 1, draft=False)
    here, there = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(
        target=_serve_target, args=(there, str(target_path), args.dtype, prompt, args.k)
    )
    child.start()
    there.close()
    here.recv()
    gap = {"draft": draft.run(), "verify": target.run()}

    def remote_verify() -> float:
        here.send(True)
        return here.recv()

    def idle_round() -> tuple[float, float]:
        drafted = draft.run()
        time.sleep(gap["verify"])
        verified = target.run()
        time.sleep(gap["draft"])
        return drafted, verified

    rounds = {
        "back_to_back": lambda: (draft.run(), target.run()),
        "idle_between": idle_round,
        "two_processes": lambda: (draft.run(), remote_verify()),
    }
    times = {way: WayTimes() for way in WAYS}
    try:
        for cycle in range(args.cycles):
            for way in random.Random(cycle).sample(WAYS, len(WAYS)):
                _burst(rounds[way], args.rounds, times[way])
            gap["draft"] = statistics.median(times["back_to_back"].draft[-1])
            gap["verify"] = statistics.median(times["back_to_back"].verify[-1])
            print(f"cycle {cycle + 1}/{args.cycles} done", file=sys.stderr)
    finally:
        here.send(None)
        child.join(timeout=60)
    return times


def main(argv: list[str] | None = None) -> int:
    """Measure, print a table, write JSON; return the exit code."""
    args = _parse_args(argv)
    times = measure(args)
    report = {
        "settings": {key: str(value) for key, value in vars(args).items()},
        "ways": {way: _way_report(times[way], times["back_to_back"]) for way in WAYS},
        "times": {way: asdict(times[way]) for way in WAYS},
    }
    for way, figures in report["ways"].items():
        low, high = figures["ratio_ci95"]
        print(
            f"{way:14} draft {figures['draft_ms_median']:8.2f} ms  verify "
            f"{figures['verify_ms_median']:8.2f} ms  round / back_to_back "
            f"{figures['round_over_back_to_back']:.3f} (95% CI {low:.3f}-{high:.3f})"
        )
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
