"""A static-shape forward of the fast Llama path, for ``torch.compile`` (an experiment, not wired).

Issue #45 point 4 asks for compiled decode and verify steps: one graph per block size over a
static KV cache, bit-equal to the eager path in float32 on CPU. ``static_forward`` is that
forward: the key/value buffers keep their full capacity, the start position is a tensor, new
keys and values are written with ``index_copy_`` and attention runs over the whole buffer with
a mask for the unused tail, so a graph depends on the block size only and a rollback stays a
length change (``LlamaFastDecoder.crop``). It shares the decoder's buffers, so eager and compiled
forwards can alternate on one cache.

What it found on CPU (torch 2.13, docs/lab/bench-compiled-steps.md), and why ``CachedLM`` does
not use it:

- Not bit-equal even uncompiled: scaled_dot_product_attention over the full buffer with the
  tail masked differs from attention over the cached prefix only (the eager path) by up to
  3e-7 in a single call; its result depends on the key length, not only on the unmasked keys.
  Bit-equality therefore needs attention over exactly the cached length, a dynamic shape.
- Inductor cannot lower the oneDNN-packed product (``mkldnn._linear_pointwise`` on a weight
  that is not a frozen constant): only the "unpacked" layout compiles.
- Compiled on the unpacked layout it differs from the same function run eagerly by up to 5e-7
  (inductor's fused reductions round differently), and compiling took 25 to 122 s per block
  size for the 3-layer micro target on the shared 2-core machine (1.5 to 5 s from the cache).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from workers.llama_fast import LlamaFastDecoder, rotate

#: The environment variable naming torch inductor's on-disk cache (compiled graphs, kernels).
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"

StaticForward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def use_compile_cache(directory: Path) -> Path:
    """Point torch inductor's cache at ``directory`` unless ``TORCHINDUCTOR_CACHE_DIR`` names
    another place; return the directory in use. Call it before the first compile.

    Importing transformers' models already sets the variable to torch's default (a temporary
    directory), so that value counts as unset.
    """
    current = os.environ.get(INDUCTOR_CACHE_ENV)
    if current is None or Path(current) == Path(default_cache_dir()):
        os.environ[INDUCTOR_CACHE_ENV] = str(directory)
    return Path(os.environ[INDUCTOR_CACHE_ENV])


def static_forward(
    decoder: LlamaFastDecoder, ids: torch.Tensor, start: torch.Tensor, packed: bool = False
) -> torch.Tensor:
    """Return the final hidden states [n, d] of ``ids`` [n] written at positions ``start`` (a
    0-d long tensor) onward, over the decoder's whole key/value buffers with the tail masked.

    The caller moves ``decoder.length`` (``StaticSteps.forward``); the buffers must already
    hold ``start + n`` positions.
    """
    d = decoder
    n = ids.numel()
    positions = start + torch.arange(n, device=ids.device)
    cos, sin = d._cos.index_select(0, positions), d._sin.index_select(0, positions)
    capacity = d._keys.shape[-2]
    mask = torch.arange(capacity, device=ids.device)[None, :] <= positions[:, None]
    n_q, n_kv = d.n_heads * d.head_dim, d.n_kv_heads * d.head_dim
    hidden = F.embedding(ids, d.embed)
    for index, layer in enumerate(d.layers):
        normed = d._rms_norm(hidden, layer.input_norm)
        q, k, v = layer.qkv(normed, packed).split([n_q, n_kv, n_kv], dim=-1)
        q = rotate(q.view(n, d.n_heads, d.head_dim).transpose(0, 1), cos, sin)
        k = rotate(k.view(n, d.n_kv_heads, d.head_dim).transpose(0, 1), cos, sin)
        v = v.view(n, d.n_kv_heads, d.head_dim).transpose(0, 1)
        d._keys[index, 0].index_copy_(1, positions, k)
        d._values[index, 0].index_copy_(1, positions, v)
        attended = F.scaled_dot_product_attention(
            q[None],
            d._keys[index],
            d._values[index],
            attn_mask=mask,
            enable_gqa=d.n_heads != d.n_kv_heads,
        )
        hidden = hidden + layer.out(attended[0].transpose(0, 1).reshape(n, n_q), packed)
        normed = d._rms_norm(hidden, layer.post_norm)
        gate, up = layer.gate_up(normed, packed).chunk(2, -1)
        hidden = hidden + layer.down(F.silu(gate) * up, packed)
    return d._rms_norm(hidden, d.final_norm)


class StaticSteps:
    """Forwards of one ``LlamaFastDecoder`` through ``static_forward``, compiled or not.

    ``capacity`` positions are allocated at once (the static shape; a request must fit).
    ``compiled`` wraps the forward in ``torch.compile(dynamic=False)``: one graph per block
    size, reused across steps and rollbacks. ``packed`` multiplies the oneDNN-packed weights,
    which only the uncompiled forward can.
    """

    def __init__(
        self, decoder: LlamaFastDecoder, capacity: int, compiled: bool, packed: bool = False
    ) -> None:
        if compiled and packed:
            raise ValueError("packed=True cannot be compiled: inductor cannot lower oneDNN's op")
        self.decoder = decoder
        if decoder.capacity < capacity:
            decoder._allocate(capacity)
        self.packed = packed

        def run(ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
            return static_forward(decoder, ids, start, packed)

        self._run: StaticForward = torch.compile(run, dynamic=False) if compiled else run

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Return the final hidden states [n, d] of ``ids`` [n] after the cached prefix and
        append them to the cache, as ``LlamaFastDecoder.forward`` does."""
        start = self.decoder.length
        end = start + ids.numel()
        if end > self.decoder.capacity:
            raise ValueError(
                f"{end} positions exceed the static cache's {self.decoder.capacity}: "
                "give StaticSteps a larger capacity"
            )
        hidden = self._run(ids, torch.tensor(start, device=ids.device))
        self.decoder.length = end
        return hidden
