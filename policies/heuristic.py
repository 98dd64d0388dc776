"""transformers' "heuristic" assistant-token schedule as a draft-length policy.

transformers' ``AssistedCandidateGenerator``: each round drafts ``num_assistant_tokens`` = K
tokens; after verification K += 2 if every candidate was accepted, else K = max(1, K − 1). With
``"heuristic"`` K carries over to the next request, with ``"heuristic_transient"`` it restarts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from policies.base import Decision, DraftPolicy, DraftStep, RequestContext, RoundOutcome


def next_heuristic_draft_len(draft_len: int, outcome: RoundOutcome) -> int:
    """Return the next round's K: K + 2 if every drafted token was accepted, else max(1, K − 1).

    Mirrors ``AssistedCandidateGenerator.update_candidate_strategy`` in transformers
    (``num_matches == number of candidates`` → +2, otherwise −1 floored at 1). As there, K itself
    is not bounded above (the round length is bounded by ``round_cap``), and a round with no
    candidates (the engine cut the last round of a request to zero) counts as fully accepted.
    """
    if outcome.n_accepted == outcome.n_drafted:
        return draft_len + 2
    return max(1, draft_len - 1)


@dataclass
class HFHeuristicPolicy(DraftPolicy):
    """Draft K tokens per round, K following transformers' heuristic schedule from K = 5.

    ``round_cap()`` is min(K, max draft length); every candidate within it is kept.
    ``persist_across_requests=False`` (default) restarts K at ``initial_draft_len`` for each
    request, like transformers' ``"heuristic_transient"``; True keeps K across requests like
    ``"heuristic"``. The start K = 5 is the docs/methods.md value (the older transformers default;
    transformers 5.x defaults ``num_assistant_tokens`` to 20).
    """

    name: ClassVar[str] = "hf_heuristic"
    keeps_every_candidate: ClassVar[bool] = True

    initial_draft_len: int = 5
    persist_across_requests: bool = False
    _draft_len: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.initial_draft_len < 1:
            raise ValueError(
                f"hf_heuristic initial_draft_len must be >= 1, got {self.initial_draft_len}"
            )
        self._draft_len = self.initial_draft_len

    @property
    def draft_len(self) -> int:
        """Return the schedule's current K (before the max-draft-length cap)."""
        return self._draft_len

    def round_cap(self) -> int:
        """Return min(K, max draft length)."""
        return min(self._draft_len, self.max_draft_len)

    def decide(self, step: DraftStep) -> Decision:
        """Return KEEP_CONTINUE: the schedule acts only through ``round_cap``."""
        return Decision.KEEP_CONTINUE

    def _reset_state(self, context: RequestContext) -> None:
        if not self.persist_across_requests:
            self._draft_len = self.initial_draft_len

    def update(self, outcome: RoundOutcome) -> None:
        """Grow or shrink K from the verified round."""
        self._draft_len = next_heuristic_draft_len(self._draft_len, outcome)
