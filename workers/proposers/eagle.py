"""The ``eagle`` draft kind: an EAGLE-style feature head over the target's hidden states.

The head (``workers.eagle``) drafts in the target's feature space: ``begin`` runs the prompt's
target features through it, ``first``/``next`` propose one token each from its predicted
features, and ``observe`` replaces this round's predicted features by the target's true ones at
the kept positions (``EagleDrafter.accept``), so the engine needs no ``rollback`` here.

A candidate's q is the head's warped distribution (full width; 0 outside a cut head
vocabulary), so exact sampling verification applies as for a draft model. Policy features:
``entropy`` and ``max_prob`` of q (of the raw softmax when greedy, as for a draft model) and
``hidden``, the head's predicted feature (the target's width, not a draft model's).

A head fusing several target layers (EAGLE-3 style) names them in ``feature_layers``; the engine
asks the target for those layers' states instead of its last layer's, and nothing else changes.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from workers.eagle.drafter import EagleDrafter, EagleProposal
from workers.eagle.head import EagleHead
from workers.proposers.base import COMMON_FEATURES, Candidate
from workers.records import SamplingConfig
from workers.sampling import entropy, feature_probs


class EagleProposer:
    """Propose with an ``EagleDrafter`` (module docstring); one head forward per candidate."""

    kind: ClassVar[str] = "eagle"
    features: ClassVar[frozenset[str]] = COMMON_FEATURES | {"hidden"}
    step_cost: ClassVar[int] = 1
    wants_target_features: ClassVar[bool] = True

    def __init__(self, head: EagleHead, prepack: bool = True) -> None:
        self.drafter = EagleDrafter(head, prepack=prepack)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target layers whose states the head reads (its drafter's; empty: EAGLE-1)."""
        return self.drafter.feature_layers

    def begin(self, prompt: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """Start a request from the prompt and the target's features of all but its last
        token; ValueError when the target sent none."""
        if features is None:
            raise ValueError(
                "an eagle draft needs the target's prompt features: prefill the target with "
                "want_features=True"
            )
        self.drafter.begin(prompt, features)

    def first(
        self,
        sequence: list[int],
        sampling: SamplingConfig,
        generator: torch.Generator,
        wanted: frozenset[str],
    ) -> Candidate:
        """Propose from the head's prediction after the last verified token (``sequence`` is
        already in the drafter's cache)."""
        return self._candidate(self.drafter.propose(sampling, generator), sampling, wanted)

    def next(
        self,
        previous: Candidate,
        sampling: SamplingConfig,
        generator: torch.Generator,
        wanted: frozenset[str],
    ) -> Candidate:
        """Run the head on the previous prediction and ``previous``; propose from it."""
        return self._candidate(self.drafter.propose(sampling, generator), sampling, wanted)

    def rollback(self, length: int) -> None:
        """Nothing here: ``observe`` drops the round's predicted features."""

    def observe(self, n_accepted: int, next_token: int, features: torch.Tensor | None) -> None:
        """Re-anchor the head on the target's true features at the kept positions."""
        if features is None:
            raise ValueError(
                "an eagle draft needs the target's features of every round: verify with "
                "want_features=True"
            )
        self.drafter.accept(n_accepted, next_token, features)

    def _candidate(
        self, proposal: EagleProposal, sampling: SamplingConfig, wanted: frozenset[str]
    ) -> Candidate:
        """Return the candidate of one proposal (its q only when sampling)."""
        token = torch.tensor([proposal.token], dtype=torch.long, device=proposal.probs.device)
        probs = None if sampling.greedy else proposal.probs
        entropy_value = max_prob = None
        if "entropy" in wanted or "max_prob" in wanted:
            shown = probs if probs is not None else feature_probs(proposal.logits, sampling)
            entropy_value, max_prob = float(entropy(shown)), float(shown.max())
        hidden = proposal.feature if "hidden" in wanted else None
        return Candidate(token, probs, False, entropy_value, max_prob, hidden)
