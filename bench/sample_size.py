"""How many prompts give a speedup interval of a given width, from a stored sweep's prompt spread.

Pools the per-prompt (tokens, seconds) of every done speculative trial and its AR baseline in a
results store, each trial's seconds scaled so that its own speedup is 1 (what is left is the
spread of prompts around their trial). For each n it draws n pooled prompts (seeded, with
replacement), takes the paired 95% interval of the speedup
(``orchestrator.analysis.stats.paired_speed_ratio``, the interval every stored speedup carries) and
reports the mean relative half-width over the draws.

``--measure acceptance`` sizes a draft-against-draft acceptance claim instead (the reproduction
report's ``report.drafts``): it pools the per-prompt (accepted, drafted) of every two done trials
of one setting (policy, parameters, max draft length, dataset entry, sampling, seed) on two
pairs, each pair of trials scaled to an acceptance ratio of 1, and takes the same paired
interval on the ratio of acceptance rates.

    python bench/sample_size.py --db sqlite:///docs/toy-demo-results.db --n 10 30 100 300
"""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np

from orchestrator.analysis.pairing import SampleSpeed, acceptance_counts, pair_samples
from orchestrator.analysis.stats import paired_speed_ratio
from orchestrator.store import open_store
from orchestrator.store.records import StoredTrial

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


def _setting(trial: StoredTrial) -> str:
    """Return what a trial measures apart from its pair: dataset entry, sampling, seed, draft
    kind, policy, parameters and max draft length."""
    parts = (
        *(trial.dataset, trial.split, trial.samples, trial.max_new_tokens),
        *(trial.temperature, trial.top_k, trial.top_p, trial.seed, trial.draft_kind),
        *(trial.policy, json.dumps(trial.params, sort_keys=True), trial.max_draft_len),
    )
    return json.dumps(parts)


def pooled_acceptance(db: str) -> list[Quad]:
    """Return (accepted, drafted, other's accepted, other's drafted) per prompt of every two done
    speculative trials of one setting on two pairs, each pair of trials scaled to a ratio of 1."""
    pooled: list[Quad] = []
    with open_store(db, read_only=True) as store:
        settings: dict[str, list[StoredTrial]] = {}
        for trial in store.trials():
            if trial.status == "done" and trial.baseline_id and not trial.config.get("is_check"):
                settings.setdefault(_setting(trial), []).append(trial)
        for trials in settings.values():
            for a, b in itertools.combinations(trials, 2):
                counts = [acceptance_counts(store.sample_speeds(t.trial_id)) or [] for t in (a, b)]
                pairs = pair_samples(*counts)
                accepted = [sum(x.tokens for x, _ in pairs), sum(y.tokens for _, y in pairs)]
                if a.pair != b.pair and pairs and min(accepted) > 0:
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
    parser.add_argument(
        "--measure",
        choices=("speedup", "acceptance"),
        default="speedup",
        help="speedup over AR (default), or one draft's acceptance rate over another's",
    )
    args = parser.parse_args()
    pooled = pooled_prompts(args.db) if args.measure == "speedup" else pooled_acceptance(args.db)
    report = {
        "prompts_pooled": len(pooled),
        "half_width": {n: half_width(pooled, n, args.draws, seed=n) for n in args.n},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
