"""Work units: prompt shards cover every prompt once; dispatch follows plan order and deps."""

import pytest

from orchestrator.sweep.work_units import (
    WorkUnit,
    group_units,
    job_key,
    missing_arms,
    pick_next,
    prompt_shards,
    shard_key,
    trial_units,
)


@pytest.mark.parametrize("samples,size", [(1, 1), (7, 3), (9, 3), (10, 4), (5, 8)])
def test_prompt_shards_cover_each_prompt_once_in_order(samples, size):
    shards = prompt_shards(samples, size)
    flat = [index for shard in shards for index in shard]
    assert flat == list(range(samples))
    assert all(1 <= len(shard) <= size for shard in shards)
    assert len(shards) == -(-samples // size)


def test_prompt_shards_rejects_zero_size():
    with pytest.raises(ValueError, match="shard_prompts"):
        prompt_shards(4, 0)


def test_ordered_trial_is_one_unit_and_spread_trial_is_many():
    spread = trial_units("t1", "pair-a", samples=10, shard_prompts=4, after=[job_key("kd")])
    assert [unit.key for unit in spread] == [shard_key("t1", i) for i in range(3)]
    assert {unit.shards for unit in spread} == {3}
    assert all(unit.after == ("job:kd",) for unit in spread)
    ordered = trial_units("t2", "pair-a", samples=10, shard_prompts=4, ordered=True)
    assert len(ordered) == 1 and ordered[0].prompts == tuple(range(10))


def test_pick_next_takes_plan_order_for_the_replicas_groups_once_deps_are_done():
    job = WorkUnit(key=job_key("kd"), group="training", job="kd")
    a = trial_units("a", "pair-a", 2, 1, after=[job.key])
    b = trial_units("b", "pair-b", 2, 1)
    pending = [job, *a, *b]
    assert pick_next(pending, done=set(), serves={"pair-a"}) is None
    assert pick_next(pending, done=set(), serves={"pair-a", "pair-b"}) == b[0]
    assert pick_next(pending, done={job.key}, serves={"pair-a", "pair-b"}) == a[0]
    assert pick_next(pending, done=set(), serves={"training"}) == job


def test_group_units_carry_every_arm_with_each_repeat_of_their_prompts():
    units = group_units("g", "pair-a", ["base", "t1"], prompts=5, shard_prompts=2, repeats=2)
    assert [unit.prompts for unit in units] == [(0, 1), (2, 3), (4,)]
    assert [unit.key for unit in units] == [shard_key("g", i) for i in range(3)]
    assert all([arm.trial_id for arm in unit.arms] == ["base", "t1"] for unit in units)
    assert [unit.arms[1].samples for unit in units] == [(0, 1, 5, 6), (2, 3, 7, 8), (4, 9)]
    samples = sorted(s for unit in units for s in unit.arms[0].samples)
    assert samples == list(range(10))
    assert all(unit.trial_id is None and unit.shards == 3 for unit in units)


def test_ordered_group_is_one_unit_and_repeats_must_be_positive():
    (unit,) = group_units("g", "p", ["a", "b"], prompts=6, shard_prompts=2, ordered=True)
    assert unit.prompts == tuple(range(6))
    with pytest.raises(ValueError, match="repeats"):
        group_units("g", "p", ["a"], prompts=2, shard_prompts=1, repeats=0)


def test_missing_arms_rerun_only_what_is_not_stored():
    units = group_units("g", "p", ["base", "t1", "t2"], prompts=4, shard_prompts=2)
    # shard 0 crashed after storing base and t1; t2 stored half of shard 1 (old shard size)
    stored = {"base": {0, 1}, "t1": {0, 1, 2, 3}, "t2": {3}}
    left = missing_arms(units, stored)
    assert [(u.shard, [(a.trial_id, a.samples) for a in u.arms]) for u in left] == [
        (0, [("t2", (0, 1))]),
        (1, [("base", (2, 3)), ("t2", (2,))]),
    ]
    everything = {arm: set(range(4)) for arm in ("base", "t1", "t2")}
    assert missing_arms(units, everything) == []
