"""Load EAGLE heads published in speculators' layout (https://github.com/vllm-project/speculators).

A speculators checkpoint is a directory with a ``config.json`` whose ``speculators_model_type``
names the head, a ``speculators_config`` block (algorithm, proposal methods, ``verifier``) and
``transformer_layer_config`` (a Llama config of the decoder layer, defaults omitted), plus
safetensors weights. Two kinds load, each over the target the caller passes:

* ``eagle`` (``EagleSpeculator``: EAGLE-1/2, HASS): ``layernorms`` and ``fusion_bias`` in the
  config; weights ``fusion_fc.*`` (``fc.*`` in older releases) and ``transformer.*``
  (``embedding_layernorm`` / ``pre_lm_head_layernorm`` with ``layernorms``). The layer's output
  goes to the verifier's LM head with no norm between (``target_norm`` False).
* ``eagle3`` (EAGLE-3): ``fc`` maps the concatenated states of three verifier layers
  (``eagle_aux_hidden_state_layer_ids``, counted as vLLM counts them: the state entering that
  layer, so id j is this project's layer j − 1; vLLM's default when absent) to d; one decoder
  layer ``layers.0.*`` (``midlayer.*`` in EAGLE-3's own releases) whose q, k and v read
  [norm(embedding), hidden_norm(h)], 2d wide; its own final ``norm`` and ``lm_head`` over a
  draft vocabulary whose row i is target token i + ``d2t[i]``; ``embed_tokens`` when the
  checkpoint carries its own embeddings (else the verifier's). ``norm_before_residual`` is read;
  ``norm_before_fc`` (a norm over the three states, gpt-oss checkpoints) and heads of several
  decoder layers are refused by name.

Weights of the verifier a checkpoint may carry (``verifier*``, its LM head in EAGLE-1 files)
are dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import LlamaConfig, PreTrainedModel

from workers.eagle.head import EagleConfig, EagleHead, TargetParts, rope_theta
from workers.eagle.layers import eagle3_layers

CONFIG_FILE = "config.json"
#: Weight-name prefixes of an EAGLE-1 checkpoint that are the verifier's, not the head's.
VERIFIER_PREFIXES = ("embed_tokens.", "lm_head.", "verifier.", "norm.")
#: Weight-name prefixes of an EAGLE-3 checkpoint that serve only its training.
EAGLE3_DROPPED = ("verifier", "t2d", "d2t")
#: EAGLE-3 weight-name prefixes and this project's names for them (``EagleHead``).
EAGLE3_NAMES = (
    ("fc.", "layers_fc."),
    ("layers.0.", "transformer."),
    ("midlayer.", "transformer."),
    ("norm.", "pre_lm_head_layernorm."),
)


def is_speculators(config: dict[str, Any]) -> bool:
    """Return whether a ``config.json`` is in speculators' layout."""
    return "speculators_config" in config or "speculators_model_type" in config


def speculators_eagle_config(
    config: dict[str, Any], path: Path, target_depth: int | None = None
) -> EagleConfig:
    """Return the ``EagleConfig`` of the speculators head at ``path`` (``config``: its
    ``config.json``). An ``eagle3`` head without ``eagle_aux_hidden_state_layer_ids`` needs
    ``target_depth`` to place vLLM's default layers; ValueError names the file and field of
    what is not supported."""
    kind = config.get("speculators_model_type")
    if kind not in ("eagle", "eagle3"):
        raise ValueError(
            f"{path / CONFIG_FILE}: speculators_model_type {kind!r} is not supported; only "
            "'eagle' (EAGLE-1/2, HASS) and 'eagle3' heads load"
        )
    layer = LlamaConfig(**config.get("transformer_layer_config", {}))
    if kind == "eagle3":
        return _eagle3_config(config, layer, path, target_depth)
    architecture = config.get("transformer_layer_architecture", "LlamaDecoderLayer")
    if architecture != "LlamaDecoderLayer":
        raise ValueError(
            f"{path / CONFIG_FILE}: transformer_layer_architecture {architecture!r} is not "
            "supported (only LlamaDecoderLayer)"
        )
    return EagleConfig(
        **_layer_shape(layer),
        fusion_bias=bool(config.get("fusion_bias", False)),
        layernorms=bool(config.get("layernorms", False)),
        target_norm=False,
    )


def _layer_shape(layer: LlamaConfig) -> dict[str, Any]:
    """Return the ``EagleConfig`` fields of a decoder layer's Llama config."""
    heads = layer.num_attention_heads
    return {
        "hidden_size": layer.hidden_size,
        "intermediate_size": layer.intermediate_size,
        "num_heads": heads,
        "num_kv_heads": layer.num_key_value_heads or heads,
        "head_dim": getattr(layer, "head_dim", None) or layer.hidden_size // heads,
        "rms_norm_eps": layer.rms_norm_eps,
        "rope_theta": rope_theta(layer),
        "max_positions": layer.max_position_embeddings,
        "vocab_size": layer.vocab_size,
    }


def _eagle3_config(
    config: dict[str, Any], layer: LlamaConfig, path: Path, target_depth: int | None
) -> EagleConfig:
    """Return the ``EagleConfig`` of an ``eagle3`` checkpoint (its vocabulary mapping and
    layer count read from its weights' names and ``d2t``)."""
    where = path / CONFIG_FILE
    if config.get("norm_before_fc"):
        raise ValueError(f"{where}: norm_before_fc (a norm over the fused states) is not supported")
    target_width = config.get("target_hidden_size")
    if target_width not in (None, layer.hidden_size):
        raise ValueError(
            f"{where}: target_hidden_size {target_width} differs from the head's hidden_size "
            f"{layer.hidden_size}; a head that changes width is not supported"
        )
    names, d2t = _eagle3_tensors(path)
    layer_ids = {n.split(".")[1] for n in names if n.startswith("layers.")}
    if any(n.startswith("midlayer.") for n in names):
        layer_ids.add("0")
    if layer_ids != {"0"}:
        raise ValueError(
            f"{path}: the head has decoder layers {sorted(layer_ids)}; only heads of one "
            "decoder layer (layers.0 or midlayer) load"
        )
    layers = _aux_layers(config.get("eagle_aux_hidden_state_layer_ids"), where, target_depth)
    return EagleConfig(
        **_layer_shape(layer),
        fusion_bias="fc.bias" in names,
        target_norm=False,
        head_vocab=None if d2t is None else tuple((torch.arange(len(d2t)) + d2t).tolist()),
        feature_layers=layers,
        eagle3_layer=True,
        norm_before_residual=bool(config.get("norm_before_residual", False)),
    )


def _aux_layers(ids: list[int] | None, where: Path, depth: int | None) -> tuple[int, ...]:
    """Return this project's feature layers of vLLM's aux layer ids (the state entering layer
    j is the state after layer j − 1), or EAGLE-3's default layers on a target ``depth`` deep."""
    if ids is None:
        if depth is None:
            raise ValueError(
                f"{where}: no eagle_aux_hidden_state_layer_ids; the default layers depend on the "
                "target's depth: load the head with its target"
            )
        return eagle3_layers(depth)
    if any(not isinstance(j, int) or j < 1 for j in ids):
        raise ValueError(
            f"{where}: eagle_aux_hidden_state_layer_ids {ids} must be layer ids >= 1 (the "
            "state entering that decoder layer; 0, the embeddings, is not served)"
        )
    return tuple(sorted({j - 1 for j in ids}))


def _eagle3_tensors(path: Path) -> tuple[set[str], torch.Tensor | None]:
    """Return the weight names of an ``eagle3`` checkpoint and its ``d2t`` (None if absent)."""
    names: set[str] = set()
    d2t = None
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt") as handle:
            keys = set(handle.keys())
            names.update(keys)
            if "d2t" in keys:
                d2t = handle.get_tensor("d2t").long()
    return names, d2t


def _weight_files(path: Path) -> list[Path]:
    """Return the checkpoint's safetensors files; ValueError when there are none."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no .safetensors weights")
    return files


def speculators_weights(path: Path, eagle3: bool) -> dict[str, torch.Tensor]:
    """Return the head's weights of a speculators checkpoint under ``EagleHead``'s names
    (an ``eagle3`` head's ``embed_tokens.weight`` kept under that name; tensors that serve
    only training or are the verifier's dropped)."""
    weights: dict[str, torch.Tensor] = {}
    for file in _weight_files(path):
        weights.update(load_file(str(file)))
    renamed = {}
    for name, value in weights.items():
        if eagle3:
            if name == "lm_head.weight":
                name = "head_rows"
            elif name.startswith(EAGLE3_DROPPED):
                continue
            for old, new in EAGLE3_NAMES:
                if name.startswith(old):
                    name = new + name.removeprefix(old)
                    break
        elif name.startswith(VERIFIER_PREFIXES):
            continue
        elif name.startswith("fc."):
            name = "fusion_fc." + name.removeprefix("fc.")
        renamed[name] = value
    return renamed


def load_speculators(config: dict[str, Any], path: Path, target: PreTrainedModel) -> EagleHead:
    """Return the speculators-format EAGLE head at ``path`` (``config``: its ``config.json``)
    over ``target``, eval mode.

    ValueError names the file when the head's vocabulary or width is not ``target``'s, or when
    its weights do not match its config.
    """
    eagle = speculators_eagle_config(config, path, target.config.num_hidden_layers)
    verifier = config.get("speculators_config", {}).get("verifier", {})
    if eagle.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"{path / CONFIG_FILE}: the head's vocabulary ({eagle.vocab_size}) is not the "
            f"target's ({target.config.vocab_size}); it was trained for "
            f"{verifier.get('name_or_path', 'another verifier')!r}"
        )
    parts = TargetParts.of(target)
    weights = speculators_weights(path, eagle.eagle3_layer)
    embed = weights.pop("embed_tokens.weight", None)
    if embed is not None:
        if embed.shape != parts.embed.shape:
            raise ValueError(
                f"{path}: embed_tokens.weight is {list(embed.shape)}, the target's embeddings "
                f"{list(parts.embed.shape)}"
            )
        parts = TargetParts(embed.to(parts.embed.dtype), parts.final_norm, parts.lm_head)
    head = EagleHead(eagle, parts)
    try:
        missing, unexpected = head.load_state_dict(weights, strict=False)
    except RuntimeError as exc:  # a tensor of another shape than the config's
        raise ValueError(f"{path}: the weights do not match the config: {exc}") from exc
    if missing or unexpected:
        raise ValueError(
            f"{path}: the weights do not match the config (missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)})"
        )
    return head.eval()
