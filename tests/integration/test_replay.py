"""Greedy trace replay: replayed rounds equal the live engine's for every replayable policy,
hand-computed rounds on a hand-made trace, and refusal of policies that read hidden states."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from support.tiny_models import build_tiny_pair
from support.tiny_models import prompts as tiny_prompts
from transformers import AutoTokenizer

from policies import POLICIES, make_policy
from policies.adaedl import entropy_acceptance_bound
from policies.replay import DraftPrediction, GreedyTrace, ReplayedRound, replay
from workers.datasets import DatasetSpec, load_prompts
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import CachedLM, load_causal_lm
from workers.proposers import NgramProposer, NgramSettings
from workers.records import SamplingConfig
from workers.target import LocalTarget
from workers.trace import record_lookup_trace, record_trace

torch.set_num_threads(1)

MAX_NEW = 24
CAPS = (4, 8)
#: A top-two logit gap below this counts as a floating-point near-tie of an argmax.
NEAR_TIE = 1e-4
#: How far recorded features may be from the live engine's (block sizes differ).
FEATURE_NOISE = 1e-5

QUANTILES = (0.25, 0.5, 0.75)


def _configs(traces: list[GreedyTrace]) -> list[tuple[str, dict[str, Any]]]:
    """Return (policy, parameters) for every replayable policy, several thresholds each.

    Thresholds are quantiles of the recorded features, so that the threshold policies stop at
    varied lengths whatever the drafts look like (the micro zoo's are flat: H ≈ 5.5 nats).
    """
    steps = [p for trace in traces for p in trace.on_path]

    def at(values: list[float]) -> list[float]:
        return [float(v) for v in np.quantile(values, QUANTILES)]

    max_probs = at([p.max_prob for p in steps])
    sqrt_entropies = at([math.sqrt(p.entropy) for p in steps])
    bounds = at([entropy_acceptance_bound(p.entropy, 0.2) for p in steps])
    return [
        ("static", {}),
        *[("max_confidence", {"threshold": t}) for t in max_probs],
        ("max_confidence", {"threshold": max_probs[1], "dynamic": True}),
        *[("adaedl", {"threshold": t}) for t in bounds],
        ("adaedl", {"threshold": bounds[1], "dynamic": False}),
        *[("svip", {"threshold": t}) for t in sqrt_entropies],
        *[("hf_heuristic", {"initial_draft_len": k}) for k in (1, 5)],
        ("oracle", {}),
        ("batch_schedule", {"schedule": "1:3"}),
        ("beta_ts", {}),
        ("beta_ts", {"prior_alpha": 4.0, "prior_beta": 1.0}),
        ("cali_ts", {"theta_model": 0.8}),
        ("specdecpp", {"constant_logit": 1.5, "threshold": 0.5}),
        ("specdecpp", {"constant_logit": 0.0, "threshold": 0.7}),
    ]


@dataclass(frozen=True)
class Pair:
    """A draft and a target wrapped for the engine, six prompts, EOS, and the prompts' traces.

    ``eos_in_outputs`` says that some greedy output is known to stop on EOS.
    """

    draft: CachedLM
    target: LocalTarget
    prompts: list[torch.Tensor]
    eos_token_id: int | None
    eos_in_outputs: bool
    traces: list[GreedyTrace]

    def settings(self, seed: int = 0) -> RequestSettings:
        """Return the greedy request settings of sample ``seed``."""
        sampling = SamplingConfig(max_new_tokens=MAX_NEW)
        return RequestSettings(sampling, seed=seed, eos_token_id=self.eos_token_id)


def _micro_pair(zoo: Any) -> tuple[CachedLM, CachedLM, list[torch.Tensor], int | None]:
    """The micro zoo's target and draft-s, six builtin:code prompts (last 48 tokens), its EOS."""
    target_path = zoo.model_path("target")
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    texts = [p.text for p in load_prompts(DatasetSpec("builtin:code", samples=6))]
    prompts = [torch.tensor(tokenizer(text)["input_ids"][-48:]) for text in texts]
    draft = load_causal_lm(zoo.model_path("draft-s"))
    return CachedLM(draft), CachedLM(load_causal_lm(target_path)), prompts, tokenizer.eos_token_id


def _tiny_pair() -> tuple[CachedLM, CachedLM, list[torch.Tensor], int | None]:
    """The in-memory tiny pair of test_engine, whose draft is rejected at every block index.

    Its EOS is the 16th greedy token of the first prompt, so live runs stop on EOS too.
    """
    draft, target = build_tiny_pair()
    prompts = tiny_prompts(6, seed=1)
    settings = RequestSettings(SamplingConfig(max_new_tokens=MAX_NEW))
    output = autoregressive_generate(LocalTarget(CachedLM(target)), prompts[0], settings)
    return CachedLM(draft), CachedLM(target), prompts, output.output_ids[15]


@pytest.fixture(scope="module", params=["micro", "tiny"])
def pair(request: pytest.FixtureRequest) -> Pair:
    """Each test pair with one trace per prompt at the largest cap (it serves smaller ones)."""
    if request.param == "micro":
        draft, target, prompts, eos = _micro_pair(request.getfixturevalue("micro_zoo"))
    else:
        draft, target, prompts, eos = _tiny_pair()
    traces = [record_trace(draft, target, ids, MAX_NEW, max(CAPS), eos) for ids in prompts]
    return Pair(draft, LocalTarget(target), prompts, eos, request.param == "tiny", traces)


def _live_rounds(pair: Pair, index: int, name, params, cap) -> tuple[list[tuple], list[int]]:
    """Return the live run's (drafted, accepted, bonus, forwards) rounds and its output."""
    ids, settings = pair.prompts[index], pair.settings(seed=index)
    policy = make_policy(name, cap, **params)
    reference = None
    if policy.needs_reference:
        reference = autoregressive_generate(pair.target, ids, settings).output_ids
    result = speculative_generate(
        pair.draft, pair.target, policy, ids, settings, reference=reference
    )
    rounds = [(r.drafted, r.accepted, r.bonus, r.draft_forwards) for r in result.rounds]
    return rounds, result.output_ids


def _key(rounds: list[ReplayedRound]) -> list[tuple]:
    return [(r.drafted, r.accepted, r.bonus, r.draft_forwards) for r in rounds]


def _shifted(trace: GreedyTrace, shift: float) -> GreedyTrace:
    """Return ``trace`` with every recorded entropy and max probability moved by ``shift``."""

    def move(p: DraftPrediction) -> DraftPrediction:
        return dataclasses.replace(p, entropy=p.entropy + shift, max_prob=p.max_prob + shift)

    return dataclasses.replace(
        trace,
        on_path=tuple(map(move, trace.on_path)),
        off_path={p: tuple(map(move, d)) for p, d in trace.off_path.items()},
    )


def _near_tie_explains(trace: GreedyTrace, live: list[tuple], name, params, cap, seed) -> bool:
    """Return True when floating-point noise explains live rounds that replay does not give.

    That is: some recorded argmax of either model is a near-tie (logit gap < NEAR_TIE), or
    replaying with the features moved by ±FEATURE_NOISE (a feature that close to a policy's
    threshold) gives the live rounds.
    """
    margins = [p.margin for p in trace.on_path] + list(trace.target_margins)
    margins += [p.margin for detour in trace.off_path.values() for p in detour]
    if min(margins) < NEAR_TIE:
        return True
    return any(
        _key(replay(make_policy(name, cap, **params), _shifted(trace, shift), seed)) == live
        for shift in (FEATURE_NOISE, -FEATURE_NOISE)
    )


def test_trace_follows_the_target_greedy_output(pair):
    disagreements, eos_stops = 0, 0
    for ids, trace in zip(pair.prompts, pair.traces, strict=True):
        expected = autoregressive_generate(pair.target, ids, pair.settings()).output_ids
        assert list(trace.reference) == expected
        eos_stops += len(expected) < MAX_NEW
        assert len(trace.on_path) == len(trace.target_tokens) - 1
        full = torch.cat([ids, torch.tensor(trace.target_tokens)])
        scratch = pair.draft.full_logits(full)[len(ids) - 1 : -2]
        assert [p.token for p in trace.on_path] == scratch.argmax(-1).tolist()
        probs = scratch.softmax(-1)
        recorded = torch.tensor([p.max_prob for p in trace.on_path])
        torch.testing.assert_close(recorded, probs.max(-1).values, atol=1e-5, rtol=0)
        for position, detour in trace.off_path.items():
            assert trace.on_path[position].token != trace.target_tokens[position]
            needed = min(max(CAPS) - 1, len(trace.target_tokens) - 2 - position)
            assert len(detour) == max(0, needed)
            drafted = [trace.on_path[position].token, *(p.token for p in detour)]
            path = torch.tensor([*trace.target_tokens[:position], *drafted])
            rows = pair.draft.full_logits(torch.cat([ids, path]))[-len(drafted) : -1]
            assert [p.token for p in detour] == rows.argmax(-1).tolist()
        disagreements += len(trace.off_path)
    assert disagreements > 0
    assert eos_stops > 0 or not pair.eos_in_outputs


def test_every_disagreement_has_its_detour_at_every_cap(pair):
    """A position where the draft leaves T has its detour, also when the recording reached
    it as the bonus position of a fully accepted block (no recording round drafted there)."""
    for cap in (1, 2, 3):
        checked = 0
        for ids in pair.prompts:
            trace = record_trace(pair.draft, pair.target.lm, ids, MAX_NEW, cap, pair.eos_token_id)
            left = [p for p, x in enumerate(trace.on_path) if x.token != trace.target_tokens[p]]
            assert sorted(trace.off_path) == left
            checked += len(left)
            for name, params in (("svip", {"threshold": 1.0}), ("static", {})):
                policy = make_policy(name, cap, **params)
                replayed = replay(policy, trace, seed=0)
                assert sum(r.accepted + 1 for r in replayed) >= len(trace.reference)
        assert checked > 0


@pytest.mark.slow
def test_replay_equals_live_rounds_for_every_replayable_policy(pair):
    configs = _configs(pair.traces)
    # Every policy a draft model can serve (ngram_match reads a lookup's match length).
    assert {name for name, _ in configs} == set(POLICIES) - {"ngram_match"}
    total, different, untraced = 0, 0, []
    detours, lengths = 0, set()
    for name, params in configs:
        for cap in CAPS:
            for index, trace in enumerate(pair.traces):
                live, output = _live_rounds(pair, index, name, params, cap)
                replayed = _key(replay(make_policy(name, cap, **params), trace, index))
                total += len(live)
                detours += sum(r[0] > r[1] + 1 for r in live)
                lengths.update(r[0] for r in live)
                if replayed != live or output != list(trace.reference):
                    differing = sum(a != b for a, b in zip(live, replayed, strict=False))
                    different += max(1, differing + abs(len(live) - len(replayed)))
                    if not _near_tie_explains(trace, live, name, params, cap, index):
                        untraced.append((name, params, cap, index, live, replayed))
    assert detours > 0, "no round drafted past a rejection: the detours went untested"
    assert lengths >= set(range(max(CAPS) + 1)), f"drafted lengths seen: {sorted(lengths)}"
    assert untraced == []
    assert different <= 0.001 * total, f"{different} of {total} rounds differ"


#: The match-length rule, which only a lookup draft serves.
LOOKUP_CONFIGS = (("ngram_match", {}), ("ngram_match", {"ratio": 0.5, "min_draft": 2}))


@pytest.mark.slow
def test_lookup_replay_equals_live_rounds_for_every_policy(pair):
    """An n-gram lookup over the pair's target: its greedy trace (T by the target alone, the
    lookup's proposals at every round start) replays every policy a lookup serves to the live
    engine's rounds and output, on the pair's prompts and on them with a repeated passage."""
    configs = [*_configs(pair.traces), *LOOKUP_CONFIGS]
    prompts = [*pair.prompts, *(torch.cat([p, p[:-1]]) for p in pair.prompts)]
    total, different, drafted = 0, [], 0
    for cap in CAPS:
        for index, ids in enumerate(prompts):
            trace = record_lookup_trace(
                pair.target, ids, MAX_NEW, cap, pair.eos_token_id, NgramSettings()
            )
            for name, params in configs:
                settings = pair.settings(seed=index)
                policy = make_policy(name, cap, **params)
                reference = None
                if policy.needs_reference:
                    reference = autoregressive_generate(pair.target, ids, settings).output_ids
                result = speculative_generate(
                    NgramProposer(), pair.target, policy, ids, settings, reference=reference
                )
                live = [(r.drafted, r.accepted, r.bonus, r.draft_forwards) for r in result.rounds]
                replayed = _key(replay(make_policy(name, cap, **params), trace, index))
                total += len(live)
                drafted += sum(r[0] for r in live)
                if replayed != live or result.output_ids != list(trace.reference):
                    different.append((name, params, cap, index, live, replayed))
    assert drafted > 0, "the lookup should propose on prompts with a repeated passage"
    assert different == [], f"{len(different)} runs of {total} rounds differ"


def _hand_trace(eos: int | None = None, entropy_after_detour: float = 0.1) -> GreedyTrace:
    """T = 10..17; the draft disagrees at positions 2 (99) and 5 (98) and detours after them."""

    def p(token: int, entropy: float = 0.1) -> DraftPrediction:
        return DraftPrediction(token=token, entropy=entropy, max_prob=0.9, margin=1.0)

    target = tuple(range(10, 18))
    on_path = tuple(p(t) for t in target)
    on_path = (*on_path[:2], p(99), *on_path[3:5], p(98), *on_path[6:])
    return GreedyTrace(
        prompt_ids=(1, 2, 3),
        max_new_tokens=8,
        cap=4,
        eos_token_id=eos,
        target_tokens=target,
        target_margins=(1.0,) * 8,
        on_path=on_path,
        off_path={
            2: (p(50, entropy_after_detour), p(51), p(52)),
            5: (p(60, entropy_after_detour), p(61)),
        },
    )


def _rounds(name: str, trace: GreedyTrace, cap: int, **params: Any) -> list[tuple]:
    return _key(replay(make_policy(name, cap, **params), trace, seed=0))


def test_hand_made_trace_static_and_oracle():
    trace = _hand_trace()
    # (drafted, accepted, bonus, draft forwards); a round's cap is min(K, 8 − generated − 1).
    assert _rounds("static", trace, 3) == [(3, 2, False, 3), (3, 2, False, 3), (1, 1, True, 1)]
    assert _rounds("static", trace, 4) == [(4, 2, False, 4), (4, 2, False, 4), (1, 1, True, 1)]
    assert _rounds("oracle", trace, 3) == [(2, 2, True, 3), (2, 2, True, 3), (1, 1, True, 1)]
    assert _rounds("oracle", trace, 4) == [(2, 2, True, 3), (2, 2, True, 3), (1, 1, True, 1)]


def test_hand_made_trace_reads_the_detour_and_stops_after_eos():
    # SVIP stops before the detour's first token (sqrt(4) > 1): it paid for that forward.
    trace = _hand_trace(entropy_after_detour=4.0)
    assert _rounds("svip", trace, 4, threshold=1.0) == [
        (3, 2, False, 4),
        (3, 2, False, 4),
        (1, 1, True, 1),
    ]
    eos_trace = _hand_trace(eos=14)
    assert eos_trace.reference == (10, 11, 12, 13, 14)
    assert _rounds("static", eos_trace, 4) == [(4, 2, False, 4), (4, 2, False, 4)]
    assert _rounds("oracle", eos_trace, 4) == [(2, 2, True, 3), (2, 2, True, 3)]


def test_hand_made_trace_stop_after_a_kept_candidate_skips_its_forward():
    # sigmoid(ln 4) = 0.8, h = 0.1: no factor at the first candidate (Algorithm 2), then
    # 1 − 0.8 > h at the second, so SpecDec++ keeps two candidates a round and stops without the
    # forward after the second; the last round's cap is 1.
    trace = _hand_trace()
    rounds = _rounds("specdecpp", trace, 4, constant_logit=math.log(4.0), threshold=0.1)
    assert rounds == [(2, 2, True, 2), (2, 2, True, 2), (1, 1, True, 1)]
    # SVIP keeps the first candidate whatever its entropy; the detour's entropy stops it after.
    high_first = dataclasses.replace(
        trace, on_path=tuple(dataclasses.replace(p, entropy=9.0) for p in trace.on_path)
    )
    assert _rounds("svip", high_first, 4, threshold=1.0)[0] == (1, 1, True, 2)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("beta_ts", {"persist_across_requests": True}),
        ("hf_heuristic", {"persist_across_requests": True, "initial_draft_len": 1}),
    ],
)
def test_replay_with_state_across_requests_equals_live_requests_in_order(pair, name, params):
    """One policy over the prompts in order, live and replayed, gives the same rounds, and
    differs from a fresh policy per prompt."""
    cap = max(CAPS)
    live_policy = make_policy(name, cap, **params)
    replay_policy = make_policy(name, cap, **params)
    live, replayed, fresh = [], [], []
    for index, (ids, trace) in enumerate(zip(pair.prompts, pair.traces, strict=True)):
        result = speculative_generate(
            pair.draft, pair.target, live_policy, ids, pair.settings(seed=index)
        )
        live.append([(r.drafted, r.accepted, r.bonus, r.draft_forwards) for r in result.rounds])
        replayed.append(_key(replay(replay_policy, trace, index)))
        fresh.append(_key(replay(make_policy(name, cap, **params), trace, index)))
    assert replayed == live
    assert fresh != live


def test_replay_refuses_hidden_state_policies_and_uncovered_caps():
    trace = _hand_trace()
    refused = [
        make_policy("specdecpp", 4),
        make_policy("specdecpp", 4, head=lambda hidden: 0.0),
        make_policy("cali_ts", 4, predictor=lambda step: 0.5),
    ]
    for policy in refused:
        with pytest.raises(ValueError, match="does not store"):
            replay(policy, trace, seed=0)
    with pytest.raises(ValueError, match="exceeds the trace's recorded cap 4"):
        replay(make_policy("static", 6), trace, seed=0)


def test_near_tie_check_accepts_feature_noise_and_nothing_more():
    def with_entropy_at_1(value: float) -> GreedyTrace:
        trace = _hand_trace()
        on_path = list(trace.on_path)
        on_path[1] = dataclasses.replace(on_path[1], entropy=value)
        return dataclasses.replace(trace, on_path=tuple(on_path))

    params = {"threshold": 1.0}
    recorded = with_entropy_at_1(1.0 + 4e-6)
    noisy_live = _rounds("svip", with_entropy_at_1(1.0 - 4e-6), 4, **params)
    assert noisy_live != _rounds("svip", recorded, 4, **params)
    assert _near_tie_explains(recorded, noisy_live, "svip", params, 4, 0)
    other_live = _rounds("svip", _hand_trace(entropy_after_detour=4.0), 4, **params)
    assert not _near_tie_explains(recorded, other_live, "svip", params, 4, 0)


def test_replayed_results_put_the_overhead_in_prefill_and_the_rounds_in_decode():
    from orchestrator.analysis.costs.model import RoundCostFit
    from orchestrator.analysis.costs.replay import GroupFit, replayed_results
    from orchestrator.analysis.costs.step_costs import StepCostFit, StepDemands

    trace = _hand_trace()
    rounds = replay(make_policy("static", 3), trace, seed=0)
    fit = RoundCostFit(0.01, 0.1, 0.02, 1.0, 1.0, 1.0, 10)
    steps = StepCostFit(
        t_draft=0.01,
        t_feature=0.0,
        t_ask=0.0,
        draft_per_context=0.0,
        verify_table=((0, 0.1), (1, 0.12), (3, 0.16)),
        verify_per_context=0.0,
        overhead=0.5,
        overhead_per_prompt_token=0.0,
        r2_draft=1.0,
        r2_verify=1.0,
        n_rounds=10,
        n_samples=1,
    )
    group = GroupFit(fit, 0.5, 1, steps)
    (result,) = replayed_results([rounds], [trace], group, StepDemands())
    # static K = 3 here: (3, 2), (3, 2), (1, 1) drafted/accepted, one forward per draft token
    assert result.prefill_seconds == 0.5
    assert result.decode_seconds == pytest.approx(7 * 0.01 + 0.16 + 0.16 + 0.12)
    assert result.seconds == pytest.approx(result.prefill_seconds + result.decode_seconds)
