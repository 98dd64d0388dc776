"""A tiny, seeded fp32 Llama pair built in memory for engine tests.

The draft is the target's first layer with the target's embeddings, norm and head, so the two
agree often (realistic acceptance) without any training. Embeddings are scaled up so that logits
are peaked and greedy near-ties are rare.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 96
LAYER_STD = 0.15


def tiny_config(layers: int, vocab: int = VOCAB) -> LlamaConfig:
    """Return the config of one tiny Llama model."""
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )


def build_tiny_pair(
    seed: int = 0, vocab: int = VOCAB, head_std: float = 0.6
) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """Return (draft, target): a 3-layer target and a 1-layer draft sharing its first layer.

    A smaller ``head_std`` gives flatter next-token distributions.
    """
    torch.manual_seed(seed)
    target = LlamaForCausalLM(tiny_config(3, vocab)).eval()
    with torch.no_grad():
        target.model.embed_tokens.weight.normal_(0.0, 1.0)
        target.lm_head.weight.normal_(0.0, head_std)
        for layer in target.model.layers:
            for linear in (layer.self_attn.o_proj, layer.mlp.down_proj, layer.mlp.up_proj):
                linear.weight.normal_(0.0, LAYER_STD)
    draft = LlamaForCausalLM(tiny_config(1, vocab)).eval()
    draft_state = {
        key: value
        for key, value in target.state_dict().items()
        if not key.startswith("model.layers.") or key.startswith("model.layers.0.")
    }
    draft.load_state_dict(draft_state)
    return draft, target


def prompts(n: int, seed: int = 0, vocab: int = VOCAB) -> list[torch.Tensor]:
    """Return ``n`` seeded random prompts of 3 to 12 tokens (ids ≥ 2: no BOS/EOS inside)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 13, (n,), generator=generator)
    return [torch.randint(2, vocab, (int(k),), generator=generator) for k in lengths]
