"""A stateful EAGLE proposer: drafts in feature space, re-anchored on the target's true features.

Positions: the target's feature f_t (its last hidden state after the final norm at sequence
index t) produced the distribution of token t + 1. The head reads pairs (f_t, x_{t+1}) and
predicts f_{t+1}, whose logits give token t + 2.

One request: ``begin`` with the prompt x_0..x_{P-1} and the target's features of its first
P − 1 tokens (what the target's prefill computes: the last prompt token is the pending token it
has not run yet) caches the pairs (f_t, x_{t+1}), t < P − 1; the last of them predicts f̂_{P-1}.
Then every round:

* ``propose`` K times: step 1 reads the logits of the last prediction; step i > 1 first runs
  the pair (f̂, d_{i−1}) of the previous predicted feature and drafted token;
* the target verifies [pending, d_1..d_K] and returns n accepted, the next token b and its
  features at the n + 1 kept positions (pending, d_1..d_n);
* ``accept(n, b, features)`` drops every cached position whose input was a predicted feature
  and runs the pairs of the true features with the tokens d_1..d_n, b in one block: the last
  predicts the feature of b's position, from which the next round's first draft comes.

The head's cost per round is K forwards: K − 1 one-pair steps and one (n + 1)-pair block.

A head fusing several target layers (``feature_layers``, EAGLE-3 style) is sent those layers'
states (k·d per position, in ``begin`` and ``accept``) and maps them to f_t with its
``layers_fc`` before the pairs run; its step i > 1 reads its own f̂ (d wide) as above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.eagle.head import EagleHead
from workers.eagle.step import EagleStep
from workers.records import SamplingConfig
from workers.sampling import sample_token, warp_probs


@dataclass(frozen=True)
class EagleProposal:
    """One drafted token: ``token``, the distribution q [V] it was drawn from (warped as the
    target warps; one-hot when greedy), the raw full-width ``logits`` [V] and the predicted
    feature [d] they came from."""

    token: int
    probs: torch.Tensor
    logits: torch.Tensor
    feature: torch.Tensor


class EagleDrafter:
    """The drafter of one ``EagleHead`` (see the module docstring for the protocol).

    ``drafted`` lists this round's proposed tokens; ``cached_len`` the positions the head's
    cache holds from true features.
    """

    def __init__(self, head: EagleHead, prepack: bool = True) -> None:
        self.step = EagleStep(head, prepack)
        self.drafted: list[int] = []
        self.cached_len = 0
        self._feature: torch.Tensor | None = None
        self._device = head.embed.device

    @property
    def hidden_size(self) -> int:
        """The feature width the target must send: d, or k·d for a head fusing k layers."""
        return self.step.head.config.feature_width

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target layers whose states the target must send (empty: its last layer's)."""
        return self.step.head.config.feature_layers

    def begin(self, prompt_ids: torch.Tensor, prompt_features: torch.Tensor) -> None:
        """Start a request from the prompt [P] and the target's features [P − 1, d] of all but
        its last token (a one-token prompt has none: a zero feature stands in)."""
        ids = prompt_ids.view(-1).to(self._device)
        features = prompt_features.reshape(-1, self.hidden_size).to(self._device)
        if features.shape[0] != ids.numel() - 1:
            raise ValueError(
                f"begin needs the features of all but the last prompt token: "
                f"{ids.numel() - 1} rows for a {ids.numel()}-token prompt, got {features.shape[0]}"
            )
        if ids.numel() == 1:
            tokens, features = ids, features.new_zeros(1, self.hidden_size)
        else:
            tokens = ids[1:]
        self.step.reset()
        self.drafted = []
        self.cached_len = 0
        self._commit(features, tokens)

    def propose(
        self, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> EagleProposal:
        """Draft the round's next token: the argmax when ``sampling`` is greedy, else a draw
        from the warped q with ``generator``."""
        if self._feature is None:
            raise RuntimeError("propose before begin: start the request with begin()")
        if self.drafted:
            last = torch.tensor([self.drafted[-1]], device=self._device)
            self._feature = self.step.forward(self._feature[None], last)[0]
        logits = self.step.logits(self._feature[None])[0]
        probs = warp_probs(logits, sampling)
        if sampling.greedy:
            token = int(logits.argmax())
        else:
            if generator is None:
                raise ValueError("sampling needs a generator")
            token = int(sample_token(probs.to(generator.device), generator))
        self.drafted.append(token)
        return EagleProposal(token, probs, logits, self._feature)

    def accept(self, n_accepted: int, next_token: int, features: torch.Tensor) -> None:
        """Take the round's verdict: ``n_accepted`` of ``drafted`` were kept, the target chose
        ``next_token``, and ``features`` [n_accepted + 1, d] are its true features at the kept
        positions (the pending token's and the accepted drafts'). Predicted features are
        dropped from the cache and the true ones run in their place."""
        if not 0 <= n_accepted <= len(self.drafted):
            raise ValueError(f"n_accepted {n_accepted} outside 0..{len(self.drafted)} drafted")
        rows = features.reshape(-1, self.hidden_size).to(self._device)
        if rows.shape[0] != n_accepted + 1:
            raise ValueError(
                f"accept needs the features of the {n_accepted + 1} kept positions, "
                f"got {rows.shape[0]}"
            )
        tokens = torch.tensor([*self.drafted[:n_accepted], next_token], device=self._device)
        self.step.crop(self.cached_len)
        self.drafted = []
        self._commit(rows, tokens)

    def _commit(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        """Run pairs of true features and tokens after the cache; keep the last prediction."""
        predicted = self.step.forward(self.step.project(features), tokens)
        self.cached_len = self.step.length
        self._feature = predicted[-1]
