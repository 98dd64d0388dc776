"""AdaEDL: stop when the entropy lower bound on acceptance, 1 − sqrt(γ·H(q_i)), falls below λ.

AdaEDL's drafting loop, per round: for i = 1..L, the draft computes q_i; if
1 − sqrt(γ·H(q_i)) < λ, stop drafting (token i is not drafted); else draw y_i from q_i and
continue. After verification λ moves by the dynamic rule (``policies.dynamic_threshold``). The
decision is taken before token i, so in the engine's protocol (``policies.base``) a stop is
STOP_BEFORE, and a round may draft nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from policies.base import DraftStep
from policies.dynamic_threshold import ThresholdPolicy
from policies.step_features import require_feature


def entropy_acceptance_bound(entropy: float, gamma: float) -> float:
    """Return AdaEDL's lower-bound estimate 1 − sqrt(γ·H) of the candidate's acceptance chance.

    Negative entropies (float round-off) are treated as 0.
    """
    return 1.0 - math.sqrt(gamma * max(entropy, 0.0))


@dataclass
class AdaEDLPolicy(ThresholdPolicy):
    """Stop before candidate i when 1 − sqrt(γ·H(q_i)) < λ (γ = 0.2, dynamic λ by default).

    Initial λ = 0.5: the bound is an estimate of the acceptance probability, so 0.5 stops once a
    candidate is estimated more likely rejected than accepted (H > 1.25 nats at γ = 0.2); it is
    also the initial threshold of the Draft & Verify controller that AdaEDL adopts. The paper
    reports results sensitive to the initial λ, so sweep it.
    """

    name: ClassVar[str] = "adaedl"
    features: ClassVar[frozenset[str]] = frozenset({"entropy"})

    dynamic: bool = True
    gamma: float = 0.2

    def __post_init__(self) -> None:
        if self.gamma < 0:
            raise ValueError(f"adaedl gamma must be >= 0, got {self.gamma}")
        super().__post_init__()

    def acceptance_score(self, step: DraftStep) -> float:
        """Return 1 − sqrt(γ·H) for this candidate's draft distribution."""
        entropy = float(require_feature(step, "entropy", self.name))
        return entropy_acceptance_bound(entropy, self.gamma)
