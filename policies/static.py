"""Static draft length K (Base-SPD / vanilla speculative decoding): draft K tokens every round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from policies.base import Decision, DraftPolicy, DraftStep


@dataclass
class StaticPolicy(DraftPolicy):
    """Keep every candidate; the round stops at ``round_cap()`` = the sweep's max draft length K."""

    name: ClassVar[str] = "static"
    keeps_every_candidate: ClassVar[bool] = True

    def decide(self, step: DraftStep) -> Decision:
        """Return KEEP_CONTINUE: a static policy never stops a round early."""
        return Decision.KEEP_CONTINUE
