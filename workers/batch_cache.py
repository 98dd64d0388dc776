"""A batched KV cache over a fast Llama decoder: ``slots`` rows, each with its own length.

``BatchedLM`` shares the weights (decoder layers, LM head, step plan) of a :class:`CachedLM`
on the plain-torch Llama path (``workers.llama_fast``) and holds its own key/value buffers of
shape [layers, slots, kv heads, capacity, head dim]. A forward runs a block of tokens on a
subset of the slots at once, each block after that slot's own cached prefix: blocks of unequal
length are padded on the right to the longest, every row gets the rotary positions of its own
length, and an attention mask lets each query see only its row's keys up to its own position,
so stale keys beyond a row's length (a rolled-back draft, another row's padding) are never
read. Rollback is per row: ``crop(slot, length)`` moves that row's length and touches no other.
A slot is freed by ``reset(slot)`` and reused by the next request (continuous batching).

Exactness. A row of a batched forward computes what the batch-1 decoder computes, operation
for operation, but not always bit for bit: its keys sit in a longer padded buffer, so
attention's softmax may sum in another order, and the projections multiply more rows (bit for
bit alike only on the oneDNN-packed layout, ``workers.step_plan``). A forward of one row runs
exactly as :class:`workers.lm.CachedLM` runs it (same mask, layout and padding of one-token
steps), so batch 1 is bit for bit the batch-1 path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workers.llama_fast import (
    INITIAL_CAPACITY,
    LlamaFastDecoder,
    rms_norm,
    silu_mul,
    unsupported_reason,
)
from workers.lm import CachedLM, head_logits


@dataclass(frozen=True)
class BatchStep:
    """Logits [m, V] and final hidden states [m, d] of the rows a batched forward returned.

    Row i of the forward owns rows ``offsets[i] : offsets[i] + counts[i]``.
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    offsets: tuple[int, ...]
    counts: tuple[int, ...]

    def logits_of(self, row: int) -> torch.Tensor:
        """Return the logits [counts[row], V] of forward row ``row``."""
        start = self.offsets[row]
        return self.logits[start : start + self.counts[row]]

    def hidden_of(self, row: int) -> torch.Tensor:
        """Return the hidden states [counts[row], d] of forward row ``row``."""
        start = self.offsets[row]
        return self.hidden[start : start + self.counts[row]]


class BatchedLM:
    """A batched KV cache of ``slots`` rows over ``lm``'s weights (see the module docstring).

    Raises ValueError when ``lm`` is not on the plain-torch Llama path.
    """

    def __init__(self, lm: CachedLM, slots: int) -> None:
        if lm.fast_decoder is None:
            reason = unsupported_reason(lm.model) or "the model was loaded with fast=False"
            raise ValueError(f"batched decoding needs the plain-torch Llama path: {reason}")
        if slots < 1:
            raise ValueError(f"the batch needs at least one slot, got slots={slots}")
        self.lm = lm
        self.fast: LlamaFastDecoder = lm.fast_decoder
        self.slots = slots
        self.device = lm.device
        self.lengths = [0] * slots
        self._keys = self._values = self._cos = self._sin = torch.empty(0)
        self._allocate(INITIAL_CAPACITY)

    @property
    def capacity(self) -> int:
        """Positions each row's key/value buffers hold before they must grow."""
        return self._keys.shape[-2]

    def _allocate(self, capacity: int) -> None:
        """(Re)allocate the buffers for ``capacity`` positions, keeping every cached prefix."""
        fast = self.fast
        shape = (len(fast.layers), self.slots, fast.n_kv_heads, capacity, fast.head_dim)
        keys, values = fast.embed.new_zeros(shape), fast.embed.new_zeros(shape)
        kept = min(max(self.lengths), self.capacity) if self._keys.numel() else 0
        if kept:
            keys[..., :kept, :] = self._keys[..., :kept, :]
            values[..., :kept, :] = self._values[..., :kept, :]
        self._keys, self._values = keys, values
        positions = torch.arange(capacity, device=fast.embed.device)[None]
        cos, sin = fast._decoder.rotary_emb(fast.embed[:1], positions)
        self._cos, self._sin = cos[0], sin[0]

    def reset(self, slot: int) -> None:
        """Free ``slot`` for a new request (its length becomes 0)."""
        self.lengths[slot] = 0

    def crop(self, slot: int, length: int) -> None:
        """Keep only the first ``length`` cached positions of ``slot`` (its rollback)."""
        self.lengths[slot] = min(self.lengths[slot], length)

    @torch.inference_mode()
    def forward(self, slots: list[int], blocks: list[torch.Tensor], last_only: bool) -> BatchStep:
        """Run ``blocks[i]`` (1-D token ids) after the cached prefix of ``slots[i]``, for every
        i in one forward, and append them to those rows' caches.

        Returns the last position of each block (``last_only``) or all of its positions.
        Raises ValueError for an empty block.
        """
        counts = [int(block.numel()) for block in blocks]
        if not counts or min(counts) == 0:
            raise ValueError("every row of a batched forward needs at least one token")
        width = max(counts)
        padded = len(blocks) == 1 and width == 1 and self.lm.plan.padded
        if padded:  # a one-token step of one row runs as CachedLM runs it: as a 2-token block
            blocks, width = [blocks[0].repeat(2)], 2
        if len(blocks) == 1:
            ids = blocks[0].view(1, -1).to(self.device)
        else:
            ids = torch.zeros(len(blocks), width, dtype=torch.long, device=self.device)
            for row, block in enumerate(blocks):
                ids[row, : block.numel()] = block.view(-1).to(self.device)
        starts = [self.lengths[slot] for slot in slots]
        packed = self.lm.plan.layout(ids.numel()) == "packed"
        hidden = self._decode(slots, ids, starts, packed)
        for slot, start, count in zip(slots, starts, counts, strict=True):
            self.lengths[slot] = start + count
        # A padded step sends both positions through the head, as CachedLM does.
        hidden = hidden.reshape(-1, hidden.shape[-1])
        if len(blocks) > 1:
            hidden = hidden[_picked_rows(counts, width, last_only)]
        elif last_only and not padded:
            hidden = hidden[-1:]
        lm = self.lm
        logits = head_logits(lm.head, lm.restricted, hidden, lm.head_product, packed)
        if padded:
            logits, hidden = logits[:1], hidden[:1]
        kept = [1] * len(counts) if last_only else counts
        offsets = [sum(kept[:row]) for row in range(len(kept))]
        return BatchStep(logits, hidden, tuple(offsets), tuple(kept))

    def _decode(
        self, slots: list[int], ids: torch.Tensor, starts: list[int], packed: bool
    ) -> torch.Tensor:
        """Return the final hidden states [b, n] of ``ids`` [b, n] after each row's prefix,
        writing their keys and values at each row's own positions."""
        fast = self.fast
        batch, width = ids.shape
        end = max(starts) + width
        if end > self.capacity:
            self._allocate(max(end, 2 * self.capacity))
        positions = torch.tensor(starts, device=self.device)[:, None] + torch.arange(width)
        if batch == 1:  # one row: the batch-1 decoder's slices, shapes and mask
            cos, sin = self._cos[starts[0] : end], self._sin[starts[0] : end]
        else:
            cos, sin = self._cos[positions][:, None], self._sin[positions][:, None]
        mask = _attention_mask(positions, end)
        n_q, n_kv = fast.n_heads * fast.head_dim, fast.n_kv_heads * fast.head_dim
        gqa = fast.n_heads != fast.n_kv_heads
        rows = torch.tensor(slots, device=self.device)
        hidden = F.embedding(ids.view(-1), fast.embed)
        for index, layer in enumerate(fast.layers):
            normed = rms_norm(hidden, layer.input_norm, fast.eps)
            q, k, v = layer.qkv(normed, packed).split([n_q, n_kv, n_kv], dim=-1)
            q = _rotate(_heads(q, batch, width, fast.n_heads), cos, sin)
            k = _rotate(_heads(k, batch, width, fast.n_kv_heads), cos, sin)
            v = _heads(v, batch, width, fast.n_kv_heads)
            if batch == 1:
                q = q[None]
                keys, values = self._write_row(index, slots[0], starts[0], k, v, end)
            else:
                keys, values = self._write(index, slots, rows, positions, k, v, end)
            attended = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, enable_gqa=gqa
            )
            attended = attended.transpose(1, 2).reshape(batch * width, n_q)
            hidden = hidden + layer.out(attended, packed)
            normed = rms_norm(hidden, layer.post_norm, fast.eps)
            gate, up = layer.gate_up(normed, packed).chunk(2, -1)
            hidden = hidden + layer.down(silu_mul(gate, up), packed)
        return rms_norm(hidden, fast.final_norm, fast.eps).view(batch, width, -1)

    def _write_row(
        self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one row's keys and values [heads, n, head_dim] at ``start`` of ``slot`` in
        layer ``layer``; return that row's keys and values [1, heads, end, head_dim]."""
        keys, values = self._keys[layer, slot], self._values[layer, slot]
        keys[:, start : start + k.shape[1]] = k
        values[:, start : start + v.shape[1]] = v
        return keys[None, :, :end], values[None, :, :end]

    def _write(
        self,
        layer: int,
        slots: list[int],
        rows: torch.Tensor,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        end: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys and values [b, heads, n, head_dim] at each row's positions of layer
        ``layer``; return the rows' keys and values up to ``end`` for attention."""
        keys, values = self._keys[layer], self._values[layer]
        keys[rows[:, None], :, positions] = k.transpose(1, 2)
        values[rows[:, None], :, positions] = v.transpose(1, 2)
        if slots == list(range(self.slots)):
            return keys[:, :, :end], values[:, :, :end]
        return keys[:, :, :end].index_select(0, rows), values[:, :, :end].index_select(0, rows)


def _attention_mask(positions: torch.Tensor, end: int) -> torch.Tensor | None:
    """Return the boolean mask [b, 1, n, end] letting each query see its row's keys up to its
    own position; for one row, the batch-1 decoder's: None for a one-token step (it sees every
    cached key), else [n, end]."""
    batch, width = positions.shape
    if batch == 1:
        if width == 1:
            return None
        start = int(positions[0, 0])
        return torch.ones(width, end, dtype=torch.bool, device=positions.device).tril(start)
    keys = torch.arange(end, device=positions.device)
    return (keys[None, None, :] <= positions[:, :, None])[:, None]


def _picked_rows(counts: list[int], width: int, last_only: bool) -> torch.Tensor:
    """Return the flat indices (into [b * width]) of the positions a forward returns."""
    if last_only:
        picks = [row * width + count - 1 for row, count in enumerate(counts)]
    else:
        picks = [row * width + i for row, count in enumerate(counts) for i in range(count)]
    return torch.tensor(picks, dtype=torch.long)


def _heads(x: torch.Tensor, batch: int, width: int, heads: int) -> torch.Tensor:
    """Return projections [b * n, heads * head_dim] as [b, heads, n, head_dim], or for one row
    as [heads, n, head_dim] (the batch-1 decoder's shape: its elementwise ops run faster)."""
    if batch == 1:
        return x.view(width, heads, -1).transpose(0, 1)
    return x.view(batch, width, heads, -1).transpose(1, 2)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Return the rotary embedding of ``x`` [b, heads, n, head_dim] with per-row ``cos`` and
    ``sin`` [b, 1, n, head_dim], or of one row's [heads, n, head_dim] with [n, head_dim]
    (transformers' formula, as ``workers.llama_fast``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
