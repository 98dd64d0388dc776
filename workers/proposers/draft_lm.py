"""The ``lm`` draft kind: an independent draft language model on the ``CachedLM`` path."""

from __future__ import annotations

from typing import ClassVar

import torch

from workers.lm import CachedLM, StepOutput
from workers.proposers.base import COMMON_FEATURES, Candidate
from workers.records import SamplingConfig
from workers.sampling import entropy, feature_probs, sample_token, warp_probs


class DraftLMProposer:
    """Propose by running the draft model one token at a time on its KV cache.

    ``first`` forwards the emitted tokens the draft has not run yet (the last one is the
    target's pending token) and samples from the last row; ``next`` forwards the kept candidate.
    """

    kind: ClassVar[str] = "lm"
    features: ClassVar[frozenset[str]] = COMMON_FEATURES | {"hidden"}
    wants_target_features: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    step_cost: ClassVar[int] = 1

    def __init__(self, lm: CachedLM) -> None:
        self.lm = lm

    def begin(self, prompt: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """Reset the draft's cache and run the prompt up to its last token (``features``
        unused: this kind reads no target features)."""
        self.lm.reset()
        if prompt.numel() > 1:
            self.lm.forward(prompt[:-1].to(self.lm.device), last_only=True)

    def first(
        self,
        sequence: list[int],
        sampling: SamplingConfig,
        generator: torch.Generator,
        wanted: frozenset[str],
    ) -> Candidate:
        """Forward the tokens emitted since the draft last ran; propose from the last row."""
        pending = torch.tensor(
            sequence[self.lm.cached_len :], dtype=torch.long, device=self.lm.device
        )
        step = self.lm.forward(pending, last_only=True)
        return self._candidate(step, sampling, generator, wanted)

    def next(
        self,
        previous: Candidate,
        sampling: SamplingConfig,
        generator: torch.Generator,
        wanted: frozenset[str],
    ) -> Candidate:
        """Forward the kept candidate; propose from its row."""
        step = self.lm.forward(previous.token, last_only=True)
        return self._candidate(step, sampling, generator, wanted)

    def rollback(self, length: int) -> None:
        """Crop the draft's cache to ``length`` tokens (a no-op when it holds no more)."""
        self.lm.crop(length)

    def observe(self, n_accepted: int, next_token: int, features: torch.Tensor | None) -> None:
        """Nothing to take: the next ``first`` runs the emitted tokens."""

    @staticmethod
    def _candidate(
        step: StepOutput, sampling: SamplingConfig, generator: torch.Generator, wanted: frozenset
    ) -> Candidate:
        """Draw the candidate from one row of logits (argmax when greedy)."""
        # One row of logits (last_only); the token stays a [1] tensor, the next step's input.
        if sampling.greedy:
            token, probs = step.logits.argmax(dim=-1), None
        else:
            probs = warp_probs(step.logits[0], sampling)
            token = sample_token(probs.cpu(), generator).to(step.logits.device).view(1)
        entropy_value = max_prob = None
        if "entropy" in wanted or "max_prob" in wanted:
            shown = probs if probs is not None else feature_probs(step.logits[0], sampling)
            entropy_value, max_prob = float(entropy(shown)), float(shown.max())
        hidden = step.hidden[-1] if "hidden" in wanted else None
        return Candidate(token, probs, False, entropy_value, max_prob, hidden)
