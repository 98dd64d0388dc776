"""Max-confidence: stop when the draft's top probability max_x q_i(x) falls below λ.

Draft & Verify's rule, as the AdaEDL paper runs it: for i = 1..L, the draft computes q_i; if
max_x q_i(x) < λ, stop drafting (token i is not drafted: STOP_BEFORE in ``policies.base``);
else draw y_i and continue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from policies.base import DraftStep
from policies.dynamic_threshold import ThresholdPolicy
from policies.step_features import require_feature


@dataclass
class MaxConfidencePolicy(ThresholdPolicy):
    """Stop before candidate i when max_x q_i(x) < λ.

    Fixed λ by default; ``dynamic=True`` gives the AdaEDL paper's "Max-Conf" baseline, whose λ
    follows the dynamic rule of ``policies.dynamic_threshold``. The default λ = 0.5 is the
    initial threshold of Draft & Verify, where this rule comes from; sweep it.
    """

    name: ClassVar[str] = "max_confidence"
    features: ClassVar[frozenset[str]] = frozenset({"max_prob"})

    def acceptance_score(self, step: DraftStep) -> float:
        """Return the draft's top probability for this candidate."""
        return float(require_feature(step, "max_prob", self.name))
