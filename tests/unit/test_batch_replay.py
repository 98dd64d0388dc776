"""Greedy replay at a batch size above 1 against the batched engine on a tiny in-memory pair:
each sequence's live rounds at B = 3 are its batch-1 replay over its greedy trace, the queue
simulator rebuilds the engine's batch rounds (every round's members carry the same seconds),
and a replayed queue stores what a live one does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from support.tiny_models import build_tiny_pair, prompts

from orchestrator.analysis.costs.batch_costs import (
    LiveQueue,
    LiveSequence,
    fit_batch_costs,
    queue_observations,
)
from orchestrator.analysis.costs.batch_replay import (
    batch_replayed_rounds,
    project_queues,
    replayed_queue_results,
)
from policies import make_policy
from policies.replay import SequenceReplay, replay
from workers.batch_cache import BatchedLM
from workers.batch_engine import (
    BatchRequest,
    batch_autoregressive_generate,
    batch_speculative_generate,
)
from workers.lm import CachedLM
from workers.records import RequestSettings, SamplingConfig
from workers.trace import record_trace

torch.set_num_threads(1)
SLOTS = 3
#: Unequal budgets, so sequences leave early and waiting ones join.
BUDGETS = (12, 20, 6, 16, 20, 9)
POLICIES = ("static", "adaedl", "max_confidence")


@pytest.fixture(scope="module")
def pair() -> tuple[CachedLM, CachedLM]:
    """The tiny in-memory pair (draft, target)."""
    draft, target = build_tiny_pair()
    return CachedLM(draft), CachedLM(target)


@pytest.fixture(scope="module")
def requests() -> list[BatchRequest]:
    """Six greedy requests with unequal budgets."""
    return [
        BatchRequest(prompt, RequestSettings(SamplingConfig(max_new_tokens=budget), seed=index))
        for index, (prompt, budget) in enumerate(zip(prompts(6, seed=4), BUDGETS, strict=True))
    ]


@pytest.fixture(scope="module")
def traces(pair, requests):
    """Each request's greedy trace at cap 4."""
    draft, target = pair
    return [
        record_trace(draft, target, r.prompt_ids, r.settings.sampling.max_new_tokens, cap=4)
        for r in requests
    ]


def _queue(trial_id: str, results) -> LiveQueue:
    return LiveQueue(
        trial_id,
        SLOTS,
        tuple(
            LiveSequence(tuple(r.rounds), r.prefill_seconds, r.seconds, r.batch_seconds)
            for r in results
        ),
    )


def _key(rounds) -> list[tuple[int, int, int]]:
    return [(r.drafted, r.accepted, r.draft_forwards) for r in rounds]


@pytest.mark.parametrize("name", POLICIES)
def test_live_rounds_at_batch_three_are_the_batch_one_replay(pair, requests, traces, name):
    draft, target = pair
    live = batch_speculative_generate(
        BatchedLM(draft, SLOTS), BatchedLM(target, SLOTS), lambda: make_policy(name, 4), requests
    )
    replayed = [
        replay(make_policy(name, 4), trace, r.settings.seed)
        for trace, r in zip(traces, requests, strict=True)
    ]
    assert [_key(r.rounds) for r in live] == [_key(rounds) for rounds in replayed]
    # the simulator's schedule is the engine's: a rebuilt round's members share its seconds
    assert queue_observations(_queue(name, live)).consistent == 1.0
    table = fit_batch_costs(SLOTS, [_queue(name, live)])
    results = replayed_queue_results(replayed, traces, table, [list(range(len(requests)))])
    assert [r.output_ids for r in results] == [r.output_ids for r in live]
    assert [_key(r.rounds) for r in results] == [_key(r.rounds) for r in live]
    # in sample the table gives the queue's wall time back: its cells keep their sums and the
    # overhead per round takes the rest
    measured_wall = sum(r.batch_seconds for r in live)
    assert sum(r.batch_seconds for r in results) == pytest.approx(measured_wall, rel=1e-6)
    assert project_queues(table, [_queue(name, live)])[1] == pytest.approx(measured_wall, rel=1e-6)


def test_the_ar_queue_is_rebuilt_too(pair, requests):
    _, target = pair
    live = batch_autoregressive_generate(BatchedLM(target, SLOTS), requests)
    observed = queue_observations(_queue("ar", live))
    assert observed.consistent == 1.0
    assert {r.draft_steps for r in observed.rounds} == {0}
    assert max(r.rows for r in observed.rounds) == SLOTS


def test_a_policy_told_the_batch_size_replays_its_live_rounds_at_batch_three(
    pair, requests, traces
):
    """batch_schedule drafts K by the rows in each round (here 4 alone, 2 with one other, 1 with
    two): its batch-1 replay is not its batched run, the queue's joint replay is."""
    draft, target = pair
    schedule = {"schedule": "1:4 2:2 3:1"}
    live = batch_speculative_generate(
        BatchedLM(draft, SLOTS),
        BatchedLM(target, SLOTS),
        lambda: make_policy("batch_schedule", 4, **schedule),
        requests,
    )
    trial = SimpleNamespace(
        setting=SimpleNamespace(policy="batch_schedule", max_draft_len=4, params_dict=schedule),
        seed=0,  # sample_seed(0, i) = i, the requests' seeds
    )
    queue = [list(range(len(requests)))]
    jointly = batch_replayed_rounds(trial, traces, queue, SLOTS)
    alone = [
        replay(make_policy("batch_schedule", 4, **schedule), trace, r.settings.seed)
        for trace, r in zip(traces, requests, strict=True)
    ]
    assert [_key(r.rounds) for r in live] == [_key(rounds) for rounds in jointly]
    assert [_key(r.rounds) for r in live] != [_key(rounds) for rounds in alone]
    assert {r.drafted for result in live for r in result.rounds} >= {1, 2}
    assert queue_observations(_queue("batch_schedule", live)).consistent == 1.0


def test_a_sequence_left_alone_is_told_its_batch_of_one(traces):
    """The engine tells a BatchAware policy every round's rows, one included: a sequence whose
    neighbours have left drafts the schedule's K for a batch of one again."""
    run = SequenceReplay(make_policy("batch_schedule", 4, schedule="1:4 2:2 3:1"), traces[1], 1)
    assert run.next_round(3).drafted == 1
    assert run.next_round(1).drafted == 4
