"""Tiny GGUF files for the importer's tests, written with the ``gguf`` package's writer.

``write_tiny_llama_gguf`` stores a random ``LlamaForCausalLM`` the way llama.cpp's converter does
(q/k rows permuted for its rotary layout, tied embeddings without an ``output.weight``) with a
byte-level BPE tokenizer section: the 256 byte symbols, a few merges, three control tokens and a
ChatML chat template. That is the least transformers' GGUF loader needs to build both model and
tokenizer.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from training.gguf_import import WheelSource

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "r e")


def tiny_vocab() -> tuple[list[str], list[int]]:
    """Return (tokens, token types): control tokens, byte symbols, then merged tokens."""
    symbols = list(bytes_to_unicode().values())
    merged = [merge.replace(" ", "") for merge in MERGES]
    tokens = [*CONTROL_TOKENS, *symbols, *merged]
    types = [3] * len(CONTROL_TOKENS) + [1] * (len(symbols) + len(merged))
    return tokens, types


def tiny_llama(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """Return a random 2-layer Llama (GQA, tied embeddings) whose weights are all non-trivial."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, value in model.named_parameters():
            if "norm" in name:
                value.uniform_(0.5, 1.5)
    return model


def _llama_cpp_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder q/k rows the way llama.cpp's ``convert_hf_to_gguf.py`` does."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _gguf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    """Return the model's weights under llama.cpp's tensor names (float32 arrays)."""
    config = model.config
    tensors = {
        "token_embd.weight": model.model.embed_tokens.weight,
        "output_norm.weight": model.model.norm.weight,
    }
    for index, layer in enumerate(model.model.layers):
        attention, mlp = layer.self_attn, layer.mlp
        prefix = f"blk.{index}."
        tensors |= {
            prefix + "attn_norm.weight": layer.input_layernorm.weight,
            prefix + "attn_q.weight": _llama_cpp_permute(
                attention.q_proj.weight, config.num_attention_heads
            ),
            prefix + "attn_k.weight": _llama_cpp_permute(
                attention.k_proj.weight, config.num_key_value_heads
            ),
            prefix + "attn_v.weight": attention.v_proj.weight,
            prefix + "attn_output.weight": attention.o_proj.weight,
            prefix + "ffn_norm.weight": layer.post_attention_layernorm.weight,
            prefix + "ffn_gate.weight": mlp.gate_proj.weight,
            prefix + "ffn_up.weight": mlp.up_proj.weight,
            prefix + "ffn_down.weight": mlp.down_proj.weight,
        }
    return {name: value.detach().float().numpy().copy() for name, value in tensors.items()}


def write_tiny_llama_gguf(
    path: Path, architecture: str = "llama", seed: int = 0
) -> LlamaForCausalLM:
    """Write a tiny llama GGUF (model + tokenizer + chat template) to ``path``; return the model.

    ``architecture`` is written as ``general.architecture`` (a wrong one exercises the
    importer's error).
    """
    import gguf

    tokens, types = tiny_vocab()
    model = tiny_llama(len(tokens), seed)
    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_pad_token_id(config.pad_token_id)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, array in _gguf_tensors(model).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


#: Where the tiny wheel holds its GGUF.
TINY_MEMBER = "tiny_pkg/tiny.gguf"


def write_tiny_gguf_wheel(
    folder: Path, architecture: str = "llama"
) -> tuple[Path, LlamaForCausalLM]:
    """Write a tiny GGUF into a wheel-like zip in ``folder`` (member ``TINY_MEMBER``); return
    (the wheel, the model the GGUF holds)."""
    gguf_path = folder / "tiny.gguf"
    model = write_tiny_llama_gguf(gguf_path, architecture=architecture)
    wheel = folder / "tiny_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf_path, TINY_MEMBER)
        archive.writestr("tiny_pkg/__init__.py", "")
    gguf_path.unlink()
    return wheel, model


def tiny_wheel_source(sha256: str) -> WheelSource:
    """Return the pinned source of the tiny wheel (``write_tiny_gguf_wheel``) with ``sha256``."""
    return WheelSource("tiny-pkg", "1.0", sha256, TINY_MEMBER, "Apache-2.0")
