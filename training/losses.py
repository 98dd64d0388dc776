"""Divergences between a target's and a draft's next-token distributions, computed from logits.

p = softmax(target_logits / T) is the target distribution and q = softmax(draft_logits / T) the
draft's, both over the last axis. Every divergence comes per token (shape ``logits.shape[:-1]``)
and mean-reduced over the tokens a mask keeps. Knowledge-distillation jobs (DistillSpec, AdaSPEC)
build on these: AdaSPEC ranks tokens by the per-token values and reduces with its own mask.

No T² factor is applied when T ≠ 1; callers that want Hinton's scaling multiply themselves.
Gradients flow into whichever logits require them; detach the target's to distil a draft.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F

DivergenceKind = Literal["forward_kl", "reverse_kl", "tvd"]
DIVERGENCE_KINDS: tuple[DivergenceKind, ...] = ("forward_kl", "reverse_kl", "tvd")


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Return ``logits / temperature`` in float32 (no copy when already fp32 at T = 1)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def _kl_per_token(from_logits: torch.Tensor, to_logits: torch.Tensor) -> torch.Tensor:
    """Return KL(a‖b) per row for a = softmax(from_logits), b = softmax(to_logits).

    Computed as Σ a log a − Σ a log b, the second term by soft-label cross-entropy (the
    cheapest exact form in PyTorch, which matters when distilling over a 4k vocabulary).
    Terms with a(x) = 0 contribute 0; where a(x) > 0 but b(x) = 0 the result is a huge finite
    number (≥ 1e30) rather than +inf, because −inf logits of b are clamped to the float32 minimum.
    """
    log_probs = F.log_softmax(from_logits, dim=-1)
    probs = log_probs.exp()
    neg_entropy = (probs * torch.where(probs > 0, log_probs, 0.0)).sum(dim=-1)
    vocab = to_logits.shape[-1]
    finite = to_logits.clamp_min(torch.finfo(to_logits.dtype).min)
    cross = F.cross_entropy(finite.reshape(-1, vocab), probs.reshape(-1, vocab), reduction="none")
    return neg_entropy + cross.view(probs.shape[:-1])


def forward_kl_per_token(
    target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Return KL(p‖q) = Σ_x p(x) log(p(x)/q(x)) for every token (mass-covering, the KD default)."""
    return _kl_per_token(_scaled(target_logits, temperature), _scaled(draft_logits, temperature))


def reverse_kl_per_token(
    target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Return KL(q‖p) = Σ_x q(x) log(q(x)/p(x)) for every token (mode-seeking)."""
    return _kl_per_token(_scaled(draft_logits, temperature), _scaled(target_logits, temperature))


def tvd_per_token(
    target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Return ½ Σ_x |p(x) − q(x)| for every token; 1 − TVD is the expected acceptance β."""
    p = torch.softmax(_scaled(target_logits, temperature), dim=-1)
    q = torch.softmax(_scaled(draft_logits, temperature), dim=-1)
    return 0.5 * (p - q).abs().sum(dim=-1)


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
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return the masked mean of KL(p‖q) over tokens (scalar)."""
    return masked_mean(forward_kl_per_token(target_logits, draft_logits, temperature), mask)


def reverse_kl(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return the masked mean of KL(q‖p) over tokens (scalar)."""
    return masked_mean(reverse_kl_per_token(target_logits, draft_logits, temperature), mask)


def tvd(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return the masked mean of the total variation distance ½Σ|p − q| over tokens (scalar)."""
    return masked_mean(tvd_per_token(target_logits, draft_logits, temperature), mask)


def distillation_loss(
    kind: DivergenceKind,
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Return the masked mean divergence ``kind`` between target and draft (scalar).

    The one entry point KD jobs call with the divergence their config names.
    """
    if kind not in PER_TOKEN_DIVERGENCES:
        raise ValueError(f"unknown divergence {kind!r}; expected one of {DIVERGENCE_KINDS}")
    per_token = PER_TOKEN_DIVERGENCES[kind](target_logits, draft_logits, temperature)
    return masked_mean(per_token, mask)
