"""Greedy replay of an EAGLE head (``workers.eagle.trace``, ``policies.replay``) on the tiny
in-memory target: the trace holds at every round start the chain a head begun on that prefix
drafts, a hand-made chain trace replays by round start, and replaying any policy over a
recorded trace gives the live engine's rounds and output."""

from __future__ import annotations

import math

import pytest
import torch
from support.eagle_heads import trained_head
from support.tiny_models import build_tiny_pair, prompts

from orchestrator.analysis.costs.replay import trace_from_json, trace_to_json
from policies import make_policy
from policies.adaedl import entropy_acceptance_bound
from policies.replay import DraftPrediction, GreedyTrace, replay
from training.lm_trainer import torch_threads
from workers.eagle.drafter import EagleDrafter
from workers.eagle.trace import record_eagle_trace
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import CachedLM
from workers.proposers import EagleProposer
from workers.records import SamplingConfig
from workers.target import LocalTarget
from workers.trace import draft_prediction

MAX_NEW = 20
GREEDY = SamplingConfig(max_new_tokens=MAX_NEW)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread: the tiny products run many times slower on threads that spin."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def models():
    """The tiny target (as ``LocalTarget``) and a head trained briefly over it (about 5 s;
    its drafts are accepted about a third of the time)."""
    _, target = build_tiny_pair()
    return LocalTarget(CachedLM(target)), trained_head(target, n=32, steps=60)


def _prefix_chain(
    target: LocalTarget, head, prefix: torch.Tensor, count: int
) -> list[DraftPrediction]:
    """Return ``count`` greedy proposals of a head begun on ``prefix`` (its features from one
    prefill of the whole prefix), with their features."""
    drafter = EagleDrafter(head)
    drafter.begin(prefix, target.prefill(prefix, GREEDY, 0, want_features=True))
    return [draft_prediction(drafter.propose(GREEDY).logits) for _ in range(count)]


def _first_new(tokens: list[int], start: int) -> int:
    """Return the first index from ``start`` whose token did not occur before it."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


def test_an_eagle_trace_holds_the_chain_of_a_head_begun_at_every_round_start(models) -> None:
    target, head = models
    prompt, cap = prompts(1, seed=4)[0], 4
    trace = record_eagle_trace(EagleDrafter(head), target, prompt, MAX_NEW, cap)
    ar = autoregressive_generate(target, prompt, RequestSettings(GREEDY))
    assert trace.target_tokens == tuple(ar.output_ids)
    assert (trace.on_path, trace.off_path, trace.lookups, trace.step_cost) == ((), {}, None, 1)
    assert sorted(trace.chains) == list(range(MAX_NEW - 1))
    for start, chain in trace.chains.items():
        assert len(chain) == min(cap, MAX_NEW - 1 - start)
        prefix = torch.cat([prompt, torch.tensor(ar.output_ids[:start], dtype=torch.long)])
        expected = _prefix_chain(target, head, prefix, len(chain))
        assert [p.token for p in chain] == [p.token for p in expected], start
        for prediction, alone in zip(chain, expected, strict=True):
            assert prediction.entropy == pytest.approx(alone.entropy, abs=1e-4)
            assert prediction.max_prob == pytest.approx(alone.max_prob, abs=1e-5)
            assert prediction.margin is not None and prediction.margin >= 0
    assert trace_from_json(trace_to_json(trace)) == trace
    # An EOS first emitted at index e leaves T up to index e + cap, the chains cut before it.
    e = _first_new(ar.output_ids, 5)
    cut = record_eagle_trace(EagleDrafter(head), target, prompt, MAX_NEW, cap, ar.output_ids[e])
    assert cut.target_tokens == trace.target_tokens[: e + cap + 1]
    assert max(s + len(c) for s, c in cut.chains.items()) == len(cut.target_tokens) - 1


def _predictions(tokens: list[int]) -> tuple[DraftPrediction, ...]:
    """Return hand-made predictions of ``tokens`` (entropy 1, max probability 0.5)."""
    return tuple(DraftPrediction(token, 1.0, 0.5, 1.0) for token in tokens)


def test_a_hand_made_chain_trace_replays_the_chain_of_each_round_start() -> None:
    """T = 10 11 12 13 14 15; a round starting at 3 drafts chains[3], not what the chain of
    an earlier start drafted at those positions."""
    chains = {
        0: _predictions([10, 11, 99]),
        1: _predictions([11, 12, 13]),
        2: _predictions([12, 13, 14]),
        3: _predictions([13, 98]),
        4: _predictions([14]),
    }
    trace = GreedyTrace(
        prompt_ids=(1, 2),
        max_new_tokens=6,
        cap=3,
        eos_token_id=None,
        target_tokens=(10, 11, 12, 13, 14, 15),
        target_margins=(),
        on_path=(),
        chains=chains,
    )
    rounds = replay(make_policy("static", 3), trace, seed=0)
    assert [(r.drafted, r.accepted, r.bonus, r.draft_forwards) for r in rounds] == [
        (3, 2, False, 3),  # chains[0]: 10 11 kept, 99 rejected; the target emits 12
        (2, 1, False, 2),  # chains[3] (cap 6 − 3 − 1 = 2): 13 kept, 98 rejected
        (0, 0, False, 0),  # one token left: no draft
    ]
    assert [r.mean_entropy for r in rounds] == [None, None, None]  # static reads no feature
    with pytest.raises(ValueError, match="match_length"):
        replay(make_policy("ngram_match", 3), trace, seed=0)


def _thresholds(values: list[float]) -> list[float]:
    """Return thresholds near the quartiles of ``values``, each in the middle of the widest gap
    between neighbouring values there, so float noise moves no value across one."""
    ordered = sorted(set(values))
    chosen = []
    for quantile in (0.25, 0.5, 0.75):
        middle = round(quantile * (len(ordered) - 1))
        pairs = range(max(middle - 3, 0), min(middle + 3, len(ordered) - 1))
        low = max(pairs, key=lambda i: ordered[i + 1] - ordered[i])
        chosen.append((ordered[low] + ordered[low + 1]) / 2)
    return chosen


def _configs(traces: list[GreedyTrace]) -> list[tuple[str, dict]]:
    """Return (policy, parameters) for every policy an EAGLE head serves and replay can
    reproduce, thresholds between recorded features so that rounds stop at varied lengths."""
    steps = [p for trace in traces for chain in trace.chains.values() for p in chain]
    bounds = _thresholds([entropy_acceptance_bound(p.entropy, 0.2) for p in steps])
    return [
        ("static", {}),
        *[("max_confidence", {"threshold": t}) for t in _thresholds([p.max_prob for p in steps])],
        *[("adaedl", {"threshold": t}) for t in bounds],
        *[("svip", {"threshold": t}) for t in _thresholds([math.sqrt(p.entropy) for p in steps])],
        ("hf_heuristic", {"initial_draft_len": 1}),
        ("oracle", {}),
        ("batch_schedule", {"schedule": "1:3"}),
        ("beta_ts", {}),
        ("cali_ts", {"theta_model": 0.8}),
        ("specdecpp", {"constant_logit": 1.5, "threshold": 0.5}),
    ]


def _live(target, head, prompt, name, params, cap, seed, eos) -> tuple[list[tuple], list[int]]:
    """Return the live EAGLE run's rounds (counts, forwards, feature summaries) and output."""
    settings = RequestSettings(GREEDY, seed=seed, eos_token_id=eos)
    policy = make_policy(name, cap, **params)
    reference = None
    if policy.needs_reference:
        reference = autoregressive_generate(target, prompt, settings).output_ids
    result = speculative_generate(
        EagleProposer(head), target, policy, prompt, settings, reference=reference
    )
    return _key(result.rounds), result.output_ids


def _key(rounds) -> list[tuple]:
    """Return what a round is compared by: counts, forwards, feature summaries."""
    return [
        (r.drafted, r.accepted, r.bonus, r.draft_forwards, r.mean_entropy, r.min_max_prob)
        for r in rounds
    ]


def _assert_same(live: list[tuple], replayed: list[tuple], case: tuple) -> None:
    """Assert equal counts and forwards, and feature summaries equal up to float noise (the
    live run computes on blocks of other sizes)."""
    assert [r[:4] for r in replayed] == [r[:4] for r in live], case
    for ours, theirs in zip(replayed, live, strict=True):
        for a, b in zip(ours[4:], theirs[4:], strict=True):
            assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, abs=1e-5))


def test_eagle_replay_equals_live_rounds_for_every_policy(models) -> None:
    """At cap 3 without EOS and at cap 6 with an EOS the first prompt emits."""
    target, head = models
    cases = prompts(3, seed=5)
    ar = autoregressive_generate(target, cases[0], RequestSettings(GREEDY))
    drafted, accepted, lengths = 0, 0, set()
    for eos, cap in ((None, 3), (ar.output_ids[9], 6)):
        traces = [
            record_eagle_trace(EagleDrafter(head), target, p, MAX_NEW, cap, eos) for p in cases
        ]
        for name, params in _configs(traces):
            for index, (prompt, trace) in enumerate(zip(cases, traces, strict=True)):
                live, output = _live(target, head, prompt, name, params, cap, index, eos)
                replayed = _key(replay(make_policy(name, cap, **params), trace, index))
                _assert_same(live, replayed, (name, params, cap, index, eos))
                assert output == list(trace.reference)
                drafted += sum(r[0] for r in live)
                accepted += sum(r[1] for r in live)
                lengths.update(r[0] for r in live)
    assert drafted > accepted > 0, "the head should have drafts accepted and rejected"
    assert lengths >= set(range(7)), f"drafted lengths seen: {sorted(lengths)}"
