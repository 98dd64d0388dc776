"""The exact two-token target distribution and the G-test the sampling-distribution tests share."""

from __future__ import annotations

import torch
from scipy import stats

from workers.lm import CachedLM
from workers.records import SamplingConfig
from workers.sampling import warp_probs


def exact_two_token_distribution(
    target_lm: CachedLM, prompt: torch.Tensor, sampling: SamplingConfig
) -> dict[tuple[int, int], float]:
    """P(x1, x2 | prompt) under target-only sampling, computed from the target's logits."""
    first = warp_probs(target_lm.full_logits(prompt)[-1], sampling)
    joint = {}
    for x1 in first.nonzero()[:, 0].tolist():
        second = warp_probs(
            target_lm.full_logits(torch.cat([prompt, torch.tensor([x1])]))[-1], sampling
        )
        for x2 in second.nonzero()[:, 0].tolist():
            joint[(x1, x2)] = float(first[x1] * second[x2])
    return joint


def g_test_p_value(
    counts: dict[tuple[int, int], int], exact: dict[tuple[int, int], float], runs: int
) -> float:
    """Return the G-test's p-value of sampled ``counts`` against ``exact`` over ``runs`` draws
    (cells expecting fewer than 5 pooled; at least 5 cells required)."""
    cells = [(counts[k], exact[k] * runs) for k in exact]
    big = [(o, e) for o, e in cells if e >= 5]
    rest_observed = sum(o for o, e in cells if e < 5)
    rest_expected = sum(e for o, e in cells if e < 5)
    observed = [o for o, _ in big] + ([rest_observed] if rest_expected > 0 else [])
    expected = [e for _, e in big] + ([rest_expected] if rest_expected > 0 else [])
    assert len(observed) >= 5
    expected = [e * sum(observed) / sum(expected) for e in expected]
    return float(stats.power_divergence(observed, expected, lambda_="log-likelihood")[1])
