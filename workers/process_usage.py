"""What a process has used so far: CPU seconds, context switches and page faults (``getrusage``);
and what the whole machine's CPUs have done (``/proc/stat``).

Benchmarks read them before and after a timed piece of work, in this process and, through
``actor.__ray_call__.remote(actor_process_usage)``, in an actor's process, to tell a slower
placement's extra wall time apart: more CPU work, or more waiting (voluntary switches: blocking
on a socket, a lock, the GIL or a device) or more preemption (involuntary switches); the
machine's figures say how much CPU other processes took meanwhile, and how much the hypervisor
withheld (steal time, on a virtual machine).
"""

from __future__ import annotations

import os
import resource
from dataclasses import astuple, dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


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


@dataclass(frozen=True)
class MachineUsage:
    """CPU seconds all of the machine's CPUs spent busy (any process or the kernel), idle
    (idle and waiting for I/O), and stolen (a virtual CPU ready to run while the host ran
    something else)."""

    busy_seconds: float = 0.0
    idle_seconds: float = 0.0
    steal_seconds: float = 0.0

    def __add__(self, other: MachineUsage) -> MachineUsage:
        return MachineUsage(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __sub__(self, other: MachineUsage) -> MachineUsage:
        return MachineUsage(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))


def parse_proc_stat(text: str, ticks_per_second: float) -> MachineUsage:
    """Return the machine's usage from the text of ``/proc/stat`` (its aggregate ``cpu`` line:
    user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks; guest time
    is already counted in user and nice)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, fields[1:9])
            return MachineUsage(
                busy_seconds=(user + nice + system + irq + softirq) / ticks_per_second,
                idle_seconds=(idle + iowait) / ticks_per_second,
                steal_seconds=steal / ticks_per_second,
            )
    raise ValueError("no aggregate 'cpu' line in /proc/stat text")


def machine_usage() -> MachineUsage | None:
    """Return what the machine's CPUs have done since boot, or None without ``/proc/stat``."""
    if not PROC_STAT.exists():
        return None
    return parse_proc_stat(PROC_STAT.read_text(), os.sysconf("SC_CLK_TCK"))
