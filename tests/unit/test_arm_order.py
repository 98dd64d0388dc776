"""The interleaved arms of a group: the seeded rotating order, and running arms in process."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from support.tiny_models import build_tiny_pair, prompts

from workers.arm_order import arm_order, cycle_length
from workers.lm import CachedLM
from workers.records import SamplingConfig
from workers.target import LocalTarget
from workers.trial import ArmRequest, GroupRequest, TrialRequest, run_arms, run_trial


@pytest.mark.parametrize("arms", [1, 2, 3, 4, 5])
def test_each_cycle_balances_positions_and_who_runs_after_whom(arms):
    length = cycle_length(arms)
    assert length == (arms if arms % 2 == 0 else 2 * arms)
    for cycle in range(4):
        orders = [arm_order(arms, seed=7, block=cycle * length + b) for b in range(length)]
        assert all(sorted(order) == list(range(arms)) for order in orders)
        for position in range(arms):
            counts = Counter(order[position] for order in orders)
            assert counts == {arm: length // arms for arm in range(arms)}
        follows = Counter((a, b) for order in orders for a, b in itertools.pairwise(order))
        if arms > 1:
            assert set(follows.values()) == {length // arms}
            assert len(follows) == arms * (arms - 1)


def test_order_is_seeded_deterministic_and_varies_by_cycle():
    runs = [[arm_order(3, seed, block) for block in range(60)] for seed in (0, 0, 1)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert len({tuple(runs[0][start : start + 6]) for start in range(0, 60, 6)}) > 1
    assert Counter(order[0] for order in runs[0]) == {0: 20, 1: 20, 2: 20}


def test_order_rejects_no_arms():
    with pytest.raises(ValueError, match="at least one arm"):
        arm_order(0, 0, 0)


def _request(policy: str, tokens: list[list[int]], indices: tuple[int, ...], **params):
    return TrialRequest(
        prompts=[tokens[i % len(tokens)] for i in indices],
        indices=indices,
        sampling=SamplingConfig(temperature=1.0, top_k=20, max_new_tokens=6),
        policy=policy,
        params=params,
        max_draft_len=3 if policy != "ar" else 0,
        seed=5,
    )


def test_arms_run_interleaved_and_decode_as_each_trial_alone():
    draft_model, target_model = build_tiny_pair()
    draft, target = CachedLM(draft_model), LocalTarget(CachedLM(target_model))
    tokens = [p.tolist() for p in prompts(2)]
    indices = (0, 1, 2, 3)  # two repeats of two prompts
    arms = (
        ArmRequest("base", _request("ar", tokens, indices)),
        ArmRequest("static", _request("static", tokens, indices)),
        ArmRequest(
            "heuristic",
            _request("hf_heuristic", tokens, indices, persist_across_requests=True),
        ),
    )
    torch.manual_seed(0)
    done = run_arms(draft, target, GroupRequest(arms, seed=3))
    for arm in arms:
        alone = run_trial(draft, target, arm.request)
        assert [r.output_ids for r in done.results[arm.key]] == [r.output_ids for r in alone]
        assert [len(r.rounds) for r in done.results[arm.key]] == [len(r.rounds) for r in alone]
    keys = [arm.key for arm in arms]
    blocks = [done.log[start : start + 3] for start in range(0, len(done.log), 3)]
    assert [tuple(s.index for s in block) for block in blocks] == [(i, i, i) for i in indices]
    for index, block in zip(indices, blocks, strict=True):
        assert [keys.index(s.key) for s in block] == list(arm_order(3, 3, index))
    starts = [s.started for s in done.log]
    assert starts == sorted(starts)


def test_arms_with_different_samples_run_only_their_own():
    draft_model, target_model = build_tiny_pair()
    draft, target = CachedLM(draft_model), LocalTarget(CachedLM(target_model))
    tokens = [p.tolist() for p in prompts(4)]
    arms = (
        ArmRequest("base", _request("ar", tokens, (2, 3))),
        ArmRequest("static", _request("static", tokens, (0, 1, 2, 3))),
    )
    done = run_arms(draft, target, GroupRequest(arms, seed=0))
    assert len(done.results["base"]) == 2 and len(done.results["static"]) == 4
    assert [(s.key, s.index) for s in done.log if s.key == "base"] == [("base", 2), ("base", 3)]


def test_an_arm_that_raises_stops_alone_and_the_others_go_on():
    draft_model, target_model = build_tiny_pair()
    draft, target = CachedLM(draft_model), LocalTarget(CachedLM(target_model))
    tokens = [p.tolist() for p in prompts(2)]
    arms = (
        ArmRequest("base", _request("ar", tokens, (0, 1))),
        ArmRequest("broken", _request("cali_ts", tokens, (0, 1), sigma_model=1.0e-200)),
    )
    done = run_arms(draft, target, GroupRequest(arms, seed=0))
    assert set(done.results) == {"base"} and len(done.results["base"]) == 2
    assert isinstance(done.errors["broken"], ZeroDivisionError)
    assert {s.key for s in done.log} == {"base"}
