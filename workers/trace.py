"""Recording the greedy trace of one (pair, prompt, cap) that ``policies.replay`` replays.

Greedy only: under sampling the output depends on the policy, so no single recording can be
replayed exactly (see ``policies.replay``). Recording is itself greedy speculative decoding
with a static block of ``cap`` draft tokens, through the same :class:`CachedLM` incremental
path as the engine: the draft's tokens up to the first rejection are its predictions along the
target's output T, the ones after it are the start of the detour a policy may draft into, and
the target verifies a whole block per forward. Where the block falls short the recording adds
draft forwards: the rest of a detour (up to cap − 1 tokens) and, after a fully accepted block,
the draft's prediction at the bonus position (with its detour when it differs from the target's
bonus token, since another policy's round may draft there). So a recording costs about one
live run of static K = cap, and the recorded features are the ones the live engine computes, up
to the last bits where the live run forwards a block of a different size.

A lookup draft (``ngram``) has no model to record: :func:`record_lookup_trace` decodes T with
the target alone (one AR run, not stopped at EOS, since a round may verify past it), and
:func:`lookup_trace` computes from the prompt and T the lookup's proposals of a round starting
at each position, as ``workers.proposers.ngram`` proposes them live. An EAGLE head's trace is
recorded by ``workers.eagle.trace`` (the head's chain at every round start).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from policies.replay import DraftPrediction, GreedyTrace
from workers.lm import CachedLM
from workers.proposers.ngram import NgramIndex, NgramSettings
from workers.records import RequestSettings, SamplingConfig
from workers.sampling import entropy, feature_probs

if TYPE_CHECKING:
    from workers.engine import TargetScorer

__all__ = [
    "DraftPrediction",
    "GreedyTrace",
    "draft_prediction",
    "lookup_trace",
    "record_lookup_trace",
    "record_trace",
]

_GREEDY = SamplingConfig()


@dataclass
class _Recording:
    """What has been recorded so far; ``limit`` is how many target tokens are needed."""

    limit: int
    tokens: list[int] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    on_path: list[DraftPrediction] = field(default_factory=list)
    off_path: dict[int, tuple[DraftPrediction, ...]] = field(default_factory=dict)


def record_trace(
    draft: CachedLM,
    target_lm: CachedLM,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    cap: int,
    eos_token_id: int | None = None,
) -> GreedyTrace:
    """Return the greedy trace of ``prompt_ids``: T, the draft along T, and its detours.

    T has ``max_new_tokens`` tokens, or stops ``cap`` tokens after the first EOS, since no
    round can reach further. The trace serves every max draft length up to ``cap``.
    """
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    prompt = prompt_ids.to(torch.long).cpu()
    for lm in (target_lm, draft):
        lm.reset()
        if prompt.numel() > 1:
            lm.forward(prompt[:-1].to(lm.device), last_only=True)
    recording = _Recording(limit=max_new_tokens)
    sequence = prompt.tolist()
    while len(recording.tokens) < recording.limit:
        start = len(recording.tokens)
        block = _draft_greedy(draft, sequence, min(cap, recording.limit - start - 1))
        choices, margins = _verify(target_lm, sequence[-1], [p.token for p in block])
        accepted = next((i for i, p in enumerate(block) if p.token != choices[i]), len(block))
        _extend_target(recording, choices[: accepted + 1], margins, eos_token_id, cap)
        recording.on_path += block[: accepted + 1]
        if accepted < len(block):
            needed = min(cap - 1, recording.limit - 2 - (start + accepted))
            recording.off_path[start + accepted] = _detour(draft, block, accepted, needed)
        elif block and start + len(block) <= recording.limit - 2:
            bonus_position = start + len(block)
            bonus = _draft_greedy(draft, [block[-1].token], 1, pending=True)[0]
            recording.on_path.append(bonus)
            if bonus.token != choices[len(block)]:
                needed = min(cap - 1, recording.limit - 2 - bonus_position)
                recording.off_path[bonus_position] = _detour(draft, [bonus], 0, needed)
        draft.crop(min(draft.cached_len, len(sequence) + accepted))
        sequence += choices[: accepted + 1]
    return _trace(recording, prompt, max_new_tokens, cap, eos_token_id)


def _draft_greedy(
    draft: CachedLM, sequence: list[int], count: int, pending: bool = False
) -> list[DraftPrediction]:
    """Return ``count`` greedy draft predictions after the tokens of ``sequence`` not cached.

    With ``pending`` the given tokens are the uncached ones themselves. Forwards the pending
    tokens, then every prediction but the last, like ``workers.engine._draft_block``.
    """
    if count <= 0:
        return []
    uncached = sequence if pending else sequence[draft.cached_len :]
    ids = torch.tensor(uncached, dtype=torch.long, device=draft.device)
    predictions: list[DraftPrediction] = []
    while True:
        logits = draft.forward(ids, last_only=True).logits[-1]
        predictions.append(draft_prediction(logits))
        if len(predictions) == count:
            return predictions
        ids = logits.argmax().view(1)


def _detour(
    draft: CachedLM, block: list[DraftPrediction], rejected: int, needed: int
) -> tuple[DraftPrediction, ...]:
    """Return ``needed`` draft predictions after the block's rejected one at index ``rejected``.

    The block already holds those it drafted past the rejection; the rest are drafted on from
    its last token (whose forward the block skipped).
    """
    drafted = block[rejected + 1 :]
    missing = needed - len(drafted)
    if missing <= 0:
        return tuple(drafted[: max(needed, 0)])
    return (*drafted, *_draft_greedy(draft, [block[-1].token], missing, pending=True))


def _verify(target_lm: CachedLM, last: int, drafted: list[int]) -> tuple[list[int], list[float]]:
    """Return the target's greedy choice and top-two logit gap at each block position.

    Forwards the last emitted token and the drafted ones, like ``LocalTarget.verify``; the
    caller's cache rollback is done here (to the accepted prefix).
    """
    base = target_lm.cached_len + 1
    logits = target_lm.forward(torch.tensor([last, *drafted], dtype=torch.long)).logits
    choices = logits.argmax(dim=-1).tolist()
    accepted = next((i for i, t in enumerate(drafted) if t != choices[i]), len(drafted))
    target_lm.crop(base + accepted)
    top = torch.topk(logits, min(2, logits.shape[-1]), dim=-1).values
    margins = (top[:, 0] - top[:, -1]).tolist()
    return choices, margins


def _extend_target(
    recording: _Recording, tokens: list[int], margins: list[float], eos: int | None, cap: int
) -> None:
    """Append target tokens; after the first EOS at e, only e + cap + 1 tokens are needed."""
    for token, margin in zip(tokens, margins, strict=False):
        if token == eos and eos not in recording.tokens:
            recording.limit = min(recording.limit, len(recording.tokens) + cap + 1)
        recording.tokens.append(token)
        recording.margins.append(margin)


def _trace(
    recording: _Recording, prompt: torch.Tensor, max_new_tokens: int, cap: int, eos: int | None
) -> GreedyTrace:
    """Return the trace, detours cut to what a round can reach (position len(T) − 2)."""
    last = len(recording.tokens) - 2
    return GreedyTrace(
        prompt_ids=tuple(prompt.tolist()),
        max_new_tokens=max_new_tokens,
        cap=cap,
        eos_token_id=eos,
        target_tokens=tuple(recording.tokens),
        target_margins=tuple(recording.margins),
        on_path=tuple(recording.on_path[: last + 1]),
        off_path={
            p: detour[: max(0, min(cap - 1, last - p))]
            for p, detour in recording.off_path.items()
            if p <= last
        },
    )


def draft_prediction(logits: torch.Tensor) -> DraftPrediction:
    """Return the greedy token and the features the engine computes from these logits."""
    probs = feature_probs(logits, _GREEDY)
    top = torch.topk(logits, min(2, logits.numel())).values
    return DraftPrediction(
        token=int(logits.argmax()),
        entropy=float(entropy(probs)),
        max_prob=float(probs.max()),
        margin=float(top[0] - top[-1]),
    )


def record_lookup_trace(
    target: TargetScorer,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    cap: int,
    eos_token_id: int | None,
    settings: NgramSettings,
) -> GreedyTrace:
    """Return the greedy trace of a lookup draft with ``settings`` on ``prompt_ids``: T from
    the target's own greedy decoding (``target.generate``, not stopped at EOS), then
    :func:`lookup_trace`."""
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    prompt = prompt_ids.to(torch.long).cpu()
    decoded = target.generate(
        prompt, RequestSettings(SamplingConfig(max_new_tokens=max_new_tokens))
    )
    return lookup_trace(
        prompt.tolist(), decoded.output_ids, max_new_tokens, cap, eos_token_id, settings
    )


def lookup_trace(
    prompt: Sequence[int],
    tokens: Sequence[int],
    max_new_tokens: int,
    cap: int,
    eos_token_id: int | None,
    settings: NgramSettings,
) -> GreedyTrace:
    """Return the lookup draft's trace of ``prompt`` whose greedy continuation is ``tokens``.

    T is ``tokens`` cut ``cap`` tokens after its first EOS (no round reaches further); for each
    round start s a round can draft at (0 to len(T) − 2), the lookup over prompt + T[:s]
    proposes the tokens after its match, at most ``cap`` and none past position len(T) − 2,
    each with the match's length, entropy 0 and max probability 1 (a point mass).
    """
    limit = min(len(tokens), max_new_tokens)
    if eos_token_id is not None and eos_token_id in tokens[:limit]:
        limit = min(limit, list(tokens).index(eos_token_id) + cap + 1)
    target = [int(token) for token in tokens[:limit]]
    index = NgramIndex(settings)
    lookups: dict[int, tuple[DraftPrediction, ...]] = {}
    for start in range(len(target) - 1):
        sequence = [*prompt, *target[:start]]
        found = index.lookup(sequence)
        if found is None:
            continue
        reach = min(cap, found.end - found.start, len(target) - 1 - start)
        lookups[start] = tuple(
            DraftPrediction(sequence[found.start + offset], 0.0, 1.0, None, found.match_length)
            for offset in range(reach)
        )
    return GreedyTrace(
        prompt_ids=tuple(int(token) for token in prompt),
        max_new_tokens=max_new_tokens,
        cap=cap,
        eos_token_id=eos_token_id,
        target_tokens=tuple(target),
        target_margins=(),
        on_path=(),
        lookups=lookups,
        step_cost=0,
    )
