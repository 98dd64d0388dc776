"""The draft-length policy contract shared by the engine and every policy.

A policy is consulted once per candidate draft token. The engine runs one draft step, which
yields the draft distribution q_i and a candidate token y_i sampled from it, and then asks
``policy.propose(step)``: True proposes y_i to the target and drafts on, False stops the round
before y_i (so a policy can stop on the confidence of the token it would add, as AdaEDL and the
oracle do, without wasting a verified slot). The round also stops at ``round_cap()`` tokens.
After the target has verified the round the engine calls ``policy.update(outcome)``.

Policies hold only their own state; they import nothing of SpecSweep's other packages.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

#: Names of the per-step features a policy may ask for (``DraftPolicy.features``). The engine
#: computes only what the policy asks for, so a static policy costs no host synchronisation.
FEATURE_NAMES = frozenset({"entropy", "max_prob", "hidden", "token", "target_hidden"})


@dataclass(frozen=True)
class DraftStep:
    """What a policy sees about candidate token i of the current round (1-based ``index``).

    ``entropy`` (nats) and ``max_prob`` are of the draft distribution the candidate is drawn
    from: the warped q_i when sampling, softmax of the raw logits when decoding greedily.
    ``position`` is the index of the candidate within the generated output (0-based), which the
    oracle uses to look up the target's greedy token. ``hidden`` is the draft's last-layer
    hidden state producing q_i; ``target_hidden`` the target's last-layer hidden state at the
    last verified position (Cali-TS). Fields the policy did not ask for are None.
    """

    index: int
    position: int
    token: int | None = None
    entropy: float | None = None
    max_prob: float | None = None
    hidden: Any | None = None
    target_hidden: Any | None = None


@dataclass(frozen=True)
class RoundOutcome:
    """The verified result of one round: tokens proposed, how many the target accepted, the cap."""

    n_drafted: int
    n_accepted: int
    max_draft_len: int


@dataclass(frozen=True)
class RequestContext:
    """Per-request information given to ``reset``.

    ``reference`` is the target's greedy continuation of the prompt; only policies with
    ``needs_reference`` (the greedy oracle) get it, and the engine computes it for them.
    """

    prompt_len: int
    max_draft_len: int
    seed: int
    reference: tuple[int, ...] | None = None


@dataclass
class DraftPolicy(ABC):
    """Base class of all draft-length policies (see the module docstring for the protocol)."""

    name: ClassVar[str] = ""
    features: ClassVar[frozenset[str]] = frozenset()
    needs_reference: ClassVar[bool] = False
    greedy_only: ClassVar[bool] = False

    max_draft_len: int = 16
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0), repr=False)

    def reset(self, context: RequestContext) -> None:
        """Start a new request: reseed the policy's randomness and clear per-request state."""
        self.max_draft_len = context.max_draft_len
        self.rng = np.random.default_rng(context.seed)
        self._reset_state(context)

    def _reset_state(self, context: RequestContext) -> None:
        """Clear per-request state; policies with state override this."""

    def round_cap(self) -> int:
        """Return the most tokens the next round may draft (the max draft length by default)."""
        return self.max_draft_len

    @abstractmethod
    def propose(self, step: DraftStep) -> bool:
        """Return True to propose the candidate token and draft on, False to stop before it."""

    def update(self, outcome: RoundOutcome) -> None:
        """Learn from a verified round; stateless policies ignore it."""
