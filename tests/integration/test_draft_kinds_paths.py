"""Every draft kind × policy decodes losslessly on the transformers-modules model path (the
fast path's matrix runs in tests/unit/test_proposers.py; this one doubles its time, so it lives in
the integration tier)."""

from __future__ import annotations

import pytest
import torch
from support.draft_kinds import briefly_trained_head, check_lossless, tiny_pair_on_paths

from policies import POLICIES
from workers.proposers import DRAFT_KINDS

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models():
    """The tiny pair as (draft, target) ``CachedLM`` on each model path."""
    return tiny_pair_on_paths()


@pytest.fixture(scope="module")
def eagle_head(models):
    """An EAGLE head trained briefly on the tiny target's greedy continuations."""
    return briefly_trained_head(models)


@pytest.mark.parametrize("kind", DRAFT_KINDS)
@pytest.mark.parametrize("policy_name", sorted(POLICIES))
def test_greedy_output_equals_target_only_for_every_kind_and_policy_on_transformers_modules(
    models, eagle_head, kind, policy_name
):
    check_lossless(models, eagle_head, "transformers_modules", kind, policy_name)
