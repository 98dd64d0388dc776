"""Running one trial's prompts through the engine: the same function in process and in actors."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from policies import DraftPolicy, make_policy
from workers.engine import (
    RequestSettings,
    TargetScorer,
    autoregressive_generate,
    speculative_generate,
)
from workers.lm import CachedLM
from workers.records import BASELINE_POLICY, GenerationResult, SamplingConfig

__all__ = ["BASELINE_POLICY", "TrialRequest", "WarmUp", "run_trial", "sample_seed", "warm_up"]

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
    exactly as the whole trial would.
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


def run_trial(
    draft: CachedLM | None, target: TargetScorer, request: TrialRequest
) -> list[GenerationResult]:
    """Decode every prompt of ``request``; return one result per prompt (warm-up excluded).

    The first ``warmup_samples`` prompts are decoded once before timing starts, so that lazy
    initialisation and allocator growth do not land in the measured samples. The measured
    prompts run in order through one policy object, reset per request: a policy with
    ``persist_across_requests`` carries its state (EESD's posterior, the heuristic's K) from
    each prompt to the next, the others start every prompt afresh. Warm-up uses its own policy.
    """
    runtime_inputs = dict(request.runtime_inputs)
    if request.artifact_path is not None:
        from workers.heads import load_runtime_inputs

        runtime_inputs.update(load_runtime_inputs(request.policy, request.artifact_path))
    warmup = request.prompts[: request.warmup_samples]
    warmup_policy = _trial_policy(request, runtime_inputs) if warmup else None
    for prompt in warmup:
        _decode(draft, target, request, warmup_policy, prompt, seed=request.seed)
    policy = _trial_policy(request, runtime_inputs)
    indices = request.indices or range(len(request.prompts))
    return [
        _decode(draft, target, request, policy, prompt, seed=sample_seed(request.seed, index))
        for index, prompt in zip(indices, request.prompts, strict=True)
    ]


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
    draft: CachedLM | None, target: TargetScorer, request: TrialRequest, min_seconds: float
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


def _trial_policy(request: TrialRequest, runtime_inputs: dict[str, Any]) -> DraftPolicy | None:
    """Return a new policy for ``request`` (None for the AR baseline)."""
    if request.policy == BASELINE_POLICY:
        return None
    return make_policy(request.policy, request.max_draft_len, **request.params, **runtime_inputs)


def _decode(
    draft: CachedLM | None,
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
    if draft is None:
        raise ValueError(f"policy {request.policy!r} needs a draft model")
    reference = None
    if policy.needs_reference:
        reference = autoregressive_generate(target, prompt_ids, settings).output_ids
    return speculative_generate(draft, target, policy, prompt_ids, settings, reference=reference)
