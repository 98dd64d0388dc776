"""A plain-torch forward of a Llama decoder over a preallocated KV cache (gpt-fast style).

Batch-1 decoding of a small model is dominated by per-call bookkeeping, not arithmetic: the
transformers forward builds a causal mask, position ids and cache objects and goes through
seven ``nn.Module`` calls per layer, and its ``DynamicCache`` grows by concatenation. On the
former toy demo zoo's 48-layer target on a 2-core CPU that bookkeeping was most of a decode step.
This module runs the same computation on the model's own weights with nothing else: q/k/v and
gate/up as one matmul each (the module weights become views of the fused tensors, so no memory
is duplicated), the rotary table computed once by the model's own rotary module, one
preallocated key/value buffer per layer that grows by doubling, and rollback by moving a
length. The operations and their order are those of transformers' Llama with SDPA attention,
so the hidden states equal its output up to float rounding (tests compare them). Every
projection goes through a ``PackedLinear``: on CPU in float32 its weight is reordered once into
oneDNN's blocked layout, which makes a few-token block cost about what one token costs (the
weights are read once either way) and is what makes verifying a draft block cheap on CPU;
elsewhere ``block_linear`` computes it.

Only plain ``LlamaForCausalLM`` models qualify (``unsupported_reason`` says why another does
not): no attention or MLP biases, SiLU MLP, ``nn.Linear`` projections (a DeepSpeed-sharded model
has its own layer types and keeps the transformers path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

#: Positions the key/value buffers hold at first; they double when a request needs more.
INITIAL_CAPACITY = 256


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Return why ``model`` cannot take the plain-torch path, or None when it can."""
    config = model.config
    if config.model_type != "llama":
        return f"model_type {config.model_type!r} is not 'llama'"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "the model has attention or MLP biases"
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r} is not 'silu'"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    if config._attn_implementation != "sdpa":
        return f"attention implementation {config._attn_implementation!r} is not 'sdpa'"
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear or head.bias is not None:
        return "the LM head is not a bias-free nn.Linear"
    for layer in model.get_decoder().layers:
        attention, mlp = layer.self_attn, layer.mlp
        projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj)
        projections += (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(p) is not nn.Linear for p in projections):
            return "a projection is not a plain nn.Linear (e.g. a tensor-parallel shard)"
    return None


def packs_for_onednn(weight: torch.Tensor) -> bool:
    """Return whether ``PackedLinear`` reorders ``weight`` for oneDNN: float32 on a CPU build
    with oneDNN (MKL-DNN)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    )


class PackedLinear:
    """``x @ weight.T`` for row blocks ``x`` [n, in], with ``weight`` [out, in] prepared once.

    On CPU in float32 (``packs_for_onednn``) the weight is copied once into oneDNN's blocked
    layout and every product runs oneDNN's prepacked kernel, the one PyTorch's own CPU inductor
    uses for frozen linears. Against ``block_linear``, the products of SmolLM2-135M's 30 layers
    (random weights of its shapes, 2 threads) took 23–27 ms instead of 33–38 for one row and
    31–37 ms instead of 46–58 for five; oneDNN's kernel given the unpacked weight took 43 ms
    for two rows against 23 packed, so the one-time reorder is what helps. Row i of an
    n-row block is bit-for-bit the product of row i alone (tests check it), so verifying a
    block gives the logits one-token steps would. The copy doubles the projections' memory;
    ``weight`` itself is kept (the model's modules still use it). Elsewhere (GPU, half
    precision), or with ``pack=False`` (to save the memory, or to compare), ``block_linear``.
    """

    def __init__(self, weight: torch.Tensor, pack: bool = True) -> None:
        self.weight = weight
        self.packed: torch.Tensor | None = None
        if pack and packs_for_onednn(weight):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)

    def __call__(self, x: torch.Tensor, packed: bool = True) -> torch.Tensor:
        """Return ``x @ weight.T`` [n, out] for ``x`` [n, in]; ``packed=False`` multiplies the
        unpacked weight even where a packed copy exists (``workers.step_plan``)."""
        if self.packed is None or not packed:
            return block_linear(x, self.weight)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's weights: norms, fused q/k/v, output, fused gate/up, down."""

    input_norm: torch.Tensor
    qkv: PackedLinear
    out: PackedLinear
    post_norm: torch.Tensor
    gate_up: PackedLinear
    down: PackedLinear


def _fuse(linears: list[nn.Linear]) -> torch.Tensor:
    """Return the row-concatenation of the linears' weights and make each weight a view of it."""
    fused = torch.cat([linear.weight.detach() for linear in linears])
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        trainable = linear.weight.requires_grad
        linear.weight = nn.Parameter(fused[start : start + rows], requires_grad=trainable)
        start += rows
    return fused


class LlamaFastDecoder:
    """A Llama decoder's weights plus a batch-1 KV cache; ``forward`` returns the hidden states
    after the final norm (what ``model.get_decoder()(...).last_hidden_state[0]`` returns).

    ``prepack`` (default) gives each projection a oneDNN-packed copy where ``PackedLinear``
    applies; each ``forward`` says which of the two layouts it multiplies.
    """

    def __init__(self, model: PreTrainedModel, prepack: bool = True) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the plain-torch Llama path does not apply: {reason}")
        decoder = model.get_decoder()
        config = model.config
        self._decoder = decoder
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.eps = config.rms_norm_eps
        self.embed = decoder.embed_tokens.weight
        self.final_norm = decoder.norm.weight
        self.layers = [
            _Layer(
                input_norm=layer.input_layernorm.weight,
                qkv=PackedLinear(
                    _fuse([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                    prepack,
                ),
                out=PackedLinear(layer.self_attn.o_proj.weight.detach(), prepack),
                post_norm=layer.post_attention_layernorm.weight,
                gate_up=PackedLinear(_fuse([layer.mlp.gate_proj, layer.mlp.up_proj]), prepack),
                down=PackedLinear(layer.mlp.down_proj.weight.detach(), prepack),
            )
            for layer in decoder.layers
        ]
        self.length = 0
        self._keys: tuple[torch.Tensor, ...] = ()
        self._values: tuple[torch.Tensor, ...] = ()
        self._cos = self._sin = torch.empty(0)
        self._allocate(INITIAL_CAPACITY)

    @property
    def capacity(self) -> int:
        """Number of positions the key/value buffers hold before they must grow."""
        return self._keys[0].shape[-2]

    def _allocate(self, capacity: int) -> None:
        """(Re)allocate buffers for ``capacity`` positions, keeping the cached prefix.

        Each layer's keys and values [1, kv heads, capacity, head dim] are a tensor of their
        own, not views of one: a compiled step writes into them in place only where no two
        inputs share storage (``workers.compiled_step``)."""
        shape = (1, self.n_kv_heads, capacity, self.head_dim)
        keys = tuple(self.embed.new_zeros(shape) for _ in self.layers)
        values = tuple(self.embed.new_zeros(shape) for _ in self.layers)
        for old, new in zip(self._keys + self._values, keys + values, strict=False):
            new[..., : self.length, :] = old[..., : self.length, :]
        self._keys, self._values = keys, values
        positions = torch.arange(capacity, device=self.embed.device)[None]
        cos, sin = self._decoder.rotary_emb(self.embed[:1], positions)
        self._cos, self._sin = cos[0], sin[0]

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` cached positions (rollback after a rejection)."""
        self.length = min(self.length, length)

    def reset(self) -> None:
        """Forget the cached prefix (start of a new request); the buffers are kept."""
        self.length = 0

    def forward(self, ids: torch.Tensor, packed: bool = True) -> torch.Tensor:
        """Return the final hidden states [n, d] of ``ids`` [n] after the cached prefix.

        The new positions' keys and values are appended to the cache. ``packed=False`` runs
        every projection on the unpacked weights even where packed copies exist.
        """
        return self._run(ids, packed, ())[0]

    def forward_layers(
        self, ids: torch.Tensor, packed: bool, layers: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``forward``'s final hidden states [n, d] and the states after each decoder
        layer in ``layers`` [n, k·d], concatenated in their order (the last layer's after the
        final norm: transformers' ``hidden_states[i + 1]``)."""
        final, taken = self._run(ids, packed, layers)
        return final, torch.cat([taken[i] for i in layers], dim=-1)

    def _run(
        self, ids: torch.Tensor, packed: bool, layers: tuple[int, ...]
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Run ``ids`` after the cached prefix; return the final hidden states and the states
        after the decoder layers in ``layers`` (by index)."""
        start, end = self.reserve(ids.numel())
        final, taken = run_block(self, ids, start, packed, layers, EAGER_KERNELS)
        self.length = end
        return final, taken

    def reserve(self, n: int) -> tuple[int, int]:
        """Make room for ``n`` more positions (the buffers double when they must grow) and
        return the positions (start, end) they will take; ``length`` is left to the caller."""
        start, end = self.length, self.length + n
        if end > self.capacity:
            self._allocate(max(end, 2 * self.capacity))
        return start, end


@dataclass(frozen=True)
class Kernels:
    """The two operations of a decoder layer that a compiler rounds differently from PyTorch's
    own kernels (its fused reductions and its SiLU): Llama's RMSNorm (hidden, weight, eps) and
    the MLP's SiLU(gate)·up. ``EAGER_KERNELS`` runs them eagerly; ``workers.compiled_step``
    passes versions a compiled graph calls as opaque ATen-backed operators."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    silu_mul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Return Llama's RMSNorm of ``hidden`` (computed in float32, as transformers does)."""
    as_float = hidden.to(torch.float32)
    variance = as_float.pow(2).mean(-1, keepdim=True)
    return weight * (as_float * torch.rsqrt(variance + eps)).to(hidden.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Return the Llama MLP's SiLU(gate)·up."""
    return F.silu(gate) * up


EAGER_KERNELS = Kernels(rms_norm, silu_mul)


def run_block(
    d: LlamaFastDecoder,
    ids: torch.Tensor,
    start: int,
    packed: bool,
    layers: tuple[int, ...],
    kernels: Kernels,
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Return the final hidden states [n, d] of ``ids`` [n] at positions ``start`` onward over
    the decoder's cached prefix, and the states after the decoder layers in ``layers``; the new
    keys and values are written into the buffers (which must hold ``start + n`` positions).

    The operations and their order are transformers' Llama with SDPA attention over exactly the
    cached prefix; ``kernels`` runs RMSNorm and SiLU·up. ``decoder.length`` is not moved.
    """
    n = ids.numel()
    end = start + n
    cos, sin = d._cos[start:end], d._sin[start:end]
    mask = None
    if n > 1:
        mask = torch.ones(n, end, dtype=torch.bool, device=ids.device).tril(start)
    n_q, n_kv = d.n_heads * d.head_dim, d.n_kv_heads * d.head_dim
    gqa = d.n_heads != d.n_kv_heads
    hidden = F.embedding(ids, d.embed)
    taken: dict[int, torch.Tensor] = {}
    for index, layer in enumerate(d.layers):
        if index - 1 in layers:
            taken[index - 1] = hidden
        normed = kernels.rms_norm(hidden, layer.input_norm, d.eps)
        q, k, v = layer.qkv(normed, packed).split([n_q, n_kv, n_kv], dim=-1)
        q = rotate(q.view(n, d.n_heads, d.head_dim).transpose(0, 1), cos, sin)
        k = rotate(k.view(n, d.n_kv_heads, d.head_dim).transpose(0, 1), cos, sin)
        keys, values = d._keys[index], d._values[index]
        keys[0, :, start:end] = k
        values[0, :, start:end] = v.view(n, d.n_kv_heads, d.head_dim).transpose(0, 1)
        attended = F.scaled_dot_product_attention(
            q[None], keys[:, :, :end], values[:, :, :end], attn_mask=mask, enable_gqa=gqa
        )
        attended = attended[0].transpose(0, 1).reshape(n, n_q)
        hidden = hidden + layer.out(attended, packed)
        normed = kernels.rms_norm(hidden, layer.post_norm, d.eps)
        gate, up = layer.gate_up(normed, packed).chunk(2, -1)
        hidden = hidden + layer.down(kernels.silu_mul(gate, up), packed)
    final = kernels.rms_norm(hidden, d.final_norm, d.eps)
    if layers:
        taken[len(d.layers) - 1] = final
    return final, taken


def block_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Return ``x @ weight.T`` for ``x`` [n, in] and ``weight`` [out, in], as ``F.linear`` does.

    One row goes through ``F.linear`` (a matrix-vector product). A block of several rows is
    computed as ``(weight @ x.T).T``: the same dot products, but MKL's kernel for a few-row
    block times a transposed weight is far slower than for the weight on the left (the former
    toy demo target's 5-token block took 1.48x a 1-token step with ``F.linear``, 1.2x this
    way). ``PackedLinear`` uses it where it does not prepack the weight.
    """
    if x.shape[0] == 1:
        return F.linear(x, weight)
    return torch.mm(weight, x.t()).t().contiguous()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Return the rotary embedding of ``x`` [heads, n, head_dim] (transformers' formula)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
