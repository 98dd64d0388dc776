"""The draft-length policy contract shared by the engine and every policy.

A policy is consulted once per candidate draft token. The engine runs one draft step, which
yields the draft distribution q_i and a candidate token y_i sampled from it, and then asks
``policy.decide(step)`` for a :class:`Decision`:

- ``STOP_BEFORE``: drop y_i and end the round (AdaEDL, max-confidence and the oracle decide
  before drafting token i, from q_i; so does SVIP for i >= 2, whose check of the entropy of the
  next position after keeping y_{i-1} is a check of q_i);
- ``KEEP_STOP``: keep y_i and end the round, without the draft forward that would produce
  q_{i+1} (EESD's Beta-TS and Cali-TS, SpecDec++: sample y_i, add it to the round, then decide);
- ``KEEP_CONTINUE``: keep y_i and draft the next candidate.

The round also stops at ``round_cap()`` tokens (and the engine cuts the last round of a request
to what ``max_new_tokens`` leaves, possibly nothing). After the target has verified the round
the engine calls ``policy.update(outcome)``. A policy whose ``decide`` is KEEP_CONTINUE whatever
it is shown (static K, transformers' heuristic: they act through ``round_cap`` alone) says so
with ``keeps_every_candidate``, and the engine then drafts up to the cap without asking: on the
micro test pair, whose draft steps take about 0.2 ms, asking cost 7–14 µs a round at K = 2–8,
half a point of the wall time.

Policies hold only their own state; they import nothing of SpecSweep's other packages.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

import numpy as np

#: Names of the per-step features a policy may ask for (``DraftPolicy.features``). The engine
#: computes only what the policy asks for, so a static policy costs no host synchronisation.
FEATURE_NAMES = frozenset(
    {"entropy", "max_prob", "hidden", "token", "target_hidden", "match_length"}
)


class Decision(Enum):
    """What a policy does with the candidate it was shown (see the module docstring)."""

    STOP_BEFORE = "stop_before"
    KEEP_CONTINUE = "keep_continue"
    KEEP_STOP = "keep_stop"

    @property
    def keeps(self) -> bool:
        """Return True when the candidate joins the round."""
        return self is not Decision.STOP_BEFORE

    @property
    def continues(self) -> bool:
        """Return True when the round drafts another candidate (cap permitting)."""
        return self is Decision.KEEP_CONTINUE


@dataclass(frozen=True)
class DraftStep:
    """What a policy sees about candidate token i of the current round (1-based ``index``).

    ``entropy`` (nats) and ``max_prob`` are of the draft distribution the candidate is drawn
    from: the warped q_i when sampling, softmax of the raw logits when decoding greedily.
    ``position`` is the index of the candidate within the generated output (0-based), which the
    oracle uses to look up the target's greedy token. ``hidden`` is the draft's last-layer
    hidden state producing q_i: for i >= 2 the state after feeding y_{i−1} (SpecDec++'s
    e_{i−1}), for i = 1 that of the last token before the round. ``target_hidden`` is the
    target's last-layer hidden state at the last verified position (Cali-TS). ``match_length``
    is an n-gram lookup draft's signal: how many tokens before its proposal agree with the
    sequence's end (None for a model draft). Fields the policy did not ask for are None.
    """

    index: int
    position: int
    token: int | None = None
    entropy: float | None = None
    max_prob: float | None = None
    hidden: Any | None = None
    target_hidden: Any | None = None
    match_length: int | None = None


@dataclass(frozen=True)
class RoundOutcome:
    """The verified result of one round: tokens proposed and how many the target accepted."""

    n_drafted: int
    n_accepted: int


@dataclass(frozen=True)
class RequestContext:
    """Per-request information given to ``reset``.

    ``reference`` is the target's greedy continuation of the prompt; only policies with
    ``needs_reference`` (the greedy oracle) get it, and the engine computes it for them.
    """

    prompt_len: int
    seed: int
    reference: tuple[int, ...] | None = None


@dataclass
class DraftPolicy(ABC):
    """Base class of all draft-length policies (see the module docstring for the protocol).

    ``max_draft_len`` is the cap the policy is built with, the one way the cap reaches a policy;
    the engine bounds each round by ``round_cap()``, which never exceeds it.
    """

    name: ClassVar[str] = ""
    features: ClassVar[frozenset[str]] = frozenset()
    needs_reference: ClassVar[bool] = False
    greedy_only: ClassVar[bool] = False
    keeps_every_candidate: ClassVar[bool] = False

    max_draft_len: int = 16
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0), repr=False)

    def reset(self, context: RequestContext) -> None:
        """Start a new request: reseed the policy's randomness and clear per-request state."""
        self.rng = np.random.default_rng(context.seed)
        self._reset_state(context)

    def _reset_state(self, context: RequestContext) -> None:
        """Clear per-request state; policies with state override this."""

    def round_cap(self) -> int:
        """Return the most tokens the next round may draft (the max draft length by default)."""
        return self.max_draft_len

    @abstractmethod
    def decide(self, step: DraftStep) -> Decision:
        """Return what to do with candidate ``step``: stop before it, keep it and go on or stop."""

    def update(self, outcome: RoundOutcome) -> None:
        """Learn from a verified round; stateless policies ignore it."""
