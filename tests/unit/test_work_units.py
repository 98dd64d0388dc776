"""Work units: prompt shards cover every prompt once; dispatch follows plan order and deps."""

import pytest

from orchestrator.sweep.work_units import (
    WorkUnit,
    job_key,
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
