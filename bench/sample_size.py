"""How many prompts give a speedup interval of a given width, from a stored sweep's prompt spread.

Pools the per-prompt (tokens, seconds) of every done speculative trial and its AR baseline in a
results store, each trial's seconds scaled so that its own speedup is 1 (what is left is the
spread of prompts around their trial). For each n it draws n pooled prompts (seeded, with
replacement), takes the paired 95% interval of the speedup
(``orchestrator.analysis.stats.paired_speed_ratio``, the interval every stored speedup carries) and
reports the mean relative half-width over the draws.

    python bench/sample_size.py --db sqlite:///docs/toy-demo-results.db --n 10 30 100 300
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from orchestrator.analysis.pairing import SampleSpeed, pair_samples
from orchestrator.analysis.stats import paired_speed_ratio
from orchestrator.store import open_store

Quad = tuple[float, float, float, float]


def pooled_prompts(db: str) -> list[Quad]:
    """Return (tokens, seconds, baseline tokens, baseline seconds) per prompt, trial speedup 1."""
    pooled: list[Quad] = []
    with open_store(db, read_only=True) as store:
        trials = [t for t in store.trials() if t.status == "done" and t.baseline_id]
        for trial in trials:
            pairs = pair_samples(
                store.sample_speeds(trial.trial_id), store.sample_speeds(trial.baseline_id)
            )
            if pairs:
                pooled += _scaled(pairs)
    return pooled


def _scaled(pairs: list[tuple[SampleSpeed, SampleSpeed]]) -> list[Quad]:
    """Return one trial's prompt pairs (method, baseline) with its seconds scaled to a
    speedup of 1."""
    speed = sum(m.tokens for m, _ in pairs) / sum(m.seconds for m, _ in pairs)
    base = sum(b.tokens for _, b in pairs) / sum(b.seconds for _, b in pairs)
    scale = speed / base
    return [(m.tokens, m.seconds * scale, b.tokens, b.seconds) for m, b in pairs]


def half_width(pooled: list[Quad], n: int, draws: int, seed: int) -> float:
    """Return the mean relative 95% half-width of the speedup over ``draws`` sets of n prompts."""
    rng = np.random.default_rng(seed)
    data = np.asarray(pooled, dtype=float)
    widths = []
    for _ in range(draws):
        sample = data[rng.integers(0, len(data), size=n)]
        interval = paired_speed_ratio(*sample.T)
        if interval is not None:
            widths.append((interval.high - interval.low) / 2 / interval.estimate)
    return float(np.mean(widths))


def main() -> None:
    """Print the half-width per n as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite:///docs/toy-demo-results.db")
    parser.add_argument("--n", type=int, nargs="+", default=[10, 30, 100, 300])
    parser.add_argument("--draws", type=int, default=20)
    args = parser.parse_args()
    pooled = pooled_prompts(args.db)
    report = {
        "prompts_pooled": len(pooled),
        "half_width": {n: half_width(pooled, n, args.draws, seed=n) for n in args.n},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
