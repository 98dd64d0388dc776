"""Replaying a draft-length policy over a recorded greedy trace (pure, no model calls).

Under greedy decoding the output of speculative decoding is the target's greedy output T, and
every quantity a round depends on is a function of T and of the draft's greedy behaviour along
it: in a round that starts at output position s the draft proposes its greedy token at s, s+1,
... while those equal T (the draft is then "on the target path"), and after the first
disagreement at position p it continues from prefix + T[:p] + its own token, which depends on p
only. A :class:`GreedyTrace` stores exactly that (``workers.trace.record_trace`` records it), so
:func:`replay` can run any policy over it, with its own state and seeded randomness, and return
the rounds ``workers.engine.speculative_generate`` would produce, without running a model.

What replay promises and what it cannot:

- Greedy decoding: the replayed rounds (drafted, accepted, bonus, draft forwards, feature
  summaries) equal the live rounds for every policy that reads only ``entropy``, ``max_prob``,
  ``token`` and the oracle's reference. The one exception is a floating-point near-tie: the live
  engine runs the models on differently sized blocks (a two-token pending block after a fully
  accepted round, the target's verification block) than the recording does, so logits differ in
  the last bits, and an argmax whose top two logits are that close, or a feature that close to a
  policy's threshold, can come out the other way. ``DraftPrediction.margin`` and
  ``GreedyTrace.target_margins`` record the logit gaps so such a difference can be traced.
- Policies that read hidden states (``hidden``, ``target_hidden``: a trained SpecDec++ head, a
  Cali-TS predictor) are refused; the trace stores no hidden states.
- A lookup draft (``ngram``) proposes the continuation of a match found in the sequence at
  the round's start, so its candidates depend on where the round starts, not on the position
  alone: its trace holds, per round start, the lookup's proposals with their ``match_length``
  (``GreedyTrace.lookups``), entropy 0 and max probability 1 (a point mass), and no draft
  forward (``step_cost`` 0). Every policy replays over it (``ngram_match`` only over it).
- An EAGLE head (``eagle``) drafts a round autoregressively in feature space from the target's
  true features of the verified prefix: its i-th candidate reads the head's own predicted
  feature of the (i − 1)-th, not the target's, so it too depends on where the round starts.
  Its trace holds, per round start s, the head's greedy chain from prompt + T[:s] with the
  features a draft model's trace records (``GreedyTrace.chains``; one head forward per
  candidate, ``step_cost`` 1; ``workers.eagle.trace`` records it).
- Sampling (temperature > 0): replay is not exact and is not offered. The draft's tokens are
  drawn from the draft-side generator, whose stream position depends on how many tokens earlier
  rounds drafted, the target's acceptance uniforms are drawn per drafted token, and the
  correction token is sampled from a residual that depends on the rejected position; so the
  output itself depends on the policy, and one recorded run determines neither another
  policy's tokens nor its rounds. At best a sampled trace could estimate expected acceptance
  from recorded distributions, which is a different (statistical) promise.

Timing is not replayed: it follows from the cost model T = t_draft·N_draft + t_target·N_target
(``orchestrator.analysis.costs.model``) applied to the replayed rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.base import DraftPolicy, DraftStep, RequestContext, RoundOutcome
from policies.batch_schedule import BatchAware

#: Step features a trace does not hold; a policy asking for one cannot be replayed.
UNREPLAYABLE_FEATURES = frozenset({"hidden", "target_hidden"})


@dataclass(frozen=True)
class DraftPrediction:
    """The draft's greedy choice at one position and the features a policy may read.

    ``entropy`` (nats) and ``max_prob`` are of the softmax of the raw logits, as the engine
    shows them in greedy mode; ``margin`` is the gap between the two largest logits (small means
    the argmax is a near-tie; None for a lookup's proposal, which has no logits).
    ``match_length`` is a lookup proposal's match length (None for a draft model's).
    """

    token: int
    entropy: float
    max_prob: float
    margin: float | None
    match_length: int | None = None


@dataclass(frozen=True)
class GreedyTrace:
    """What any policy can ask for along the target's greedy output of one prompt.

    ``target_tokens`` is T, the target's greedy continuation, as far as any round can reach
    (``max_new_tokens`` tokens, or fewer when an EOS at position e makes positions past
    e + ``cap`` unreachable); ``target_margins`` are its top-two logit gaps. ``on_path[i]`` is
    the draft's greedy prediction given prompt + T[:i], for every position a round can draft
    at (0 to len(T) − 2). ``off_path[p]``, for each such p where ``on_path[p].token != T[p]``,
    is the draft's greedy continuation after prompt + T[:p] + ``on_path[p].token``, as far as a
    round can reach: min(``cap`` − 1, len(T) − 2 − p) tokens. The trace serves any max draft
    length up to ``cap``.

    A lookup draft's trace has instead ``lookups[s]``: the proposals of a round that starts at
    output position s (at most ``cap``, none past position len(T) − 2; s absent: no match),
    ``on_path`` and ``off_path`` empty, ``target_margins`` empty (T decoded by the target
    alone), and ``step_cost`` 0: the draft forwards one proposal costs (1 for a draft model).
    An EAGLE head's trace has ``chains[s]``: the head's greedy chain of a round that starts at
    s (min(``cap``, len(T) − 1 − s) candidates, each with its features), ``on_path``,
    ``off_path`` and ``target_margins`` empty, and ``step_cost`` 1.
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    cap: int
    eos_token_id: int | None
    target_tokens: tuple[int, ...]
    target_margins: tuple[float, ...]
    on_path: tuple[DraftPrediction, ...]
    off_path: dict[int, tuple[DraftPrediction, ...]] = field(default_factory=dict)
    lookups: dict[int, tuple[DraftPrediction, ...]] | None = None
    step_cost: int = 1
    chains: dict[int, tuple[DraftPrediction, ...]] | None = None

    @property
    def reference(self) -> tuple[int, ...]:
        """Return the target's greedy output as decoding emits it: cut after the first EOS."""
        tokens = self.target_tokens[: self.max_new_tokens]
        if self.eos_token_id is not None and self.eos_token_id in tokens:
            return tokens[: tokens.index(self.eos_token_id) + 1]
        return tokens

    @property
    def disagreements(self) -> list[int]:
        """Return the positions where the draft's greedy token differs from the target's."""
        return sorted(self.off_path)

    def candidate(self, position: int, first_disagreement: int | None) -> DraftPrediction:
        """Return the draft's candidate at ``position`` in a round that left T at the given one.

        ``first_disagreement`` is the position of the round's first candidate that differed
        from T, or None while the round is still on T.
        """
        if first_disagreement is None or position <= first_disagreement:
            return self.on_path[position]
        return self.off_path[first_disagreement][position - first_disagreement - 1]

    def proposal(
        self, start: int, position: int, first_disagreement: int | None
    ) -> DraftPrediction | None:
        """Return the candidate at ``position`` of a round that started at ``start`` (None: the
        draft proposes nothing more, a lookup past its match): a lookup's proposal or an EAGLE
        head's chain element, else :meth:`candidate`."""
        by_start = self.lookups if self.lookups is not None else self.chains
        if by_start is None:
            return self.candidate(position, first_disagreement)
        found = by_start.get(start, ())
        offset = position - start
        return found[offset] if offset < len(found) else None


@dataclass(frozen=True)
class ReplayedRound:
    """One replayed round, with the fields of ``workers.records.RoundRecord`` but no timings."""

    drafted: int
    accepted: int
    bonus: bool
    draft_forwards: int
    mean_entropy: float | None = None
    min_max_prob: float | None = None

    @property
    def emitted(self) -> int:
        """Tokens this round added to the output: the accepted ones plus the target's one."""
        return self.accepted + 1


def check_replayable(policy: DraftPolicy, trace: GreedyTrace) -> None:
    """Raise ValueError if ``policy`` (at its max draft length) cannot be replayed over ``trace``.

    Exists so that a policy reading hidden states, or a cap the trace was not recorded for,
    fails with a message naming the cause instead of replaying something that is not exact.
    """
    missing = sorted(set(policy.features) & UNREPLAYABLE_FEATURES)
    if "match_length" in policy.features and trace.lookups is None:
        missing.append("match_length (a lookup draft's feature)")
    if missing:
        raise ValueError(
            f"policy {policy.name!r} reads {', '.join(missing)}, which a greedy trace does not "
            f"store; run it live instead"
        )
    if policy.max_draft_len > trace.cap:
        raise ValueError(
            f"max draft length {policy.max_draft_len} exceeds the trace's recorded cap "
            f"{trace.cap}; record the trace with cap >= {policy.max_draft_len}"
        )


def replay(policy: DraftPolicy, trace: GreedyTrace, seed: int) -> list[ReplayedRound]:
    """Return the rounds greedy ``speculative_generate`` would run for ``policy`` on ``trace``.

    Mirrors the engine step by step: ``reset`` with the request seed (and the reference for
    policies that need it), per round the cap min(round_cap(), max_new_tokens − generated − 1),
    ``decide`` on each candidate, one draft forward for the pending tokens plus one per kept
    candidate the policy continues after below the cap, greedy verification against T,
    ``update``, and the stop after the round that emits EOS. Raises ValueError for policies
    ``check_replayable`` rejects.
    """
    run = SequenceReplay(policy, trace, seed)
    while not run.done:
        run.next_round()
    return run.rounds


class SequenceReplay:
    """One sequence's greedy replay, a round at a time (:func:`replay` runs it to its end).

    A batched queue runs its sequences round by round (``workers.batch_engine``), telling a
    policy that wants it (``BatchAware``) the batch size before each round: ``next_round``
    takes that size, so a queue simulator can replay such a policy exactly.
    """

    def __init__(self, policy: DraftPolicy, trace: GreedyTrace, seed: int) -> None:
        check_replayable(policy, trace)
        policy.reset(
            RequestContext(
                prompt_len=len(trace.prompt_ids),
                seed=seed,
                reference=trace.reference if policy.needs_reference else None,
            )
        )
        self.policy, self.trace = policy, trace
        self.wants_features = bool({"entropy", "max_prob"} & set(policy.features))
        self.rounds: list[ReplayedRound] = []
        self.generated = 0

    @property
    def done(self) -> bool:
        """Whether the sequence has emitted its last token (its length, or its reference's)."""
        trace = self.trace
        return self.generated >= trace.max_new_tokens or self.generated >= len(trace.reference)

    def next_round(self, batch_size: int = 1) -> ReplayedRound:
        """Run and return the sequence's next round in a batch of ``batch_size`` sequences (the
        policy is told it first when it asks, ``observe_batch``, as the batched engine does)."""
        policy, trace = self.policy, self.trace
        if isinstance(policy, BatchAware):
            policy.observe_batch(batch_size)
        cap = min(policy.round_cap(), trace.max_new_tokens - self.generated - 1)
        if cap > trace.cap:
            raise ValueError(f"policy {policy.name!r} asked for a round of {cap} > trace cap")
        proposed, forwards = _draft_round(policy, trace, self.generated, cap)
        accepted = _accepted(proposed, trace.target_tokens, self.generated)
        policy.update(RoundOutcome(len(proposed), accepted))
        entropies = [p.entropy for p in proposed] if self.wants_features else []
        replayed = ReplayedRound(
            drafted=len(proposed),
            accepted=accepted,
            bonus=bool(proposed) and accepted == len(proposed),
            draft_forwards=forwards,
            mean_entropy=sum(entropies) / len(entropies) if entropies else None,
            min_max_prob=min(p.max_prob for p in proposed) if entropies else None,
        )
        self.rounds.append(replayed)
        self.generated += accepted + 1
        return replayed


def _draft_round(
    policy: DraftPolicy, trace: GreedyTrace, start: int, cap: int
) -> tuple[list[DraftPrediction], int]:
    """Return the candidates ``policy`` keeps in a round starting at ``start``, and forwards.

    The forward count follows ``workers.engine._draft_block``: none for an empty cap, else the
    trace's ``step_cost`` for the pending tokens and one more after each kept candidate the
    policy continues after, when its index is below the cap (a lookup: none at all). A
    draft that proposes nothing more ends the round, as the engine ends it.
    """
    if cap <= 0:
        return [], 0
    wanted = policy.features
    proposed: list[DraftPrediction] = []
    forwards = trace.step_cost
    left_path: int | None = None
    for index in range(1, cap + 1):
        position = start + index - 1
        prediction = trace.proposal(start, position, left_path)
        if prediction is None:
            break
        features = "entropy" in wanted or "max_prob" in wanted
        step = DraftStep(
            index=index,
            position=position,
            token=prediction.token if "token" in wanted else None,
            entropy=prediction.entropy if features else None,
            max_prob=prediction.max_prob if features else None,
            match_length=prediction.match_length if "match_length" in wanted else None,
        )
        decision = policy.decide(step)
        if not decision.keeps:
            break
        proposed.append(prediction)
        if left_path is None and prediction.token != trace.target_tokens[position]:
            left_path = position
        if not decision.continues or index == cap:
            break
        forwards += trace.step_cost
    return proposed, forwards


def _accepted(proposed: list[DraftPrediction], target_tokens: tuple[int, ...], start: int) -> int:
    """Return how many leading proposed tokens equal T from ``start`` (greedy verification)."""
    for offset, prediction in enumerate(proposed):
        if prediction.token != target_tokens[start + offset]:
            return offset
    return len(proposed)
