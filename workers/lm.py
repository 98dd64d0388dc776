"""A causal LM with its own KV cache: forward new tokens, crop back to an accepted prefix.

Works with Hugging Face decoder-only models that expose ``get_decoder()`` and
``get_output_embeddings()`` (Llama, Mistral, Qwen, GPT-NeoX/Pythia, ...). The decoder and the
LM head are called separately so that only the rows that are needed go through the head and the
last-layer hidden states come for free (trained acceptance heads read them). Plain Llama models
run their decoder through ``workers.llama_fast`` (same computation, without transformers'
per-call bookkeeping); every other model, and any model with ``fast=False``, through the
transformers forward with a ``DynamicCache``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from workers.llama_fast import LlamaFastDecoder, block_linear, unsupported_reason

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class StepOutput:
    """Logits [n, V] (and last-layer hidden states [n, d]) for the rows that were asked for."""

    logits: torch.Tensor
    hidden: torch.Tensor


def load_causal_lm(
    path: str | Path,
    dtype: str = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """Load a causal LM from a local directory or hub id, safetensors only, in eval mode.

    ``trust_remote_code`` stays off unless a sweep asks for it explicitly.
    """
    model = AutoModelForCausalLM.from_pretrained(
        str(path),
        dtype=DTYPES[dtype],
        use_safetensors=True,
        trust_remote_code=trust_remote_code,
    )
    return model.to(device).eval()


class CachedLM:
    """One model plus one KV cache for batch-1 decoding.

    ``fast`` (default) takes the plain-torch Llama path when the model qualifies;
    ``fast_path`` says whether it did.
    """

    def __init__(self, model: PreTrainedModel, fast: bool = True) -> None:
        self.model = model
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.device = next(model.parameters()).device
        use_fast = fast and unsupported_reason(model) is None
        self.fast_decoder = LlamaFastDecoder(model) if use_fast else None
        self.cache = None if use_fast else DynamicCache(config=model.config)

    @property
    def fast_path(self) -> bool:
        """True when the decoder runs through ``workers.llama_fast``."""
        return self.fast_decoder is not None

    @property
    def cached_len(self) -> int:
        """Number of tokens whose keys and values are in the cache."""
        if self.fast_decoder is not None:
            return self.fast_decoder.length
        return self.cache.get_seq_length()

    def reset(self) -> None:
        """Drop the cache (start of a new request)."""
        if self.fast_decoder is not None:
            self.fast_decoder.reset()
        else:
            self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, last_only: bool = False) -> StepOutput:
        """Run ``ids`` [n] after the cached prefix, append them to the cache, return outputs.

        With ``last_only`` only the last position goes through the LM head. Raises
        ValueError for an empty ``ids`` (e.g. a prompt that tokenised to nothing).
        """
        ids = ids.view(-1).to(self.device)
        if ids.numel() == 0:
            raise ValueError("the model was given no tokens to run (an empty prompt?)")
        if self.fast_decoder is not None:
            hidden = self.fast_decoder.forward(ids)
            hidden = hidden[-1:] if last_only else hidden
            return StepOutput(logits=block_linear(hidden, self.head.weight).float(), hidden=hidden)
        out = self.decoder(input_ids=ids[None], past_key_values=self.cache, use_cache=True)
        hidden = out.last_hidden_state[0]
        if last_only:
            hidden = hidden[-1:]
        return StepOutput(logits=self.head(hidden).float(), hidden=hidden)

    def crop(self, length: int) -> None:
        """Roll the cache back so that it holds only the first ``length`` tokens."""
        if self.fast_decoder is not None:
            self.fast_decoder.crop(length)
            return
        excess = self.cached_len - length
        if excess > 0:
            self.cache.crop(-excess)

    @torch.inference_mode()
    def full_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Return logits [n, V] of a from-scratch forward of ``ids`` (no cache involved)."""
        out = self.decoder(input_ids=ids.view(1, -1).to(self.device), use_cache=False)
        return self.head(out.last_hidden_state[0]).float()
