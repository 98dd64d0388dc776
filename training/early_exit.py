"""EESD's early-exit draft cut from a Llama target, and which target layer its exit layer copies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers import LlamaConfig, LlamaForCausalLM


def is_zero_residual_layer(layer: Any) -> bool:
    """Return True when a Llama decoder layer adds nothing to the residual stream (its
    attention ``o_proj`` and MLP ``down_proj`` weights are all zero)."""
    return bool(
        (layer.self_attn.o_proj.weight == 0).all() and (layer.mlp.down_proj.weight == 0).all()
    )


def exit_init_layer(
    num_layers: int, enlargement: Mapping[str, Any] | None, zero_layers: Sequence[bool]
) -> tuple[int, str]:
    """Return (index, reason): the target layer the trainable exit layer is initialised from.

    The last layer, unless the card's ``enlargement`` lists it as added (then the last trained
    layer) or, without that information, its weights make it a zero residual layer (then the
    last layer that is not).
    """
    last = num_layers - 1
    if enlargement and last in enlargement.get("added_layers", []):
        trained = max(enlargement["trained_layers"])
        return trained, (
            f"the target's last layer ({last}) is a function-preserving zero layer added by "
            f"the zoo's enlargement (its model card); initialised from its last trained "
            f"layer ({trained}) instead"
        )
    effective = [index for index in range(num_layers) if not zero_layers[index]]
    if zero_layers[last] and effective:
        return effective[-1], (
            f"the target's layers after {effective[-1]} have zero output projections "
            f"(function-preserving); initialised from layer {effective[-1]}, the last that "
            "changes the residual stream"
        )
    return last, f"initialised from the target's last layer ({last})"


def early_exit_draft(
    target: LlamaForCausalLM, exit_layers: int, init_layer: int
) -> LlamaForCausalLM:
    """Return the N + 1 layer draft cut from ``target`` (N = ``exit_layers``), on CPU.

    Embeddings and layers 0..N-1 are copies of the target's and frozen; layer N is a copy of
    target layer ``init_layer``; norm and an untied LM head are copies of the target's; those
    three train.
    """
    config = LlamaConfig.from_dict(
        {
            **target.config.to_dict(),
            "num_hidden_layers": exit_layers + 1,
            "tie_word_embeddings": False,
        }
    )
    draft = LlamaForCausalLM(config)
    source = target.state_dict()
    head = target.get_output_embeddings().weight
    exit_prefix = f"model.layers.{exit_layers}."
    state = {}
    for key in draft.state_dict():
        if key.startswith(exit_prefix):
            state[key] = source[f"model.layers.{init_layer}." + key[len(exit_prefix) :]]
        elif key == "lm_head.weight":
            state[key] = head
        else:
            state[key] = source[key]
    draft.load_state_dict(state)
    draft.model.embed_tokens.requires_grad_(False)
    for layer in draft.model.layers[:exit_layers]:
        layer.requires_grad_(False)
    return draft.eval()
