"""The driver's wait on a worker, with a deadline that each report of progress pushes back.

A shard's worker (the pair's draft actor) counts the target calls answered so far
(``DraftWorker.progress``). While its call runs, the driver asks for that count every few
seconds; once it has not moved for ``execution.stall_timeout_seconds`` (a progress query that
gets no answer counts as no move), the wait ends with :class:`WorkerStalled`, and the replica
replaces its worker group while the scheduler retries the shard (``GroupReplica.run_shard``).
The deadline thus bounds a hang, not a shard's length: a long shard that keeps answering never
trips it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

#: The most seconds between two progress queries.
POLL_SECONDS = 2.0
#: The sweep-file field that sets the deadline (named in the error a user sees).
STALL_FIELD = "execution.stall_timeout_seconds"


class WorkerStalled(TimeoutError):
    """A worker reported no progress for the stall deadline."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the worker reported no progress for {seconds:g} s ({STALL_FIELD}); its worker "
            f"group was replaced and the shard retried; raise {STALL_FIELD} if one target call "
            "can legitimately take that long"
        )


@dataclass
class StallClock:
    """When progress was last seen; stalled once it is older than ``seconds``."""

    seconds: float
    since: float
    count: int | None = None

    def stalled(self, count: int | None, now: float) -> bool:
        """Note the progress ``count`` seen at ``now`` (None: no answer); return whether the
        worker has now gone ``seconds`` without progress."""
        if count is not None and count != self.count:
            self.count, self.since = count, now
        return now - self.since > self.seconds


def wait_with_progress(
    ref: ray.ObjectRef, progress: Callable[[], ray.ObjectRef], seconds: float
) -> Any:
    """Return ``ray.get(ref)``; raise :class:`WorkerStalled` once ``progress()`` (a call that
    returns the worker's progress count) has not moved for ``seconds``.

    A dead worker raises Ray's actor error, from ``ref`` or from the progress query.
    """
    poll = min(POLL_SECONDS, seconds / 4)
    clock = StallClock(seconds, time.monotonic())
    while True:
        ready, _ = ray.wait([ref], timeout=poll)
        if ready:
            return ray.get(ready[0])
        try:
            count = ray.get(progress(), timeout=poll)
        except ray.exceptions.GetTimeoutError:
            count = None
        if clock.stalled(count, time.monotonic()):
            raise WorkerStalled(seconds)
