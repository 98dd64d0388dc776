"""Grow a trained target without changing its function: wider MLPs and zero-output layers."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from training.zoo.recipes import Enlargement


def enlarge_target(model: LlamaForCausalLM, plan: Enlargement, seed: int) -> LlamaForCausalLM:
    """Return a bigger copy of ``model`` that computes the same logits (see ``Enlargement``).

    New weights are drawn from the model's own initialiser with ``seed``; then the trained
    weights are copied in and the output projections of everything new are zeroed.
    """
    old = model.config
    if plan.intermediate_size < old.intermediate_size:
        raise ValueError("enlargement cannot shrink the MLP")
    config = LlamaConfig.from_dict(
        {
            **old.to_dict(),
            "num_hidden_layers": old.num_hidden_layers + plan.extra_layers,
            "intermediate_size": plan.intermediate_size,
        }
    )
    torch.manual_seed(seed)
    big = LlamaForCausalLM(config).eval()
    width = old.intermediate_size
    trained = model.state_dict()
    with torch.no_grad():
        for key, value in big.state_dict().items():
            if key not in trained:
                continue
            if key.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
                value[:width].copy_(trained[key])
            elif key.endswith("mlp.down_proj.weight"):
                value[:, :width].copy_(trained[key])
                value[:, width:].zero_()
            else:
                value.copy_(trained[key])
        for layer in big.model.layers[old.num_hidden_layers :]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return big


def enlargement_note(trained_layers: int, plan: Enlargement, trained_width: int) -> str:
    """Return the model-card text saying what was added to the target and that it all runs."""
    first, last = trained_layers, trained_layers + plan.extra_layers - 1
    note = (
        f"Layers 0-{trained_layers - 1} were trained. Layers {first}-{last} were added after "
        f"training as function-preserving layers: their attention o_proj and MLP down_proj "
        f"weights are zero, so their residual outputs are zero and the logits are unchanged. "
    )
    if plan.intermediate_size > trained_width:
        note += (
            f"Every layer's MLP was widened from {trained_width} to {plan.intermediate_size} "
            f"hidden units with random input weights and zero output weights. "
        )
    return note + (
        "The added weights are real dense matrices (random q/k/v, gate and up projections): "
        "every layer still runs all of its matmuls at inference, so the decoding cost is that "
        "of the full model."
    )


@torch.inference_mode()
def max_logit_difference(a: LlamaForCausalLM, b: LlamaForCausalLM, blocks: torch.Tensor) -> float:
    """Return max |logits_a − logits_b| over ``blocks`` (the enlargement's preservation check)."""
    return (a(input_ids=blocks).logits - b(input_ids=blocks).logits).abs().max().item()
