"""Save and load EAGLE heads: this project's artifact layout and speculators' published one.

This project's artifact (``training.jobs.eagle_head``, the zoo's ``eagle``): a directory with
``config.json`` (``kind`` = ``EAGLE_KIND``, ``eagle``: the ``EagleConfig``, and the job's
provenance and metrics) and ``HEAD_FILE`` holding the head's own weights only.

speculators' layout (https://github.com/vllm-project/speculators, ``EagleSpeculator``): a
``config.json`` whose ``speculators_model_type`` is ``"eagle"``, with ``speculators_config``
(algorithm, proposal methods, ``verifier``), ``transformer_layer_config`` (a Llama config of
the decoder layer, defaults omitted), ``layernorms`` and ``fusion_bias``; and safetensors
weights named ``fusion_fc.*`` (``fc.*`` in older releases) and ``transformer.*``
(``embedding_layernorm`` / ``pre_lm_head_layernorm`` with ``layernorms``). Its head reads the
verifier's features and feeds the layer's output to the verifier's LM head with no norm
between (``target_norm`` False). EAGLE-3 checkpoints (``eagle3``: fused layers, their own
vocabulary mapping, a decoder layer attending over 2d-wide inputs) are not read: this
project's fused heads (``EagleConfig.feature_layers``) keep EAGLE-1's layer behind their
``layers_fc`` and are saved in its own layout, the layers in ``config.json``.

Either kind is built over the target the caller passes (its embeddings, norm and LM head);
``load_head_for_target`` loads that target's parts from its checkpoint (a sweep's draft worker).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, PreTrainedModel

from workers.eagle.head import EagleConfig, EagleHead, TargetParts, rope_theta
from workers.lm import DTYPES, load_causal_lm
from workers.model_spec import ModelSpec

CONFIG_FILE = "config.json"
EAGLE_KIND = "eagle_head"
HEAD_FILE = "eagle_head.safetensors"
#: Weight-name prefixes of a speculators checkpoint that are the verifier's, not the head's.
VERIFIER_PREFIXES = ("embed_tokens.", "lm_head.", "verifier.", "norm.")


def save_eagle_head(directory: Path, head: EagleHead, meta: dict[str, Any]) -> Path:
    """Write ``head``'s own weights and ``config.json`` (``meta`` added) to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(weights, str(directory / HEAD_FILE))
    config = {**meta, "kind": EAGLE_KIND, "eagle": head.config.to_json()}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    return directory


def read_config(path: str | Path) -> dict[str, Any]:
    """Return a head directory's ``config.json``; ValueError names a missing one."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise ValueError(f"{file} does not exist: an EAGLE head is a directory with config.json")
    return json.loads(file.read_text())


def is_speculators(config: dict[str, Any]) -> bool:
    """Return whether a ``config.json`` is in speculators' layout."""
    return "speculators_config" in config or "speculators_model_type" in config


def read_eagle_config(path: str | Path) -> EagleConfig:
    """Return the ``EagleConfig`` of the head at ``path`` (either layout), weights unread.

    ValueError names the file when the directory holds no EAGLE head (a model's directory,
    another artifact kind) or a speculators head of a kind not supported.
    """
    config = read_config(path)
    if is_speculators(config):
        return speculators_eagle_config(config, Path(path))
    if config.get("kind") != EAGLE_KIND:
        raise ValueError(
            f"{Path(path) / CONFIG_FILE} has kind {config.get('kind')!r}, not {EAGLE_KIND!r}: "
            "not an EAGLE head (an eagle_head job's artifact, a zoo eagle head such as "
            "zoo:smol-eagle/eagle, or a speculators checkpoint)"
        )
    return EagleConfig.from_json(config["eagle"])


def load_eagle_head(path: str | Path, target: PreTrainedModel) -> EagleHead:
    """Return the head at ``path`` (either layout) over ``target``'s frozen parts, eval mode.

    ValueError names the file and what does not fit (another kind, another target's shape).
    """
    if is_speculators(read_config(path)):
        return load_speculators(path, target)
    head = EagleHead(read_eagle_config(path), TargetParts.of(target))
    head.load_state_dict(load_file(str(Path(path) / HEAD_FILE)))
    return head.eval()


def load_head_for_target(path: str | Path, target: ModelSpec, device: str) -> EagleHead:
    """Return the head at ``path`` on ``device``, in ``target``'s dtype, over the frozen parts
    of the target ``target`` names (what a draft worker serving an EAGLE pair holds).

    The target loads on the CPU and only its embeddings, final norm and LM head move to
    ``device`` with the head; the rest of it is dropped when this returns.
    """
    model = load_causal_lm(target.path, target.dtype, "cpu", target.trust_remote_code)
    head = load_eagle_head(path, model)
    return head.to(device=device, dtype=DTYPES[target.dtype])


def speculators_eagle_config(config: dict[str, Any], path: Path) -> EagleConfig:
    """Return the ``EagleConfig`` of a speculators ``config.json`` (read from ``path``)."""
    kind = config.get("speculators_model_type")
    if kind != "eagle":
        raise ValueError(
            f"{path / CONFIG_FILE}: speculators_model_type {kind!r} is not supported; only "
            "'eagle' (EAGLE-1/2, HASS) heads load"
        )
    architecture = config.get("transformer_layer_architecture", "LlamaDecoderLayer")
    if architecture != "LlamaDecoderLayer":
        raise ValueError(
            f"{path / CONFIG_FILE}: transformer_layer_architecture {architecture!r} is not "
            "supported (only LlamaDecoderLayer)"
        )
    layer = LlamaConfig(**config.get("transformer_layer_config", {}))
    heads = layer.num_attention_heads
    return EagleConfig(
        hidden_size=layer.hidden_size,
        intermediate_size=layer.intermediate_size,
        num_heads=heads,
        num_kv_heads=layer.num_key_value_heads or heads,
        head_dim=getattr(layer, "head_dim", None) or layer.hidden_size // heads,
        rms_norm_eps=layer.rms_norm_eps,
        rope_theta=rope_theta(layer),
        max_positions=layer.max_position_embeddings,
        vocab_size=layer.vocab_size,
        fusion_bias=bool(config.get("fusion_bias", False)),
        layernorms=bool(config.get("layernorms", False)),
        target_norm=False,
    )


def speculators_weights(path: Path) -> dict[str, torch.Tensor]:
    """Return the head's weights of a speculators checkpoint, renamed to ``EagleHead``'s
    names (``fc.*`` → ``fusion_fc.*``; the verifier's own tensors dropped)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no .safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    renamed = {}
    for name, value in weights.items():
        if name.startswith(VERIFIER_PREFIXES):
            continue
        if name.startswith("fc."):
            name = "fusion_fc." + name.removeprefix("fc.")
        renamed[name] = value
    return renamed


def load_speculators(path: str | Path, target: PreTrainedModel) -> EagleHead:
    """Return the speculators-format EAGLE head at ``path`` over ``target``, eval mode.

    ValueError names the file when the head's vocabulary or width is not ``target``'s, or when
    its weights do not match its config.
    """
    path = Path(path)
    config = read_config(path)
    eagle = speculators_eagle_config(config, path)
    verifier = config.get("speculators_config", {}).get("verifier", {})
    if eagle.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"{path / CONFIG_FILE}: the head's vocabulary ({eagle.vocab_size}) is not the "
            f"target's ({target.config.vocab_size}); it was trained for "
            f"{verifier.get('name_or_path', 'another verifier')!r}"
        )
    head = EagleHead(eagle, TargetParts.of(target))
    missing, unexpected = head.load_state_dict(speculators_weights(path), strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path}: the weights do not match the config (missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)})"
        )
    return head.eval()
