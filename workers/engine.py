"""Speculative decoding and the autoregressive baseline, batch 1 (docs/design.md, one round).

``speculative_generate`` drives the rounds from the draft side: draft from a proposer of any
kind (``workers.proposers``: a draft LM, n-gram lookup, an EAGLE head) with the policy deciding
after every candidate, send the block to the target (anything with ``prefill``/``verify``: a
:class:`workers.target.LocalTarget` in process, or a Ray actor handle wrapped to look like one),
sample the residual after a rejection, roll the draft cache back and hand the proposer the
verdict (with the target's features for a kind that wants them, the EAGLE head), tell the
policy. The same code runs in one process and split across actors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from policies import DraftPolicy, DraftStep, RequestContext, RoundOutcome
from workers.lm import CachedLM
from workers.proposers import Candidate, Proposer, as_proposer, check_features
from workers.records import (
    GenerationResult,
    RequestSettings,
    RoundRecord,
    SamplingConfig,
    truncate_at_eos,
)
from workers.sampling import sample_token
from workers.target import VerifyRequest, VerifyResponse, side_seed
from workers.verification import point_mass_residual, residual_distribution

#: q(x) of a point-mass proposal, as the [1] tensor the target's sampling check reads.
_ONE = torch.ones(1)


class TargetScorer(Protocol):
    """The target side as the engine sees it (a local object or an actor proxy)."""

    def prefill(
        self,
        prompt_ids: torch.Tensor,
        sampling: SamplingConfig,
        seed: int,
        want_features: bool = False,
        feature_layers: tuple[int, ...] = (),
    ) -> torch.Tensor | None:
        """Start a request (reset, process the prompt, reseed); the prompt's features
        [P − 1, d] when ``want_features`` (asked only by proposers that want them), those of
        the decoder layers ``feature_layers`` [P − 1, k·d] when it names k of them."""

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        """Score one drafted block."""

    def generate(self, prompt_ids: torch.Tensor, settings: RequestSettings) -> GenerationResult:
        """Decode one request with the target alone."""


@dataclass(frozen=True)
class _Wants:
    """What the engine asks the target for besides the verdict: the hidden state at the next
    token's position (a policy reading ``target_hidden``), the features at every kept position
    (a proposer that ``wants_target_features``) and the layers they come from (its
    ``feature_layers``; empty: the last layer's)."""

    hidden: bool
    features: bool
    layers: tuple[int, ...] = ()

    @classmethod
    def of(cls, policy: DraftPolicy, proposer: Proposer) -> _Wants:
        """Return what ``policy`` and ``proposer`` need of the target each round."""
        hidden = "target_hidden" in policy.features
        return cls(hidden, proposer.wants_target_features, proposer.feature_layers)


@dataclass
class _Block:
    """The tokens one round proposes, with what verification and the record need."""

    tokens: list[torch.Tensor]
    token_probs: list[torch.Tensor]
    rows: list[torch.Tensor | None]
    entropies: list[float]
    max_probs: list[float]
    forwards: int


@torch.inference_mode()
def speculative_generate(
    draft: CachedLM | Proposer,
    target: TargetScorer,
    policy: DraftPolicy,
    prompt_ids: torch.Tensor,
    settings: RequestSettings,
    *,
    reference: list[int] | None = None,
    on_round: Callable[[list[int]], None] | None = None,
) -> GenerationResult:
    """Generate up to ``settings.sampling.max_new_tokens`` tokens by speculative decoding.

    ``draft`` is a proposer of any kind (``workers.proposers``; a ``CachedLM`` is the ``lm``
    kind). ``reference``: the target's greedy output, which policies with ``needs_reference``
    (the oracle) require. Each round's cap is the policy's ``round_cap`` (at most its max draft
    length), so there is no cap argument; ``reference`` and ``on_round`` are keyword-only, so a
    call still passing a cap fails. ``on_round`` gets the sequence after every round (tests).
    """
    sampling = settings.sampling
    proposer = as_proposer(draft)
    _check_policy(proposer, policy, sampling, reference)
    start = time.perf_counter()
    prompt = prompt_ids.to(torch.long).cpu()
    generator = _start_request(proposer, target, policy, prompt, settings, reference)
    prefilled = time.perf_counter()
    sequence = prompt.tolist()
    output: list[int] = []
    rounds: list[RoundRecord] = []
    target_hidden = None
    wants = _Wants.of(policy, proposer)
    stopped_on_eos = False
    while len(output) < sampling.max_new_tokens and not stopped_on_eos:
        round_start = time.perf_counter()
        cap = min(policy.round_cap(), sampling.max_new_tokens - len(output) - 1)
        block = _draft_block(
            proposer, policy, sequence, len(output), cap, sampling, generator, target_hidden
        )
        drafted_at = time.perf_counter()
        n_accepted, new_tokens, response = _verify_block(
            target, sequence[-1], block, sampling, wants, generator
        )
        target_hidden = response.hidden
        proposer.rollback(len(sequence) + n_accepted)
        proposer.observe(n_accepted, new_tokens[-1], response.features)
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


def _check_policy(
    proposer: Proposer,
    policy: DraftPolicy,
    sampling: SamplingConfig,
    reference: list[int] | None,
) -> None:
    """Raise ValueError when ``policy`` cannot run here (sampling, reference, features)."""
    if policy.greedy_only and not sampling.greedy:
        raise ValueError(f"policy {policy.name!r} is defined for greedy decoding only")
    if policy.needs_reference and reference is None:
        raise ValueError(f"policy {policy.name!r} needs the target's greedy output as reference")
    check_features(proposer, policy.name, policy.features)


def _start_request(
    proposer: Proposer,
    target: TargetScorer,
    policy: DraftPolicy,
    prompt: torch.Tensor,
    settings: RequestSettings,
    reference: list[int] | None,
) -> torch.Generator:
    """Prefill the target and the proposer (with the target's prompt features when the
    proposer wants them) and reset the policy for a request; return the draft's generator."""
    if proposer.wants_target_features:
        sampling, layers = settings.sampling, proposer.feature_layers
        features = target.prefill(prompt, sampling, settings.seed, True, layers)
        proposer.begin(prompt, features)
    else:
        target.prefill(prompt, settings.sampling, settings.seed)
        proposer.begin(prompt)
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
    last_token: int,
    block: _Block,
    sampling: SamplingConfig,
    wants: _Wants,
    generator: torch.Generator,
) -> tuple[int, list[int], VerifyResponse]:
    """Have the target verify ``block`` after ``last_token`` (the last emitted one); return
    (accepted, the round's new tokens, the target's response: hidden state and features).

    After a rejection under sampling the correction token is drawn here, on the draft side,
    from the residual norm(max(0, p − q)) of the rejected position (for a point-mass q at x:
    p with x removed, renormalised).
    """
    drafted = torch.cat(block.tokens).cpu() if block.tokens else torch.empty(0, dtype=torch.long)
    tokens = torch.cat([torch.tensor([last_token]), drafted])
    response = target.verify(
        VerifyRequest(
            tokens=tokens,
            draft_token_probs=None if sampling.greedy else _stack(block.token_probs),
            want_hidden=wants.hidden,
            want_features=wants.features,
            feature_layers=wants.layers,
        )
    )
    n_accepted, next_token = response.n_accepted, response.next_token
    if next_token is None:
        rejected_row, draft_row = response.rejected_row.cpu(), block.rows[n_accepted]
        if draft_row is None:
            residual = point_mass_residual(rejected_row, int(tokens[1 + n_accepted]))
        else:
            residual = residual_distribution(rejected_row, draft_row)
        next_token = int(sample_token(residual, generator))
    return n_accepted, [*tokens.tolist()[1 : 1 + n_accepted], next_token], response


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
    proposer: Proposer,
    policy: DraftPolicy,
    sequence: list[int],
    n_generated: int,
    cap: int,
    sampling: SamplingConfig,
    generator: torch.Generator,
    target_hidden: torch.Tensor | None,
) -> _Block:
    """Draft up to ``cap`` tokens after ``sequence`` (prompt and output so far), asking the
    policy what to do with each candidate (unless it keeps every candidate).

    The proposer's next step follows a kept candidate only when the policy continues and the
    cap allows another: a stop before a candidate or after one (``Decision``) ends the round at
    once, and so does a proposer with nothing to propose.
    """
    block = _Block(tokens=[], token_probs=[], rows=[], entropies=[], max_probs=[], forwards=0)
    if cap <= 0:
        return block
    wanted, asks = policy.features, not policy.keeps_every_candidate
    candidate = proposer.first(sequence, sampling, generator, wanted)
    block.forwards = proposer.step_cost
    for index in range(1, cap + 1):
        if candidate is None:
            break
        continues = True
        if asks:
            decision = policy.decide(_step(candidate, index, n_generated, wanted, target_hidden))
            if not decision.keeps:
                break
            continues = decision.continues
        _add(block, candidate, sampling)
        if index == cap or not continues:
            break
        candidate = proposer.next(candidate, sampling, generator, wanted)
        block.forwards += proposer.step_cost
    return block


def _step(
    candidate: Candidate,
    index: int,
    n_generated: int,
    wanted: frozenset[str],
    target_hidden: torch.Tensor | None,
) -> DraftStep:
    """Return what the policy is shown of ``candidate``, the round's ``index``-th."""
    return DraftStep(
        index=index,
        position=n_generated + index - 1,
        token=int(candidate.token) if "token" in wanted else None,
        entropy=candidate.entropy,
        max_prob=candidate.max_prob,
        hidden=candidate.hidden,
        target_hidden=target_hidden,
        match_length=candidate.match_length if "match_length" in wanted else None,
    )


def _add(block: _Block, candidate: Candidate, sampling: SamplingConfig) -> None:
    """Add a kept candidate to the block with what it was drafted from: its draft row when
    sampling (None for a point mass, whose q(x) is 1), and the features shown for it."""
    block.tokens.append(candidate.token)
    if not sampling.greedy:
        if candidate.point_mass:
            block.rows.append(None)
            block.token_probs.append(_ONE)
        else:
            block.rows.append(candidate.probs.cpu())
            block.token_probs.append(candidate.probs[candidate.token].cpu())
    if candidate.entropy is not None:
        block.entropies.append(candidate.entropy)
        block.max_probs.append(candidate.max_prob)


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
