"""Discrete-event simulation of the scheduler: work units over replicas (pure: no Ray, no I/O).

Every idle replica takes its next unit with :func:`orchestrator.sweep.work_units.pick_next`, the
rule the live scheduler dispatches with, so the simulated makespan measures that rule. A replica is
free from its ``ready_at`` (its models loaded) and busy for each unit's modelled seconds; a unit
whose ``after`` keys are not yet done waits until they are.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.sweep.work_units import WorkUnit, pick_next


class SimulationError(ValueError):
    """The units cannot all run: no replica serves a unit's group, or its dependencies never end."""


@dataclass(frozen=True)
class Replica:
    """One replica of a worker group: the groups it serves and when its models are loaded."""

    name: str
    serves: frozenset[str]
    ready_at: float = 0.0


@dataclass(frozen=True)
class SimResult:
    """The simulated wall time, and each replica's busy seconds (model loading not included)."""

    makespan: float
    replicas: tuple[str, ...]
    busy: tuple[float, ...]
    capacity: float | None = None

    @property
    def total_work(self) -> float:
        """Seconds of work summed over replicas."""
        return sum(self.busy)

    @property
    def utilisation(self) -> float:
        """Busy share of the replicas' time while they exist (up to the makespan unless
        ``capacity`` says otherwise; 1.0 for an empty run)."""
        capacity = self.makespan * len(self.busy) if self.capacity is None else self.capacity
        return self.total_work / capacity if capacity > 0 else 1.0


def one_after_another(results: Sequence[SimResult]) -> SimResult:
    """Return simulations run one after the other (each on its own replicas) as one result:
    the makespans add up, and each replica exists only during its own part."""
    return SimResult(
        makespan=sum(r.makespan for r in results),
        replicas=tuple(name for r in results for name in r.replicas),
        busy=tuple(seconds for r in results for seconds in r.busy),
        capacity=sum(r.makespan * len(r.busy) for r in results),
    )


class _Queues:
    """The pending units in plan order, one view per set of groups a replica serves."""

    def __init__(self, units: Sequence[WorkUnit], replicas: Sequence[Replica]) -> None:
        self.views = {
            replica.serves: deque(unit for unit in units if unit.group in replica.serves)
            for replica in replicas
        }

    def take(self, serves: frozenset[str], done: set[str]) -> WorkUnit | None:
        """Return and remove the unit ``pick_next`` gives a replica serving ``serves``."""
        unit = pick_next(self.views[serves], done, serves)
        if unit is not None:
            for groups, view in self.views.items():
                if unit.group not in groups:
                    continue
                if view[0] is unit:
                    view.popleft()
                else:
                    view.remove(unit)
        return unit


def simulate(
    units: Sequence[WorkUnit], seconds: Mapping[str, float], replicas: Sequence[Replica]
) -> SimResult:
    """Return the makespan of running ``units`` (plan order) on ``replicas``.

    ``seconds`` maps each unit key to its modelled duration. Raises SimulationError when a unit
    is left that no replica can ever start.
    """
    queues = _Queues(units, replicas)
    busy = [0.0] * len(replicas)
    done: set[str] = set()
    running: list[tuple[float, str]] = []
    events = [(replica.ready_at, index) for index, replica in enumerate(replicas)]
    heapq.heapify(events)
    end = 0.0
    while events:
        now, index = heapq.heappop(events)
        while running and running[0][0] <= now:
            done.add(heapq.heappop(running)[1])
        unit = queues.take(replicas[index].serves, done)
        if unit is not None:
            finish = now + seconds[unit.key]
            heapq.heappush(running, (finish, unit.key))
            heapq.heappush(events, (finish, index))
            busy[index] += seconds[unit.key]
            end = max(end, finish)
        elif running:
            heapq.heappush(events, (running[0][0], index))
    _check_all_ran(units, done | {key for _, key in running})
    return SimResult(
        makespan=end, replicas=tuple(replica.name for replica in replicas), busy=tuple(busy)
    )


def _check_all_ran(units: Sequence[WorkUnit], started: set[str]) -> None:
    """Raise SimulationError naming the first unit that never started."""
    for unit in units:
        if unit.key not in started:
            raise SimulationError(
                f"unit {unit.key} (group {unit.group}) never started: no replica serves its "
                "group, or a unit it waits for never ran"
            )
