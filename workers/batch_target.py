"""The target side of batched decoding, in process and over a target's channel.

The batched engine (``workers.batch_engine``) drives a :class:`workers.batch_cache.BatchedLM`
of the target. :class:`BatchTarget` holds that cache next to the model (one per batch size),
runs the AR baseline's whole batched token loop there (``batch_generate``, as the batch-1
baseline runs in the target worker) and serves one batched forward a call (``batch_forward``).
:class:`ChannelBatchedLM` is that cache as the draft side sees it: rollback and freeing a row
only move the row lengths it keeps, and each forward sends the rows' lengths along with their
blocks, so a round costs one call. A forward's answer is the logits (and final hidden states)
of the rows it scored, moved to the CPU: O(rows · V) per round, where the batch-1 protocol
sends O(K + V), the price of judging each sequence on the draft side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from workers.batch_cache import BatchedLM, BatchStep
from workers.batch_engine import BatchRequest, batch_autoregressive_generate
from workers.lm import CachedLM
from workers.records import GenerationResult

#: The target's channel methods :class:`BatchTarget` serves.
BATCH_METHODS = frozenset({"batch_forward", "batch_generate"})


class BatchTarget:
    """Batched caches over one target model, one per batch size, built on first use."""

    def __init__(self, lm: CachedLM) -> None:
        self.lm = lm
        self.caches: dict[int, BatchedLM] = {}

    def batched(self, slots: int) -> BatchedLM:
        """Return the target's cache of ``slots`` rows (raises ValueError off the plain-torch
        Llama path)."""
        if slots not in self.caches:
            self.caches[slots] = BatchedLM(self.lm, slots)
        return self.caches[slots]

    def batch_forward(
        self,
        slots: int,
        rows: list[int],
        starts: list[int],
        blocks: list[torch.Tensor],
        last_only: bool,
    ) -> BatchStep:
        """Run ``blocks`` after the first ``starts[i]`` cached positions of ``rows[i]`` of the
        ``slots``-row cache; return the step on the CPU."""
        cache = self.batched(slots)
        for row, start in zip(rows, starts, strict=True):
            cache.lengths[row] = start
        step = cache.forward(rows, blocks, last_only)
        return BatchStep(step.logits.cpu(), step.hidden.cpu(), step.offsets, step.counts)

    def batch_generate(
        self, requests: Sequence[BatchRequest], slots: int
    ) -> list[GenerationResult]:
        """Decode ``requests`` with the target alone, ``slots`` at a time (the AR baseline)."""
        return batch_autoregressive_generate(self.batched(slots), requests)


class ChannelBatchedLM:
    """A target's batched cache of ``slots`` rows behind ``call`` (a channel's
    ``method, *args`` call), with :class:`BatchedLM`'s interface for the batched engine."""

    def __init__(self, call: Callable[..., object], slots: int) -> None:
        if slots < 1:
            raise ValueError(f"the batch needs at least one slot, got slots={slots}")
        self.call = call
        self.slots = slots
        self.lengths = [0] * slots

    def reset(self, slot: int) -> None:
        """Free ``slot`` for a new request (its length becomes 0)."""
        self.lengths[slot] = 0

    def crop(self, slot: int, length: int) -> None:
        """Keep only the first ``length`` cached positions of ``slot``."""
        self.lengths[slot] = min(self.lengths[slot], length)

    def forward(self, slots: list[int], blocks: list[torch.Tensor], last_only: bool) -> BatchStep:
        """Run ``blocks[i]`` after the cached prefix of ``slots[i]`` on the target."""
        starts = [self.lengths[slot] for slot in slots]
        sent = [block.detach().to("cpu", torch.long).view(-1) for block in blocks]
        step = self.call("batch_forward", self.slots, slots, starts, sent, last_only)
        assert isinstance(step, BatchStep)
        for slot, start, block in zip(slots, starts, sent, strict=True):
            self.lengths[slot] = start + block.numel()
        return step
