"""Speculative decoding and the autoregressive baseline, batch 1 (docs/design.md, one round).

``speculative_generate`` drives the rounds from the draft side: draft with the policy deciding
after every draft step, send the block to the target (anything with ``prefill``/``verify``: a
:class:`workers.target.LocalTarget` in process, or a Ray actor handle wrapped to look like one),
sample the residual after a rejection, roll the draft cache back, tell the policy. The same code
runs in one process and split across actors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from policies import DraftPolicy, DraftStep, RequestContext, RoundOutcome
from workers.lm import CachedLM
from workers.records import (
    GenerationResult,
    RequestSettings,
    RoundRecord,
    SamplingConfig,
    truncate_at_eos,
)
from workers.sampling import entropy, feature_probs, sample_token, warp_probs
from workers.target import VerifyRequest, VerifyResponse, side_seed
from workers.verification import residual_distribution


class TargetScorer(Protocol):
    """The target side as the engine sees it (a local object or an actor proxy)."""

    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        """Start a request (reset, process the prompt, reseed)."""

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        """Score one drafted block."""

    def generate(self, prompt_ids: torch.Tensor, settings: RequestSettings) -> GenerationResult:
        """Decode one request with the target alone."""


@dataclass
class _Block:
    """The tokens one round proposes, with what verification and the record need."""

    tokens: list[torch.Tensor]
    token_probs: list[torch.Tensor]
    rows: list[torch.Tensor]
    entropies: list[float]
    max_probs: list[float]
    forwards: int


@torch.inference_mode()
def speculative_generate(
    draft: CachedLM,
    target: TargetScorer,
    policy: DraftPolicy,
    prompt_ids: torch.Tensor,
    settings: RequestSettings,
    *,
    reference: list[int] | None = None,
    on_round: Callable[[list[int]], None] | None = None,
) -> GenerationResult:
    """Generate up to ``settings.sampling.max_new_tokens`` tokens by speculative decoding.

    ``reference`` is the target's greedy output, required by policies with ``needs_reference``
    (the oracle). Each round's cap is the policy's ``round_cap`` (bounded by the max draft length
    the policy was built with), so there is no cap argument; ``reference`` and ``on_round`` are
    keyword-only, so a call still passing a cap fails instead of taking it for a reference.
    ``on_round`` is called with the full sequence after every round (tests use it to check the
    caches).
    """
    sampling = settings.sampling
    if policy.greedy_only and not sampling.greedy:
        raise ValueError(f"policy {policy.name!r} is defined for greedy decoding only")
    if policy.needs_reference and reference is None:
        raise ValueError(f"policy {policy.name!r} needs the target's greedy output as reference")
    start = time.perf_counter()
    prompt = prompt_ids.to(torch.long).cpu()
    generator = _start_request(draft, target, policy, prompt, settings, reference)
    prefilled = time.perf_counter()
    sequence = prompt.tolist()
    output: list[int] = []
    rounds: list[RoundRecord] = []
    target_hidden = None
    want_hidden = "target_hidden" in policy.features
    stopped_on_eos = False
    while len(output) < sampling.max_new_tokens and not stopped_on_eos:
        round_start = time.perf_counter()
        cap = min(policy.round_cap(), sampling.max_new_tokens - len(output) - 1)
        # The emitted tokens the draft has not run yet; the last one is the target's pending.
        pending = torch.tensor(sequence[draft.cached_len :], dtype=torch.long, device=draft.device)
        block = _draft_block(
            draft, policy, pending, len(output), cap, sampling, generator, target_hidden
        )
        drafted_at = time.perf_counter()
        n_accepted, new_tokens, target_hidden = _verify_block(
            target, pending, block, sampling, want_hidden, generator
        )
        draft.crop(len(sequence) + n_accepted)  # a no-op when the draft holds no more
        sequence.extend(new_tokens)
        output.extend(new_tokens)
        policy.update(RoundOutcome(len(block.tokens), n_accepted))
        rounds.append(_round_record(block, n_accepted, round_start, drafted_at))
        output, stopped_on_eos = truncate_at_eos(output, settings.eos_token_id)
        if on_round is not None:
            on_round(sequence)
    return GenerationResult(
        prompt_ids=prompt.tolist(),
        output_ids=output[: sampling.max_new_tokens],
        rounds=rounds,
        seconds=(end := time.perf_counter()) - start,
        stopped_on_eos=stopped_on_eos,
        prefill_seconds=prefilled - start,
        decode_seconds=end - prefilled,
    )


def _start_request(
    draft: CachedLM,
    target: TargetScorer,
    policy: DraftPolicy,
    prompt: torch.Tensor,
    settings: RequestSettings,
    reference: list[int] | None,
) -> torch.Generator:
    """Prefill both models and reset the policy for a request; return the draft's generator."""
    target.prefill(prompt, settings.sampling, settings.seed)
    draft.reset()
    if prompt.numel() > 1:
        draft.forward(prompt[:-1].to(draft.device), last_only=True)
    policy.reset(
        RequestContext(
            prompt_len=prompt.numel(),
            seed=settings.seed,
            reference=tuple(reference) if reference is not None else None,
        )
    )
    return torch.Generator(device="cpu").manual_seed(side_seed(settings.seed, "draft"))


def _verify_block(
    target: TargetScorer,
    pending: torch.Tensor,
    block: _Block,
    sampling: SamplingConfig,
    want_hidden: bool,
    generator: torch.Generator,
) -> tuple[int, list[int], torch.Tensor | None]:
    """Have the target verify ``block`` after the last of ``pending`` (the emitted tokens the
    draft had not run); return (accepted, the round's new tokens, hidden).

    After a rejection under sampling the correction token is drawn here, on the draft side,
    from the residual norm(max(0, p − q)) of the rejected position.
    """
    tokens = torch.cat([pending[-1:], *block.tokens]).cpu()
    response = target.verify(
        VerifyRequest(
            tokens=tokens,
            draft_token_probs=None if sampling.greedy else _stack(block.token_probs),
            want_hidden=want_hidden,
        )
    )
    n_accepted, next_token = response.n_accepted, response.next_token
    if next_token is None:
        residual = residual_distribution(response.rejected_row.cpu(), block.rows[n_accepted])
        next_token = int(sample_token(residual, generator))
    return n_accepted, [*tokens.tolist()[1 : 1 + n_accepted], next_token], response.hidden


def _round_record(
    block: _Block, n_accepted: int, round_start: float, drafted_at: float
) -> RoundRecord:
    """Return the record of a verified round (its verify time ends now)."""
    return RoundRecord(
        drafted=len(block.tokens),
        accepted=n_accepted,
        bonus=bool(block.tokens) and n_accepted == len(block.tokens),
        draft_forwards=block.forwards,
        draft_seconds=drafted_at - round_start,
        verify_seconds=time.perf_counter() - drafted_at,
        mean_entropy=_mean(block.entropies),
        min_max_prob=min(block.max_probs) if block.max_probs else None,
    )


def _draft_block(
    draft: CachedLM,
    policy: DraftPolicy,
    pending: torch.Tensor,
    n_generated: int,
    cap: int,
    sampling: SamplingConfig,
    generator: torch.Generator,
    target_hidden: torch.Tensor | None,
) -> _Block:
    """Draft up to ``cap`` tokens after ``pending`` (the emitted tokens the draft has not run),
    asking the policy what to do with each candidate (unless it keeps every candidate).

    A draft forward follows a kept candidate only when the policy continues and the cap allows
    another: a stop before a candidate or after one (``Decision``) ends the round at once.
    """
    block = _Block(tokens=[], token_probs=[], rows=[], entropies=[], max_probs=[], forwards=0)
    if cap <= 0:
        return block
    wanted, asks, greedy = policy.features, not policy.keeps_every_candidate, sampling.greedy
    wants_probs = "entropy" in wanted or "max_prob" in wanted
    step = draft.forward(pending, last_only=True)
    block.forwards = 1
    for index in range(1, cap + 1):
        # One row of logits (last_only); the token stays a [1] tensor, the next step's input.
        if greedy:
            token, probs = step.logits.argmax(dim=-1), None
        else:
            probs = warp_probs(step.logits[0], sampling)
            token = sample_token(probs.cpu(), generator).to(step.logits.device).view(1)
        entropy_value = max_prob = None
        if wants_probs:
            shown = probs if probs is not None else feature_probs(step.logits[0], sampling)
            entropy_value, max_prob = float(entropy(shown)), float(shown.max())
        continues = True
        if asks:
            candidate = DraftStep(
                index=index,
                position=n_generated + index - 1,
                token=int(token) if "token" in wanted else None,
                entropy=entropy_value,
                max_prob=max_prob,
                hidden=step.hidden[-1] if "hidden" in wanted else None,
                target_hidden=target_hidden,
            )
            decision = policy.decide(candidate)
            if not decision.keeps:
                break
            continues = decision.continues
        block.tokens.append(token)
        if probs is not None or entropy_value is not None:
            _add_shown(block, token, probs, entropy_value, max_prob)
        if index == cap or not continues:
            break
        step = draft.forward(token, last_only=True)
        block.forwards += 1
    return block


def _add_shown(
    block: _Block,
    token: torch.Tensor,
    probs: torch.Tensor | None,
    entropy_value: float | None,
    max_prob: float | None,
) -> None:
    """Record what a kept candidate was drafted from: its draft row when sampling, and the
    features shown for it when there were any."""
    if probs is not None:
        block.rows.append(probs.cpu())
        block.token_probs.append(probs[token].cpu())
    if entropy_value is not None:
        block.entropies.append(entropy_value)
        block.max_probs.append(max_prob)


def autoregressive_generate(
    target: TargetScorer, prompt_ids: torch.Tensor, settings: RequestSettings
) -> GenerationResult:
    """Generate with the target alone (the AR baseline): ``target.generate``.

    The token loop runs where the target runs (``workers.target.LocalTarget.generate``): in
    this process for a local target, inside the target worker for a remote group, one call per
    request, as a deployment of the target alone would decode.
    """
    return target.generate(prompt_ids.to(torch.long).cpu(), settings)


def _stack(values: list[torch.Tensor]) -> torch.Tensor:
    """Join [1] tensors into a 1-D CPU tensor (an empty one for no values)."""
    if not values:
        return torch.empty(0)
    return torch.cat(values).cpu()


def _mean(values: list[float]) -> float | None:
    """Return the mean of ``values`` or None when empty."""
    return sum(values) / len(values) if values else None
