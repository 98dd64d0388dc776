"""How realistic a draft/target pair is: agreement, draft uncertainty, relative decoding cost
and the speedup static-K speculative decoding actually gets.

These are the figures written into the zoo's model cards. Agreement and entropy are measured
teacher-forced on held-out text; cost is the wall time of one batch-1 decoding forward with a
KV cache, timed for draft and target alternately so that load on a shared machine hits both;
the speedup is wall-clock tokens/s of static K over target-only AR on held-out prompts, greedy,
through the project's own engine (``workers.static_comparison``), the methods taking turns.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from training.lm_trainer import torch_threads
from workers.engine import RequestSettings
from workers.lm import CachedLM
from workers.records import SamplingConfig
from workers.static_comparison import compare_static_k
from workers.target import LocalTarget

DEFAULT_TIMING_THREADS = 2


@dataclass(frozen=True)
class AgreementStats:
    """Teacher-forced comparison of a draft with its target over ``n_positions`` tokens.

    ``greedy_agreement``: fraction of positions where argmax q == argmax p.
    ``entropy_mean``/``entropy_std``: of the draft's entropy (nats, softmax of raw logits).
    """

    greedy_agreement: float
    entropy_mean: float
    entropy_std: float
    n_positions: int


@dataclass(frozen=True)
class CostStats:
    """Median seconds of one single-token cached decoding forward and their ratio.

    ``load_average`` is the machine's 1-minute load when timing ended: on a shared machine
    timings mean little without it.
    """

    t_draft_s: float
    t_target_s: float
    cost_ratio: float
    context_len: int
    repeats: int
    threads: int
    load_average: float


def greedy_matches(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Return a bool tensor, True where the draft's argmax token equals the target's."""
    return target_logits.argmax(dim=-1) == draft_logits.argmax(dim=-1)


def entropy_nats(logits: torch.Tensor) -> torch.Tensor:
    """Return the entropy (nats) of softmax(logits) for every row of the last axis."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    probs = log_probs.exp()
    return -(probs * torch.where(probs > 0, log_probs, torch.zeros_like(log_probs))).sum(-1)


def summarize_agreement(matches: torch.Tensor, entropies: torch.Tensor) -> AgreementStats:
    """Return the agreement rate of bool ``matches`` and the mean/std of ``entropies``."""
    return AgreementStats(
        greedy_agreement=matches.float().mean().item(),
        entropy_mean=entropies.mean().item(),
        entropy_std=entropies.std().item(),
        n_positions=matches.numel(),
    )


@torch.inference_mode()
def agreement_stats(
    target: PreTrainedModel,
    drafts: Mapping[str, PreTrainedModel],
    blocks: torch.Tensor,
    batch_size: int = 8,
) -> dict[str, AgreementStats]:
    """Return, per draft, greedy agreement with ``target`` and draft entropy over ``blocks``.

    ``blocks`` [N, L] are token ids fed teacher-forced; every position counts. The target runs
    once per batch for all drafts.
    """
    matches: dict[str, list[torch.Tensor]] = {name: [] for name in drafts}
    entropies: dict[str, list[torch.Tensor]] = {name: [] for name in drafts}
    for start in range(0, blocks.shape[0], batch_size):
        inputs = blocks[start : start + batch_size]
        target_logits = target(input_ids=inputs).logits
        for name, draft in drafts.items():
            draft_logits = draft(input_ids=inputs).logits
            matches[name].append(greedy_matches(target_logits, draft_logits).flatten())
            entropies[name].append(entropy_nats(draft_logits).flatten())
    return {
        name: summarize_agreement(torch.cat(matches[name]), torch.cat(entropies[name]))
        for name in drafts
    }


@torch.inference_mode()
def decode_step_seconds(
    models: Sequence[PreTrainedModel],
    context_len: int = 128,
    new_tokens: int | Sequence[int] = 1,
    repeats: int = 50,
    warmup: int = 5,
    threads: int = DEFAULT_TIMING_THREADS,
    seed: int = 0,
) -> list[float]:
    """Return, per entry of ``models``, the median seconds of one cached forward.

    Each model runs as the engine runs it: a ``CachedLM`` (on a copy; fast Llama path where the
    model qualifies, a draft's restricted head, the calibrated one-token step). Entry i forwards
    ``new_tokens[i]`` tokens (or ``new_tokens`` for all) after a prefill of ``context_len``
    random tokens (batch 1, the model's dtype, ``threads`` threads), then crops its cache back.
    Entries take turns within every repeat, so all of them share whatever else the machine is
    doing; a model may appear more than once (e.g. to compare 1-token and 9-token forwards).
    """
    counts = [new_tokens] * len(models) if isinstance(new_tokens, int) else list(new_tokens)
    if len(counts) != len(models):
        raise ValueError(f"{len(counts)} token counts for {len(models)} models")
    generator = torch.Generator().manual_seed(seed)
    with torch_threads(threads):
        distinct = {id(model): model for model in models}
        by_model = {key: CachedLM(copy.deepcopy(model)) for key, model in distinct.items()}
        for lm in by_model.values():
            vocab = lm.model.config.vocab_size
            lm.forward(torch.randint(0, vocab, (context_len,), generator=generator))
        lms = [by_model[id(model)] for model in models]
        steps = [
            torch.randint(0, lm.model.config.vocab_size, (count,), generator=generator)
            for lm, count in zip(lms, counts, strict=True)
        ]
        samples: list[list[float]] = [[] for _ in models]
        for repeat in range(warmup + repeats):
            for index, lm in enumerate(lms):
                started = time.perf_counter()
                lm.forward(steps[index])
                elapsed = time.perf_counter() - started
                lm.crop(context_len)
                if repeat >= warmup:
                    samples[index].append(elapsed)
    return [statistics.median(values) for values in samples]


def cached_step_seconds(
    model: PreTrainedModel,
    context_len: int = 128,
    new_tokens: Sequence[int] = (1, 5, 9),
    repeats: int = 20,
    threads: int = DEFAULT_TIMING_THREADS,
) -> dict[int, float]:
    """Return the median seconds of one ``CachedLM`` forward per block size in ``new_tokens``
    (``decode_step_seconds`` on one copy of ``model``, the block sizes taking turns)."""
    sizes = list(new_tokens)
    seconds = decode_step_seconds(
        [model] * len(sizes), context_len, sizes, repeats, warmup=2, threads=threads
    )
    return dict(zip(sizes, seconds, strict=True))


def machine_load() -> float:
    """Return the 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def cost_stats(
    target: PreTrainedModel,
    drafts: Mapping[str, PreTrainedModel],
    context_len: int = 128,
    repeats: int = 50,
    threads: int = DEFAULT_TIMING_THREADS,
) -> dict[str, CostStats]:
    """Return, per draft, its and the target's single-token decoding cost and their ratio.

    All models are timed in one alternating loop, so the target is timed once per repeat and
    every ratio compares timings taken under the same machine load.
    """
    names = list(drafts)
    seconds = decode_step_seconds(
        [*drafts.values(), target], context_len, repeats=repeats, threads=threads
    )
    t_target = seconds[-1]
    load = machine_load()
    return {
        name: CostStats(
            t_draft_s=t_draft,
            t_target_s=t_target,
            cost_ratio=t_draft / t_target,
            context_len=context_len,
            repeats=repeats,
            threads=threads,
            load_average=load,
        )
        for name, t_draft in zip(names, seconds[:-1], strict=True)
    }


@dataclass(frozen=True)
class SpeedupStats:
    """Static-K speculative decoding against target-only AR for one draft (greedy, wall clock).

    ``tokens_per_s`` maps each K to its tokens/s; ``best_k`` is the fastest K and ``speedup``
    its tokens/s over AR's. ``matches_ar`` says whether every K reproduced AR's tokens.
    """

    ar_tokens_per_s: float
    tokens_per_s: dict[int, float]
    acceptance: dict[int, float]
    best_k: int
    speedup: float
    matches_ar: bool
    prompts: int
    new_tokens: int
    threads: int
    load_average: float


def static_speedups(
    target: PreTrainedModel,
    drafts: Mapping[str, PreTrainedModel],
    prompts: Sequence[torch.Tensor],
    ks: Sequence[int],
    new_tokens: int,
    threads: int = DEFAULT_TIMING_THREADS,
    eos_token_id: int | None = None,
    progress: str | None = None,
) -> dict[str, SpeedupStats]:
    """Return, per draft, how much faster static-K speculative decoding is than the target alone.

    Every prompt is decoded greedily to ``new_tokens`` tokens by AR and by each draft at
    each K (stopping early at ``eos_token_id`` when given), taking turns prompt by prompt, with
    ``threads`` torch threads; ``progress`` labels a progress bar over the prompts. The models are
    copied first: ``CachedLM`` fuses a Llama's projection weights in place, and the caller's
    models are the ones it saves.
    """
    settings = RequestSettings(SamplingConfig(max_new_tokens=new_tokens), eos_token_id=eos_token_id)
    with torch_threads(threads):
        target_side = LocalTarget(CachedLM(copy.deepcopy(target)))
        draft_lms = {name: CachedLM(copy.deepcopy(draft)) for name, draft in drafts.items()}
        runs = compare_static_k(target_side, draft_lms, prompts, settings, ks, progress)
    load = machine_load()
    ar_tokens_per_s = runs.tokens_per_second(runs.ar)
    stats = {}
    for name in drafts:
        tokens_per_s = {k: runs.tokens_per_second(runs.static[name, k]) for k in ks}
        best_k = max(ks, key=tokens_per_s.__getitem__)
        stats[name] = SpeedupStats(
            ar_tokens_per_s=ar_tokens_per_s,
            tokens_per_s=tokens_per_s,
            acceptance={k: runs.acceptance(name, k) for k in ks},
            best_k=best_k,
            speedup=runs.speedup(name, best_k),
            matches_ar=all(runs.matches_ar(name, k) for k in ks),
            prompts=len(prompts),
            new_tokens=new_tokens,
            threads=threads,
            load_average=load,
        )
    return stats
