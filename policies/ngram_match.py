"""N-gram match: draft as many lookup proposals as the match's length vouches for.

A prompt-lookup draft (``workers.proposers.ngram``) proposes the continuation of the most
recent earlier occurrence of the sequence's end; ``match_length`` counts how many tokens that
occurrence and the end agree on. A long match (a passage being copied) is likely to go on, a
one-token match is a guess. This policy keeps candidate i while i <= ratio × match_length
(at least ``min_draft`` candidates), within the round cap K; the lookup itself ends the round
where the matched continuation ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from policies.base import Decision, DraftPolicy, DraftStep
from policies.step_features import require_feature


@dataclass
class NgramMatchPolicy(DraftPolicy):
    """Stop before candidate i when i > max(min_draft, ratio × match_length)."""

    name: ClassVar[str] = "ngram_match"
    features: ClassVar[frozenset[str]] = frozenset({"match_length"})

    ratio: float = 1.0
    min_draft: int = 1

    def decide(self, step: DraftStep) -> Decision:
        """Keep the candidate while the match length allows it."""
        match_length = int(require_feature(step, "match_length", self.name))
        allowed = max(self.min_draft, self.ratio * match_length)
        return Decision.KEEP_CONTINUE if step.index <= allowed else Decision.STOP_BEFORE
