"""Running a trial's prompts, or a group's arms interleaved, through the engine: the same
functions in process and in actors."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from policies import DraftPolicy, make_policy
from workers.arm_order import arm_order
from workers.engine import (
    RequestSettings,
    TargetScorer,
    autoregressive_generate,
    speculative_generate,
)
from workers.lm import CachedLM
from workers.proposers import Proposer, make_proposer
from workers.records import BASELINE_POLICY, GenerationResult, SamplingConfig

#: What a draft worker drafts with: a draft model, an EAGLE head's proposer, or nothing (a
#: target-only or n-gram pair).
Draft = CachedLM | Proposer | None

__all__ = [
    "BASELINE_POLICY",
    "ArmRequest",
    "ArmSample",
    "GroupRequest",
    "GroupResults",
    "TrialRequest",
    "WarmUp",
    "arm_call",
    "request_runtime_inputs",
    "run_arms",
    "run_trial",
    "sample_seed",
    "trial_policy",
    "warm_up",
]

#: Seconds a new process on a GPU decodes before its first timed sample. On an H200, decoding
#: in a fresh process ran at 47–71 ms a token, in spells, for about its first 12 s, then mostly
#: at 13–16 ms, whatever the prompt or temperature, while a pure-Python probe between requests
#: kept its speed (docs/gpu/warmup-transient-h200.log); a one-prompt warm-up left that spell in
#: the first trials' samples. A later H200 run traced the spells to cuDNN attention building a
#: graph for each new key length, which ``workers.lm.avoid_cudnn_attention`` now prevents;
#: whether this warm-up is still needed was not measured.
GPU_WARMUP_SECONDS = 20.0


@dataclass(frozen=True)
class TrialRequest:
    """Everything a worker needs to run one trial: prompts as token ids, decoding, policy.

    ``runtime_inputs`` are trained callables (SpecDec++ head, Cali-TS predictor) passed to the
    policy constructor; ``artifact_path`` is a trained artifact's directory the worker loads
    them from instead (``workers.heads.load_runtime_inputs``), so a request stays small.
    Sample i is decoded with seed ``sample_seed(seed, i)`` so samples differ but every run of
    the trial is reproducible; ``indices`` are the prompts' positions in the whole trial when
    the request is one shard of it (default: 0, 1, ...), so a shard decodes its samples
    exactly as the whole trial would. ``draft_kind`` is how candidates are proposed
    (``workers.proposers``): ``lm`` by the worker's draft model, ``ngram`` by prompt lookup
    with ``draft_settings`` (no model), ``eagle`` by the worker's EAGLE head. ``batch_size``
    above 1 decodes the prompts that many at a time through the batched engine
    (``workers.batch_trial``).
    """

    prompts: list[list[int]]
    sampling: SamplingConfig
    policy: str
    params: dict[str, Any] = field(default_factory=dict)
    max_draft_len: int = 0
    seed: int = 0
    warmup_samples: int = 0
    eos_token_id: int | None = None
    runtime_inputs: dict[str, Any] = field(default_factory=dict)
    artifact_path: str | None = None
    indices: tuple[int, ...] | None = None
    draft_kind: str = "lm"
    draft_settings: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 1


def run_trial(draft: Draft, target: TargetScorer, request: TrialRequest) -> list[GenerationResult]:
    """Decode every prompt of ``request``; return one result per prompt (warm-up excluded).

    The first ``warmup_samples`` prompts are decoded once before timing starts, so that lazy
    initialisation and allocator growth do not land in the measured samples. The measured
    prompts run in order through one policy object, reset per request: a policy with
    ``persist_across_requests`` carries its state (EESD's posterior, the heuristic's K) from
    each prompt to the next, the others start every prompt afresh. Warm-up uses its own policy.
    """
    policy = _warmed_policy(draft, target, request)
    indices = request.indices or range(len(request.prompts))
    return [
        _decode(draft, target, request, policy, prompt, seed=sample_seed(request.seed, index))
        for index, prompt in zip(indices, request.prompts, strict=True)
    ]


@dataclass(frozen=True)
class ArmRequest:
    """One arm of a group request: a trial (``key``, its id) and its samples in this shard.

    ``request.indices`` are the arm's sample indices (repeat r of prompt i is r * prompts + i)
    and ``request.prompts`` the prompt of each.
    """

    key: str
    request: TrialRequest


@dataclass(frozen=True)
class GroupRequest:
    """The arms of one group shard, run interleaved prompt by prompt in an order seeded by
    ``seed`` (``workers.arm_order``). ``shard`` is the shard's index in its group: at a batch
    size above 1 the arms take turns once per shard, in the order of block ``shard``."""

    arms: tuple[ArmRequest, ...]
    seed: int = 0
    shard: int = 0


@dataclass(frozen=True)
class ArmSample:
    """One decoded sample of a group shard, in the order they ran: its arm, its sample index,
    and when it started and ended (``time.time()`` seconds)."""

    key: str
    index: int
    started: float
    ended: float


@dataclass(frozen=True)
class GroupResults:
    """What a group shard decoded: each arm's results in its request's order (by arm key),
    every sample in the order it ran, and the error of each arm that raised (its results
    left out: the arm stopped there while the others went on)."""

    results: dict[str, list[GenerationResult]]
    log: tuple[ArmSample, ...]
    errors: dict[str, Exception] = field(default_factory=dict)


def run_arms(draft: Draft, target: TargetScorer, group: GroupRequest) -> GroupResults:
    """Decode a group shard: for each sample index, every arm holding it, back to back.

    Each arm's warm-up runs first (untimed), then one block per sample index in ascending
    order, its arms in the order :func:`workers.arm_order.arm_order` gives for (``seed``,
    index). Each arm has one policy object for the request, so a policy that persists across
    requests carries its state from sample to sample within its arm, as in :func:`run_trial`;
    sample seeds are ``sample_seed(trial seed, index)`` as there, so outputs do not depend on
    the interleaving.
    """
    arms = group.arms
    results: dict[str, list[GenerationResult]] = {arm.key: [] for arm in arms}
    errors: dict[str, Exception] = {}
    policies = [arm_call(errors, arm, _warmed_policy, draft, target, arm.request) for arm in arms]
    wanted = [dict(zip(_indices(arm.request), arm.request.prompts, strict=True)) for arm in arms]
    log: list[ArmSample] = []
    for index in sorted(set().union(*wanted)):
        for position in arm_order(len(arms), group.seed, index):
            arm = arms[position]
            if index not in wanted[position] or arm.key in errors:
                continue
            started, seed = time.time(), sample_seed(arm.request.seed, index)
            prompt, policy = wanted[position][index], policies[position]
            result = arm_call(
                errors, arm, _decode, draft, target, arm.request, policy, prompt, seed
            )
            if arm.key not in errors:
                results[arm.key].append(result)
                log.append(ArmSample(arm.key, index, started, time.time()))
    kept = {key: found for key, found in results.items() if key not in errors}
    return GroupResults(kept, tuple(log), errors)


def arm_call(errors: dict[str, Exception], arm: ArmRequest, call: Any, *args: Any) -> Any:
    """Return ``call(*args)`` for ``arm``; an error of the arm's own (not a broken channel to
    the target, nor Ray's) is kept in ``errors`` under its key instead, and None returned."""
    try:
        return call(*args)
    except Exception as exc:
        if isinstance(exc, ConnectionError | EOFError) or type(exc).__module__.startswith("ray"):
            raise
        errors[arm.key] = exc
        return None


def request_runtime_inputs(request: TrialRequest) -> dict[str, Any]:
    """Return the trained callables ``request``'s policy is built with: its own, and those its
    artifact directory holds."""
    runtime_inputs = dict(request.runtime_inputs)
    if request.artifact_path is not None:
        from workers.heads import load_runtime_inputs

        runtime_inputs.update(load_runtime_inputs(request.policy, request.artifact_path))
    return runtime_inputs


def _indices(request: TrialRequest) -> tuple[int, ...]:
    """Return the sample indices of ``request``'s prompts (default 0, 1, ...)."""
    return tuple(request.indices or range(len(request.prompts)))


def _warmed_policy(draft: Draft, target: TargetScorer, request: TrialRequest) -> DraftPolicy | None:
    """Decode ``request``'s warm-up prompts untimed (their own policy); return the policy its
    measured prompts run through (None for the AR baseline)."""
    runtime_inputs = request_runtime_inputs(request)
    warmup = request.prompts[: request.warmup_samples]
    warmup_policy = trial_policy(request, runtime_inputs) if warmup else None
    for prompt in warmup:
        _decode(draft, target, request, warmup_policy, prompt, seed=request.seed)
    return trial_policy(request, runtime_inputs)


@dataclass(frozen=True)
class WarmUp:
    """What a warm-up did: passes over its prompts, seconds spent, per-token cost of each pass."""

    seconds: float
    seconds_per_token: tuple[float, ...]

    @property
    def passes(self) -> int:
        """Number of passes over the request's prompts."""
        return len(self.seconds_per_token)


def warm_up(
    draft: Draft, target: TargetScorer, request: TrialRequest, min_seconds: float
) -> WarmUp:
    """Decode ``request`` (results discarded) in passes until ``min_seconds`` have gone by.

    At least one pass runs. A process's first decoding can be slower for a while (lazy
    initialisation, allocator growth; on a GPU a spell of several seconds, see
    ``GPU_WARMUP_SECONDS``), and that time must not land in a timed sample.
    """
    start = time.perf_counter()
    costs: list[float] = []
    while not costs or time.perf_counter() - start < min_seconds:
        results = run_trial(draft, target, request)
        tokens = sum(r.n_generated for r in results)
        costs.append(sum(r.seconds for r in results) / max(tokens, 1))
    return WarmUp(time.perf_counter() - start, tuple(costs))


def sample_seed(trial_seed: int, index: int) -> int:
    """Return the request seed of a trial's sample ``index`` (distinct per sample, reproducible)."""
    return trial_seed * 1_000_003 + index


def trial_policy(request: TrialRequest, runtime_inputs: dict[str, Any]) -> DraftPolicy | None:
    """Return a new policy for ``request`` (None for the AR baseline)."""
    if request.policy == BASELINE_POLICY:
        return None
    return make_policy(request.policy, request.max_draft_len, **request.params, **runtime_inputs)


def _decode(
    draft: Draft,
    target: TargetScorer,
    request: TrialRequest,
    policy: DraftPolicy | None,
    prompt: list[int],
    seed: int,
) -> GenerationResult:
    """Decode one prompt with the baseline (``policy`` None) or the trial's policy."""
    settings = RequestSettings(request.sampling, seed=seed, eos_token_id=request.eos_token_id)
    prompt_ids = torch.tensor(prompt, dtype=torch.long)
    if policy is None:
        return autoregressive_generate(target, prompt_ids, settings)
    proposer = _proposer(draft, request)
    reference = None
    if policy.needs_reference:
        reference = autoregressive_generate(target, prompt_ids, settings).output_ids
    return speculative_generate(proposer, target, policy, prompt_ids, settings, reference=reference)


def _proposer(draft: Draft, request: TrialRequest) -> CachedLM | Proposer:
    """Return what drafts ``request``'s candidates: the worker's draft model (kind ``lm``), a
    fresh n-gram lookup, or the worker's EAGLE proposer (begun afresh by every request);
    raises ValueError when the worker holds no draft of the request's kind."""
    kind = request.draft_kind
    if kind == "ngram":
        return make_proposer("ngram", **request.draft_settings)
    if kind not in ("lm", "eagle"):
        raise ValueError(f"draft kind {kind!r} does not run in a sweep's workers")
    held = getattr(draft, "kind", "lm") if draft is not None else None
    if held != kind:
        what = "a draft model" if kind == "lm" else "an EAGLE head"
        raise ValueError(
            f"policy {request.policy!r} with draft kind {kind!r} needs {what}, but this worker "
            f"holds {'nothing' if held is None else f'a draft of kind {held!r}'}"
        )
    return draft
