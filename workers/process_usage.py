"""What a process has used so far: CPU seconds, context switches and page faults (``getrusage``).

Benchmarks read it before and after a timed piece of work, in this process and, through
``actor.__ray_call__.remote(actor_process_usage)``, in an actor's process, to tell a slower
placement's extra wall time apart: more CPU work, or more waiting (voluntary switches: blocking
on a socket, a lock, the GIL or a device) or more preemption (involuntary switches).
"""

from __future__ import annotations

import resource
from dataclasses import astuple, dataclass


@dataclass(frozen=True)
class ProcessUsage:
    """CPU seconds in user and in kernel mode (all threads), context switches and page faults of
    one or more processes (minor faults: a page mapped without reading the disk, as when freed
    memory returned to the system is touched again)."""

    user_seconds: float = 0.0
    system_seconds: float = 0.0
    voluntary_switches: int = 0
    involuntary_switches: int = 0
    minor_faults: int = 0

    @property
    def cpu_seconds(self) -> float:
        """User plus kernel CPU seconds."""
        return self.user_seconds + self.system_seconds

    def __add__(self, other: ProcessUsage) -> ProcessUsage:
        return ProcessUsage(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __sub__(self, other: ProcessUsage) -> ProcessUsage:
        return ProcessUsage(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))


def process_usage() -> ProcessUsage:
    """Return this process's usage since it started."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return ProcessUsage(
        usage.ru_utime, usage.ru_stime, usage.ru_nvcsw, usage.ru_nivcsw, usage.ru_minflt
    )


def actor_process_usage(_actor: object) -> ProcessUsage:
    """Return the usage of the process hosting ``_actor`` (for ``actor.__ray_call__``)."""
    return process_usage()
