"""Greedy replay of an n-gram lookup draft (``workers.trace.lookup_trace``, ``policies.replay``):
the trace holds what the live lookup proposes at every round start, and replaying any policy
over it gives the live engine's rounds and output on the tiny in-memory target."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.draft_kinds import repeat_prompts
from support.tiny_models import build_tiny_pair

from policies import make_policy
from policies.replay import replay
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import CachedLM
from workers.proposers import NgramProposer, NgramSettings
from workers.records import SamplingConfig
from workers.target import LocalTarget
from workers.trace import lookup_trace, record_lookup_trace

torch.set_num_threads(1)

MAX_NEW = 20
#: Every policy a lookup serves, with parameters that make the threshold rules stop at varied
#: lengths over point-mass features (entropy 0, max probability 1).
CONFIGS = (
    ("static", {}),
    ("ngram_match", {}),
    ("ngram_match", {"ratio": 0.5, "min_draft": 2}),
    ("max_confidence", {"threshold": 0.5}),
    ("adaedl", {}),
    ("svip", {}),
    ("hf_heuristic", {"initial_draft_len": 1}),
    ("hf_heuristic", {"initial_draft_len": 5, "persist_across_requests": False}),
    ("oracle", {}),
    ("batch_schedule", {"schedule": "1:3"}),
    ("beta_ts", {}),
    ("cali_ts", {"theta_model": 0.8}),
    ("specdecpp", {"constant_logit": 1.5, "threshold": 0.5}),
)


@pytest.fixture(scope="module")
def target() -> LocalTarget:
    """The tiny target (its draft half is not needed: the lookup drafts)."""
    _, model = build_tiny_pair()
    return LocalTarget(CachedLM(model))


def _first_round(sequence: list[int], settings: NgramSettings) -> list[tuple[int, int]]:
    """Return (token, match length) of what a live lookup proposes after ``sequence``."""
    proposer = NgramProposer(settings)
    proposer.begin(torch.tensor(sequence))
    sampling, generator = SamplingConfig(), torch.Generator()
    wanted = frozenset({"match_length"})
    candidate = proposer.first(sequence, sampling, generator, wanted)
    proposed = []
    while candidate is not None:
        proposed.append((int(candidate.token), int(candidate.match_length)))
        candidate = proposer.next(candidate, sampling, generator, wanted)
    return proposed


def test_a_lookup_trace_holds_the_live_lookups_proposals_at_every_round_start() -> None:
    prompt, tokens = [5, 6, 7, 5, 6], [7, 5, 6, 7, 8, 5, 6, 7]
    settings = NgramSettings(n_max=3)
    trace = lookup_trace(prompt, tokens, 8, 4, None, settings)
    assert (trace.step_cost, trace.on_path, trace.target_tokens) == (0, (), tuple(tokens))
    first = trace.lookups[0]
    assert [(p.token, p.match_length) for p in first] == [(7, 2), (5, 2), (6, 2)]
    assert all((p.entropy, p.max_prob) == (0.0, 1.0) for p in first)
    for start in range(len(tokens) - 1):
        live = _first_round([*prompt, *tokens[:start]], settings)
        reach = min(4, len(tokens) - 1 - start)
        recorded = [(p.token, p.match_length) for p in trace.lookups.get(start, ())]
        assert recorded == live[:reach]
    # An EOS at index 2 leaves T up to index 2 + cap (no round reaches further).
    assert len(lookup_trace(prompt, tokens, 8, 2, 6, settings).target_tokens) == 5


def test_a_hand_made_lookup_trace_replays_its_rounds_without_a_draft_forward() -> None:
    trace = lookup_trace([5, 6, 7, 5, 6], [7, 5, 6, 7, 8], 5, 4, None, NgramSettings())
    rounds = replay(make_policy("static", 4), trace, seed=0)
    assert [(r.drafted, r.accepted, r.bonus, r.draft_forwards) for r in rounds] == [
        (3, 3, True, 0),
        (0, 0, False, 0),
    ]
    lm_trace = dataclasses.replace(trace, lookups=None, step_cost=1)
    with pytest.raises(ValueError, match="match_length"):
        replay(make_policy("ngram_match", 4), lm_trace, seed=0)


def _live(target, prompt, name, params, cap, seed, eos):
    """Return the live lookup run's rounds (with feature summaries) and output."""
    settings = RequestSettings(SamplingConfig(max_new_tokens=MAX_NEW), seed=seed, eos_token_id=eos)
    policy = make_policy(name, cap, **params)
    reference = None
    if policy.needs_reference:
        reference = autoregressive_generate(target, prompt, settings).output_ids
    result = speculative_generate(
        NgramProposer(), target, policy, prompt, settings, reference=reference
    )
    return _key(result.rounds), result.output_ids


def _key(rounds) -> list[tuple]:
    """Return what a round is compared by: counts, draft forwards, feature summaries."""
    return [
        (r.drafted, r.accepted, r.bonus, r.draft_forwards, r.mean_entropy, r.min_max_prob)
        for r in rounds
    ]


def test_lookup_replay_equals_live_rounds_for_every_policy(target) -> None:
    prompts = repeat_prompts()
    greedy = RequestSettings(SamplingConfig(max_new_tokens=MAX_NEW))
    ar = autoregressive_generate(target, prompts[0], greedy)
    drafted = 0
    for eos in (None, ar.output_ids[9]):
        for cap in (3, 6):
            for index, prompt in enumerate(prompts):
                trace = record_lookup_trace(target, prompt, MAX_NEW, cap, eos, NgramSettings())
                for name, params in CONFIGS:
                    live, output = _live(target, prompt, name, params, cap, index, eos)
                    replayed = _key(replay(make_policy(name, cap, **params), trace, index))
                    assert replayed == live, (name, params, cap, index, eos)
                    assert output == list(trace.reference)
                    drafted += sum(r[0] for r in live)
    assert drafted > 0, "the lookup should propose on prompts with a repeated passage"
