"""The driver's stall deadline: pushed back by each report of progress, tripped by silence
(``orchestrator.run.stall_watch``), on the pure clock and on real Ray actors."""

from __future__ import annotations

import time

import pytest
import ray

from orchestrator.run.stall_watch import STALL_FIELD, StallClock, WorkerStalled, wait_with_progress


def test_the_clock_trips_only_after_the_deadline_passes_without_a_change() -> None:
    clock = StallClock(seconds=10.0, since=0.0)
    assert not clock.stalled(0, 5.0)  # first report: progress seen at 5
    assert not clock.stalled(0, 14.0)
    assert clock.stalled(0, 15.5)  # unchanged for 10.5 s
    assert not clock.stalled(1, 16.0)  # moved: the deadline is pushed back
    assert not clock.stalled(None, 25.0)  # no answer is no progress...
    assert clock.stalled(None, 26.5)  # ...and counts toward the deadline


def test_the_error_names_the_sweep_field() -> None:
    assert STALL_FIELD in str(WorkerStalled(5)) and "5 s" in str(WorkerStalled(5))


@ray.remote(max_concurrency=2)
class _Worker:
    """A worker that either reports a step every ``every`` seconds, or says nothing."""

    def __init__(self) -> None:
        self.steps = 0

    def work(self, seconds: float, every: float | None) -> str:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(every or seconds)
            if every is not None:
                self.steps += 1
        return "finished"

    def progress(self) -> int:
        return self.steps


#: The stall deadline of these tests; the talkative worker reports 10 times within it.
STALL_S = 2.0


def test_a_call_that_keeps_reporting_outlives_the_deadline(ray_local: None) -> None:
    worker = _Worker.remote()
    ref = worker.work.remote(3 * STALL_S, every=STALL_S / 10)
    assert wait_with_progress(ref, worker.progress.remote, STALL_S) == "finished"


def test_a_silent_call_stalls_after_the_deadline(ray_local: None) -> None:
    worker = _Worker.remote()
    ref = worker.work.remote(60.0, every=None)
    start = time.monotonic()
    with pytest.raises(WorkerStalled):
        wait_with_progress(ref, worker.progress.remote, STALL_S)
    assert time.monotonic() - start < 30.0  # generous: the 60 s call was not waited for
    ray.kill(worker)


def test_a_dead_worker_raises_rays_actor_error(ray_local: None) -> None:
    worker = _Worker.remote()
    ref = worker.work.remote(60.0, every=None)
    ray.kill(worker)
    with pytest.raises(ray.exceptions.RayActorError):
        wait_with_progress(ref, worker.progress.remote, STALL_S)
