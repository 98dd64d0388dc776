"""The target side of the round protocol: prefill, then score a drafted block and roll back.

``LocalTarget`` holds a :class:`CachedLM` and its own random generator; the Ray target actor
wraps one and only moves its requests and responses. The target's cache always holds the
sequence minus the tokens it has not seen yet (``pending``: the last emitted token, which the
draft side may have sampled).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from workers.lm import CachedLM
from workers.records import (
    GenerationResult,
    RequestSettings,
    RoundRecord,
    SamplingConfig,
    truncate_at_eos,
)
from workers.sampling import warp_probs
from workers.verification import Verdict, verify_greedy, verify_sampling


@dataclass(frozen=True)
class VerifyRequest:
    """One round's payload to the target: the tokens it scores in one forward, O(K).

    ``tokens`` [1 + K] is the pending token (the last emitted one, which the target has not
    processed yet) followed by the drafted block; ``draft_token_probs`` [K] holds q_i(y_i) of
    the drafted tokens (sampling only). ``want_hidden`` asks for the last-layer hidden state
    at the position that produced the next token (Cali-TS); ``want_features`` for those at every
    kept position, O((K + 1)·d) (an EAGLE head), or, with ``feature_layers``, the states after
    those decoder layers, O((K + 1)·k·d) (an EAGLE head fusing k layers).
    """

    tokens: torch.Tensor
    draft_token_probs: torch.Tensor | None = None
    want_hidden: bool = False
    want_features: bool = False
    feature_layers: tuple[int, ...] = ()

    @property
    def draft_tokens(self) -> torch.Tensor:
        """The drafted block [K] (``tokens`` after the pending token)."""
        return self.tokens[1:]

    def __reduce__(self):
        """Pickle the few ids and probabilities as lists: a round sends one request to the
        target actor, and pickling a small tensor costs about 100 times more than its list."""
        probs = self.draft_token_probs
        if probs is not None:
            probs = (probs.tolist(), str(probs.dtype).removeprefix("torch."))
        flags = (self.want_hidden, self.want_features, self.feature_layers)
        return (_verify_request, (self.tokens.tolist(), probs, *flags))


def _verify_request(
    tokens: list[int],
    probs: tuple[list[float], str] | None,
    want_hidden: bool,
    want_features: bool = False,
    feature_layers: tuple[int, ...] = (),
) -> VerifyRequest:
    """Rebuild a pickled :class:`VerifyRequest` (the inverse of its ``__reduce__``)."""
    return VerifyRequest(
        tokens=torch.tensor(tokens, dtype=torch.long),
        draft_token_probs=None
        if probs is None
        else torch.tensor(probs[0], dtype=getattr(torch, probs[1])),
        want_hidden=want_hidden,
        want_features=want_features,
        feature_layers=feature_layers,
    )


@dataclass(frozen=True)
class VerifyResponse:
    """The target's answer: accepted count, and the next token or the rejected row.

    ``hidden`` is the target's last-layer hidden state at the position that produced the next
    token (for Cali-TS), when asked for. ``features`` [n_accepted + 1, d] are the last-layer
    hidden states at the kept positions (the pending token and the accepted drafts; the last
    produced the next token), when ``want_features`` asked for them (an EAGLE drafter's
    ``accept`` takes them); [n_accepted + 1, k·d], the states after the request's
    ``feature_layers``, when it named k of them.
    """

    n_accepted: int
    next_token: int | None
    rejected_row: torch.Tensor | None
    hidden: torch.Tensor | None
    features: torch.Tensor | None = None


@dataclass(frozen=True)
class _Scored:
    """One judged block on the target side: the verdict, the hidden state and features the
    request asked for, and (greedy) the target's argmax tokens [K+1] at the judged positions."""

    verdict: Verdict
    hidden: torch.Tensor | None
    choices: torch.Tensor | None
    features: torch.Tensor | None = None


class LocalTarget:
    """Target-side logic of speculative decoding and of the autoregressive baseline.

    ``prefill`` and ``verify`` serve a draft side (one call per round); ``generate`` runs the
    target-only baseline's whole token loop here, next to the model.
    """

    def __init__(self, lm: CachedLM) -> None:
        if lm.vocab_kept is not None:
            raise ValueError(
                f"a target must score its whole vocabulary, but this model's config restricts "
                f"its head to {lm.vocab_kept} tokens (draft_vocab): use it as a draft, or remove "
                "draft_vocab from its config.json"
            )
        self.lm = lm
        self.sampling = SamplingConfig()
        self.generator = torch.Generator(device="cpu")

    def prefill(
        self,
        prompt_ids: torch.Tensor,
        sampling: SamplingConfig,
        seed: int,
        want_features: bool = False,
        feature_layers: tuple[int, ...] = (),
    ) -> torch.Tensor | None:
        """Start a request: reset the cache, process all but the last prompt token, reseed.

        With ``want_features`` return the last-layer hidden states [P − 1, d] of the tokens it
        processed (an EAGLE drafter's ``begin`` takes them), or the states after the decoder
        layers ``feature_layers`` [P − 1, k·d] when it names k of them; else None.
        """
        self.sampling = sampling
        self.generator.manual_seed(side_seed(seed, "target"))
        self.lm.reset()
        if prompt_ids.numel() <= 1:
            return prompt_ids.new_zeros(0) if want_features else None
        layers = feature_layers if want_features else ()
        out = self.lm.forward(prompt_ids[:-1], True, all_hidden=want_features, layers=layers)
        if not want_features:
            return None
        return out.layers if layers else out.hidden

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        """Score pending + drafted tokens in one forward, judge the block, roll the cache back.

        Callers run it under ``torch.inference_mode`` (``speculative_generate`` does, and so do
        the target actor's calls): entering it again on every round cost about 8 µs of the
        engine's time with instant stand-in models.
        """
        scored = self._score(request)
        return VerifyResponse(
            n_accepted=scored.verdict.n_accepted,
            next_token=scored.verdict.next_token,
            rejected_row=scored.verdict.rejected_row,
            hidden=scored.hidden,
            features=scored.features,
        )

    def _score(self, request: VerifyRequest) -> _Scored:
        """Run ``verify``'s forward, judgement and rollback; return the verdict and what the
        response and the AR loop need from them."""
        base_len = self.lm.cached_len + 1
        layers = request.feature_layers if request.want_features else ()
        out = self.lm.forward(request.tokens, layers=layers)
        choices = None
        if self.sampling.greedy:
            choices = out.logits.argmax(dim=-1)
            # An AR step's tokens are the previous argmax, on the model's device: no copy.
            drafted = request.tokens.tolist()[1:] if request.tokens.numel() > 1 else []
            verdict = verify_greedy(drafted, choices)
        else:
            # The K+1 warped rows move to the CPU, where the seeded generator draws (the same
            # stream on every device) and the rejected row is sent back from.
            verdict = verify_sampling(
                request.draft_tokens.cpu(),
                request.draft_token_probs.cpu(),
                warp_probs(out.logits, self.sampling).cpu(),
                self.generator,
            )
        self.lm.crop(base_len + verdict.n_accepted)
        hidden = out.hidden[verdict.n_accepted] if request.want_hidden else None
        features = None
        if request.want_features:
            features = (out.layers if layers else out.hidden)[: verdict.n_accepted + 1]
        return _Scored(verdict, hidden, choices, features)

    @torch.inference_mode()
    def generate(self, prompt_ids: torch.Tensor, settings: RequestSettings) -> GenerationResult:
        """Decode ``prompt_ids`` with the target alone: one record per generated token.

        Each step is a verification of an empty block (``_score``, as ``verify`` runs it),
        which gives the target's next token (argmax when greedy, a sample of the warped p
        otherwise), so the baseline runs the same target-side code as speculative decoding.
        Greedy, the argmax tensor itself is the next step's input (no new tensor per token).
        """
        sampling = settings.sampling
        start = _now()
        self.prefill(prompt_ids, sampling, settings.seed)
        prefilled = _now()
        pending = prompt_ids[-1:].to(torch.long)
        output: list[int] = []
        rounds: list[RoundRecord] = []
        empty_probs = None if sampling.greedy else torch.empty(0)
        stopped_on_eos = False
        while len(output) < sampling.max_new_tokens and not stopped_on_eos:
            step_start = _now()
            scored = self._score(VerifyRequest(pending, empty_probs))
            token = scored.verdict.next_token
            pending = scored.choices if scored.choices is not None else torch.tensor([token])
            output.append(token)
            rounds.append(RoundRecord(0, 0, False, 0, 0.0, _now() - step_start))
            output, stopped_on_eos = truncate_at_eos(output, settings.eos_token_id)
        return GenerationResult(
            prompt_ids=prompt_ids.tolist(),
            output_ids=output,
            rounds=rounds,
            seconds=(end := _now()) - start,
            stopped_on_eos=stopped_on_eos,
            prefill_seconds=prefilled - start,
            decode_seconds=end - prefilled,
        )


def side_seed(seed: int, side: str) -> int:
    """Return the seed of one side's generator, so draft and target streams never coincide."""
    return (seed * 1_000_003 + (1 if side == "target" else 2)) % (2**63)


def _now() -> float:
    """Return a monotonic clock reading in seconds."""
    return time.perf_counter()
