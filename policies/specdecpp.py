"""SpecDec++: stop when the predicted chance that some candidate so far is rejected exceeds h.

Eq. (3.1): the draft reads (x_prefix, Y_1, ..., Y_i), and its final embedding e_i, the
last-layer hidden state at the token Y_i itself, gives P̂(Y_i accepted | Y_1..Y_{i−1} accepted)
= sigmoid(f(e_i)). Algorithm 2, per round: p̂ = 1; for i = 1, 2, ...: sample Y_i ~ q_i; if
i >= 2, p̂ ← p̂·sigmoid(f(e_{i−1})); break if 1 − p̂ > h, keeping Y_i. There is no factor at
i = 1 (e_0 is never computed): the product at step i covers Y_1 ... Y_{i−1}, and e_{i−1} comes
from the same draft forward that produced q_i (the authors' code reads the head there and sets
the factor of its first step to 1). So every round drafts at least one token, and two whenever
the cap allows and h >= 0.

In the engine's protocol (``policies.base``) candidate i's ``DraftStep.hidden`` is the draft's
last-layer state that produced q_i: for i >= 2 the state after feeding Y_{i−1}, i.e. e_{i−1},
exactly what step i multiplies in; for i = 1 the state of the context's last token, which the
policy ignores. Each candidate is kept, with KEEP_STOP once 1 − p̂ > h, so the stop also skips
the draft forward that would produce q_{i+1}. With a constant sigmoid s the round drafts the
smallest i with 1 − s^{i−1} > h. The head is trained on the paper's pairing
(``training.jobs.specdecpp_head``: e_k, the state that has read Y_k, with the label of Y_k).
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
    """Keep candidate i, then stop when 1 − Π_{j<i} sigmoid(f(e_j)) > h (h = 0.7, the paper's best).

    f is the trained acceptance head given a draft hidden state (``head``), or, without one,
    the constant logit ``constant_logit`` (for tests and ablations); with neither, ``decide``
    raises. The product restarts at the first candidate of each round, which contributes no
    factor; candidate i >= 2 multiplies in f of the state it carries, e_{i−1}. The round cap
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
        """Return p̂ = Π_{j<i} sigmoid(f(e_j)) at the last candidate i of this round seen."""
        return self._acceptance_product

    def round_cap(self) -> int:
        """Return min(max draft length, SpecDec++'s length cap)."""
        return min(self.max_draft_len, self.length_cap)

    def head_logit(self, step: DraftStep) -> float:
        """Return f of the state ``step`` carries, from the head or the constant logit."""
        self._check_head()
        if self.head is not None:
            return float(self.head(require_feature(step, "hidden", self.name)))
        return float(self.constant_logit)

    def _check_head(self) -> None:
        """Raise ValueError when neither a head nor a constant logit was given."""
        if self.head is None and self.constant_logit is None:
            raise ValueError(
                "specdecpp needs a trained acceptance head: pass head=<callable(hidden) -> logit> "
                "to make_policy, or constant_logit=<float> for a head-free run"
            )

    def decide(self, step: DraftStep) -> Decision:
        """Keep the candidate; stop after it once the predicted chance of a rejection exceeds h.

        At candidate 1 p̂ restarts at 1 (no factor); at candidate i >= 2 it takes the factor of
        e_{i−1}, the state the engine shows for candidate i.
        """
        if step.index == 1:
            self._check_head()
            self._acceptance_product = 1.0
        else:
            self._acceptance_product *= stable_sigmoid(self.head_logit(step))
        if 1.0 - self._acceptance_product > self.threshold:
            return Decision.KEEP_STOP
        return Decision.KEEP_CONTINUE

    def _reset_state(self, context: RequestContext) -> None:
        self._acceptance_product = 1.0
