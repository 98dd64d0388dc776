"""Lossless verification of a drafted block (pure functions, no model calls).

Greedy: accept y_i while y_i == argmax p_i; emit argmax p at the first mismatch, or the bonus
argmax p_{K+1} when all K match. Sampling: accept y_i with probability min(1, p_i(y_i)/q_i(y_i));
at the first rejection the draft side samples norm(max(0, p_i - q_i)); if all are accepted the
target samples the bonus token from p_{K+1}. The target side needs only q_i(y_i) for each
drafted token (payload O(K)); the draft side receives only the one p row at the rejected
position (payload O(V)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.sampling import sample_token


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one block on the target side.

    Exactly one of ``next_token`` (greedy, or the bonus token when all were accepted) and
    ``rejected_row`` (warped target distribution at the first rejected position, from which the
    draft side samples the residual) is set.
    """

    n_accepted: int
    next_token: int | None
    rejected_row: torch.Tensor | None = None


def verify_greedy(draft_tokens: list[int], target_choices: torch.Tensor) -> Verdict:
    """Verify ``draft_tokens`` (K ids) against the target's argmax tokens [K+1] under greedy
    decoding.

    ``target_choices`` is ``target_logits.argmax(dim=-1)`` of the K+1 scored positions, on any
    device: it is compared as a Python list.
    """
    # K is small: one copy to Python and a Python scan cost less than tensor ops.
    target_choice = target_choices.tolist()
    n_accepted = 0
    for drafted in draft_tokens:
        if drafted != target_choice[n_accepted]:
            break
        n_accepted += 1
    return Verdict(n_accepted=n_accepted, next_token=target_choice[n_accepted])


def verify_sampling(
    draft_tokens: torch.Tensor,
    draft_token_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Verify by rejection sampling.

    ``draft_token_probs`` [K] holds q_i(y_i); ``target_probs`` [K+1, V] the warped target
    distributions. Uniforms u_i are drawn from ``generator``; y_i is accepted iff
    u_i * q_i(y_i) <= p_i(y_i), i.e. with probability min(1, p/q).
    """
    n_draft = draft_tokens.shape[0]
    uniforms = torch.rand(n_draft, generator=generator, dtype=torch.float64)
    if n_draft:
        p_of_draft = target_probs[:n_draft].gather(1, draft_tokens[:, None])[:, 0].double()
        rejected = (uniforms * draft_token_probs.double() > p_of_draft).nonzero()
    else:
        rejected = torch.empty(0, 1, dtype=torch.long)
    if rejected.numel():
        first = int(rejected[0, 0])
        return Verdict(n_accepted=first, next_token=None, rejected_row=target_probs[first])
    bonus = int(sample_token(target_probs[n_draft], generator))
    return Verdict(n_accepted=n_draft, next_token=bonus)


def residual_distribution(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """Return norm(max(0, p - q)), the distribution to sample after a rejection.

    If p <= q everywhere (possible only through rounding, since a rejection needs p(y) < q(y)
    somewhere and total masses are equal) it falls back to p.
    """
    residual = (target_row.double() - draft_row.double()).clamp_min(0.0)
    total = residual.sum()
    if total <= 0:
        return target_row
    return (residual / total).to(target_row.dtype)


def point_mass_residual(target_row: torch.Tensor, token: int) -> torch.Tensor:
    """Return norm(max(0, p - q)) for q a point mass at ``token``: p with ``token`` removed.

    A deterministic proposal (n-gram lookup) has q(x) = 1 at its token x, so x is accepted with
    probability p(x) and a rejection samples from p without x. No dense one-hot is built. If
    p(x) = 1 (no rejection is then possible) it falls back to p.
    """
    residual = target_row.double().clone()
    residual[token] = 0.0
    total = residual.sum()
    if total <= 0:
        return target_row
    return (residual / total).to(target_row.dtype)


def speculative_step_distribution(
    target_probs: torch.Tensor, draft_probs: torch.Tensor
) -> torch.Tensor:
    """Return the exact distribution of the first emitted token of one sampling round with K=1.

    P(x) = q(x)·min(1, p(x)/q(x)) + (1 − Σ_y min(p(y), q(y)))·residual(x), which equals p(x);
    tests compare it with p to show the sampler is lossless by computation, not by sampling.
    """
    p = target_probs.double()
    q = draft_probs.double()
    accepted = torch.minimum(p, q)
    rejection_mass = 1.0 - accepted.sum()
    return accepted + rejection_mass * residual_distribution(p, q).double()
