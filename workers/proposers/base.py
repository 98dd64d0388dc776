"""The proposer contract: what the engine's round loop asks a draft kind for.

A proposer yields the candidates of one round one at a time, each with the distribution it
came from, so every draft-length policy and exact sampling verification apply to every kind:

- ``first(sequence, ...)`` proposes the first candidate after ``sequence`` (the prompt and the
  output emitted so far; its last token is the target's pending one), or None when the kind
  has nothing to propose (the round is then a plain target step, still lossless);
- ``next(previous, ...)`` proposes the candidate after a kept ``previous``, or None;
- ``rollback(length)`` drops whatever the proposer holds past ``length`` tokens after the
  target's verdict (the draft LM's cache; nothing for a lookup);
- ``observe(n_accepted, next_token, features)`` hands it the verdict of every round with the
  target's features at the kept positions (None unless the kind ``wants_target_features``;
  the states after its ``feature_layers`` when it names any, else the last layer's).

A kind that ``wants_target_features`` (an EAGLE head) is begun with the target's features of
the prompt's processed tokens and observes each round's; the engine asks the target for them
only then, so the other kinds cost nothing more.

Kinds: ``lm`` (an independent draft language model, :mod:`workers.proposers.draft_lm`),
``ngram`` (prompt lookup, :mod:`workers.proposers.ngram`), ``eagle`` (an EAGLE-style feature
head drafting from the target's hidden states, :mod:`workers.proposers.eagle`).

A candidate's distribution is a dense row q (a model sampling) or a point mass at the token (a
deterministic proposal, ``Candidate.probs`` None with ``point_mass`` True): then q(x) = 1, the
target accepts with probability p(x), and after a rejection the residual is p with x removed,
renormalised (``workers.verification.point_mass_residual``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from workers.records import SamplingConfig


@dataclass(frozen=True)
class Candidate:
    """One proposed token and what it was proposed from.

    ``token`` is a [1] long tensor (on the proposer's device; the next draft step's input).
    ``probs`` is the warped draft row q when a model sampled the token, None otherwise (greedy,
    or a point mass when ``point_mass``). ``entropy``, ``max_prob``, ``hidden`` and
    ``match_length`` are the policy features the kind can show (None where not asked or not
    defined for the kind).
    """

    token: torch.Tensor
    probs: torch.Tensor | None = None
    point_mass: bool = False
    entropy: float | None = None
    max_prob: float | None = None
    hidden: Any | None = None
    match_length: int | None = None


class Proposer(Protocol):
    """A draft kind as the engine's round loop drives it (see the module docstring).

    ``kind`` names it (a sweep's ``draft.kind``); ``features`` are the ``DraftStep`` features
    it can fill in; ``step_cost`` is the draft forwards one ``first``/``next`` call makes;
    ``wants_target_features`` whether it reads the target's hidden states (``begin`` and
    ``observe`` then get them); ``feature_layers`` the decoder layers whose states it reads
    (empty: the last layer's after the final norm).
    """

    kind: ClassVar[str]
    features: ClassVar[frozenset[str]]
    step_cost: ClassVar[int]
    wants_target_features: ClassVar[bool]
    feature_layers: tuple[int, ...]

    def begin(self, prompt: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """Start a request on ``prompt`` (1-D CPU ids; its last token is not yet processed);
        ``features`` [P − 1, d]: the target's of the processed tokens, when wanted."""

    def first(
        self,
        sequence: list[int],
        sampling: SamplingConfig,
        generator: torch.Generator,
        wanted: frozenset[str],
    ) -> Candidate | None:
        """Propose the first candidate of a round after ``sequence``, or None."""

    def next(
        self,
        previous: Candidate,
        sampling: SamplingConfig,
        generator: torch.Generator,
        wanted: frozenset[str],
    ) -> Candidate | None:
        """Propose the candidate after the kept ``previous``, or None."""

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` tokens of whatever the proposer has processed."""

    def observe(self, n_accepted: int, next_token: int, features: torch.Tensor | None) -> None:
        """Take a round's verdict: ``n_accepted`` drafts kept, then ``next_token``;
        ``features`` [n_accepted + 1, d] the target's at the kept positions, when wanted."""


#: Features every kind fills in; the engine adds ``target_hidden`` itself.
COMMON_FEATURES = frozenset({"entropy", "max_prob", "token", "target_hidden"})


def check_features(proposer: Proposer, policy_name: str, wanted: frozenset[str]) -> None:
    """Raise ValueError when policy ``policy_name`` asks for a feature the kind cannot show."""
    missing = sorted(wanted - proposer.features)
    if missing:
        raise ValueError(
            f"policy {policy_name!r} needs the step feature(s) {', '.join(missing)}, which a "
            f"draft of kind {proposer.kind!r} does not provide; pick another policy or draft "
            f"kind (docs/methods.md, draft kinds)"
        )
