"""The batched engine: greedy output equals target-only decoding per sequence at every batch
size and for every kind of policy, with continuous batching; sampled sequences follow the
target's distribution per sequence; one row's rollback leaves the others alone; a batch-level
policy sees the batch size."""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import build_tiny_pair, prompts, tiny_config
from transformers import LlamaForCausalLM

from policies import BatchSchedulePolicy, make_policy
from policies.batch_schedule import normalise_schedule, scheduled_draft_len
from workers.batch_cache import BatchedLM
from workers.batch_engine import (
    BatchRequest,
    batch_autoregressive_generate,
    batch_speculative_generate,
)
from workers.engine import autoregressive_generate, speculative_generate
from workers.lm import CachedLM
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget

torch.set_num_threads(1)
POLICY_NAMES = ("static", "max_confidence", "svip", "adaedl", "batch_schedule")


@pytest.fixture(scope="module")
def pair() -> tuple[CachedLM, CachedLM]:
    """The tiny in-memory pair (draft, target) on the plain-torch path."""
    draft, target = build_tiny_pair()
    return CachedLM(draft), CachedLM(target)


@pytest.fixture(scope="module")
def requests_and_references(pair) -> list[tuple[BatchRequest, list[int]]]:
    """Seven prompts of 3–12 tokens with unequal budgets (some finish early, so waiting ones
    join), each with its target-only greedy output from the batch-1 path."""
    _, target = pair
    local = LocalTarget(target)
    cases = []
    for index, prompt in enumerate(prompts(7, seed=1)):
        sampling = SamplingConfig(max_new_tokens=(4, 20, 9, 20, 2, 15, 20)[index])
        settings = RequestSettings(sampling, seed=index)
        reference = autoregressive_generate(local, prompt, settings).output_ids
        cases.append((BatchRequest(prompt, settings, reference), reference))
    return cases


@pytest.mark.parametrize("slots", [1, 3, 5])
@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_greedy_output_equals_target_only_per_sequence(
    pair, requests_and_references, slots, policy_name
):
    draft, target = pair
    requests = [request for request, _ in requests_and_references]
    results = batch_speculative_generate(
        BatchedLM(draft, slots),
        BatchedLM(target, slots),
        lambda: make_policy(policy_name, 5),
        requests,
    )
    assert len(results) == len(requests)
    for index, (result, (_, reference)) in enumerate(
        zip(results, requests_and_references, strict=True)
    ):
        assert result.output_ids == reference, f"request {index} differs at batch {slots}"
        assert sum(r.emitted for r in result.rounds) >= len(result.output_ids)
        assert all(r.drafted <= 5 for r in result.rounds)
    assert sum(result.n_accepted for result in results) > 0


@pytest.mark.parametrize("slots", [1, 3, 5])
def test_batched_autoregressive_equals_target_only_per_sequence(
    pair, requests_and_references, slots
):
    _, target = pair
    requests = [request for request, _ in requests_and_references]
    results = batch_autoregressive_generate(BatchedLM(target, slots), requests)
    assert [r.output_ids for r in results] == [ref for _, ref in requests_and_references]
    assert all(len(r.rounds) == len(r.output_ids) for r in results)


def test_sampled_sequences_equal_batch_one_for_the_same_seed(pair):
    """On this pair a row's logits come out bit for bit as at batch 1, so every sampled sequence
    is the batch-1 sequence of its seed (the module docstring says when it need not be)."""
    draft, target = pair
    local = LocalTarget(target)
    sampling = SamplingConfig(temperature=1.0, top_k=20, max_new_tokens=16)
    requests = [
        BatchRequest(prompt, RequestSettings(sampling, seed=10 + index))
        for index, prompt in enumerate(prompts(5, seed=3))
    ]
    alone = [
        speculative_generate(
            draft, local, make_policy("static", 3), r.prompt_ids, r.settings
        ).output_ids
        for r in requests
    ]
    together = batch_speculative_generate(
        BatchedLM(draft, 3), BatchedLM(target, 3), lambda: make_policy("static", 3), requests
    )
    assert [r.output_ids for r in together] == alone
    ar_alone = [
        autoregressive_generate(local, r.prompt_ids, r.settings).output_ids for r in requests
    ]
    ar_together = batch_autoregressive_generate(BatchedLM(target, 3), requests)
    assert [r.output_ids for r in ar_together] == ar_alone
    assert len({tuple(out) for out in alone}) > 1


def test_rolling_back_one_row_leaves_the_other_rows_alone(pair):
    _, target = pair
    batched = BatchedLM(target, 3)
    first, second = prompts(2, seed=5)
    batched.forward([0, 2], [first, second], last_only=True)
    before = batched.forward([2], [torch.tensor([7])], last_only=True).logits
    batched.crop(2, second.numel())
    batched.forward([0], [torch.tensor([9, 10, 11])], last_only=True)
    batched.crop(0, first.numel() + 1)  # row 0 rolls back two of its three tokens
    step = batched.forward([0, 2], [torch.tensor([12, 13]), torch.tensor([7])], last_only=False)
    assert batched.lengths == [first.numel() + 3, 0, second.numel() + 1]
    torch.testing.assert_close(step.logits_of(1), before, rtol=1e-5, atol=1e-5)
    expected_0 = target.full_logits(torch.cat([first, torch.tensor([9, 12, 13])]))[-2:]
    expected_2 = target.full_logits(torch.cat([second, torch.tensor([7])]))[-1:]
    torch.testing.assert_close(step.logits_of(0), expected_0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(step.logits_of(1), expected_2, rtol=1e-4, atol=1e-4)


def test_a_batch_schedule_policy_is_told_the_batch_size(pair, requests_and_references):
    draft, target = pair
    seen: list[tuple[int, int]] = []

    class Spy(BatchSchedulePolicy):
        def round_cap(self) -> int:
            cap = super().round_cap()
            seen.append((self.batch_size, cap))
            return cap

    requests = [request for request, _ in requests_and_references][:3]
    results = batch_speculative_generate(
        BatchedLM(draft, 3),
        BatchedLM(target, 3),
        lambda: Spy(max_draft_len=6, schedule="1:5 2:3 3:1"),
        requests,
    )
    assert [r.output_ids for r in results] == [ref for _, ref in requests_and_references[:3]]
    assert {size for size, _ in seen} == {1, 2, 3}
    assert all(cap == {1: 5, 2: 3, 3: 1}[size] for size, cap in seen)


def test_batch_schedule_follows_tensorrt_llm_bounds():
    table = normalise_schedule({4: 4, 8: 2, 32: 1})
    assert [scheduled_draft_len(table, b) for b in (1, 4, 5, 8, 9, 32, 33)] == [4, 4, 2, 2, 1, 1, 0]
    assert normalise_schedule("32:1 4:4 8:2") == table
    assert make_policy("batch_schedule", 3).round_cap() == 3
    with pytest.raises(ValueError, match=r"batch_schedule\.schedule"):
        make_policy("batch_schedule", 4, schedule="4-4")
    with pytest.raises(ValueError, match="distinct bounds"):
        make_policy("batch_schedule", 4, schedule="4:1 4:2")


def test_a_model_off_the_fast_path_is_refused_with_the_reason():
    model = LlamaForCausalLM(tiny_config(1)).eval()
    with pytest.raises(ValueError, match="plain-torch Llama path"):
        BatchedLM(CachedLM(model, fast=False, single_step="plain"), 2)
