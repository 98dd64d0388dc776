"""AR and static-K runs taken in turns: what the engine benchmark and the zoo cards report."""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import build_tiny_pair, prompts

from workers.engine import RequestSettings, autoregressive_generate
from workers.lm import CachedLM
from workers.records import SamplingConfig
from workers.static_comparison import compare_static_k
from workers.target import LocalTarget

torch.set_num_threads(1)


def test_every_draft_and_k_decodes_every_prompt_to_the_targets_tokens() -> None:
    draft_a, target = build_tiny_pair(seed=3)
    draft_b, _ = build_tiny_pair(seed=4)
    settings = RequestSettings(SamplingConfig(max_new_tokens=12))
    target_side = LocalTarget(CachedLM(target))
    drafts = {"a": CachedLM(draft_a), "b": CachedLM(draft_b)}
    batch = prompts(3, seed=6)
    runs = compare_static_k(target_side, drafts, batch, settings, ks=(1, 3))
    assert set(runs.static) == {("a", 1), ("a", 3), ("b", 1), ("b", 3)}
    expected = [autoregressive_generate(target_side, p, settings).output_ids for p in batch]
    assert [r.output_ids for r in runs.ar] == expected
    for name, k in runs.static:
        assert runs.matches_ar(name, k)
        results = runs.static[name, k]
        assert len(results) == len(batch)
        assert all(max(r.drafted for r in result.rounds) <= k for result in results)
        drafted = sum(r.n_drafted for r in results)
        assert runs.acceptance(name, k) == pytest.approx(
            sum(r.n_accepted for r in results) / drafted
        )
        ar_speed = sum(r.n_generated for r in runs.ar) / sum(r.seconds for r in runs.ar)
        speed = sum(r.n_generated for r in results) / sum(r.seconds for r in results)
        assert runs.speedup(name, k) == pytest.approx(speed / ar_speed)


def test_a_different_output_is_reported_and_no_prompts_is_refused() -> None:
    draft, target = build_tiny_pair(seed=5)
    settings = RequestSettings(SamplingConfig(max_new_tokens=8))
    target_side = LocalTarget(CachedLM(target))
    runs = compare_static_k(target_side, {"d": CachedLM(draft)}, prompts(2, seed=1), settings, [2])
    assert runs.matches_ar("d", 2)
    runs.static["d", 2][0].output_ids[0] += 1
    assert not runs.matches_ar("d", 2)
    with pytest.raises(ValueError, match="at least one prompt"):
        compare_static_k(target_side, {"d": CachedLM(draft)}, [], settings, [2])
