"""Speculative decoding and the autoregressive baseline for a batch of sequences.

Up to ``slots`` requests decode together on :class:`workers.batch_cache.BatchedLM` caches, one
row each; a request that ends leaves the batch and the next waiting one is prefilled into its
row before the next round (continuous batching). Every round of ``batch_speculative_generate``:

1. Draft: every sequence drafts with its own policy, as the batch-1 engine
   (``workers.engine``) does, but the draft steps of all sequences still drafting run as one
   forward: the round drafts until every sequence has stopped or reached its cap. A
   ``policies.batch_schedule.BatchAware`` policy is told the batch size first.
2. Verify: one target forward scores every sequence's pending token and block (blocks of
   unequal length padded), each sequence is judged on its own rows (``workers.verification``)
   and its target row rolled back to its accepted prefix, as is its draft row.
3. Each sequence's policy learns its round's outcome; each sequence records the round.

Randomness is per sequence: a draft-side and a target-side generator seeded from the request's
own seed as the batch-1 engine seeds them, so a sequence's output depends on its own seed and
the target's rows only, never on its neighbours. Greedy output equals target-only decoding per
sequence. A row's logits equal batch 1's up to float rounding (``workers.batch_cache``), so a
sampled sequence is the batch-1 sequence of the same seed unless rounding moves a draw across
a boundary; the sampled tokens' distribution is the target's either way.

Timing: every sequence's ``RoundRecord`` carries the batch round's draft and verify seconds
(what the round cost the batch), and its ``GenerationResult.seconds`` runs from joining the
batch (its prefill, split off as ``prefill_seconds``) to its last round, waiting for its
neighbours included: what its user waits for. ``batch_seconds`` is its share of the batch's
wall time (``workers.batch_time``), what the batch's throughput divides by.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from policies import BatchAware, DraftPolicy, DraftStep, RequestContext, RoundOutcome
from workers.batch_cache import BatchedLM, BatchStep
from workers.batch_time import time_shares
from workers.records import (
    GenerationResult,
    RequestSettings,
    RoundRecord,
    truncate_at_eos,
)
from workers.sampling import entropy, feature_probs, sample_token, warp_probs
from workers.target import side_seed
from workers.verification import residual_distribution, verify_greedy, verify_sampling


@dataclass(frozen=True)
class BatchRequest:
    """One request of a batch: its prompt ids [n], settings, and (oracle only) the target's
    greedy output."""

    prompt_ids: torch.Tensor
    settings: RequestSettings
    reference: list[int] | None = None


@dataclass
class _Block:
    """What one sequence drafted this round (as ``workers.engine``'s block)."""

    tokens: list[int] = field(default_factory=list)
    token_probs: list[float] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    max_probs: list[float] = field(default_factory=list)
    forwards: int = 0


@dataclass
class _Sequence:
    """A request in the batch: its row, its policy and generators, what it has emitted."""

    index: int
    slot: int
    request: BatchRequest
    policy: DraftPolicy | None
    draft_gen: torch.Generator
    target_gen: torch.Generator
    sequence: list[int]
    start: float
    prefilled: float
    output: list[int] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    stopped_on_eos: bool = False
    target_hidden: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        """Whether the request has its tokens (or met EOS)."""
        return self.stopped_on_eos or len(self.output) >= self.max_new_tokens

    @property
    def max_new_tokens(self) -> int:
        """The request's token budget."""
        return self.request.settings.sampling.max_new_tokens

    def emit(self, tokens: list[int], record: RoundRecord) -> None:
        """Append a round's new tokens and its record, cutting at EOS."""
        self.sequence.extend(tokens)
        self.output.extend(tokens)
        self.rounds.append(record)
        self.output, self.stopped_on_eos = truncate_at_eos(
            self.output, self.request.settings.eos_token_id
        )

    def result(self) -> GenerationResult:
        """Return the finished request's result: its time from joining the batch (its prefill
        included) to now, split at the end of its prefill."""
        end = time.perf_counter()
        return GenerationResult(
            prompt_ids=self.request.prompt_ids.tolist(),
            output_ids=self.output[: self.max_new_tokens],
            rounds=self.rounds,
            seconds=end - self.start,
            stopped_on_eos=self.stopped_on_eos,
            prefill_seconds=self.prefilled - self.start,
            decode_seconds=end - self.prefilled,
        )


def batch_speculative_generate(
    draft: BatchedLM,
    target: BatchedLM,
    make_policy: Callable[[], DraftPolicy],
    requests: Sequence[BatchRequest],
) -> list[GenerationResult]:
    """Decode ``requests`` by speculative decoding, ``target.slots`` at a time; return their
    results in request order.

    ``make_policy`` returns a fresh policy for each request (its cap is the policy's own
    ``max_draft_len``). Draft and target must have the same number of slots.
    """
    if draft.slots != target.slots:
        raise ValueError(f"draft has {draft.slots} slots but target has {target.slots}")

    def start(joins: list[tuple[int, int]]) -> list[_Sequence]:
        return _start_speculative(draft, target, make_policy, requests, joins)

    def round_(active: list[_Sequence]) -> None:
        _speculative_round(draft, target, active)

    with torch.inference_mode():
        return _continuous_batching(len(requests), target.slots, start, round_)


def batch_autoregressive_generate(
    target: BatchedLM, requests: Sequence[BatchRequest]
) -> list[GenerationResult]:
    """Decode ``requests`` with the target alone, ``target.slots`` at a time (the AR baseline
    at the same batch size); return their results in request order."""

    def start(joins: list[tuple[int, int]]) -> list[_Sequence]:
        return _start_sequences(target, None, requests, joins)

    def round_(active: list[_Sequence]) -> None:
        _autoregressive_round(target, active)

    with torch.inference_mode():
        return _continuous_batching(len(requests), target.slots, start, round_)


def _continuous_batching(
    n_requests: int,
    slots: int,
    start: Callable[[list[tuple[int, int]]], list[_Sequence]],
    round_: Callable[[list[_Sequence]], None],
) -> list[GenerationResult]:
    """Run rounds over the active sequences until every request is done; before each round the
    free rows take the next waiting requests (``start`` prefills them together). Each result
    carries its share of the batch's wall time (``workers.batch_time``)."""
    waiting, free = deque(range(n_requests)), deque(range(slots))
    active: list[_Sequence] = []
    finished: dict[int, GenerationResult] = {}
    joined: dict[int, float] = {}
    while waiting or active:
        joins = []
        while waiting and free:
            joins.append((waiting.popleft(), free.popleft()))
        if joins:
            active.extend(start(joins))
        running = [seq for seq in active if not seq.done]
        if running:
            round_(running)
        for seq in active:
            if seq.done:
                finished[seq.index], joined[seq.index] = seq.result(), seq.start
                free.append(seq.slot)
        active = [seq for seq in active if not seq.done]
    results = [finished[index] for index in range(n_requests)]
    spans = [(joined[i], joined[i] + r.seconds) for i, r in enumerate(results)]
    for result, share in zip(results, time_shares(spans), strict=True):
        result.batch_seconds = share
    return results


def _start_sequences(
    target: BatchedLM,
    draft: BatchedLM | None,
    requests: Sequence[BatchRequest],
    joins: list[tuple[int, int]],
) -> list[_Sequence]:
    """Start the (request index, slot) pairs of ``joins``: prefill their target (and draft)
    rows with all but each prompt's last token in one forward per model, and seed each
    sequence's generators as the batch-1 engine does."""
    began = time.perf_counter()
    prompts = [requests[index].prompt_ids.to(torch.long).cpu().view(-1) for index, _ in joins]
    for (index, _), prompt in zip(joins, prompts, strict=True):
        if prompt.numel() == 0:
            raise ValueError(f"request {index} has an empty prompt")
    for lm in (target, draft):
        if lm is None:
            continue
        for _, slot in joins:
            lm.reset(slot)
        long = [row for row, prompt in enumerate(prompts) if prompt.numel() > 1]
        if long:
            lm.forward([joins[row][1] for row in long], [prompts[row][:-1] for row in long], True)
    prefilled = time.perf_counter()
    return [
        _Sequence(
            index=index,
            slot=slot,
            request=requests[index],
            policy=None,
            draft_gen=_generator(requests[index].settings.seed, "draft"),
            target_gen=_generator(requests[index].settings.seed, "target"),
            sequence=prompt.tolist(),
            start=began,
            prefilled=prefilled,
        )
        for (index, slot), prompt in zip(joins, prompts, strict=True)
    ]


def _generator(seed: int, side: str) -> torch.Generator:
    """Return a CPU generator seeded for ``side`` of a request, as the batch-1 engine seeds."""
    return torch.Generator(device="cpu").manual_seed(side_seed(seed, side))


def _start_speculative(
    draft: BatchedLM,
    target: BatchedLM,
    make_policy: Callable[[], DraftPolicy],
    requests: Sequence[BatchRequest],
    joins: list[tuple[int, int]],
) -> list[_Sequence]:
    """Start speculative requests: give each a fresh policy (checked against the request),
    prefill both models' rows, reset the policies."""
    policies = [make_policy() for _ in joins]
    for (index, _), policy in zip(joins, policies, strict=True):
        settings, reference = requests[index].settings, requests[index].reference
        if policy.greedy_only and not settings.sampling.greedy:
            raise ValueError(f"policy {policy.name!r} is defined for greedy decoding only")
        if policy.needs_reference and reference is None:
            raise ValueError(f"policy {policy.name!r} needs the target's greedy output")
    sequences = _start_sequences(target, draft, requests, joins)
    for seq, policy in zip(sequences, policies, strict=True):
        reference = seq.request.reference
        policy.reset(
            RequestContext(
                prompt_len=len(seq.sequence),
                seed=seq.request.settings.seed,
                reference=tuple(reference) if reference is not None else None,
            )
        )
        seq.policy = policy
    return sequences


def _autoregressive_round(target: BatchedLM, active: list[_Sequence]) -> None:
    """One target step for every active sequence: its pending token in, its next token out
    (the argmax, or a draw from the warped row with its target generator)."""
    began = time.perf_counter()
    blocks = [torch.tensor(seq.sequence[-1:]) for seq in active]
    step = target.forward([seq.slot for seq in active], blocks, last_only=True)
    choices = step.logits.argmax(dim=-1).tolist()
    tokens = []
    for row, seq in enumerate(active):
        sampling = seq.request.settings.sampling
        if sampling.greedy:
            tokens.append(choices[row])
            continue
        probs = warp_probs(step.logits_of(row), sampling).cpu()
        verdict = verify_sampling(
            torch.empty(0, dtype=torch.long), torch.empty(0), probs, seq.target_gen
        )
        tokens.append(verdict.next_token)
    seconds = time.perf_counter() - began
    for seq, token in zip(active, tokens, strict=True):
        seq.emit([token], RoundRecord(0, 0, False, 0, 0.0, seconds))


def _speculative_round(draft: BatchedLM, target: BatchedLM, active: list[_Sequence]) -> None:
    """Draft for every sequence, verify all blocks in one target forward, roll back, record."""
    round_start = time.perf_counter()
    for seq in active:
        if isinstance(seq.policy, BatchAware):
            seq.policy.observe_batch(len(active))
    blocks = _draft_round(draft, active)
    drafted_at = time.perf_counter()
    verdicts = _verify_round(target, active, blocks)
    record_end = time.perf_counter()
    for seq, block, (n_accepted, tokens) in zip(active, blocks, verdicts, strict=True):
        draft.crop(seq.slot, len(seq.sequence) + n_accepted)
        seq.policy.update(RoundOutcome(len(block.tokens), n_accepted))
        record = RoundRecord(
            drafted=len(block.tokens),
            accepted=n_accepted,
            bonus=bool(block.tokens) and n_accepted == len(block.tokens),
            draft_forwards=block.forwards,
            draft_seconds=drafted_at - round_start,
            verify_seconds=record_end - drafted_at,
            mean_entropy=_mean(block.entropies),
            min_max_prob=min(block.max_probs) if block.max_probs else None,
        )
        seq.emit(tokens, record)


def _draft_round(draft: BatchedLM, active: list[_Sequence]) -> list[_Block]:
    """Draft every sequence's block, the steps of all sequences still drafting as one forward.

    The first forward of a sequence runs its pending tokens (those its draft row has not run);
    each later one the candidate it kept. A sequence leaves the drafting set when its policy
    stops or its cap is reached.
    """
    blocks = [_Block() for _ in active]
    caps = [min(seq.policy.round_cap(), seq.max_new_tokens - len(seq.output) - 1) for seq in active]
    inputs = {
        row: torch.tensor(seq.sequence[draft.lengths[seq.slot] :])
        for row, seq in enumerate(active)
        if caps[row] > 0
    }
    while inputs:
        rows = list(inputs)
        step = draft.forward([active[row].slot for row in rows], list(inputs.values()), True)
        greedy_tokens = step.logits.argmax(dim=-1).tolist()
        inputs = {}
        for position, row in enumerate(rows):
            blocks[row].forwards += 1
            token = _draft_candidate(active[row], blocks[row], step, position, greedy_tokens)
            if token is not None and len(blocks[row].tokens) < caps[row]:
                inputs[row] = torch.tensor([token])
    return blocks


def _draft_candidate(
    seq: _Sequence, block: _Block, step: BatchStep, position: int, greedy_tokens: list[int]
) -> int | None:
    """Choose the next candidate of ``seq`` from its row of ``step`` and ask its policy (as the
    batch-1 engine's ``_draft_block``); return the kept token when drafting goes on, else None.
    """
    policy, sampling = seq.policy, seq.request.settings.sampling
    logits = step.logits_of(position)[0]
    probs = None
    if sampling.greedy:
        token = greedy_tokens[position]
    else:
        probs = warp_probs(logits, sampling)
        token = int(sample_token(probs.cpu(), seq.draft_gen))
    wanted = policy.features
    entropy_value = max_prob = None
    if "entropy" in wanted or "max_prob" in wanted:
        shown = probs if probs is not None else feature_probs(logits, sampling)
        entropy_value, max_prob = float(entropy(shown)), float(shown.max())
    continues = True
    if not policy.keeps_every_candidate:
        decision = policy.decide(
            DraftStep(
                index=len(block.tokens) + 1,
                position=len(seq.output) + len(block.tokens),
                token=token if "token" in wanted else None,
                entropy=entropy_value,
                max_prob=max_prob,
                hidden=step.hidden_of(position)[-1] if "hidden" in wanted else None,
                target_hidden=seq.target_hidden,
            )
        )
        if not decision.keeps:
            return None
        continues = decision.continues
    block.tokens.append(token)
    if probs is not None:
        block.rows.append(probs.cpu())
        block.token_probs.append(float(probs[token]))
    if entropy_value is not None:
        block.entropies.append(entropy_value)
        block.max_probs.append(max_prob)
    return token if continues else None


def _verify_round(
    target: BatchedLM, active: list[_Sequence], blocks: list[_Block]
) -> list[tuple[int, list[int]]]:
    """Score every sequence's pending token and block in one target forward, judge each, roll
    each target row back to its accepted prefix; return (accepted, new tokens) per sequence."""
    scored = [
        torch.tensor(seq.sequence[-1:] + block.tokens)
        for seq, block in zip(active, blocks, strict=True)
    ]
    bases = [target.lengths[seq.slot] + 1 for seq in active]
    step = target.forward([seq.slot for seq in active], scored, last_only=False)
    choices = step.logits.argmax(dim=-1).tolist()
    results = []
    for row, (seq, block) in enumerate(zip(active, blocks, strict=True)):
        sampling = seq.request.settings.sampling
        offset, count = step.offsets[row], step.counts[row]
        if sampling.greedy:
            verdict = verify_greedy(block.tokens, torch.tensor(choices[offset : offset + count]))
        else:
            verdict = verify_sampling(
                torch.tensor(block.tokens, dtype=torch.long),
                torch.tensor(block.token_probs, dtype=step.logits.dtype),
                warp_probs(step.logits_of(row), sampling).cpu(),
                seq.target_gen,
            )
        n_accepted, next_token = verdict.n_accepted, verdict.next_token
        target.crop(seq.slot, bases[row] + n_accepted)
        if "target_hidden" in seq.policy.features:
            seq.target_hidden = step.hidden_of(row)[n_accepted]
        if next_token is None:
            residual = residual_distribution(verdict.rejected_row, block.rows[n_accepted])
            next_token = int(sample_token(residual, seq.draft_gen))
        results.append((n_accepted, [*block.tokens[:n_accepted], next_token]))
    return results


def _mean(values: list[float]) -> float | None:
    """Return the mean of ``values`` or None when empty."""
    return sum(values) / len(values) if values else None
