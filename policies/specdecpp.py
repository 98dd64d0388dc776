"""SpecDec++: stop when the predicted chance that some candidate so far is rejected exceeds h.

SpecDec++'s Algorithm 2, per round (p̂ = 1): for i = 1, 2, ...: sample Y_i ~ q_i; multiply p̂ by
sigmoid(f(e)), the head's predicted chance that Y_i is accepted given the earlier candidates
were, where e is the draft's last hidden state that produced q_i; break if 1 − p̂ > h. Y_i is
kept at the break (the MDP's transition draws Y_{k+1} and appends it before the stop decision),
so every round drafts at least one token and the head's factor for i = 1 is read from the state
at the last token before the round (the one that produced q_1). That is the reading implemented:
in the engine's protocol (``policies.base``) each candidate is kept, with KEEP_STOP once
1 − p̂ > h, so the stop also skips the draft forward that would produce q_{i+1}. The head is
trained on exactly that pairing (``training.jobs.specdecpp_head``: the state producing q_i, the
label of Y_i).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from policies.base import Decision, DraftPolicy, DraftStep, RequestContext
from policies.runtime_inputs import RUNTIME_INPUT
from policies.step_features import require_feature


def stable_sigmoid(logit: float) -> float:
    """Return 1 / (1 + e^−x) without overflowing for large |x|."""
    if logit >= 0:
        return 1.0 / (1.0 + math.exp(-logit))
    exp_logit = math.exp(logit)
    return exp_logit / (1.0 + exp_logit)


@dataclass
class SpecDecPPPolicy(DraftPolicy):
    """Keep candidate i, then stop when 1 − Π_{j≤i} sigmoid(f(e_j)) > h (h = 0.7, the paper's best).

    f is the trained acceptance head given the draft's last hidden state e_i (``head``), or,
    without one, the constant logit ``constant_logit`` (for tests and ablations); with neither,
    ``decide`` raises. The product restarts at the first candidate of each round. The round cap
    is min(max draft length, ``length_cap``) with SpecDec++'s hard cap of 20.
    """

    name: ClassVar[str] = "specdecpp"

    threshold: float = 0.7
    length_cap: int = 20
    constant_logit: float | None = None
    head: Callable[[Any], float] | None = field(
        default=None, repr=False, compare=False, metadata=RUNTIME_INPUT
    )
    _acceptance_product: float = field(init=False, repr=False, default=1.0)

    @property
    def features(self) -> frozenset[str]:  # type: ignore[override]
        """Return {"hidden"} when a head is to be evaluated, nothing for a constant logit."""
        if self.head is None and self.constant_logit is not None:
            return frozenset()
        return frozenset({"hidden"})

    @property
    def acceptance_product(self) -> float:
        """Return Π sigmoid(f(e_j)) over this round's candidates seen so far."""
        return self._acceptance_product

    def round_cap(self) -> int:
        """Return min(max draft length, SpecDec++'s length cap)."""
        return min(self.max_draft_len, self.length_cap)

    def head_logit(self, step: DraftStep) -> float:
        """Return f(e_i) for this candidate from the head, or the constant logit."""
        if self.head is not None:
            return float(self.head(require_feature(step, "hidden", self.name)))
        if self.constant_logit is not None:
            return float(self.constant_logit)
        raise ValueError(
            "specdecpp needs a trained acceptance head: pass head=<callable(hidden) -> logit> "
            "to make_policy, or constant_logit=<float> for a head-free run"
        )

    def decide(self, step: DraftStep) -> Decision:
        """Keep the candidate; stop after it once the predicted chance of a rejection exceeds h."""
        if step.index == 1:
            self._acceptance_product = 1.0
        self._acceptance_product *= stable_sigmoid(self.head_logit(step))
        if 1.0 - self._acceptance_product > self.threshold:
            return Decision.KEEP_STOP
        return Decision.KEEP_CONTINUE

    def _reset_state(self, context: RequestContext) -> None:
        self._acceptance_product = 1.0
