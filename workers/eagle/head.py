"""An EAGLE-style head over a target's last-layer features (EAGLE-1 shape), or several fused.

Feature space: the target's last hidden states after its final norm, what ``CachedLM`` returns
as ``StepOutput.hidden`` (f_t, which produced the distribution of token t + 1). The head reads
the pair (f_t, x_{t+1}) at each position t: ``fusion_fc`` maps [embed(x_{t+1}), f_t] (2d) to d,
one Llama decoder layer (``transformer``) runs causally over the positions, and its output is
the predicted next feature f̂_{t+1}; with ``target_norm`` (this project's heads) the output first
goes through the target's frozen final norm, so f̂ lies where the true features lie. Logits are
the target's frozen LM head applied to f̂ (after ``pre_lm_head_layernorm`` where ``layernorms``
is set, as in speculators' variants), restricted to ``head_vocab`` rows when one is given.

A fused head (``feature_layers``: several target layers, EAGLE-3 style, ``workers.eagle.layers``)
reads g_t, those layers' hidden states concatenated (k·d), and ``layers_fc`` (k·d → d, no bias)
maps it to the feature f_t that enters ``fusion_fc`` as above (``project``). Its own predicted
features f̂ are d wide, so from the second draft step on it reads them as they are.

In training the forward can also unroll the head over its own outputs (EAGLE-3's training-time
test): draft steps 2..k from every start at once, each attending to the true pairs up to its
start and to its own chain (``unrolled_mask``), exactly as ``workers.eagle.step`` drafts them.

An EAGLE-3 layer (``eagle3_layer``, what speculators' ``eagle3`` checkpoints hold) has no
``fusion_fc``: its attention reads the pair itself, [norm(embed(x_{t+1})), hidden_norm(h_t)]
(2d wide), over the residual h_t (the fused features through ``layers_fc``, or from the second
draft step on the layer's own previous output), and its logits come from its own final norm and
its own LM head over a draft vocabulary (``head_vocab``: the target id of each row).

Parameter names follow speculators' ``EagleSpeculator`` (``fusion_fc``, ``transformer``,
``embedding_layernorm``, ``pre_lm_head_layernorm``), so its checkpoints load by name
(``workers.eagle.artifact``). The target's embeddings, norm and head are buffers: frozen, never
saved with the head, taken from the target when the head is built.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from workers.lm import OUTSIDE_VOCAB_LOGIT


@dataclass(frozen=True)
class EagleConfig:
    """The head's shape and variant.

    The layer's sizes are the target's by default (``for_target``). ``fusion_bias``: a bias on
    ``fusion_fc``; ``layernorms``: speculators' extra trainable norms (on the embeddings, the
    layer's input and before the LM head); ``target_norm``: the target's frozen final norm on
    the layer's output. ``head_vocab``: the sorted token ids the head may propose (None: all).
    ``feature_layers``: the target layers it fuses (``workers.eagle.layers``; empty: EAGLE-1).
    ``eagle3_layer``: EAGLE-3's decoder layer (see the module docstring; ``head_vocab`` then
    lists the target id of each row of the head's own LM head, in row order, and
    ``fusion_bias`` is a bias on ``layers_fc``); ``norm_before_residual``: its residual is the
    normed h_t (speculators' flag of that name).
    """

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_positions: int
    vocab_size: int
    fusion_bias: bool = False
    layernorms: bool = False
    target_norm: bool = True
    head_vocab: tuple[int, ...] | None = None
    feature_layers: tuple[int, ...] = ()
    eagle3_layer: bool = False
    norm_before_residual: bool = False

    def __post_init__(self) -> None:
        if self.eagle3_layer and (not self.feature_layers or self.target_norm):
            raise ValueError("an EAGLE-3 layer reads fused features and ends in its own norm")

    @property
    def fused(self) -> bool:
        """Whether the head fuses several target layers (``feature_layers`` given)."""
        return bool(self.feature_layers)

    @property
    def feature_width(self) -> int:
        """The width of the target's features the head reads: k·d fused, else d."""
        return self.hidden_size * max(1, len(self.feature_layers))

    @classmethod
    def for_target(cls, target: PreTrainedModel, **variant: Any) -> EagleConfig:
        """Return the config of a head with ``target``'s layer shape (``variant``: the rest)."""
        config = target.config
        heads = config.num_attention_heads
        return cls(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=rope_theta(config),
            max_positions=config.max_position_embeddings,
            vocab_size=config.vocab_size,
            **variant,
        )

    def layer_config(self) -> LlamaConfig:
        """Return the ``LlamaConfig`` of the head's decoder layer (SDPA attention)."""
        config = LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.max_positions,
        )
        config._attn_implementation = "sdpa"
        return config

    def to_json(self) -> dict[str, Any]:
        """Return the config as JSON-ready values."""
        values = asdict(self)
        values["head_vocab"] = None if self.head_vocab is None else list(self.head_vocab)
        values["feature_layers"] = list(self.feature_layers)
        return values

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> EagleConfig:
        """Return the config ``to_json`` wrote; ValueError names an unknown key."""
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown EAGLE head config keys {unknown}")
        vocab = values.get("head_vocab")
        layers = tuple(values.get("feature_layers", ()))
        vocab = None if vocab is None else tuple(vocab)
        return cls(**{**values, "head_vocab": vocab, "feature_layers": layers})


def rope_theta(config: Any) -> float:
    """Return a Llama config's rotary base (``rope_parameters`` in transformers 5, else
    ``rope_theta``; 10000 when neither says)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0))


@dataclass(frozen=True)
class TargetParts:
    """What a head takes from its target, frozen: token embeddings [V, d], the final norm's
    weight [d], the LM head's weight [V, d]."""

    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor

    @classmethod
    def of(cls, target: PreTrainedModel) -> TargetParts:
        """Return ``target``'s parts (detached; shared with the model, not copied)."""
        decoder = target.get_decoder()
        head = target.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError("an EAGLE head needs a target whose LM head has no bias")
        return cls(
            embed=decoder.embed_tokens.weight.detach(),
            final_norm=decoder.norm.weight.detach(),
            lm_head=head.weight.detach(),
        )


class EagleHead(nn.Module):
    """The trainable head plus its target's frozen parts (see the module docstring)."""

    def __init__(self, config: EagleConfig, parts: TargetParts) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_size
        if parts.embed.shape[1] != d or parts.lm_head.shape[1] != d:
            raise ValueError(
                f"the head's hidden size {d} differs from its target's "
                f"{parts.embed.shape[1]}: a head fits only the target it was built for"
            )
        layer_config = config.layer_config()
        self.layers_fc = None
        if config.fused:
            bias = config.fusion_bias and config.eagle3_layer
            self.layers_fc = nn.Linear(config.feature_width, d, bias=bias)
        self.fusion_fc = None
        if not config.eagle3_layer:
            self.fusion_fc = nn.Linear(2 * d, d, bias=config.fusion_bias)
        self.transformer = LlamaDecoderLayer(layer_config, layer_idx=0)
        if config.eagle3_layer:
            _widen_attention_input(self.transformer, config)
        elif not config.layernorms:
            self.transformer.input_layernorm = nn.Identity()
        self.embedding_layernorm = _norm(config) if config.layernorms else None
        own_norm = config.layernorms or config.eagle3_layer
        self.pre_lm_head_layernorm = _norm(config) if own_norm else None
        self.rotary = LlamaRotaryEmbedding(layer_config)
        kept = None if config.head_vocab is None else torch.tensor(config.head_vocab)
        if config.eagle3_layer:  # its own LM head: loaded with the head's weights
            rows = parts.lm_head.new_zeros(config.vocab_size if kept is None else len(kept), d)
        else:
            rows = parts.lm_head if kept is None else parts.lm_head[kept.to(parts.lm_head.device)]
        self.register_buffer("embed", parts.embed, persistent=False)
        self.register_buffer("final_norm", parts.final_norm, persistent=False)
        self.register_buffer("head_rows", rows.contiguous(), persistent=config.eagle3_layer)
        self.register_buffer("kept", kept, persistent=False)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Return the features f [..., d] of the target's features [..., feature_width]: the
        fused layers through ``layers_fc``, or the EAGLE-1 feature as it is."""
        if self.layers_fc is None:
            return features
        return self.layers_fc(features.to(self.layers_fc.weight.dtype))

    def layer_input(
        self, features: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the decoder layer's attention input and residual [..., d] (the attention
        input 2d wide for an EAGLE-3 layer) for features f_t [..., d] and tokens x_{t+1}."""
        embedded = nn.functional.embedding(tokens, self.embed)
        features = features.to(embedded.dtype)
        layer = self.transformer
        if self.config.eagle3_layer:
            normed = layer.hidden_norm(features)
            attention_in = torch.cat([layer.input_layernorm(embedded), normed], dim=-1)
            return attention_in, normed if self.config.norm_before_residual else features
        if self.embedding_layernorm is not None:
            embedded = self.embedding_layernorm(embedded)
        hidden = self.fusion_fc(torch.cat([embedded, features], dim=-1))
        return layer.input_layernorm(hidden), hidden

    def finish(self, layer_out: torch.Tensor) -> torch.Tensor:
        """Return the predicted feature f̂ of the layer's output (the target's norm applied
        with ``target_norm``)."""
        if not self.config.target_norm:
            return layer_out
        variance = layer_out.float().pow(2).mean(-1, keepdim=True)
        normed = layer_out.float() * torch.rsqrt(variance + self.config.rms_norm_eps)
        return self.final_norm * normed.to(layer_out.dtype)

    def kept_logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """Return logits [..., len(head_vocab) or V] of predicted features [..., d]."""
        if self.pre_lm_head_layernorm is not None:
            predicted = self.pre_lm_head_layernorm(predicted)
        return nn.functional.linear(predicted, self.head_rows)

    def full_logits(self, kept_logits: torch.Tensor) -> torch.Tensor:
        """Return float logits [..., V]: ``kept_logits`` in their columns, the rest
        ``OUTSIDE_VOCAB_LOGIT`` (probability exactly 0 under any softmax)."""
        if self.kept is None:
            return kept_logits.float()
        full = kept_logits.new_full(
            (*kept_logits.shape[:-1], self.config.vocab_size), OUTSIDE_VOCAB_LOGIT
        ).float()
        full[..., self.kept] = kept_logits.float()
        return full

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, steps: int = 1) -> torch.Tensor:
        """Return predicted features [steps, B, T, d]: [0] of the pairs (the target's features
        at t [B, T, feature_width], token ``tokens[:, t]`` = x_{t+1}), causal over T,
        positions 0..T-1 (teacher forcing); [j] of the head's own draft step j + 1 from each
        start t, as ``workers.eagle.step`` drafts it (EAGLE-3's training-time test).

        Step j reads (its step j − 1 prediction at t, ``tokens[:, t + j]``) at position t + j and
        attends to the true pairs up to t and to its own chain's earlier steps, so ``tokens`` is
        [B, T + steps − 1]: x_{t+1+j} for every start t and step j.
        """
        width = features.shape[1]
        if tokens.shape[1] != width + steps - 1:
            raise ValueError(
                f"{steps} steps over {width} positions need {width + steps - 1} tokens a row, "
                f"got {tokens.shape[1]}"
            )
        layer, inputs = self.transformer, self.project(features)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        predicted = []
        for step in range(steps):
            attention_in, hidden = self.layer_input(inputs, tokens[:, step : step + width])
            positions = torch.arange(step, step + width, device=hidden.device)[None]
            cos, sin = self.rotary(hidden, positions)
            hidden = hidden + self._attend(attention_in, cos, sin, keys, values)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            inputs = self.finish(hidden)
            predicted.append(inputs)
        return torch.stack(predicted)

    def _attend(
        self,
        normed: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> torch.Tensor:
        """Return the attention block's output [B, T, d] of one unrolled step, appending its
        keys and values to those of the steps before it (``unrolled_mask``)."""
        attention, config = self.transformer.self_attn, self.config
        batch, width = normed.shape[:2]
        q = attention.q_proj(normed).view(batch, width, config.num_heads, -1).transpose(1, 2)
        k = attention.k_proj(normed).view(batch, width, config.num_kv_heads, -1).transpose(1, 2)
        v = attention.v_proj(normed).view(batch, width, config.num_kv_heads, -1).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys.append(k)
        values.append(v)
        attended = nn.functional.scaled_dot_product_attention(
            q,
            torch.cat(keys, dim=2),
            torch.cat(values, dim=2),
            attn_mask=unrolled_mask(width, len(keys), normed.device),
            enable_gqa=config.num_heads != config.num_kv_heads,
        )
        return attention.o_proj(attended.transpose(1, 2).reshape(batch, width, -1))


def unrolled_mask(width: int, steps: int, device: torch.device | None = None) -> torch.Tensor:
    """Return the boolean attention mask [T, steps·T] of unrolled step ``steps`` (1-based):
    start t sees the true pairs 0..t (causal) and, of each earlier step's keys, its own (t)."""
    positions = torch.arange(width, device=device)
    causal = positions[None, :] <= positions[:, None]
    own = torch.eye(width, dtype=torch.bool, device=device)
    return torch.cat([causal, *([own] * (steps - 1))], dim=1)


def _widen_attention_input(layer: LlamaDecoderLayer, config: EagleConfig) -> None:
    """Make ``layer`` EAGLE-3's: q, k and v read 2d-wide inputs, and a ``hidden_norm``."""
    attention, d, width = layer.self_attn, config.hidden_size, config.head_dim
    attention.q_proj = nn.Linear(2 * d, config.num_heads * width, bias=False)
    attention.k_proj = nn.Linear(2 * d, config.num_kv_heads * width, bias=False)
    attention.v_proj = nn.Linear(2 * d, config.num_kv_heads * width, bias=False)
    layer.hidden_norm = _norm(config)


def _norm(config: EagleConfig) -> LlamaRMSNorm:
    """Return a trainable RMSNorm of the head's width."""
    return LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
