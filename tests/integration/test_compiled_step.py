"""Compiled steps of the fast path (``workers.compiled_step``, issue #45 point 4).

``CompiledSteps`` (the "compiled" layout of ``CachedLM``) must be bit for bit the eager unpacked
forward at every block size and cached length, across rollbacks, with its graphs all made by
``warm``; ``CachedLM`` must then decode the same tokens from the same logits on it as on the
unpacked layout. Compiling takes tens of seconds on this CPU, so these tests are slow and share
one inductor cache per module.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
from support.tiny_models import build_tiny_pair
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from workers.compiled_step import WARM_SCHEDULE, CompiledSteps, use_compile_cache
from workers.llama_fast import LlamaFastDecoder
from workers.lm import CachedLM
from workers.records import RequestSettings, SamplingConfig
from workers.step_plan import StepPlan
from workers.target import LocalTarget

#: (block size, tokens kept after it) of the alternating schedule the tests run.
SCHEDULE = ((1, 1), (3, 1), (1, 1), (3, 3), (3, 0), (1, 1))


def _prefilled(decoder: LlamaFastDecoder, seed: int) -> torch.Generator:
    """Run a 7-token prompt eagerly into ``decoder``; return the generator of later tokens."""
    generator = torch.Generator().manual_seed(seed)
    decoder.forward(torch.randint(2, 90, (7,), generator=generator), packed=False)
    return generator


def _run_schedule(
    decoder: LlamaFastDecoder,
    forward: Callable[[torch.Tensor], torch.Tensor],
    generator: torch.Generator,
    schedule: tuple[tuple[int, int], ...] = SCHEDULE,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Alternate ``forward`` and eager unpacked forwards of the same tokens over ``schedule``
    with rollbacks; return each block's (``forward``'s, eager) hidden states."""
    outputs = []
    for n, keep in schedule:
        ids = torch.randint(2, 90, (n,), generator=generator)
        length = decoder.length
        eager = decoder.forward(ids, packed=False)
        decoder.crop(length)
        mine = forward(ids)
        assert decoder.length == length + n
        outputs.append((mine, eager))
        decoder.crop(length + keep)
    return outputs


def test_compile_cache_moves_from_torchs_default_but_keeps_a_users_choice(
    tmp_path, monkeypatch
) -> None:
    mine = tmp_path / "specsweep" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert use_compile_cache(mine) == mine
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    assert use_compile_cache(mine) == tmp_path / "users"


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory) -> None:
    """Compile into one temporary inductor cache for the module (restored after)."""
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor"))
    yield
    if before is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


@pytest.fixture
def fresh_compile(inductor_cache) -> None:
    """Forget the graphs earlier tests compiled, so that each test compiles its own (its
    compile counts do not depend on the order the tests run in)."""
    torch._dynamo.reset()


@pytest.mark.slow
@torch.inference_mode()
def test_compiled_steps_are_bit_equal_to_eager_unpacked_steps_across_rollbacks(
    fresh_compile,
) -> None:
    _, target = build_tiny_pair(seed=3)
    decoder = LlamaFastDecoder(target)
    generator = _prefilled(decoder, 1)
    compiled = CompiledSteps(decoder)
    assert compiled.warm() > 0
    assert decoder.length == 7 and compiled.graphs >= 2
    graphs = compiled.graphs
    schedule = (*SCHEDULE, (2, 2), (4, 2), (6, 3), (8, 8), (1, 1))
    for mine, eager in _run_schedule(decoder, compiled.forward, generator, schedule * 2):
        assert torch.equal(mine, eager), float((mine - eager).abs().max())
    assert compiled.graphs == graphs  # warm made every graph the schedule needs
    assert graphs <= len(WARM_SCHEDULE)


@pytest.mark.slow
@torch.inference_mode()
def test_cached_lm_decodes_the_same_tokens_from_the_same_logits_on_the_compiled_layout(
    fresh_compile,
) -> None:
    _, target = build_tiny_pair(seed=3)
    lm = CachedLM(target, compiled_steps=True)
    assert "compiled" in lm.layouts and lm.calibration is not None
    assert lm.calibration.compile_seconds is not None and lm.calibration.compile_seconds > 0
    assert set(lm.calibration.seconds) == {"packed", "unpacked", "compiled"}
    prompt = torch.randint(2, 90, (9,), generator=torch.Generator().manual_seed(4))
    settings = RequestSettings(
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=12), seed=0, eos_token_id=None
    )
    outputs, logits = {}, {}
    for layout in ("unpacked", "compiled"):
        lm.plan = StepPlan.uniform(layout)
        outputs[layout] = LocalTarget(lm).generate(prompt, settings).output_ids
        lm.reset()
        first = lm.forward(prompt[:5]).logits
        block = lm.forward(prompt[5:]).logits
        logits[layout] = torch.cat([first, block])
        lm.reset()
    assert outputs["compiled"] == outputs["unpacked"] and len(outputs["compiled"]) == 12
    assert torch.equal(logits["compiled"], logits["unpacked"])


def test_a_plan_with_compiled_steps_needs_a_model_loaded_with_them() -> None:
    _, target = build_tiny_pair(seed=3)
    with pytest.raises(ValueError, match="compiled_steps=True"):
        CachedLM(target, single_step=StepPlan.uniform("compiled"))
    _, target = build_tiny_pair(seed=3)
    with pytest.raises(ValueError, match="plain-torch Llama path"):
        CachedLM(target, fast=False, compiled_steps=True)
