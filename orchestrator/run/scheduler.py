"""One scheduler of work units (trial shards, training jobs) over workers: retries, progress.

Each worker runs in its own thread and serves one group (a pair's worker-group replica, or
the training stage): it takes the next ready unit of its group by :func:`pick_next` (plan
order; a unit is ready once the units in its ``after`` are settled), runs it, and reports.
A unit that raises is put back at the front and retried, by any worker of its group, up to
``retries`` times; then the worker that ran its last attempt gives it up. ``max_groups``
bounds how many groups have work started at once (``execution.max_concurrent_pairs``); a
worker whose group has no pending unit left exits and closes what it holds. Ctrl-C (or an
error outside a unit) stops every worker from starting a new unit; units in flight finish.
A unit whose run raises :class:`Deferred` (another driver runs its shard) goes back behind
the others, with no attempt counted, and is offered again after the seconds it names.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tqdm import tqdm

from orchestrator.run.errors import describe_failure
from orchestrator.sweep.work_units import WorkUnit, pick_next

#: Seconds between the main thread's checks on its workers (keeps Ctrl-C responsive).
JOIN_SECONDS = 0.2


class Deferred(Exception):
    """Raised by :meth:`Worker.run` when a unit cannot start now: offer it again in ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"deferred for {seconds:g} s")
        self.seconds = seconds


class Worker(Protocol):
    """What the scheduler drives: runs units of one group, one at a time."""

    group: str

    def run(self, unit: WorkUnit) -> None:
        """Run ``unit`` and store what it produced; raise to have it retried."""

    def give_up(self, unit: WorkUnit, error: str) -> None:
        """Record that ``unit`` failed for good with ``error`` (its retries are spent)."""

    def close(self) -> None:
        """Release what the worker holds (actors, placement groups)."""


@dataclass
class SchedulerResult:
    """Which units ended done and which failed for good (with their last error)."""

    done: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)


class Scheduler:
    """The pending units of one stage, dispatched to worker threads (see the module doc)."""

    def __init__(
        self,
        units: Sequence[WorkUnit],
        retries: int,
        progress: tqdm,
        max_groups: int | None = None,
    ) -> None:
        self.pending = list(units)
        self.retries = retries
        self.progress = progress
        self.max_groups = max_groups
        self.result = SchedulerResult()
        self.settled: set[str] = set()
        self.attempts: Counter[str] = Counter()
        #: Deferred units' keys and the monotonic time before which they are not offered.
        self.not_before: dict[str, float] = {}
        self.running: Counter[str] = Counter()
        self.active: set[str] = set()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        #: Worker threads started and not yet ended.
        self.serving = 0
        self._cond = threading.Condition()

    def run(self, workers: Sequence[Worker]) -> SchedulerResult:
        """Run every unit on ``workers``; return what ended done and failed."""
        threads = [
            threading.Thread(target=self._serve, args=(worker,), name=f"worker-{worker.group}")
            for worker in workers
        ]
        try:
            for thread in threads:
                self.serving += 1
                thread.start()
            self._wait_for_workers()
        except BaseException:
            self.halt()
            self._wait_for_workers()
            raise
        finally:
            self.progress.close()
        if self.errors:
            raise self.errors[0]
        return self.result

    def halt(self) -> None:
        """Start no new unit; units in flight finish and are stored."""
        with self._cond:
            self.stop.set()
            self._cond.notify_all()

    def _serve(self, worker: Worker) -> None:
        """A worker's thread: take ready units of its group until none is left, then close."""
        try:
            while (unit := self._take(worker.group)) is not None:
                try:
                    worker.run(unit)
                except Deferred as deferred:
                    self._defer(unit, deferred.seconds)
                    continue
                except Exception as exc:
                    error = describe_failure(exc)
                    if self._settle(unit, error):
                        worker.give_up(unit, error)
                    continue
                self._settle(unit, None)
        except BaseException as exc:
            self.errors.append(exc)
            self.halt()
        finally:
            worker.close()
            with self._cond:
                self.serving -= 1
                self._cond.notify_all()

    def _wait_for_workers(self) -> None:
        """Wait until every worker thread has ended, in slices so that Ctrl-C still reaches the
        main thread.

        After an interrupt the scheduler waits here again, so units in flight finish and are
        stored while Ray is still up; a second Ctrl-C abandons them. It counts the threads itself:
        a ``Thread.join`` that Ctrl-C interrupts marks a still running thread as ended (CPython
        3.11), and the interpreter would then exit, shutting Ray down, under its feet.
        """
        with self._cond:
            while self.serving:
                self._cond.wait(JOIN_SECONDS)

    def _take(self, group: str) -> WorkUnit | None:
        """Wait for and return the next ready unit of ``group``; None when there is none left."""
        with self._cond:
            while not self.stop.is_set():
                if not any(unit.group == group for unit in self.pending):
                    return None
                open_group = group in self.active or self.max_groups is None
                if open_group or len(self.active) < (self.max_groups or 0):
                    now = time.monotonic()
                    due = [u for u in self.pending if self.not_before.get(u.key, now) <= now]
                    unit = pick_next(due, self.settled, {group})
                    if unit is not None:
                        self.pending.remove(unit)
                        self.running[group] += 1
                        self.active.add(group)
                        return unit
                self._cond.wait(self._next_due(group))
            return None

    def _next_due(self, group: str) -> float | None:
        """Return the seconds until a deferred unit of ``group`` is due (None: none deferred)."""
        waits = [
            self.not_before[unit.key] - time.monotonic()
            for unit in self.pending
            if unit.group == group and unit.key in self.not_before
        ]
        return max(0.0, min(waits)) if waits else None

    def _defer(self, unit: WorkUnit, seconds: float) -> None:
        """Put ``unit`` back behind the pending units, offered again after ``seconds``."""
        with self._cond:
            self.running[unit.group] -= 1
            self.pending.append(unit)
            self.not_before[unit.key] = time.monotonic() + seconds
            self._cond.notify_all()

    def _settle(self, unit: WorkUnit, error: str | None) -> bool:
        """Record an attempt's end; return True when ``unit`` failed for good (no retry left)."""
        with self._cond:
            self.running[unit.group] -= 1
            final = error is None or self.attempts[unit.key] >= self.retries
            if not final:
                self.attempts[unit.key] += 1
                self.pending.insert(0, unit)
            else:
                self.settled.add(unit.key)
                if error is None:
                    self.result.done.add(unit.key)
                else:
                    self.result.failed[unit.key] = error
                self.progress.update()
            if not self.running[unit.group] and all(u.group != unit.group for u in self.pending):
                self.active.discard(unit.group)
            self._cond.notify_all()
            return final and error is not None
