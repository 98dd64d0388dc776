"""The scheduler simulation (orchestrator.analysis.costs.schedule_sim) against hand-computed
makespans."""

from __future__ import annotations

import pytest

from orchestrator.analysis.costs.schedule_sim import Replica, SimulationError, simulate
from orchestrator.sweep.work_units import WorkUnit, trial_units


def _replicas(n: int, serves: tuple[str, ...] = ("p",), ready_at: float = 0.0) -> list[Replica]:
    return [Replica(f"r{i}", frozenset(serves), ready_at) for i in range(n)]


def test_equal_units_divide_evenly_over_the_replicas() -> None:
    units = trial_units("t", "p", samples=12, shard_prompts=1)
    seconds = {unit.key: 5.0 for unit in units}
    result = simulate(units, seconds, _replicas(4))
    assert result.makespan == pytest.approx(15.0)
    assert result.busy == (15.0, 15.0, 15.0, 15.0)
    assert result.utilisation == pytest.approx(1.0)


def test_one_long_unit_bounds_the_makespan() -> None:
    units = trial_units("t", "p", samples=5, shard_prompts=1)
    seconds = {unit.key: 1.0 for unit in units} | {units[0].key: 10.0}
    result = simulate(units, seconds, _replicas(3))
    # r0 takes the 10 s unit; r1 and r2 share the four 1 s units (2 s each).
    assert result.makespan == pytest.approx(10.0)
    assert result.total_work == pytest.approx(14.0)
    assert result.utilisation == pytest.approx(14.0 / 30.0)


def test_a_dependency_delays_the_unit_until_it_is_done() -> None:
    first = WorkUnit(key="a", group="p")
    second = WorkUnit(key="b", group="p", after=("a",))
    third = WorkUnit(key="c", group="p")
    seconds = {"a": 4.0, "b": 3.0, "c": 1.0}
    result = simulate([first, second, third], seconds, _replicas(2))
    # r0 runs a (0-4); r1 skips b (not ready) and runs c (0-1), then waits; at 4 the first
    # free replica (r0) starts b, which ends at 7.
    assert result.makespan == pytest.approx(7.0)
    assert result.busy == (7.0, 1.0)


def test_plan_order_is_kept_and_loading_delays_the_start() -> None:
    units = trial_units("t", "p", samples=3, shard_prompts=1)
    seconds = {units[0].key: 3.0, units[1].key: 1.0, units[2].key: 1.0}
    result = simulate(units, seconds, _replicas(1, ready_at=2.0))
    assert result.makespan == pytest.approx(7.0)
    assert result.busy == (5.0,)


def test_replicas_take_only_the_groups_they_serve() -> None:
    units = [*trial_units("a", "pa", 4, 1), *trial_units("b", "pb", 2, 1)]
    seconds = {unit.key: 1.0 for unit in units}
    replicas = [Replica("ra", frozenset({"pa"})), Replica("rb", frozenset({"pb"}))]
    result = simulate(units, seconds, replicas)
    assert result.makespan == pytest.approx(4.0)
    assert result.busy == (4.0, 2.0)
    shared = simulate(units, seconds, _replicas(2, serves=("pa", "pb")))
    assert shared.makespan == pytest.approx(3.0)


def test_a_unit_no_replica_serves_is_an_error_naming_it() -> None:
    units = trial_units("t", "other", 1, 1)
    with pytest.raises(SimulationError, match="t/0"):
        simulate(units, {units[0].key: 1.0}, _replicas(1))


def test_no_units_take_no_time() -> None:
    result = simulate([], {}, _replicas(2))
    assert result.makespan == 0.0 and result.utilisation == 1.0
