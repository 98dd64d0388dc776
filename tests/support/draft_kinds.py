"""Shared pieces of the draft-kind tests: the tiny pair on each model path, a briefly trained
EAGLE head, a proposer of each kind, prompts with repeated passages, any policy built."""

from __future__ import annotations

import pytest
import torch

from policies import make_policy
from support.eagle_heads import trained_head
from support.tiny_models import build_tiny_pair, prompts
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import CachedLM
from workers.proposers import make_proposer
from workers.records import SamplingConfig
from workers.target import LocalTarget

GREEDY = SamplingConfig(max_new_tokens=16)
PATHS = {"plain_torch": {"fast": True}, "transformers_modules": {"fast": False}}


def tiny_pair_on_paths() -> dict[str, tuple[CachedLM, CachedLM]]:
    """Return the tiny pair as (draft, target) ``CachedLM`` on each model path."""
    draft, target = build_tiny_pair()
    return {path: (CachedLM(draft, **o), CachedLM(target, **o)) for path, o in PATHS.items()}


def briefly_trained_head(models: dict[str, tuple[CachedLM, CachedLM]]):
    """Return an EAGLE head trained briefly on the tiny target's greedy continuations (both
    paths share the target model)."""
    return trained_head(models["plain_torch"][1].model)


def proposer_of(kind: str, draft_lm: CachedLM, eagle_head):
    """Return a proposer of ``kind``: the draft model, a lookup, the trained EAGLE head (an
    untrained one is lossless too, but the oracle would keep none of its drafts)."""
    if kind == "lm":
        return make_proposer(kind, draft_lm)
    if kind == "eagle":
        return make_proposer(kind, head=eagle_head)
    return make_proposer(kind)


def repeat_prompts() -> list[torch.Tensor]:
    """Random prompts, half of them with a repeated passage, so the lookup finds matches."""
    plain = prompts(4, seed=2)
    return plain + [torch.cat([p, p[:-1]]) for p in plain]


def any_policy(name: str, max_draft_len: int):
    """Build any registered policy, giving trained-artifact policies a stand-in callable."""
    if name == "specdecpp":
        return make_policy(name, max_draft_len, head=lambda hidden: float(hidden[0]) + 2.0)
    if name == "cali_ts":
        return make_policy(name, max_draft_len, predictor=lambda step: 0.6)
    return make_policy(name, max_draft_len)


def check_lossless(models, eagle_head, path: str, kind: str, policy_name: str) -> None:
    """Assert that ``kind`` × ``policy_name`` on ``path`` decodes every prompt to the target's
    greedy output and drafts something, or is refused with the named error."""
    draft_lm, target_lm = models[path]
    target = LocalTarget(target_lm)
    proposer = proposer_of(kind, draft_lm, eagle_head)
    if not any_policy(policy_name, 5).features <= proposer.features:
        with pytest.raises(ValueError, match=f"draft of kind '{kind}'"):
            speculative_generate(
                proposer,
                target,
                any_policy(policy_name, 5),
                repeat_prompts()[0],
                RequestSettings(GREEDY),
            )
        return
    total_drafted = 0
    for index, prompt in enumerate(repeat_prompts()):
        settings = RequestSettings(GREEDY, seed=index)
        reference = autoregressive_generate(target, prompt, settings).output_ids
        result = speculative_generate(
            proposer, target, any_policy(policy_name, 5), prompt, settings, reference=reference
        )
        assert result.output_ids == reference, f"prompt {index} differs ({kind}, {policy_name})"
        assert sum(r.emitted for r in result.rounds) == len(result.output_ids)
        assert all(r.drafted <= 5 for r in result.rounds)
        total_drafted += result.n_drafted
    assert total_drafted > 0
