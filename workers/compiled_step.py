"""Compiled decode and verify steps of the fast Llama path (``torch.compile``, inductor).

``CompiledSteps`` runs ``workers.llama_fast.run_block`` on the decoder's unpacked weights through
``torch.compile``, with attention over exactly the cached prefix (the prefix length is a dynamic
size of the graph) and Llama's RMSNorm and SiLU·up as opaque operators (``KEPT_KERNELS``:
``specsweep::rms_norm``, ``specsweep::silu_mul``) whose bodies are the eager functions. Inductor
fuses what is left (rotary embedding, residual adds, copies) and calls ATen's kernels for the
products and attention, so every output is bit for bit the eager unpacked forward's in float32
on CPU (tests assert equality). Left to inductor, its fused RMSNorm reduction and its SiLU round
differently (up to 7e-7 on the tiny test model): the two operators are what makes the graph
exact. ``CachedLM(compiled_steps=True)`` offers it as a third layout, "compiled", timed against
the eager ones at load (``workers.step_plan``). Three graphs, all made by ``warm``, cover every
block size and length (a one-token step at one length, then one-token steps and blocks with
symbolic sizes); compiled code is cached on disk by inductor, under
``$SPECSWEEP_CACHE/inductor`` where the caller sets it (``use_compile_cache``).

The earlier static-shape design (key/value buffers at full capacity, attention over the whole
buffer with the tail masked: the shape CUDA graphs need) rounded differently from attention over
the prefix (3e-7 in one call) and was removed after 8ccec5a (in git history there;
docs/lab/bench-compiled-steps.md). Inductor cannot lower the oneDNN-packed product, so only the
unpacked weights compile.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from workers.llama_fast import Kernels, LlamaFastDecoder, rms_norm, run_block, silu_mul

#: The environment variable naming torch inductor's on-disk cache (compiled graphs, kernels).
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"

#: The forwards ``CompiledSteps.warm`` runs (block size, one-token steps before it): one-token
#: steps at two lengths and blocks of two sizes, after which the one-token graph and the block
#: graph have symbolic lengths (torch's automatic dynamic shapes recompile once a size changes).
WARM_SCHEDULE = ((1, 0), (1, 1), (2, 0), (3, 1))


@torch.library.custom_op("specsweep::rms_norm", mutates_args=())
def kept_rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``workers.llama_fast.rms_norm`` as an operator a compiled graph calls as it is."""
    return rms_norm(hidden, weight, eps)


@kept_rms_norm.register_fake
def _rms_norm_shape(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The output's shape and dtype for tracing."""
    return torch.empty_like(hidden)


@torch.library.custom_op("specsweep::silu_mul", mutates_args=())
def kept_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``workers.llama_fast.silu_mul`` as an operator a compiled graph calls as it is."""
    return silu_mul(gate, up)


@kept_silu_mul.register_fake
def _silu_mul_shape(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The output's shape and dtype for tracing."""
    return torch.empty_like(gate)


#: The kernels compiled steps run: RMSNorm and SiLU·up left to PyTorch's own kernels.
KEPT_KERNELS = Kernels(kept_rms_norm, kept_silu_mul)


def _compiled_block(decoder: LlamaFastDecoder, ids: torch.Tensor, start: int) -> torch.Tensor:
    """Return ``run_block``'s final hidden states on the unpacked weights with the kept
    kernels (the function ``CompiledSteps`` compiles)."""
    return run_block(decoder, ids, start, False, (), KEPT_KERNELS)[0]


class CompiledSteps:
    """Forwards of one ``LlamaFastDecoder`` on its unpacked weights through ``torch.compile``,
    bit-equal to ``decoder.forward(ids, packed=False)`` (see the module).

    They share the decoder's cache and length, so compiled and eager forwards alternate freely
    across rollbacks. ``compile_seconds`` sums the calls that compiled a graph (the call's own
    run included) and ``graphs`` counts them.
    """

    def __init__(self, decoder: LlamaFastDecoder) -> None:
        self.decoder = decoder
        self.compile_seconds = 0.0
        self.graphs = 0
        self._run = torch.compile(_compiled_block, dynamic=None)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Return the final hidden states [n, d] of ``ids`` [n] after the cached prefix and
        append them to the cache, as ``LlamaFastDecoder.forward(ids, packed=False)`` does."""
        start, end = self.decoder.reserve(ids.numel())
        before = _unique_graphs()
        began = time.perf_counter()
        hidden = self._run(self.decoder, ids, start)
        if _unique_graphs() > before:
            self.compile_seconds += time.perf_counter() - began
            self.graphs += _unique_graphs() - before
        self.decoder.length = end
        return hidden

    def warm(self) -> float:
        """Compile the one-token and the block graph now and return the seconds it took: the
        forwards of ``WARM_SCHEDULE`` (block size, one-token steps before it) after the cached
        prefix, which is restored."""
        length, spent = self.decoder.length, self.compile_seconds
        ids = torch.zeros(max(n for n, _ in WARM_SCHEDULE), dtype=torch.long)
        ids = ids.to(self.decoder.embed.device)
        for n, steps_before in WARM_SCHEDULE:
            self.decoder.crop(length)
            for _ in range(steps_before):
                self.forward(ids[:1])
            self.forward(ids[:n])
        self.decoder.crop(length)
        return self.compile_seconds - spent


def _unique_graphs() -> int:
    """Return how many graphs torch.compile has made in this process."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


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
