"""Divergences between a target's and a draft's next-token distributions, computed from logits.

p = softmax(target_logits / T) is the target distribution and q = softmax(draft_logits / T) the
draft's, both over the last axis. Every divergence comes per token (shape ``logits.shape[:-1]``)
and mean-reduced over the tokens a mask keeps. Knowledge-distillation jobs (DistillSpec, AdaSPEC)
build on these: AdaSPEC ranks tokens by the per-token values and reduces with its own mask.

The target side may be given as logits or as a ``TargetDistribution`` prepared once with
``target_distribution``; distilling several drafts from one batch then pays for the target's
softmax once (over a 4k vocabulary that is most of the loss's cost).

No T² factor is applied when T ≠ 1; callers that want Hinton's scaling multiply themselves.
Gradients flow into whichever logits require them; detach the target's to distil a draft.
Where a distribution has zero mass (−inf logits) its terms contribute 0; where KL would be +inf
(mass on a token the other distribution excludes) the result is a huge finite number (≥ 1e30).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

DivergenceKind = Literal["forward_kl", "reverse_kl", "tvd"]
DIVERGENCE_KINDS: tuple[DivergenceKind, ...] = ("forward_kl", "reverse_kl", "tvd")


@dataclass(frozen=True)
class TargetDistribution:
    """A target's next-token distribution at temperature ``temperature``, ready for reuse.

    ``neg_entropy`` is Σ_x p(x) log p(x) per token.
    """

    log_probs: torch.Tensor
    probs: torch.Tensor
    neg_entropy: torch.Tensor
    temperature: float


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Return ``logits / temperature`` in float32 (no copy when already fp32 at T = 1)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def _distribution(logits: torch.Tensor, temperature: float) -> TargetDistribution:
    """Return log-probabilities, probabilities and Σ p log p of softmax(logits / T)."""
    log_probs = F.log_softmax(_scaled(logits, temperature), dim=-1)
    probs = log_probs.exp()
    neg_entropy = (probs * torch.where(probs > 0, log_probs, 0.0)).sum(dim=-1)
    return TargetDistribution(log_probs, probs, neg_entropy, temperature)


def target_distribution(
    target_logits: torch.Tensor, temperature: float = 1.0
) -> TargetDistribution:
    """Return the target's distribution prepared for several divergence calls."""
    return _distribution(target_logits, temperature)


def _as_target(target: torch.Tensor | TargetDistribution, temperature: float) -> TargetDistribution:
    """Return ``target`` as a prepared distribution, checking that temperatures agree."""
    if isinstance(target, TargetDistribution):
        if target.temperature != temperature:
            raise ValueError(
                f"target prepared at T={target.temperature}, divergence asked at T={temperature}"
            )
        return target
    return _distribution(target, temperature)


def _finite(log_values: torch.Tensor) -> torch.Tensor:
    """Return ``log_values`` with −inf replaced by the float minimum (so 0 · it is 0, not NaN)."""
    return log_values.clamp_min(torch.finfo(log_values.dtype).min)


def forward_kl_per_token(
    target: torch.Tensor | TargetDistribution,
    draft_logits: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return KL(p‖q) = Σ_x p(x) log(p(x)/q(x)) for every token (mass-covering, the KD default).

    Computed as Σ p log p + soft-label cross-entropy of the draft, the cheapest exact form.
    """
    p = _as_target(target, temperature)
    draft = _finite(_scaled(draft_logits, temperature))
    vocab = draft.shape[-1]
    cross = F.cross_entropy(
        draft.reshape(-1, vocab), p.probs.reshape(-1, vocab), reduction="none"
    ).view(p.neg_entropy.shape)
    return p.neg_entropy + cross


def reverse_kl_per_token(
    target: torch.Tensor | TargetDistribution,
    draft_logits: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return KL(q‖p) = Σ_x q(x) log(q(x)/p(x)) for every token (mode-seeking)."""
    p = _as_target(target, temperature)
    q = _distribution(draft_logits, temperature)
    return q.neg_entropy - (q.probs * _finite(p.log_probs)).sum(dim=-1)


def tvd_per_token(
    target: torch.Tensor | TargetDistribution,
    draft_logits: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return ½ Σ_x |p(x) − q(x)| for every token; 1 − TVD is the expected acceptance β."""
    p = _as_target(target, temperature)
    q = torch.softmax(_scaled(draft_logits, temperature), dim=-1)
    return 0.5 * (p.probs - q).abs().sum(dim=-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Return the mean of ``values`` over positions where ``mask`` is nonzero (all if None).

    A float mask acts as per-token weights. An all-zero mask gives 0 rather than NaN so that a
    batch with no kept tokens contributes nothing to a running loss.
    """
    if mask is None:
        return values.mean()
    weights = mask.to(values.dtype)
    if weights.shape != values.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != token shape {tuple(values.shape)}")
    return (values * weights).sum() / weights.sum().clamp_min(1e-12)


PER_TOKEN_DIVERGENCES: dict[DivergenceKind, Callable[..., torch.Tensor]] = {
    "forward_kl": forward_kl_per_token,
    "reverse_kl": reverse_kl_per_token,
    "tvd": tvd_per_token,
}


def forward_kl(
    target: torch.Tensor | TargetDistribution,
    draft_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return the masked mean of KL(p‖q) over tokens (scalar)."""
    return masked_mean(forward_kl_per_token(target, draft_logits, temperature), mask)


def reverse_kl(
    target: torch.Tensor | TargetDistribution,
    draft_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return the masked mean of KL(q‖p) over tokens (scalar)."""
    return masked_mean(reverse_kl_per_token(target, draft_logits, temperature), mask)


def tvd(
    target: torch.Tensor | TargetDistribution,
    draft_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return the masked mean of the total variation distance ½Σ|p − q| over tokens (scalar)."""
    return masked_mean(tvd_per_token(target, draft_logits, temperature), mask)


def distillation_loss(
    kind: DivergenceKind,
    target: torch.Tensor | TargetDistribution,
    draft_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return the masked mean divergence ``kind`` between target and draft (scalar).

    The one entry point KD jobs call with the divergence their config names; ``target`` is the
    target's logits or its ``target_distribution`` shared across drafts.
    """
    if kind not in PER_TOKEN_DIVERGENCES:
        raise ValueError(f"unknown divergence {kind!r}; expected one of {DIVERGENCE_KINDS}")
    per_token = PER_TOKEN_DIVERGENCES[kind](target, draft_logits, temperature)
    return masked_mean(per_token, mask)
