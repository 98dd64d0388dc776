"""Simulated paired per-prompt data, and how often an interval method covers the truth (pure).

A paired comparison measures trial A and trial B on the same n prompts. Prompt i generates T_i
tokens in both (greedy: the same output), costs B ``c_i`` seconds per token and runs ``s_i``
times faster under A, all independent and log-normal:

    T_i = round(tokens · exp(tokens_log_sd · Z)),  c_i = exp(ar_cost_log_sd · Z'),
    s_i = speedup · exp(X_i),  X_i ~ N(0, log_speedup_sd²),
    seconds_b = T_i · c_i,  seconds_a = seconds_b / s_i.

With ``outlier_share`` > 0, that share of prompts are outliers (a contaminated normal): their
X_i and log c_i have ``outlier_sd_factor`` times the usual spread, e.g. a prompt on which the
draft does far better or worse than usual, or one that runs far longer per token; their X_i is
also shifted by ``outlier_shift`` (``FAILURES``: the draft fails on one prompt in ten, halving
its speedup there, a one-sided outlier no interval over a few prompts can anticipate).

The estimand is what ``orchestrator.analysis.stats.paired_speed_ratio`` estimates, the ratio of
expected tokens/s,
(E[T] / E[T c / s]) / (E[T] / E[T c]) = 1 / E[1 / s] (T, c and s independent): see
:func:`true_ratio`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import exp, log, sqrt

import numpy as np

from orchestrator.analysis.stats import Interval

PairedInterval = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], Interval | None]


@dataclass(frozen=True)
class PromptModel:
    """The per-prompt spreads of simulated paired data (defaults: the demo's)."""

    speedup: float = 1.2
    log_speedup_sd: float = 0.11
    ar_cost_log_sd: float = 0.12
    tokens: float = 128.0
    tokens_log_sd: float = 0.3
    outlier_share: float = 0.0
    outlier_sd_factor: float = 4.0
    outlier_shift: float = 0.0


#: The demo's spreads (docs/methods.md, "Statistics"), the same with one prompt in ten an
#: outlier of four times the spread, and with one prompt in ten a draft failure (speedup / 2).
DEMO = PromptModel()
OUTLIERS = PromptModel(outlier_share=0.1)
FAILURES = PromptModel(outlier_share=0.1, outlier_sd_factor=1.0, outlier_shift=log(0.5))


@dataclass(frozen=True)
class PairedSamples:
    """Simulated replications, each array (replications, n prompts)."""

    tokens_a: np.ndarray
    seconds_a: np.ndarray
    tokens_b: np.ndarray
    seconds_b: np.ndarray


@dataclass(frozen=True)
class Coverage:
    """How many of ``replications`` intervals were shown and how many of those held the truth."""

    n: int
    replications: int
    shown: int
    covered: int

    @property
    def rate(self) -> float | None:
        """Covered over shown (None when no interval was shown)."""
        return self.covered / self.shown if self.shown else None


def _mean_exp(model: PromptModel, sd: float, shift: float) -> float:
    """Return E[exp(Y)], Y ~ N(0, sd²), or N(shift, (factor·sd)²) for outlier prompts."""
    outlier = exp(shift + (model.outlier_sd_factor * sd) ** 2 / 2)
    return (1 - model.outlier_share) * exp(sd**2 / 2) + model.outlier_share * outlier


def true_ratio(model: PromptModel) -> float:
    """Return A's expected tokens/s over B's, 1 / E[1/s], for ``model``."""
    return model.speedup / _mean_exp(model, model.log_speedup_sd, -model.outlier_shift)


def true_rate(model: PromptModel) -> float:
    """Return B's expected tokens/s alone, E[T] / E[T c] = 1 / E[c], for ``model``."""
    return 1 / _mean_exp(model, model.ar_cost_log_sd, 0.0)


def simulate(model: PromptModel, n: int, replications: int, seed: int) -> PairedSamples:
    """Return ``replications`` seeded sets of n paired prompts drawn from ``model``."""
    rng = np.random.default_rng(seed)
    shape = (replications, n)
    outlier = rng.random(shape) < model.outlier_share
    spread = np.where(outlier, model.outlier_sd_factor, 1.0)
    tokens = np.maximum(1.0, np.round(model.tokens * rng.lognormal(0, model.tokens_log_sd, shape)))
    cost = np.exp(model.ar_cost_log_sd * spread * rng.standard_normal(shape))
    shift = np.where(outlier, model.outlier_shift, 0.0)
    log_speedup = shift + model.log_speedup_sd * spread * rng.standard_normal(shape)
    speedup = model.speedup * np.exp(log_speedup)
    seconds_b = tokens * cost
    return PairedSamples(tokens, seconds_b / speedup, tokens, seconds_b)


def coverage(
    method: PairedInterval,
    model: PromptModel,
    n: int,
    replications: int,
    seed: int,
    truth: float | None = None,
) -> Coverage:
    """Return how often ``method``'s interval over n simulated prompts holds ``truth`` (by
    default the true ratio: pass :func:`true_rate` for an interval of B's tokens/s alone)."""
    data = simulate(model, n, replications, seed)
    truth = true_ratio(model) if truth is None else truth
    shown = covered = 0
    for row in range(replications):
        interval = method(
            data.tokens_a[row], data.seconds_a[row], data.tokens_b[row], data.seconds_b[row]
        )
        if interval is not None:
            shown += 1
            covered += interval.contains(truth)
    return Coverage(n=n, replications=replications, shown=shown, covered=covered)


def binomial_margin(rate: float, replications: int, z: float = 3.0) -> float:
    """Return z standard errors of a coverage rate measured over ``replications`` intervals."""
    return z * sqrt(rate * (1 - rate) / replications)
