"""Logit warping and the per-token features policies look at (pure tensor functions)."""

from __future__ import annotations

import torch

from workers.records import SamplingConfig


def warp_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Return the sampling distribution for ``logits`` (last dim = vocabulary).

    Temperature, then top-k, then top-p (nucleus, keeping the smallest prefix of the sorted
    distribution whose mass reaches top_p) are applied exactly as for the target, so draft and
    target distributions are warped identically, which lossless rejection sampling requires.
    Greedy decoding (temperature 0) returns the one-hot distribution of the argmax.
    """
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), num_classes=logits.shape[-1]).to(
            logits.dtype
        )
    scores = logits.to(torch.promote_types(logits.dtype, torch.float32)) / sampling.temperature
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def feature_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Return the distribution whose entropy and max probability policies see.

    When sampling it is the warped q the draft samples from; when decoding greedily it is the
    softmax of the raw logits (the warped one-hot would carry no information).
    """
    if sampling.greedy:
        return logits.float().softmax(dim=-1)
    return warp_probs(logits, sampling)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Return the Shannon entropy in nats of each distribution along the last dim."""
    logs = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logs).sum(dim=-1)


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one token id (0-d tensor) from a 1-D distribution with the given generator."""
    return torch.multinomial(probs, 1, generator=generator)[0]
