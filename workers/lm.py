"""A causal LM with its own KV cache: forward new tokens, crop back to an accepted prefix.

Works with Hugging Face decoder-only models that expose ``get_decoder()`` and
``get_output_embeddings()`` (Llama, Mistral, Qwen, GPT-NeoX/Pythia, ...). The decoder and the
LM head are called separately so that only the rows that are needed go through the head and the
last-layer hidden states come for free (trained acceptance heads read them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

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
    """One model plus one KV cache for batch-1 decoding."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)

    @property
    def cached_len(self) -> int:
        """Number of tokens whose keys and values are in the cache."""
        return self.cache.get_seq_length()

    def reset(self) -> None:
        """Drop the cache (start of a new request)."""
        self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, last_only: bool = False) -> StepOutput:
        """Run ``ids`` [n] after the cached prefix, append them to the cache, return outputs.

        With ``last_only`` only the last position goes through the LM head.
        """
        out = self.decoder(
            input_ids=ids.view(1, -1).to(self.device), past_key_values=self.cache, use_cache=True
        )
        hidden = out.last_hidden_state[0]
        if last_only:
            hidden = hidden[-1:]
        return StepOutput(logits=self.head(hidden).float(), hidden=hidden)

    def crop(self, length: int) -> None:
        """Roll the cache back so that it holds only the first ``length`` tokens."""
        excess = self.cached_len - length
        if excess > 0:
            self.cache.crop(-excess)

    @torch.inference_mode()
    def full_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Return logits [n, V] of a from-scratch forward of ``ids`` (no cache involved)."""
        out = self.decoder(input_ids=ids.view(1, -1).to(self.device), use_cache=False)
        return self.head(out.last_hidden_state[0]).float()
