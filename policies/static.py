"""Static draft length K (Base-SPD / vanilla speculative decoding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from policies.base import DraftPolicy, DraftStep


@dataclass
class StaticPolicy(DraftPolicy):
    """Always propose; the round stops at ``round_cap()`` = the sweep's max draft length K."""

    name: ClassVar[str] = "static"

    def propose(self, step: DraftStep) -> bool:
        """Return True: a static policy never stops a round early."""
        return True
