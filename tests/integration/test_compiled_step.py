"""The static-shape forward of ``workers.compiled_step`` (issue #45 point 4, an experiment).

It shares the fast decoder's cache, so it alternates with eager forwards across rollbacks; it
is close to the eager path, not bit-equal (attention over the whole masked buffer rounds
differently from attention over the cached prefix, see the module); compiled, it keeps one graph
per block size across steps and rollbacks. Compiling takes a minute or more on a busy CPU, so
that test is slow and runs the 1-layer tiny model at two block sizes.
"""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import build_tiny_pair
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from workers.compiled_step import StaticSteps, use_compile_cache
from workers.llama_fast import LlamaFastDecoder

#: Largest difference allowed from the eager path (float32 rounding of a few-layer model).
TOLERANCE = 1e-5


def _run_schedule(decoder: LlamaFastDecoder, static: StaticSteps) -> list[float]:
    """Prefill eagerly, then alternate static and eager forwards of 1 and 3 tokens with
    rollbacks; return the largest difference of each static forward from the eager one."""
    differences = []
    generator = torch.Generator().manual_seed(0)
    decoder.forward(torch.randint(2, 90, (7,), generator=generator), packed=False)
    for n, keep in ((1, 1), (3, 1), (1, 1), (3, 3), (3, 0), (1, 1)):
        ids = torch.randint(2, 90, (n,), generator=generator)
        length = decoder.length
        eager = decoder.forward(ids, packed=False)
        decoder.crop(length)
        mine = static.forward(ids)
        assert decoder.length == length + n
        differences.append(float((mine - eager).abs().max()))
        decoder.crop(length + keep)
    return differences


@torch.inference_mode()
def test_static_forward_alternates_with_eager_steps_across_rollbacks() -> None:
    _, target = build_tiny_pair(seed=2)
    decoder = LlamaFastDecoder(target)
    differences = _run_schedule(decoder, StaticSteps(decoder, 64, compiled=False))
    assert max(differences) < TOLERANCE


def test_static_steps_refuse_what_they_cannot_run() -> None:
    _, target = build_tiny_pair(seed=2)
    decoder = LlamaFastDecoder(target)
    with pytest.raises(ValueError, match="inductor"):
        StaticSteps(decoder, 64, compiled=True, packed=True)
    static = StaticSteps(decoder, 8, compiled=False)
    assert decoder.capacity >= 8
    decoder.length = decoder.capacity - 1
    with pytest.raises(ValueError, match="larger capacity"), torch.inference_mode():
        static.forward(torch.tensor([2, 3]))


@pytest.mark.slow
@torch.inference_mode()
def test_compiled_steps_keep_one_graph_per_block_size(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert use_compile_cache(tmp_path / "inductor") == tmp_path / "inductor"
    torch._dynamo.reset()
    draft, _ = build_tiny_pair(seed=2)
    decoder = LlamaFastDecoder(draft)
    differences = _run_schedule(decoder, StaticSteps(decoder, 64, compiled=True))
    assert max(differences) < TOLERANCE
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


def test_compile_cache_moves_from_torchs_default_but_keeps_a_users_choice(
    tmp_path, monkeypatch
) -> None:
    mine = tmp_path / "specsweep" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert use_compile_cache(mine) == mine
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    assert use_compile_cache(mine) == tmp_path / "users"
