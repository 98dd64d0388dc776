"""Run an ``EagleHead`` one block at a time over its own KV cache, in plain torch.

The same computation as ``EagleHead.forward`` (tests compare them) without transformers'
per-call bookkeeping, on ``workers.llama_fast.PackedLinear`` products: one decoder layer's
keys and values in a buffer that grows by doubling, rollback by moving a length. This is the
head's per-draft-step cost: one layer of the target's shape plus the (cut) LM head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workers.eagle.head import EagleHead
from workers.llama_fast import INITIAL_CAPACITY, PackedLinear, rotate


class EagleStep:
    """A head's weights prepared for batch-1 steps, plus its KV cache.

    ``prepack`` gives each product a oneDNN-packed copy where ``PackedLinear`` applies.
    ``length`` is the number of cached positions.
    """

    def __init__(self, head: EagleHead, prepack: bool = True) -> None:
        self.head = head.eval()
        config = head.config
        layer = head.transformer
        attention, mlp = layer.self_attn, layer.mlp
        self.n_heads, self.n_kv = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.eps = config.rms_norm_eps
        detached = [p.detach() for p in (attention.q_proj.weight, attention.k_proj.weight)]
        qkv = torch.cat([*detached, attention.v_proj.weight.detach()])
        self.fc = None
        if head.fusion_fc is not None:
            self.fc = PackedLinear(head.fusion_fc.weight.detach(), prepack)
        self.layers_fc = None
        if head.layers_fc is not None:
            self.layers_fc = PackedLinear(head.layers_fc.weight.detach(), prepack)
        self.qkv = PackedLinear(qkv, prepack)
        self.out = PackedLinear(attention.o_proj.weight.detach(), prepack)
        gate_up = torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()])
        self.gate_up = PackedLinear(gate_up, prepack)
        self.down = PackedLinear(mlp.down_proj.weight.detach(), prepack)
        self.lm_head = PackedLinear(head.head_rows, prepack)
        self.length = 0
        self._keys = self._values = self._cos = self._sin = torch.empty(0)
        self._allocate(INITIAL_CAPACITY)

    @property
    def capacity(self) -> int:
        """Number of positions the buffers hold before they must grow."""
        return self._keys.shape[-2]

    def _allocate(self, capacity: int) -> None:
        """(Re)allocate the key/value buffers and rotary table, keeping the cached prefix."""
        embed = self.head.embed
        shape = (1, self.n_kv, capacity, self.head_dim)
        keys, values = embed.new_zeros(shape), embed.new_zeros(shape)
        if self.length:
            keys[..., : self.length, :] = self._keys[..., : self.length, :]
            values[..., : self.length, :] = self._values[..., : self.length, :]
        self._keys, self._values = keys, values
        positions = torch.arange(capacity, device=embed.device)[None]
        cos, sin = self.head.rotary(embed[:1], positions)
        self._cos, self._sin = cos[0], sin[0]

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` cached positions."""
        self.length = min(self.length, length)

    def reset(self) -> None:
        """Forget every cached position (a new request)."""
        self.length = 0

    @torch.inference_mode()
    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Return the features [n, d] of the target's features [n, feature_width]
        (``EagleHead.project``: a fused head's ``layers_fc``; else as they are)."""
        if self.layers_fc is None:
            return features
        projected = self.layers_fc(features.to(self.head.embed.dtype))
        bias = self.head.layers_fc.bias
        return projected if bias is None else projected + bias

    @torch.inference_mode()
    def forward(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Return predicted features [n, d] for pairs (``features`` [n, d], ``tokens`` [n])
        after the cached positions, whose keys and values it appends."""
        head = self.head
        n = tokens.numel()
        start, end = self.length, self.length + n
        if end > self.capacity:
            self._allocate(max(end, 2 * self.capacity))
        attention_in, hidden = self._layer_input(features, tokens.view(-1))
        hidden = hidden + self._attend(attention_in, start, end)
        normed = head.transformer.post_attention_layernorm(hidden)
        gate, up = self.gate_up(normed).chunk(2, -1)
        hidden = hidden + self.down(F.silu(gate) * up)
        self.length = end
        return head.finish(hidden)

    def _layer_input(
        self, features: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the layer's attention input and residual (``EagleHead.layer_input``), the
        fusion on its packed product."""
        head = self.head
        if self.fc is None:
            return head.layer_input(features, tokens)
        embedded = F.embedding(tokens, head.embed)
        if head.embedding_layernorm is not None:
            embedded = head.embedding_layernorm(embedded)
        hidden = self.fc(torch.cat([embedded, features.to(embedded.dtype)], dim=-1))
        if head.fusion_fc.bias is not None:
            hidden = hidden + head.fusion_fc.bias
        return head.transformer.input_layernorm(hidden), hidden

    def _attend(self, normed: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Return the attention block's output [n, d] for positions start..end-1, caching
        their keys and values."""
        n = normed.shape[0]
        n_q, n_kv = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        cos, sin = self._cos[start:end], self._sin[start:end]
        q, k, v = self.qkv(normed).split([n_q, n_kv, n_kv], dim=-1)
        q = rotate(q.view(n, self.n_heads, self.head_dim).transpose(0, 1), cos, sin)
        k = rotate(k.view(n, self.n_kv, self.head_dim).transpose(0, 1), cos, sin)
        self._keys[0, :, start:end] = k
        self._values[0, :, start:end] = v.view(n, self.n_kv, self.head_dim).transpose(0, 1)
        mask = None
        if n > 1:
            mask = torch.ones(n, end, dtype=torch.bool, device=normed.device).tril(start)
        attended = F.scaled_dot_product_attention(
            q[None],
            self._keys[:, :, :end],
            self._values[:, :, :end],
            attn_mask=mask,
            enable_gqa=self.n_heads != self.n_kv,
        )
        return self.out(attended[0].transpose(0, 1).reshape(n, n_q))

    @torch.inference_mode()
    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """Return float logits [n, V] (full width; 0 probability outside ``head_vocab``) of
        predicted features [n, d]."""
        head = self.head
        if head.pre_lm_head_layernorm is not None:
            predicted = head.pre_lm_head_layernorm(predicted)
        return head.full_logits(self.lm_head(predicted))
