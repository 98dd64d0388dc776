"""SVIP: stop when sqrt(H(q_i)) exceeds h; draft length capped at 40."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from policies.base import DraftPolicy, DraftStep
from policies.step_features import require_feature


@dataclass
class SVIPPolicy(DraftPolicy):
    """Stop before candidate i when sqrt(H(q_i)) > ``threshold`` (h).

    h = 0.4 is the paper's Pythia setting (0.3 for Qwen and LLaMA-3, 0.5 for GliDe). The round
    cap is min(max draft length, ``length_cap``); SVIP's own cap is 40.
    """

    name: ClassVar[str] = "svip"
    features: ClassVar[frozenset[str]] = frozenset({"entropy"})

    threshold: float = 0.4
    length_cap: int = 40

    def round_cap(self) -> int:
        """Return min(max draft length, SVIP's length cap)."""
        return min(self.max_draft_len, self.length_cap)

    def propose(self, step: DraftStep) -> bool:
        """Return True unless sqrt of the candidate's draft entropy exceeds h."""
        entropy = float(require_feature(step, "entropy", self.name))
        return math.sqrt(max(entropy, 0.0)) <= self.threshold
