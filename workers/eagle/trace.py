"""Recording the greedy trace of an EAGLE head, which ``policies.replay`` replays.

An EAGLE head drafts a round from the target's true features of the verified prefix and then
autoregressively from its own predicted features (``workers.eagle.drafter``), so a round's
candidates depend on where the round starts, not on the position alone (as a lookup's do).
:func:`record_eagle_trace` decodes T with the target one token per verification of an empty
block, asking for its features, as a round that drafted nothing asks; before each step s it
drafts the head's greedy chain of a round starting there (up to ``cap`` candidates, each with
the features a draft model's trace records: ``workers.trace.draft_prediction``), and after it
re-anchors the head on the target's true feature with ``accept(0, T[s], f)``, the drafter's
own protocol for a round that kept nothing. The trace holds the chains by round start
(``GreedyTrace.chains``).

A recording costs one target-only decode plus about ``cap`` head forwards per position. Its
tokens and features are the live engine's up to the last bits where the live run computes on
blocks of other sizes (the target's verification of a drafted block, the head's commit of the
n + 1 true pairs of a round): a near-tie, as for a draft model's trace (``policies.replay``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from policies.replay import DraftPrediction, GreedyTrace
from workers.eagle.drafter import EagleDrafter
from workers.records import SamplingConfig
from workers.target import VerifyRequest
from workers.trace import draft_prediction

if TYPE_CHECKING:
    from workers.engine import TargetScorer

_GREEDY = SamplingConfig()


@torch.inference_mode()
def record_eagle_trace(
    drafter: EagleDrafter,
    target: TargetScorer,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    cap: int,
    eos_token_id: int | None = None,
) -> GreedyTrace:
    """Return the greedy trace of ``prompt_ids`` for the head ``drafter`` drives: T, decoded
    by ``target`` with its features, and the head's chain at every round start.

    T has ``max_new_tokens`` tokens, or stops ``cap`` tokens after the first EOS, since no
    round can reach further. The trace serves every max draft length up to ``cap``.
    """
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    prompt = prompt_ids.to(torch.long).cpu()
    layers = drafter.feature_layers
    drafter.begin(prompt, target.prefill(prompt, _GREEDY, 0, True, layers))
    tokens: list[int] = []
    chains: dict[int, tuple[DraftPrediction, ...]] = {}
    limit, pending = max_new_tokens, int(prompt[-1])
    while len(tokens) < limit:
        start = len(tokens)
        chains[start] = _chain(drafter, min(cap, limit - 1 - start))
        request = VerifyRequest(torch.tensor([pending]), want_features=True, feature_layers=layers)
        response = target.verify(request)
        pending = int(response.next_token)
        drafter.accept(0, pending, response.features)
        if pending == eos_token_id and eos_token_id not in tokens:
            limit = min(limit, start + cap + 1)
        tokens.append(pending)
    return GreedyTrace(
        prompt_ids=tuple(prompt.tolist()),
        max_new_tokens=max_new_tokens,
        cap=cap,
        eos_token_id=eos_token_id,
        target_tokens=tuple(tokens),
        target_margins=(),
        on_path=(),
        chains=_reachable(chains, len(tokens)),
    )


def _chain(drafter: EagleDrafter, count: int) -> tuple[DraftPrediction, ...]:
    """Return the head's next ``count`` greedy proposals (the round's chain) with features."""
    return tuple(draft_prediction(drafter.propose(_GREEDY).logits) for _ in range(count))


def _reachable(
    chains: dict[int, tuple[DraftPrediction, ...]], length: int
) -> dict[int, tuple[DraftPrediction, ...]]:
    """Return the chains a round can reach in a T of ``length`` tokens: round starts 0 to
    length − 2, each cut at position length − 2."""
    return {s: chain[: length - 1 - s] for s, chain in chains.items() if s <= length - 2}
