"""The greedy oracle: draft exactly the candidates the target's greedy decoding would emit.

Per round: for i = 1..L, if the draft's greedy token y_i equals the target's greedy token at its
output position, keep it and continue; else stop before it (STOP_BEFORE in ``policies.base``).
The round then holds no rejected token, and the target verifies once per disagreement, plus once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from policies.base import Decision, DraftPolicy, DraftStep, RequestContext
from policies.step_features import require_feature


@dataclass
class GreedyOraclePolicy(DraftPolicy):
    """Propose while the candidate equals the target's greedy token at its output position.

    An upper bound for greedy decoding only: it never proposes a token the target rejects, so it
    discards nothing and verifies |disagreements| + 1 times. It stops at the first mismatch and
    past the end of the reference continuation.
    """

    name: ClassVar[str] = "oracle"
    features: ClassVar[frozenset[str]] = frozenset({"token"})
    needs_reference: ClassVar[bool] = True
    greedy_only: ClassVar[bool] = True

    _reference: tuple[int, ...] = field(init=False, repr=False, default=())

    def _reset_state(self, context: RequestContext) -> None:
        if context.reference is None:
            raise ValueError(
                "the oracle policy needs RequestContext.reference (the target's greedy "
                "continuation); the engine computes it for policies with needs_reference"
            )
        self._reference = tuple(context.reference)

    def decide(self, step: DraftStep) -> Decision:
        """Keep the candidate while it equals the reference token at its position, else stop."""
        token = require_feature(step, "token", self.name)
        if step.position < len(self._reference) and token == self._reference[step.position]:
            return Decision.KEEP_CONTINUE
        return Decision.STOP_BEFORE
