"""The engine: greedy losslessness for every policy, exact KV rollback, EOS and length limits,
and the rejection sampler's distribution (exactly for one step, statistically end to end)."""

from __future__ import annotations

import itertools
import math
from typing import ClassVar

import pytest
import torch
from support.tiny_models import build_tiny_pair, prompts

from policies import POLICIES, make_policy
from policies.static import StaticPolicy
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import CachedLM
from workers.proposers import DraftLMProposer
from workers.records import SamplingConfig
from workers.sampling import entropy, warp_probs
from workers.target import LocalTarget
from workers.verification import (
    point_mass_residual,
    residual_distribution,
    speculative_step_distribution,
    verify_greedy,
    verify_sampling,
)

GREEDY = SamplingConfig(max_new_tokens=20)
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pair() -> tuple[CachedLM, LocalTarget]:
    """The tiny in-memory pair wrapped for the engine."""
    draft, target = build_tiny_pair()
    return CachedLM(draft), LocalTarget(CachedLM(target))


def _policy(name: str, max_draft_len: int):
    """Build any registered policy, giving trained-artifact policies a stand-in callable."""
    if name == "specdecpp":
        return make_policy(name, max_draft_len, head=lambda hidden: float(hidden[0]) + 2.0)
    if name == "cali_ts":
        return make_policy(name, max_draft_len, predictor=lambda step: 0.6)
    return make_policy(name, max_draft_len)


@pytest.fixture(scope="module")
def greedy_references(pair) -> list[tuple[torch.Tensor, list[int]]]:
    """Twenty-four prompts with the target-only greedy output of each."""
    _, target = pair
    return [
        (prompt, autoregressive_generate(target, prompt, RequestSettings(GREEDY)).output_ids)
        for prompt in prompts(24, seed=1)
    ]


LM_POLICIES = sorted(n for n in POLICIES if _policy(n, 6).features <= DraftLMProposer.features)


def test_every_policy_but_the_lookup_ones_runs_on_a_draft_lm():
    assert set(POLICIES) - set(LM_POLICIES) == {"ngram_match"}


@pytest.mark.parametrize("policy_name", LM_POLICIES)
def test_greedy_output_equals_target_only_for_every_policy(pair, greedy_references, policy_name):
    draft, target = pair
    total_drafted = 0
    for index, (prompt, reference) in enumerate(greedy_references):
        settings = RequestSettings(GREEDY, seed=index)
        policy = _policy(policy_name, max_draft_len=6)
        result = speculative_generate(draft, target, policy, prompt, settings, reference=reference)
        assert result.output_ids == reference, f"prompt {index} differs under {policy_name}"
        assert sum(r.emitted for r in result.rounds) == len(result.output_ids)
        assert all(r.drafted <= 6 for r in result.rounds)
        total_drafted += result.n_drafted
    assert total_drafted > 0


def test_oracle_discards_nothing_and_needs_one_target_call_per_disagreement(pair):
    draft, target = pair
    for prompt in prompts(10, seed=2):
        settings = RequestSettings(GREEDY)
        reference = autoregressive_generate(target, prompt, settings).output_ids
        result = speculative_generate(
            draft, target, make_policy("oracle", 64), prompt, settings, reference=reference
        )
        assert result.output_ids == reference
        assert result.n_drafted == result.n_accepted
        full = torch.cat([prompt, torch.tensor(reference)])
        draft_choice = draft.full_logits(full)[len(prompt) - 1 : -1].argmax(-1).tolist()
        disagreements = sum(1 for t in range(len(reference) - 1) if draft_choice[t] != reference[t])
        assert result.n_target_calls == disagreements + 1


def test_kv_rollback_matches_from_scratch_forward(pair):
    draft, target = pair
    checked = []

    def check(sequence: list[int]) -> None:
        ids = torch.tensor(sequence)
        for lm in (target.lm, draft):
            cached = lm.cached_len
            assert cached <= len(sequence) - 1
            via_cache = lm.forward(ids[cached:], last_only=True).logits[-1]
            lm.crop(cached)
            assert lm.cached_len == cached
            scratch = lm.full_logits(ids)[-1]
            torch.testing.assert_close(via_cache, scratch, atol=1e-4, rtol=0)
        checked.append(len(sequence))

    for policy_name in ("static", "svip", "hf_heuristic"):
        for prompt in prompts(4, seed=3):
            speculative_generate(
                draft,
                target,
                make_policy(policy_name, 5),
                prompt,
                RequestSettings(GREEDY),
                on_round=check,
            )
    sampled = RequestSettings(SamplingConfig(temperature=1.0, max_new_tokens=24), seed=5)
    for prompt in prompts(4, seed=4):
        speculative_generate(
            draft, target, make_policy("static", 5), prompt, sampled, on_round=check
        )
    assert len(checked) > 40


def test_max_new_tokens_and_eos(pair):
    draft, target = pair
    prompt = prompts(1, seed=7)[0]
    for limit in (1, 2, 7, 13):
        settings = RequestSettings(SamplingConfig(max_new_tokens=limit))
        result = speculative_generate(draft, target, make_policy("static", 8), prompt, settings)
        assert len(result.output_ids) == limit
    long_output = autoregressive_generate(target, prompt, RequestSettings(GREEDY)).output_ids
    eos = long_output[5]
    settings = RequestSettings(GREEDY, eos_token_id=eos)
    expected = long_output[: long_output.index(eos) + 1]
    result = speculative_generate(draft, target, make_policy("static", 8), prompt, settings)
    assert result.output_ids == expected
    assert result.stopped_on_eos
    assert autoregressive_generate(target, prompt, settings).output_ids == expected


def test_verify_greedy_by_hand():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0], [1.0, 2.0, 0.0]])
    choices = logits.argmax(dim=-1)
    verdict = verify_greedy([1, 0, 2], choices)
    assert (verdict.n_accepted, verdict.next_token) == (3, 1)
    verdict = verify_greedy([1, 2, 2], choices)
    assert (verdict.n_accepted, verdict.next_token) == (1, 0)
    verdict = verify_greedy([], choices[:1])
    assert (verdict.n_accepted, verdict.next_token) == (0, 1)


def test_verify_sampling_acceptance_rule():
    target_probs = torch.tensor([[0.2, 0.8], [0.5, 0.5], [0.9, 0.1]])
    generator = torch.Generator().manual_seed(0)
    uniforms = torch.rand(2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    verdict = verify_sampling(
        torch.tensor([0, 1]), torch.tensor([0.6, 0.25]), target_probs, generator
    )
    first_accepted = uniforms[0] * 0.6 <= 0.2
    if not first_accepted:
        assert verdict.n_accepted == 0
        torch.testing.assert_close(verdict.rejected_row, target_probs[0])
    else:
        assert verdict.n_accepted == 2 and verdict.next_token in (0, 1)


def test_residual_by_hand():
    residual = residual_distribution(torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2]))
    torch.testing.assert_close(residual, torch.tensor([1.0, 0.0, 0.0]))


def test_point_mass_residual_is_the_target_without_the_proposal():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    torch.testing.assert_close(
        point_mass_residual(p, 1), torch.tensor([5 / 7, 0.0, 2 / 7]).double()
    )
    one_hot = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(point_mass_residual(p, 1), residual_distribution(p, one_hot))


def test_a_point_mass_proposal_is_accepted_with_probability_p_and_the_step_is_exact():
    """q a point mass at x: min(1, p(x)/q(x)) = p(x), and accept-or-residual emits p exactly."""
    generator = torch.Generator().manual_seed(3)
    for _ in range(20):
        p = torch.randn(10, generator=generator, dtype=torch.float64).softmax(dim=-1)
        x = int(torch.randint(10, (1,), generator=generator))
        q = torch.nn.functional.one_hot(torch.tensor(x), 10).double()
        accepted = q * torch.minimum(torch.ones(10, dtype=torch.float64), p / q.clamp_min(1e-300))
        assert float(accepted.sum()) == pytest.approx(float(p[x]))
        emitted = accepted + (1 - p[x]) * point_mass_residual(p, x)
        torch.testing.assert_close(emitted, p, atol=1e-12, rtol=0)
        torch.testing.assert_close(speculative_step_distribution(p, q), p, atol=1e-12, rtol=0)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 5, 0.9), (1.3, 4, 0.8), (1.0, 0, 1.0)])
def test_one_step_output_distribution_equals_target_exactly(temperature, top_k, top_p):
    generator = torch.Generator().manual_seed(11)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    for _ in range(20):
        p = warp_probs(torch.randn(12, generator=generator, dtype=torch.float64) * 2, sampling)
        q = warp_probs(torch.randn(12, generator=generator, dtype=torch.float64) * 2, sampling)
        emitted = speculative_step_distribution(p, q)
        torch.testing.assert_close(emitted, p.double(), atol=1e-12, rtol=0)


def test_warp_applies_top_k_and_top_p_as_defined():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    probs = warp_probs(logits, SamplingConfig(temperature=1.0, top_k=3))
    torch.testing.assert_close(probs, torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0]))
    probs = warp_probs(logits, SamplingConfig(temperature=1.0, top_p=0.6))
    torch.testing.assert_close(probs, torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))
    flat = warp_probs(logits, SamplingConfig(temperature=1e9))
    torch.testing.assert_close(flat, torch.full((4,), 0.25), atol=1e-6, rtol=0)
    assert math.isclose(float(entropy(torch.full((4,), 0.25))), math.log(4), rel_tol=1e-6)


def test_sampling_is_reproducible_per_seed(pair):
    draft, target = pair
    sampling = SamplingConfig(temperature=1.0, top_k=20, max_new_tokens=20)
    prompt = prompts(1, seed=8)[0]
    runs = [
        speculative_generate(
            draft,
            target,
            make_policy("beta_ts", 4),
            prompt,
            RequestSettings(sampling, seed=seed),
        ).output_ids
        for seed in (1, 1, 2)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_policy_sees_entropy_of_the_distribution_it_drafts_from(pair):
    draft, target = pair
    seen = []
    policy = make_policy("svip", 4, threshold=10.0)
    original = policy.decide

    def spy(step):
        seen.append(step)
        return original(step)

    policy.decide = spy
    prompt = prompts(1, seed=9)[0]
    speculative_generate(draft, target, policy, prompt, RequestSettings(GREEDY))
    first = seen[0]
    expected = entropy(CachedLM(draft.model).full_logits(prompt)[-1].softmax(-1))
    assert math.isclose(first.entropy, float(expected), rel_tol=1e-4)
    assert all(a.index + 1 == b.index or b.index == 1 for a, b in itertools.pairwise(seen))


def test_a_stop_after_a_kept_candidate_costs_no_further_draft_forward(pair):
    """SpecDec++ with sigmoid(f) = 0.8 and h = 0.3 (Algorithm 2: no factor at i = 1, so step i
    holds 0.8^(i−1)): 1 − 0.8 ≤ h < 1 − 0.64, so every round keeps three candidates and stops
    (KEEP_STOP) without forwarding the third; a stop before a candidate (SVIP) has paid the
    forward that produced it."""
    draft, target = pair
    prompt = prompts(1, seed=10)[0]
    keep_stop = make_policy("specdecpp", 6, constant_logit=math.log(4.0), threshold=0.3)
    result = speculative_generate(draft, target, keep_stop, prompt, RequestSettings(GREEDY))
    full = result.rounds[:-1]
    assert full and all((r.drafted, r.draft_forwards) == (3, 3) for r in full)
    svip = make_policy("svip", 6, threshold=0.0)
    result = speculative_generate(draft, target, svip, prompt, RequestSettings(GREEDY))
    generated, stopped = 0, []
    for r in result.rounds:
        cap = min(6, GREEDY.max_new_tokens - generated - 1)
        if r.drafted < cap:
            stopped.append(r)
        generated += r.accepted + 1
    assert stopped and all(r.draft_forwards == r.drafted + 1 for r in stopped)
    assert all(r.drafted >= 1 for r in result.rounds[:-1])


class _AskedStatic(StaticPolicy):
    """Static K, but the engine is to ask it about every candidate."""

    keeps_every_candidate: ClassVar[bool] = False


class _NeverAsked(StaticPolicy):
    """Static K whose ``decide`` fails: the engine must not call it."""

    def decide(self, step):
        raise AssertionError("a policy that keeps every candidate was asked")


def test_a_policy_keeping_every_candidate_is_not_asked_and_drafts_the_same(pair) -> None:
    draft, target = pair
    settings = RequestSettings(GREEDY)
    for prompt in prompts(8, seed=5):
        asked = speculative_generate(draft, target, _AskedStatic(4), prompt, settings)
        skipped = speculative_generate(draft, target, _NeverAsked(4), prompt, settings)
        assert skipped.output_ids == asked.output_ids
        rounds = [(r.drafted, r.accepted, r.draft_forwards) for r in skipped.rounds]
        assert rounds == [(r.drafted, r.accepted, r.draft_forwards) for r in asked.rounds]


class _Clock:
    """A stand-in ``perf_counter``: time moves only when a model works (100 s a prefill, 1 s a
    verification), so the split of a request's time is exact and not timed."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _ClockedTarget(LocalTarget):
    """The tiny target, advancing ``clock`` by 100 s a prefill and 1 s a scoring forward."""

    def __init__(self, lm: CachedLM, clock: _Clock) -> None:
        super().__init__(lm)
        self.clock = clock

    def prefill(self, prompt_ids, sampling, seed) -> None:
        super().prefill(prompt_ids, sampling, seed)
        self.clock.now += 100.0

    def _score(self, request):
        self.clock.now += 1.0
        return super()._score(request)


def test_prefill_and_decode_split_the_request_time(pair, monkeypatch) -> None:
    """Prefill ends when the prompt is processed; decode is every round after it (one clocked
    second per verification), and the two add up to the request's seconds, for both paths."""
    draft, target = pair
    clock = _Clock()
    monkeypatch.setattr("workers.engine.time", clock)
    monkeypatch.setattr("workers.target._now", clock.perf_counter)
    clocked = _ClockedTarget(target.lm, clock)
    prompt = prompts(1, seed=3)[0]
    spec = speculative_generate(
        draft, clocked, make_policy("static", 3), prompt, RequestSettings(GREEDY)
    )
    ar = autoregressive_generate(clocked, prompt, RequestSettings(GREEDY))
    for result in (spec, ar):
        assert result.prefill_seconds == 100.0
        assert result.decode_seconds == float(len(result.rounds))
        assert result.prefill_seconds + result.decode_seconds == result.seconds
    assert ar.decode_seconds == ar.n_generated
