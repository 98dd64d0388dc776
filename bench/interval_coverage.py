"""How often candidate 95% intervals of a paired speed ratio hold the true ratio, by n prompts.

Simulates paired per-prompt data (``orchestrator.analysis.coverage``: log-normal prompt costs
with the demo's spreads, log speedup sd 0.11 and AR seconds per token 12%, and the same with one
prompt in ten an outlier of four times the spread) and measures, per n, the coverage of:

- ``percentile``: the percentile bootstrap of the ratio of sums (the method used until #43);
- ``bca``: the bias-corrected and accelerated bootstrap (jackknife acceleration);
- ``studentized``: the bootstrap-t of log ratio, each resample's delta-method standard error;
- ``t_delta``: a t interval (n - 1 df) on log ratio with its delta-method standard error;
- ``t_jackknife``: the same with the jackknife standard error;
- ``t_mean_log``: a t interval on the mean of per-prompt log speed ratios (a geometric mean,
  another estimand: shown to say why it is not used);
- ``chosen``: ``orchestrator.analysis.stats.paired_speed_ratio`` as it is now (None below its
  minimum n);
- ``chosen_single``: ``orchestrator.analysis.stats.ratio_interval`` of B's tokens/s alone (a single
  trial's interval, the same method without pairing).

A third model, ``failures`` (the draft fails on one prompt in ten, halving its speedup there),
shows what no interval over few prompts can hold: it is reported, not required.

Bootstraps use 2000 resamples, as the stored intervals do. Writes JSON.

    python bench/interval_coverage.py --out docs/lab/data/interval-coverage.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

from orchestrator.analysis.coverage import (
    DEMO,
    FAILURES,
    OUTLIERS,
    PromptModel,
    binomial_margin,
    coverage,
    simulate,
    true_rate,
    true_ratio,
)
from orchestrator.analysis.stats import MIN_PROMPTS, Interval, paired_speed_ratio, ratio_interval
from workers.json_files import write_json

NS = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 30, 40)
MODELS = {"demo": DEMO, "outliers": OUTLIERS, "failures": FAILURES}
CANDIDATES = ("percentile", "bca", "studentized", "t_delta", "t_jackknife", "t_mean_log")
RESAMPLES = 2000
ALPHA = 0.05


def _log_ratio(ta: np.ndarray, sa: np.ndarray, tb: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """Return log of (Σta/Σsa)/(Σtb/Σsb) along the last axis."""
    logs = [np.log(np.sum(x, -1)) for x in (ta, sa, tb, sb)]
    return logs[0] - logs[1] - logs[2] + logs[3]


def _delta_se(ta: np.ndarray, sa: np.ndarray, tb: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """Return the delta-method standard error of the log ratio along the last axis."""
    share = [x / np.sum(x, -1, keepdims=True) for x in (ta, sa, tb, sb)]
    influence = share[0] - share[1] - share[2] + share[3]
    n = ta.shape[-1]
    return np.sqrt(n / (n - 1) * np.sum(influence**2, -1))


def _jackknife(data: tuple[np.ndarray, ...]) -> np.ndarray:
    """Return the n leave-one-out log ratios of one replicate."""
    n = len(data[0])
    keep = ~np.eye(n, dtype=bool)
    return _log_ratio(*(np.broadcast_to(x, (n, n))[keep].reshape(n, n - 1) for x in data))


def candidate_bounds(data: tuple[np.ndarray, ...], rng: np.random.Generator) -> dict[str, tuple]:
    """Return every candidate's (low, high) of the ratio for one replicate's n prompts."""
    n = len(data[0])
    theta, se = _log_ratio(*data), _delta_se(*data)
    index = rng.integers(0, n, size=(RESAMPLES, n))
    resampled = tuple(x[index] for x in data)
    star = _log_ratio(*resampled)
    tail = [ALPHA / 2, 1 - ALPHA / 2]
    q = student_t.ppf(1 - ALPHA / 2, n - 1)
    jack = _jackknife(data)
    jack_se = np.sqrt((n - 1) / n * np.sum((jack - jack.mean()) ** 2))
    bounds = {
        "percentile": tuple(np.quantile(star, tail)),
        "bca": _bca(star, theta, jack),
        "studentized": _studentized(star, theta, se, _delta_se(*resampled)),
        "t_delta": (theta - q * se, theta + q * se),
        "t_jackknife": (theta - q * jack_se, theta + q * jack_se),
        "t_mean_log": _t_mean(np.log(data[0] / data[1]) - np.log(data[2] / data[3]), q),
    }
    return {name: (float(np.exp(low)), float(np.exp(high))) for name, (low, high) in bounds.items()}


def _bca(star: np.ndarray, theta: float, jack: np.ndarray) -> tuple[float, float]:
    """Return the BCa bounds of ``theta`` from its resamples and jackknife values."""
    below = np.clip(np.mean(star < theta), 1 / len(star), 1 - 1 / len(star))
    z0 = norm.ppf(below)
    spread = jack.mean() - jack
    denominator = 6 * np.sum(spread**2) ** 1.5
    accel = np.sum(spread**3) / denominator if denominator > 0 else 0.0
    z = norm.ppf([ALPHA / 2, 1 - ALPHA / 2])
    levels = norm.cdf(z0 + (z0 + z) / (1 - accel * (z0 + z)))
    low, high = np.quantile(star, levels)
    return float(low), float(high)


def _studentized(
    star: np.ndarray, theta: float, se: float, star_se: np.ndarray
) -> tuple[float, float]:
    """Return bootstrap-t bounds; resamples of one repeated prompt (se 0) are left out."""
    usable = star_se > 0
    if not usable.any() or se == 0:
        return theta, theta
    t_star = (star[usable] - theta) / star_se[usable]
    t_low, t_high = np.quantile(t_star, [ALPHA / 2, 1 - ALPHA / 2])
    return float(theta - t_high * se), float(theta - t_low * se)


def _t_mean(values: np.ndarray, q: float) -> tuple[float, float]:
    """Return mean ± q·s/√n of ``values``."""
    half = q * values.std(ddof=1) / np.sqrt(len(values))
    return float(values.mean() - half), float(values.mean() + half)


def candidates_coverage(model: PromptModel, n: int, replications: int, seed: int) -> dict:
    """Return each candidate's coverage rate of the true ratio over n simulated prompts."""
    data = simulate(model, n, replications, seed)
    truth = true_ratio(model)
    rng = np.random.default_rng(seed + 1)
    hits = dict.fromkeys(CANDIDATES, 0)
    for row in range(replications):
        one = (data.tokens_a[row], data.seconds_a[row], data.tokens_b[row], data.seconds_b[row])
        for name, (low, high) in candidate_bounds(one, rng).items():
            hits[name] += low <= truth <= high
    return {name: hits[name] / replications for name in CANDIDATES}


def _single(ta: np.ndarray, sa: np.ndarray, tb: np.ndarray, sb: np.ndarray) -> Interval | None:
    """Return the interval of B's tokens/s alone."""
    return ratio_interval(tb, sb)


def measure(replications: int, ns: tuple[int, ...]) -> dict:
    """Return the coverage grid: per model, per n, every candidate and the chosen method."""
    grid: dict = {}
    for name, model in MODELS.items():
        grid[name] = {}
        for n in ns:
            rates = candidates_coverage(model, n, replications, seed=n)
            chosen = coverage(paired_speed_ratio, model, n, replications, seed=n)
            rates["chosen"] = chosen.rate
            rates["chosen_shown"] = chosen.shown
            single = coverage(_single, model, n, replications, seed=n, truth=true_rate(model))
            rates["chosen_single"] = single.rate
            grid[name][str(n)] = rates
            print(name, n, {k: round(v, 3) if v else v for k, v in rates.items()}, flush=True)
    return grid


def main(argv: list[str] | None = None) -> None:
    """Measure the grid and write it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replications", type=int, default=2000)
    parser.add_argument("--n", type=int, nargs="+", default=list(NS))
    parser.add_argument("--out", type=Path, default=Path("interval-coverage.json"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    grid = measure(args.replications, tuple(args.n))
    report = {
        "replications": args.replications,
        "resamples": RESAMPLES,
        "min_prompts": MIN_PROMPTS,
        "margin_at_95": binomial_margin(0.95, args.replications, z=2.0),
        "models": {name: vars(model) for name, model in MODELS.items()},
        "true_ratio": {name: true_ratio(model) for name, model in MODELS.items()},
        "coverage": grid,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
