"""SVIP: after keeping a token, stop when sqrt(H) of the next position exceeds h; cap 40.

SVIP's Algorithm 1 (per round, j = 0): sample x_{n+j+1} ~ q(· | x_{≤n+j}) and j ← j + 1; compute
q(· | x_{≤n+j}), the draft distribution of the *next* position; break if
sqrt(H(q(· | x_{≤n+j}))) > h; repeat while j < L. So the first token is always drafted, and the
entropy that decides whether to draft token j + 1 is that of q_{j+1}, the distribution token
j + 1 is drawn from. In the engine's protocol (``policies.base``) that is: keep candidate 1
unconditionally; for candidate i >= 2, whose step carries H(q_i), stop before it when
sqrt(H(q_i)) > h, else keep it. The draft forward that produces q_i after y_{i-1} is the one
Algorithm 1 runs to compute the next-position entropy, so the cost is the paper's too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from policies.base import Decision, DraftPolicy, DraftStep
from policies.step_features import require_feature


@dataclass
class SVIPPolicy(DraftPolicy):
    """Always keep candidate 1; stop before candidate i >= 2 when sqrt(H(q_i)) > ``threshold``.

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

    def decide(self, step: DraftStep) -> Decision:
        """Keep the first candidate; later ones unless sqrt of their draft entropy exceeds h."""
        if step.index == 1:
            return Decision.KEEP_CONTINUE
        entropy = float(require_feature(step, "entropy", self.name))
        if math.sqrt(max(entropy, 0.0)) > self.threshold:
            return Decision.STOP_BEFORE
        return Decision.KEEP_CONTINUE
