"""Speculative sampling reproduces the target's distribution, for every draft kind.

A Monte-Carlo check (2000 decodes per case, a G-test against the exact two-token distribution
computed from the target's logits): the exact one-step check stays in tests/unit/test_engine.py;
this one decodes whole requests through the engine, the n-gram lookup's point mass and the
EAGLE head's q included, and through the batched engine per sequence. No zoo and no Ray, but
about a minute and a half of CPU in all, so it lives in the integration tier to keep the unit
tier under two minutes.
"""

from __future__ import annotations

import pytest
import torch
from support.eagle_heads import untrained_head
from support.sampling_checks import exact_two_token_distribution, g_test_p_value
from support.tiny_models import build_tiny_pair

from policies import make_policy
from workers.batch_cache import BatchedLM
from workers.batch_engine import BatchRequest, batch_speculative_generate
from workers.engine import RequestSettings, speculative_generate
from workers.lm import CachedLM
from workers.proposers import EagleProposer, NgramProposer
from workers.records import SamplingConfig
from workers.sampling import warp_probs
from workers.target import LocalTarget


def _likely_repeat_prompt(target_lm: CachedLM, sampling: SamplingConfig) -> torch.Tensor:
    """Return a prompt [3, 5, x, 3, 5] whose lookup proposal x the target likes most."""
    candidates = [torch.tensor([3, 5, x, 3, 5]) for x in range(2, 8)]
    return max(
        candidates,
        key=lambda c: float(warp_probs(target_lm.full_logits(c)[-1], sampling)[int(c[2])]),
    )


def _sampling_draft(kind: str, draft_model, target_model):
    """Return the draft of ``kind`` for the sampling test (an untrained EAGLE head)."""
    if kind == "lm":
        return CachedLM(draft_model)
    if kind == "eagle":
        return EagleProposer(untrained_head(target_model))
    return NgramProposer()


@pytest.mark.parametrize("kind", ["lm", "ngram", "eagle"])
@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_speculative_sampling_matches_target_distribution(temperature, kind):
    """Every draft kind samples exactly the target's distribution, the n-gram lookup's point
    mass included (its prompt repeats, so the lookup proposes at the first position) and the
    EAGLE head's q over the target's features."""
    vocab = 8
    draft_model, target_model = build_tiny_pair(seed=4, vocab=vocab, head_std=0.12)
    target = LocalTarget(CachedLM(target_model))
    draft = _sampling_draft(kind, draft_model, target_model)
    sampling = SamplingConfig(temperature=temperature, top_k=6, top_p=0.95, max_new_tokens=2)
    prompt = torch.tensor([3, 5, 2])
    if kind == "ngram":
        prompt = _likely_repeat_prompt(target.lm, sampling)
    exact = exact_two_token_distribution(target.lm, prompt, sampling)
    counts = dict.fromkeys(exact, 0)
    runs = 2000
    accepted = 0
    for seed in range(runs):
        result = speculative_generate(
            draft, target, make_policy("static", 2), prompt, RequestSettings(sampling, seed=seed)
        )
        key = tuple(result.output_ids)
        assert key in counts, f"sampled {key}, which has zero probability under the target"
        counts[key] += 1
        accepted += result.n_accepted
    # The lookup proposes one token here, which the flat target accepts about one time in ten.
    minimum = 0.05 if kind == "ngram" else 0.2
    assert accepted > runs * minimum, "the draft should get tokens accepted for the test to bite"
    p_value = g_test_p_value(counts, exact, runs)
    assert p_value > 0.01, f"G-test rejects equality with target sampling: p={p_value:.4g}"


def test_batched_sampling_matches_the_target_distribution_per_sequence():
    vocab = 8
    draft_model, target_model = build_tiny_pair(seed=4, vocab=vocab, head_std=0.12)
    draft, target = CachedLM(draft_model), CachedLM(target_model)
    sampling = SamplingConfig(temperature=0.9, top_k=6, top_p=0.95, max_new_tokens=2)
    prompts_ = [torch.tensor([3, 5, 2]), torch.tensor([4, 7, 6, 2, 5])]
    runs = 800
    requests = [
        BatchRequest(prompts_[seed % 2], RequestSettings(sampling, seed=seed))
        for seed in range(2 * runs)
    ]
    results = batch_speculative_generate(
        BatchedLM(draft, 8), BatchedLM(target, 8), lambda: make_policy("static", 2), requests
    )
    assert sum(r.n_accepted for r in results) > 2 * runs * 0.2, "the test needs acceptances"
    for which, prompt in enumerate(prompts_):
        exact = exact_two_token_distribution(target, prompt, sampling)
        counts = dict.fromkeys(exact, 0)
        for result in results[which::2]:
            key = tuple(result.output_ids)
            assert key in counts, f"sampled {key}, which has zero probability under the target"
            counts[key] += 1
        p_value = g_test_p_value(counts, exact, runs)
        assert p_value > 0.01, f"prompt {which}: G-test rejects the target's law, p={p_value:.3g}"
