"""A group shard at a batch size above 1: each arm decodes the shard's prompts as one batch
queue, the arms taking turns (the batch-1 shard: ``workers.trial.run_arms``).

At batch size B an arm's prompts are the queue of the batched engine (``workers.batch_engine``):
B decode together and the next waiting one takes the row of one that ends (continuous
batching). The AR baseline decodes its queue with the target alone at the same B, on the
target's side (``batch_generate``). The arms run one after another, each its whole queue, in
the order ``workers.arm_order`` gives block ``shard`` (the shard's index in its group), so over
a group's shards every arm runs in every position alike. Each request keeps its batch-1 seed
(``sample_seed``), so greedy outputs equal batch 1's.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from policies import DraftPolicy
from workers.arm_order import arm_order
from workers.batch_cache import BatchedLM
from workers.batch_engine import BatchRequest, batch_speculative_generate
from workers.batch_target import BatchTarget, ChannelBatchedLM
from workers.engine import TargetScorer
from workers.lm import CachedLM
from workers.records import BASELINE_POLICY, GenerationResult, RequestSettings
from workers.target import LocalTarget
from workers.trial import (
    ArmSample,
    GroupRequest,
    GroupResults,
    TrialRequest,
    arm_call,
    request_runtime_inputs,
    run_arms,
    sample_seed,
    trial_policy,
)


class BatchSide(Protocol):
    """The target as the batched path needs it: its batched cache and its batched baseline."""

    def batched(self, slots: int) -> BatchedLM | ChannelBatchedLM:
        """Return the target's cache of ``slots`` rows."""
        ...

    def batch_generate(self, requests: list[BatchRequest], slots: int) -> list[GenerationResult]:
        """Decode ``requests`` with the target alone, ``slots`` at a time."""
        ...


def run_group(draft: CachedLM | None, target: TargetScorer, group: GroupRequest) -> GroupResults:
    """Run a group shard: batch-1 arms interleaved prompt by prompt (``run_arms``), arms of a
    larger batch size as batch queues (:func:`run_batch_arms`)."""
    sizes = {arm.request.batch_size for arm in group.arms}
    if sizes == {1} or not group.arms:
        return run_arms(draft, target, group)
    if len(sizes) > 1:
        raise ValueError(f"the arms of a group shard share one batch size, got {sorted(sizes)}")
    side = BatchTarget(target.lm) if isinstance(target, LocalTarget) else target
    return run_batch_arms(draft, side, group)  # type: ignore[arg-type]


def run_batch_arms(draft: CachedLM | None, target: BatchSide, group: GroupRequest) -> GroupResults:
    """Decode each arm's prompts as one batch queue, the arms in turn; an arm that raises
    stops with its own error while the others go on (as in ``run_arms``)."""
    arms = group.arms
    results: dict[str, list[GenerationResult]] = {}
    errors: dict[str, Exception] = {}
    log: list[ArmSample] = []
    for position in arm_order(len(arms), group.seed, group.shard):
        arm = arms[position]
        started = time.time()
        decoded = arm_call(errors, arm, decode_queue, draft, target, arm.request)
        if arm.key in errors:
            continue
        results[arm.key] = decoded
        ended = time.time()
        log += [ArmSample(arm.key, index, started, ended) for index in _indices(arm.request)]
    return GroupResults(results, tuple(log), errors)


def decode_queue(
    draft: CachedLM | None, target: BatchSide, request: TrialRequest
) -> list[GenerationResult]:
    """Decode ``request``'s warm-up prompts untimed, then its prompts as one batch queue of
    ``request.batch_size`` rows; return one result per prompt (warm-up excluded)."""
    warmup = request.prompts[: request.warmup_samples]
    if warmup:
        _queue(draft, target, request, warmup, [request.seed] * len(warmup))
    seeds = [sample_seed(request.seed, index) for index in _indices(request)]
    return _queue(draft, target, request, request.prompts, seeds)


def _queue(
    draft: CachedLM | None,
    target: BatchSide,
    request: TrialRequest,
    prompts: list[list[int]],
    seeds: list[int],
) -> list[GenerationResult]:
    """Decode ``prompts`` (sample seeds ``seeds``) through the batched engine."""
    slots = request.batch_size
    requests = [
        BatchRequest(
            torch.tensor(prompt, dtype=torch.long),
            RequestSettings(request.sampling, seed=seed, eos_token_id=request.eos_token_id),
        )
        for prompt, seed in zip(prompts, seeds, strict=True)
    ]
    if request.policy == BASELINE_POLICY:
        return target.batch_generate(requests, slots)
    if draft is None or request.draft_kind != "lm":
        raise ValueError(f"policy {request.policy!r} at batch size {slots} needs a draft model")
    runtime_inputs = request_runtime_inputs(request)

    def make_policy() -> DraftPolicy:
        policy = trial_policy(request, runtime_inputs)
        assert policy is not None
        return policy

    if make_policy().needs_reference:
        references = target.batch_generate(requests, slots)  # greedy: the oracle's reference
        requests = [
            BatchRequest(r.prompt_ids, r.settings, reference.output_ids)
            for r, reference in zip(requests, references, strict=True)
        ]
    return batch_speculative_generate(
        BatchedLM(draft, slots), target.batched(slots), make_policy, requests
    )


def _indices(request: TrialRequest) -> tuple[int, ...]:
    """Return the sample indices of ``request``'s prompts (default 0, 1, ...)."""
    return tuple(request.indices or range(len(request.prompts)))
