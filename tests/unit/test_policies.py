"""Draft-length policies against hand-computed values of their formulas (docs/methods.md, 1-9)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from support.tiny_models import VOCAB, build_tiny_pair
from support.tiny_models import prompts as tiny_prompts

from policies import (
    FEATURE_NAMES,
    POLICIES,
    Decision,
    DraftPolicy,
    DraftStep,
    DynamicThresholdConfig,
    DynamicThresholdState,
    RequestContext,
    RoundOutcome,
    make_policy,
    policy_parameters,
    update_dynamic_threshold,
)
from workers.engine import RequestSettings, speculative_generate
from workers.lm import CachedLM, StepOutput
from workers.records import SamplingConfig
from workers.target import LocalTarget


def start(policy: DraftPolicy, seed: int = 0, reference: tuple[int, ...] | None = None) -> None:
    """Reset ``policy`` for a request (its cap is the one it was built with)."""
    policy.reset(RequestContext(prompt_len=4, seed=seed, reference=reference))


def drafted_count(policy: DraftPolicy, steps: list[DraftStep]) -> int:
    """Run one round the way the engine does and return how many candidates it drafted."""
    count = 0
    for step in steps[: policy.round_cap()]:
        decision = policy.decide(step)
        if not decision.keeps:
            break
        count += 1
        if not decision.continues:
            break
    return count


def entropy_steps(entropies: list[float]) -> list[DraftStep]:
    return [DraftStep(index=i + 1, position=i, entropy=value) for i, value in enumerate(entropies)]


# --- registry ---------------------------------------------------------------------------------


def test_registry_names_and_features_are_consistent() -> None:
    assert set(POLICIES) == {
        "static",
        "max_confidence",
        "adaedl",
        "svip",
        "hf_heuristic",
        "beta_ts",
        "cali_ts",
        "specdecpp",
        "oracle",
        "ngram_match",
        "batch_schedule",
    }
    for name, policy_class in POLICIES.items():
        assert policy_class.name == name
        assert dataclasses.is_dataclass(policy_class)
        policy = make_policy(name, 8)
        assert policy.max_draft_len == 8
        assert policy.features <= FEATURE_NAMES
    assert make_policy("static", 8).features == frozenset()


def test_policy_parameters_list_paper_defaults() -> None:
    assert policy_parameters("static") == {}
    assert policy_parameters("adaedl") == {
        "threshold": 0.5,
        "dynamic": True,
        "acceptance_smoothing": 0.5,
        "threshold_smoothing": 0.9,
        "threshold_step": 0.01,
        "target_acceptance": 0.9,
        "gamma": 0.2,
    }
    assert policy_parameters("max_confidence")["dynamic"] is False
    assert policy_parameters("svip") == {"threshold": 0.4, "length_cap": 40}
    assert policy_parameters("hf_heuristic")["initial_draft_len"] == 5
    assert policy_parameters("beta_ts")["prior_alpha"] == 1.0
    assert policy_parameters("beta_ts")["prior_beta"] == 1.0
    assert policy_parameters("specdecpp")["threshold"] == 0.7
    assert policy_parameters("specdecpp")["length_cap"] == 20
    assert "head" not in policy_parameters("specdecpp")
    assert "predictor" not in policy_parameters("cali_ts")
    assert policy_parameters("cali_ts")["theta_model"] == 0.7


def test_make_policy_sets_parameters_by_name() -> None:
    policy = make_policy("svip", 12, threshold=0.3, length_cap=10)
    assert (policy.threshold, policy.length_cap, policy.round_cap()) == (0.3, 10, 10)


def test_make_policy_rejects_unknown_names_and_parameters() -> None:
    with pytest.raises(ValueError, match=r"'nope'.*adaedl.*static"):
        make_policy("nope", 8)
    with pytest.raises(ValueError, match=r"tresh.*'svip'.*threshold, length_cap"):
        make_policy("svip", 8, tresh=0.3)
    with pytest.raises(ValueError, match="rng"):
        make_policy("static", 8, rng=np.random.default_rng(1))
    with pytest.raises(ValueError, match="unknown policy"):
        policy_parameters("nope")


# --- static -----------------------------------------------------------------------------------


def test_static_drafts_to_the_cap() -> None:
    policy = make_policy("static", 3)
    start(policy)
    assert drafted_count(policy, entropy_steps([9.0] * 10)) == 3


def test_policies_that_keep_every_candidate_decide_nothing() -> None:
    """The engine skips ``decide`` for these: it must be KEEP_CONTINUE whatever the step shows,
    and no policy that asks for features (which only ``decide`` sees) may claim it."""
    keepers = {name for name, policy in POLICIES.items() if policy.keeps_every_candidate}
    assert keepers == {"static", "hf_heuristic", "batch_schedule"}
    steps = [
        DraftStep(index=i, position=i + 3, token=i, entropy=e, max_prob=m)
        for i, (e, m) in enumerate([(0.0, 1.0), (9.0, 0.01), (1.5, 0.4)], start=1)
    ]
    for name in keepers:
        policy = make_policy(name, 8)
        assert policy.features == frozenset()
        start(policy)
        assert {policy.decide(step) for step in steps} == {Decision.KEEP_CONTINUE}


# --- dynamic threshold, max_confidence, adaedl ------------------------------------------------

# Seven rounds with L = 8, λ0 = 0.5, AR0 = 0, β1 = 0.5, β2 = 0.9, ε = 0.01, α = 0.9.
# Whenever λ' = λ ± ε the new λ is 0.9·λ + 0.1·(λ ± 0.01) = λ ± 0.001.
#   round (drafted, accepted)  AR                                 branch           λ
#   1 (8, 8)   0.5·0        + 0.5·1     = 0.5        < 0.9    → +ε   0.501
#   2 (8, 8)   0.5·0.5      + 0.5·1     = 0.75       < 0.9    → +ε   0.502
#   3 (8, 8)   0.5·0.75     + 0.5·1     = 0.875      < 0.9    → +ε   0.503
#   4 (8, 8)   0.5·0.875    + 0.5·1     = 0.9375     n_acc = L → =   0.503
#   5 (4, 4)   0.5·0.9375   + 0.5·1     = 0.96875    n_acc ≠ L → −ε  0.502
#   6 (8, 7)   0.5·0.96875  + 0.5·0.875 = 0.921875   n_acc ≠ L → −ε  0.501
#   7 (5, 1)   0.5·0.921875 + 0.5·0.2   = 0.5609375  < 0.9    → +ε   0.502
ROUNDS = [(8, 8), (8, 8), (8, 8), (8, 8), (4, 4), (8, 7), (5, 1)]
EXPECTED_LAMBDA = [0.501, 0.502, 0.503, 0.503, 0.502, 0.501, 0.502]
EXPECTED_AR = [0.5, 0.75, 0.875, 0.9375, 0.96875, 0.921875, 0.5609375]


def test_dynamic_threshold_trajectory_matches_hand_arithmetic() -> None:
    state = DynamicThresholdState(threshold=0.5)
    config = DynamicThresholdConfig()
    for (drafted, accepted), want_lambda, want_ar in zip(
        ROUNDS, EXPECTED_LAMBDA, EXPECTED_AR, strict=True
    ):
        state = update_dynamic_threshold(state, RoundOutcome(drafted, accepted), config, 8)
        assert state.threshold == pytest.approx(want_lambda, abs=1e-12)
        assert state.acceptance_rate == pytest.approx(want_ar, abs=1e-12)


def test_dynamic_threshold_lowers_lambda_after_an_empty_round() -> None:
    state = DynamicThresholdState(threshold=0.8, acceptance_rate=0.3)
    state = update_dynamic_threshold(state, RoundOutcome(0, 0), DynamicThresholdConfig(), 8)
    # AR unchanged, λ' = 0.79, λ = 0.9·0.8 + 0.1·0.79 = 0.799
    assert state.acceptance_rate == pytest.approx(0.3)
    assert state.threshold == pytest.approx(0.799)


def test_adaedl_lambda_trajectory_and_decisions() -> None:
    policy = make_policy("adaedl", 8)
    start(policy)
    # score 1 − sqrt(0.2·H) = 0.5015  ⇔  H = (1 − 0.5015)² / 0.2 = 0.4985² / 0.2
    probe = entropy_steps([0.4985**2 / 0.2])
    assert math.isclose(1 - math.sqrt(0.2 * probe[0].entropy), 0.5015)
    decisions = []
    for (drafted, accepted), want in zip(ROUNDS, EXPECTED_LAMBDA, strict=True):
        policy.update(RoundOutcome(drafted, accepted))
        assert policy.current_threshold == pytest.approx(want, abs=1e-12)
        decisions.append(drafted_count(policy, probe))
    # λ = 0.501 → 0.5015 ≥ λ: propose; λ ≥ 0.502 → stop.
    assert decisions == [1, 0, 0, 0, 0, 1, 0]
    start(policy)
    assert policy.current_threshold == 0.5


def test_adaedl_stop_index_from_entropy_bound() -> None:
    policy = make_policy("adaedl", 8, dynamic=False, threshold=0.6)
    start(policy)
    # 1 − sqrt(0.2·H) < 0.6  ⇔  H > 0.4² / 0.2 = 0.8: the fourth entropy (0.81) is the first above.
    assert drafted_count(policy, entropy_steps([0.0, 0.5, 0.79, 0.81, 0.1])) == 3


def test_max_confidence_fixed_versus_dynamic() -> None:
    probe = [DraftStep(index=1, position=0, max_prob=0.5005)]
    fixed = make_policy("max_confidence", 8, threshold=0.5)
    dynamic = make_policy("max_confidence", 8, threshold=0.5, dynamic=True)
    for policy in (fixed, dynamic):
        start(policy)
        assert drafted_count(policy, probe) == 1
        policy.update(RoundOutcome(8, 8))
    assert fixed.current_threshold == 0.5
    assert drafted_count(fixed, probe) == 1
    assert dynamic.current_threshold == pytest.approx(0.501)
    assert drafted_count(dynamic, probe) == 0
    steps = [DraftStep(index=i + 1, position=i, max_prob=p) for i, p in enumerate([0.9, 0.7, 0.4])]
    assert drafted_count(fixed, steps) == 2


def test_missing_feature_raises_a_clear_error() -> None:
    policy = make_policy("max_confidence", 8)
    start(policy)
    with pytest.raises(ValueError, match="max_prob"):
        policy.decide(DraftStep(index=1, position=0))


# --- svip -------------------------------------------------------------------------------------


def test_svip_stop_index_and_cap() -> None:
    policy = make_policy("svip", 16)
    start(policy)
    # sqrt(H) > 0.4 ⇔ H > 0.16: 0.161 (index 4) is the first.
    assert drafted_count(policy, entropy_steps([0.05, 0.1, 0.159, 0.161, 0.01])) == 3
    assert make_policy("svip", 64).round_cap() == 40
    assert make_policy("svip", 10).round_cap() == 10
    assert drafted_count(make_policy("svip", 64), entropy_steps([0.0] * 50)) == 40


# --- hf_heuristic -----------------------------------------------------------------------------


def test_hf_heuristic_schedule() -> None:
    policy = make_policy("hf_heuristic", 6)
    start(policy)
    caps = [policy.round_cap()]
    ks = [policy.draft_len]
    # K: 5 →(all 5 accepted) 7 →(3 of 6) 6 →(all 6) 8 →(0 of 6) 7
    for drafted, accepted in [(5, 5), (6, 3), (6, 6), (6, 0)]:
        policy.update(RoundOutcome(drafted, accepted))
        ks.append(policy.draft_len)
        caps.append(policy.round_cap())
    assert ks == [5, 7, 6, 8, 7]
    assert caps == [5, 6, 6, 6, 6]
    assert drafted_count(policy, entropy_steps([9.0] * 10)) == 6


def test_hf_heuristic_floor_and_persistence() -> None:
    transient = make_policy("hf_heuristic", 8, initial_draft_len=2)
    start(transient)
    for _ in range(3):
        transient.update(RoundOutcome(2, 0))
    assert transient.draft_len == 1
    assert transient.round_cap() == 1
    start(transient)
    assert transient.draft_len == 2

    persistent = make_policy("hf_heuristic", 8, persist_across_requests=True)
    start(persistent)
    persistent.update(RoundOutcome(5, 5))
    start(persistent, seed=1)
    assert persistent.draft_len == 7


# --- beta_ts ----------------------------------------------------------------------------------


def test_beta_ts_posterior_after_rounds() -> None:
    policy = make_policy("beta_ts", 8)
    start(policy)
    # r = n_acc, n = min(n_acc + 1, n_drafted):
    # (5 drafted, 2 acc): r = 2, n = 3 → α = 1 + 2 = 3, β = 1 + 1 = 2
    # (4, 4):             r = 4, n = 4 → α = 7,          β = 2
    # (3, 0):             r = 0, n = 1 → α = 7,          β = 3
    # (0, 0):             r = 0, n = 0 → unchanged
    expected = [(3.0, 2.0), (7.0, 2.0), (7.0, 3.0), (7.0, 3.0)]
    for (drafted, accepted), want in zip([(5, 2), (4, 4), (3, 0), (0, 0)], expected, strict=True):
        policy.update(RoundOutcome(drafted, accepted))
        assert policy.posterior == want
    start(policy)
    assert policy.posterior == (1.0, 1.0)

    persistent = make_policy("beta_ts", 8, persist_across_requests=True)
    start(persistent)
    persistent.update(RoundOutcome(5, 2))
    start(persistent, seed=3)
    assert persistent.posterior == (3.0, 2.0)


def _decisions(policy: DraftPolicy, seed: int, n: int) -> list[bool]:
    start(policy, seed=seed)
    step = DraftStep(index=1, position=0)
    return [policy.decide(step).continues for _ in range(n)]


@pytest.mark.parametrize("name", ["beta_ts", "cali_ts"])
def test_thompson_decisions_are_reproducible_for_a_seed(name: str) -> None:
    first = _decisions(make_policy(name, 8), seed=11, n=300)
    again = _decisions(make_policy(name, 8), seed=11, n=300)
    other = _decisions(make_policy(name, 8), seed=12, n=300)
    assert first == again
    assert first != other
    assert 0 < sum(first) < 300


def test_thompson_draws_follow_the_stated_order() -> None:
    # Beta-TS: θ ~ Beta(α, β) then χ = [u < θ], u ~ U(0, 1), all from default_rng(seed).
    rng = np.random.default_rng(21)
    expected = []
    for _ in range(50):
        theta = rng.beta(3.0, 2.0)
        expected.append(bool(rng.random() < theta))
    policy = make_policy("beta_ts", 8, prior_alpha=3.0, prior_beta=2.0)
    assert _decisions(policy, 21, 50) == expected
    # Cali-TS: θ ~ N(μ, σ²) then χ = [u < clip(θ, 0, 1)]; at n = 0, (μ, σ) = (θ_M, σ_M).
    rng = np.random.default_rng(22)
    expected = []
    for _ in range(50):
        theta = min(max(rng.normal(0.6, 0.3), 0.0), 1.0)
        expected.append(bool(rng.random() < theta))
    policy = make_policy("cali_ts", 8, theta_model=0.6, sigma_model=0.3)
    assert _decisions(policy, 22, 50) == expected


@pytest.mark.parametrize(("alpha", "beta"), [(2.0, 6.0), (900.0, 100.0), (1.0, 1.0)])
def test_beta_ts_continue_frequency_is_the_beta_mean(alpha: float, beta: float) -> None:
    # With the posterior held fixed, P(χ = 1) = E[θ] = α / (α + β).
    n = 20_000
    decisions = _decisions(make_policy("beta_ts", 8, prior_alpha=alpha, prior_beta=beta), 5, n)
    mean = alpha / (alpha + beta)
    tolerance = 5 * math.sqrt(mean * (1 - mean) / n)
    assert abs(np.mean(decisions) - mean) < tolerance


def test_beta_ts_draws_theta_per_candidate() -> None:
    # θ drawn once per candidate: with a U(0, 1) prior the chance of continuing after two
    # candidates in a row is E[θ]² = 1/4; had θ been drawn once per round it would be E[θ²] = 1/3.
    policy = make_policy("beta_ts", 8)
    start(policy, seed=2)
    n = 20_000
    pairs = [
        policy.decide(DraftStep(1, 0)).continues and policy.decide(DraftStep(2, 1)).continues
        for _ in range(n)
    ]
    # each pair draws 2 or 4 numbers, so pairs are independent
    assert abs(np.mean(pairs) - 0.25) < 5 * math.sqrt(0.25 * 0.75 / n)


# --- cali_ts ----------------------------------------------------------------------------------


def test_cali_ts_posterior_after_verifications() -> None:
    policy = make_policy("cali_ts", 8, theta_model=0.7, sigma_model=0.2, sigma_sample=0.5)
    start(policy)
    step = DraftStep(index=1, position=0)
    mean, std = policy.posterior(step)
    assert (mean, std) == pytest.approx((0.7, 0.2))  # n = 0: the prior
    # ratios 2/4, 5/5, 1/2 → θ̂ = (0.5 + 1 + 0.5) / 3 = 2/3, n = 3; the empty round is skipped.
    for drafted, accepted in [(4, 2), (5, 5), (0, 0), (2, 1)]:
        policy.update(RoundOutcome(drafted, accepted))
    assert policy.n_verifications == 3
    assert policy.observed_acceptance == pytest.approx(2 / 3)
    # μ = (0.25·0.7 + 3·0.04·(2/3)) / (3·0.04 + 0.25) = (0.175 + 0.08) / 0.37
    # 1/σ² = 1/0.04 + 3/0.25 = 25 + 12 = 37
    mean, std = policy.posterior(step)
    assert mean == pytest.approx(0.255 / 0.37)
    assert std == pytest.approx(1 / math.sqrt(37))


def test_cali_ts_uses_the_predictor_and_its_features() -> None:
    seen: list[DraftStep] = []

    def predictor(step: DraftStep) -> float:
        seen.append(step)
        return 0.1

    policy = make_policy("cali_ts", 8, predictor=predictor, sigma_model=0.2, sigma_sample=0.5)
    assert policy.features == {"hidden", "target_hidden"}
    assert make_policy("cali_ts", 8).features == frozenset()
    start(policy)
    step = DraftStep(index=1, position=0, hidden=np.zeros(3), target_hidden=np.ones(3))
    assert policy.posterior(step) == pytest.approx((0.1, 0.2))
    assert seen == [step]


def test_cali_ts_continue_frequency_follows_theta_model() -> None:
    # σ_M → 0 pins θ at θ_M, so P(χ = 1) = θ_M.
    n = 20_000
    policy = make_policy("cali_ts", 8, theta_model=0.3, sigma_model=1e-9)
    decisions = _decisions(policy, 4, n)
    assert abs(np.mean(decisions) - 0.3) < 5 * math.sqrt(0.3 * 0.7 / n)
    certain = make_policy("cali_ts", 8, theta_model=1.4, sigma_model=1e-9)  # clipped to 1
    assert all(_decisions(certain, 4, 200))


# --- specdecpp --------------------------------------------------------------------------------


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _logit(probability: float) -> float:
    return math.log(probability / (1 - probability))


#: What the head makes of the state before the round (the one producing q_1): a value that would
#: stop every round at its first candidate if Algorithm 2 had a factor at i = 1.
BEFORE_ROUND = -50.0


def paper_steps(head_outputs: list[float]) -> list[DraftStep]:
    """Return a round's DraftSteps as the engine fills them: candidate 1 carries the state that
    produced q_1 (BEFORE_ROUND), candidate i >= 2 the state that produced q_i, which is e_{i−1},
    the final embedding of Y_{i−1}; ``head_outputs[j − 1]`` is f(e_j)."""
    states = [BEFORE_ROUND, *head_outputs]
    return [DraftStep(index=i + 1, position=i, hidden=np.array([x])) for i, x in enumerate(states)]


def test_specdecpp_stop_index_from_head_logits() -> None:
    policy = make_policy("specdecpp", 16, head=lambda hidden: float(hidden[0]))
    start(policy)
    head_outputs = [3.0, 2.0, 1.0, -1.0, 5.0]  # f(e_1) ... f(e_5)
    products = np.cumprod([_sigmoid(x) for x in head_outputs])
    # at step i, p̂ = Π_{j<i} sigmoid(f(e_j)); 1 − p̂: 0 (i = 1), 0.047, 0.161, 0.387, 0.835, so
    # 1 − p̂ > h = 0.7 first at i = 5: Y_5 is kept and the round stops
    assert list(1 - products[:4] > 0.7) == [False, False, False, True]
    assert drafted_count(policy, paper_steps(head_outputs)) == 5
    # the product restarts with the next round
    policy.update(RoundOutcome(5, 5))
    assert drafted_count(policy, paper_steps(head_outputs)[:4]) == 4
    assert policy.acceptance_product == pytest.approx(products[2])


@pytest.mark.parametrize(
    ("acceptance", "drafted"),
    [(0.27, 2), (0.5, 3), (_sigmoid(2.2), 13)],
)
def test_specdecpp_constant_acceptance_drafts_the_first_i_with_1_minus_s_to_the_i_minus_1_above_h(
    acceptance: float, drafted: int
) -> None:
    # Algorithm 2 with sigmoid(f(e)) = s everywhere: p̂ = s^{i−1} at step i, so the round stops
    # at the smallest i with 1 − s^{i−1} > h = 0.7 (s = 0.27: 2; 0.5: 3; the demo's stand-in
    # sigmoid(2.2) = 0.900: 13). A factor at i = 1 as well would draft 1, 2 and 12.
    assert 1 - acceptance ** (drafted - 2) <= 0.7 < 1 - acceptance ** (drafted - 1)
    for params in (
        {"head": lambda hidden: _logit(acceptance)},
        {"constant_logit": _logit(acceptance)},
    ):
        policy = make_policy("specdecpp", 20, **params)
        start(policy)
        assert drafted_count(policy, paper_steps([_logit(acceptance)] * 19)) == drafted


def test_specdecpp_cap_constant_logit_and_missing_head() -> None:
    assert make_policy("specdecpp", 32, constant_logit=9.0).round_cap() == 20
    # constant logit 2: p̂ = sigmoid(2)^{i−1} = 1, 0.881, 0.776, 0.683, 0.602, 0.530, 0.467, ...
    # so 1 − p̂ > 0.5 first at i = 7, which is kept
    policy = make_policy("specdecpp", 32, constant_logit=2.0, threshold=0.5)
    assert policy.features == frozenset()
    start(policy)
    assert 1 - _sigmoid(2.0) ** 5 <= 0.5 < 1 - _sigmoid(2.0) ** 6
    assert drafted_count(policy, entropy_steps([0.0] * 10)) == 7
    headless = make_policy("specdecpp", 8)
    assert headless.features == {"hidden"}
    start(headless)
    with pytest.raises(ValueError, match="head"):
        headless.decide(DraftStep(index=1, position=0, hidden=np.zeros(2)))


def test_specdecpp_sigmoid_is_stable_for_extreme_logits() -> None:
    # no factor at i = 1: a head predicting certain rejection still drafts Y_1 and Y_2
    policy = make_policy("specdecpp", 8, constant_logit=-1000.0)
    start(policy)
    assert drafted_count(policy, entropy_steps([0.0] * 8)) == 2
    policy = make_policy("specdecpp", 8, constant_logit=1000.0)
    start(policy)
    assert drafted_count(policy, entropy_steps([0.0] * 8)) == 8


# --- oracle -----------------------------------------------------------------------------------


def test_oracle_stops_at_first_mismatch_and_past_the_reference() -> None:
    policy = make_policy("oracle", 8)
    assert policy.greedy_only and policy.needs_reference
    assert policy.features == {"token"}
    start(policy, reference=(5, 7, 9, 11))
    mismatch = [DraftStep(index=i + 1, position=i, token=t) for i, t in enumerate([5, 7, 8, 11])]
    assert drafted_count(policy, mismatch) == 2
    # a later round starting at output position 2: tokens 9, 11 match, position 4 is past the end
    tail = [DraftStep(index=i + 1, position=2 + i, token=t) for i, t in enumerate([9, 11, 13])]
    assert drafted_count(policy, tail) == 2
    with pytest.raises(ValueError, match="reference"):
        start(policy, reference=None)


# --- each paper's algorithm, written out literally, against the engine's protocol ------------


def svip_algorithm_1(entropies: list[float], h: float, cap: int) -> int:
    """SVIP Algorithm 1 as printed: sample x_{n+j}, j ← j + 1, then break if the entropy of the
    *next* position, H(q(· | x_{≤n+j})) = ``entropies[j]`` (q_{j+1}), has sqrt above h."""
    j = 0
    while j < cap:
        j += 1
        if math.sqrt(entropies[j]) > h:
            break
    return j


def eesd_algorithm_1(rng: np.random.Generator, alpha: float, beta: float, cap: int) -> int:
    """EESD Algorithm 1 (Beta-TS) as printed: x_i joins Q_d (lines 6–7), θ ~ Beta, χ ~ Bern(θ)
    (8–9), break if χ = 0 (11)."""
    drafted = 0
    for _ in range(cap):
        drafted += 1
        theta = rng.beta(alpha, beta)
        if not rng.random() < theta:
            break
    return drafted


def specdecpp_algorithm_2(head_of_embedding: Callable[[int], float], h: float, cap: int) -> int:
    """SpecDec++ Algorithm 2 as printed, one round: p̂ = 1; for i = 1, 2, ...: sample Y_i (the
    draft reads x_prefix, Y_1, ..., Y_{i−1}); if i >= 2, p̂ ← p̂·sigmoid(f(e_{i−1})), with
    e_{i−1} the draft's final embedding of Y_{i−1} (``head_of_embedding(i − 1)`` = f(e_{i−1}); e_0
    is never computed); break if 1 − p̂ > h, Y_i staying in the round. Returns the round's length."""
    p_hat = 1.0
    for i in range(1, cap + 1):
        if i >= 2:
            p_hat *= _sigmoid(head_of_embedding(i - 1))
        if 1 - p_hat > h:
            return i
    return cap


@pytest.mark.parametrize("cap", [1, 2, 5, 12])
def test_svip_drafts_as_algorithm_1(cap: int) -> None:
    rng = np.random.default_rng(cap)
    for _ in range(300):
        entropies = list(rng.exponential(0.2, size=cap + 1))
        policy = make_policy("svip", cap, threshold=0.4)
        start(policy)
        assert drafted_count(policy, entropy_steps(entropies)) == svip_algorithm_1(
            entropies, 0.4, cap
        )


def test_svip_always_drafts_the_first_token() -> None:
    # Every entropy far above h: the paper drafts x_{n+1}, then stops on the next position's
    # entropy. (Stopping before the first candidate drafted nothing in 130 of 200 such rounds.)
    policy = make_policy("svip", 8, threshold=0.3)
    start(policy)
    assert drafted_count(policy, entropy_steps([9.0] * 8)) == 1
    # the first candidate's own entropy never stops the round; the second's does
    assert drafted_count(policy, entropy_steps([9.0, 0.01, 0.01, 1.0])) == 3


@pytest.mark.parametrize(("alpha", "beta", "cap"), [(1.0, 1.0, 8), (3.0, 2.0, 4), (0.5, 4.0, 16)])
def test_beta_ts_drafts_as_eesd_algorithm_1(alpha: float, beta: float, cap: int) -> None:
    drafted = []
    for seed in range(500):
        policy = make_policy("beta_ts", cap, prior_alpha=alpha, prior_beta=beta)
        start(policy, seed=seed)
        got = drafted_count(policy, entropy_steps([0.0] * cap))
        assert got == eesd_algorithm_1(np.random.default_rng(seed), alpha, beta, cap)
        drafted.append(got)
    assert min(drafted) == 1


def test_beta_ts_first_rounds_draft_one_or_more_under_the_uniform_prior() -> None:
    # Under Beta(1, 1) P(χ = 0) = 1/2: half the first rounds draft exactly one token, none zero.
    counts = []
    for seed in range(4000):
        policy = make_policy("beta_ts", 8)
        start(policy, seed=seed)
        counts.append(drafted_count(policy, entropy_steps([0.0] * 8)))
    assert min(counts) == 1
    share_one = np.mean(np.array(counts) == 1)
    assert abs(share_one - 0.5) < 5 * math.sqrt(0.25 / 4000)


def test_cali_ts_keeps_the_candidate_it_stops_after() -> None:
    # θ pinned at 0 (clipped): χ = 0 after every candidate, so each round drafts exactly one.
    policy = make_policy("cali_ts", 8, theta_model=-5.0, sigma_model=1e-9)
    start(policy)
    assert drafted_count(policy, entropy_steps([0.0] * 8)) == 1


@pytest.mark.parametrize("cap", [1, 3, 7, 20])
def test_specdecpp_drafts_as_algorithm_2(cap: int) -> None:
    rng = np.random.default_rng(cap)
    for _ in range(300):
        head_outputs = list(rng.normal(2.0, 1.5, size=cap))
        policy = make_policy("specdecpp", cap, head=lambda hidden: float(hidden[0]))
        start(policy)
        expected = specdecpp_algorithm_2(lambda j, f=head_outputs: f[j - 1], 0.7, cap)
        assert drafted_count(policy, paper_steps(head_outputs)) == expected


@pytest.mark.parametrize(
    ("name", "params", "decisions"),
    [
        ("adaedl", {"dynamic": False, "threshold": 0.6}, {"stop_before"}),
        ("max_confidence", {"threshold": 0.5}, {"stop_before"}),
        ("oracle", {}, {"stop_before"}),
        ("svip", {"threshold": 0.4}, {"stop_before"}),
        ("beta_ts", {}, {"keep_stop"}),
        ("cali_ts", {}, {"keep_stop"}),
        ("specdecpp", {"constant_logit": 0.0}, {"keep_stop"}),
    ],
)
def test_each_policy_stops_the_way_its_paper_decides(name, params, decisions) -> None:
    # Before token i (AdaEDL, max-confidence, oracle, SVIP's next-position entropy) or after
    # keeping it (EESD, SpecDec++): the stops a policy makes over many rounds are of one kind.
    seen = set()
    for seed in range(50):
        policy = make_policy(name, 6, **params)
        start(policy, seed=seed, reference=(1,) * 3)
        for i in range(1, 7):
            step = DraftStep(index=i, position=i - 1, token=1, entropy=2.0, max_prob=0.3)
            decision = policy.decide(step)
            if not decision.continues:
                seen.add(decision.value)
                break
    assert seen == decisions


# --- SpecDec++ through the engine: the state each candidate carries, round by round -----------


class TokenStateDraft:
    """The tiny draft, except that its last-layer state after reading token t is [t]: e_j, the
    final embedding of Y_j, names Y_j, so a head can be any function of the token it judges."""

    def __init__(self, lm: CachedLM) -> None:
        self.lm = lm
        self.device = lm.device

    @property
    def cached_len(self) -> int:
        return self.lm.cached_len

    def reset(self) -> None:
        self.lm.reset()

    def crop(self, length: int) -> None:
        self.lm.crop(length)

    def forward(self, ids: torch.Tensor, last_only: bool = False) -> StepOutput:
        out = self.lm.forward(ids, last_only)
        read = ids.view(-1)[-out.hidden.shape[0] :].to(torch.float32)
        return StepOutput(logits=out.logits, hidden=read[:, None])


def _greedy_draft_tokens(draft: CachedLM, context: list[int]) -> Callable[[int], int]:
    """Return j ↦ Y_j, the draft's greedy j-th token after ``context`` (computed from scratch)."""
    tokens: list[int] = []

    def token(j: int) -> int:
        while len(tokens) < j:
            logits = draft.full_logits(torch.tensor([*context, *tokens]))
            tokens.append(int(logits[-1].argmax()))
        return tokens[j - 1]

    return token


HEAD_TABLES = {
    "per-token head, seed 0": np.random.default_rng(0).normal(1.5, 1.5, size=VOCAB),
    "per-token head, seed 1": np.random.default_rng(1).normal(2.5, 1.0, size=VOCAB),
    "sigmoid 0.27 everywhere": np.full(VOCAB, math.log(0.27 / 0.73)),
    "sigmoid 0.5 everywhere": np.zeros(VOCAB),
}


@pytest.fixture(scope="module")
def tiny_engine_pair() -> tuple[CachedLM, LocalTarget]:
    """The tiny in-memory pair of test_engine: (draft, target as the engine's target side)."""
    draft_model, target_model = build_tiny_pair()
    return CachedLM(draft_model, single_step="plain"), LocalTarget(
        CachedLM(target_model, single_step="plain")
    )


@pytest.mark.parametrize("table", list(HEAD_TABLES))
def test_specdecpp_through_the_engine_drafts_as_algorithm_2_round_by_round(
    table: str, tiny_engine_pair: tuple[CachedLM, LocalTarget]
) -> None:
    # The head reads f(e) = HEAD_TABLES[table][token named by e]. Each live round's length must
    # be Algorithm 2's over the draft's greedy tokens after that round's context, with the
    # factor at step i read from e_{i−1} (the embedding of Y_{i−1}) and none at i = 1.
    head_of_token = HEAD_TABLES[table]
    (draft, target), cap, max_new = tiny_engine_pair, 12, 32
    lengths = []
    for seed, prompt in enumerate(tiny_prompts(3, seed=3)):
        policy = make_policy("specdecpp", cap, head=lambda e: float(head_of_token[int(e[0])]))
        settings = RequestSettings(SamplingConfig(max_new_tokens=max_new), seed=seed)
        result = speculative_generate(TokenStateDraft(draft), target, policy, prompt, settings)
        generated = 0
        for record in result.rounds:
            context = [*prompt.tolist(), *result.output_ids[:generated]]
            token = _greedy_draft_tokens(draft, context)
            round_cap = min(cap, max_new - generated - 1)
            expected = specdecpp_algorithm_2(lambda j, y=token: head_of_token[y(j)], 0.7, round_cap)
            assert record.drafted == expected, (seed, generated, record)
            lengths.append(record.drafted)
            generated += record.accepted + 1
    if table.startswith("sigmoid 0.27"):
        assert max(lengths) == 2
    if table.startswith("sigmoid 0.5"):
        assert max(lengths) == 3
    if table.startswith("per-token"):
        assert len(set(lengths)) >= 3, lengths


def test_ngram_match_keeps_candidates_while_the_match_length_vouches_for_them() -> None:
    policy = make_policy("ngram_match", 8, ratio=0.5, min_draft=2)
    decisions = [policy.decide(DraftStep(index=i, position=i, match_length=6)) for i in (3, 4)]
    assert decisions == [Decision.KEEP_CONTINUE, Decision.STOP_BEFORE]
    assert policy.decide(DraftStep(index=2, position=0, match_length=1)).keeps
    assert not policy.decide(DraftStep(index=3, position=0, match_length=1)).keeps
    with pytest.raises(ValueError, match="match_length"):
        policy.decide(DraftStep(index=1, position=0))
