"""workers.process_usage: what a process has used, read before and after a piece of work."""

from __future__ import annotations

import time
from dataclasses import astuple

import pytest

from workers.process_usage import (
    MachineUsage,
    ProcessUsage,
    actor_process_usage,
    machine_usage,
    parse_proc_stat,
    process_usage,
)


def test_usage_differences_and_sums_are_field_by_field() -> None:
    before = ProcessUsage(1.0, 0.25, 10, 3)
    after = ProcessUsage(1.5, 0.5, 14, 4)
    spent = after - before
    assert spent == ProcessUsage(0.5, 0.25, 4, 1)
    assert spent.cpu_seconds == pytest.approx(0.75)
    assert spent + before == after
    assert sum([spent, spent], ProcessUsage()) == ProcessUsage(1.0, 0.5, 8, 2)


def test_busy_work_shows_as_cpu_time_and_sleeping_does_not() -> None:
    start, cpu_clock = process_usage(), time.process_time()
    while time.process_time() < cpu_clock + 0.3:  # 0.3 s of CPU, however busy the machine is
        pass
    busy = process_usage() - start
    assert busy.cpu_seconds >= 0.25  # getrusage agrees with the process's CPU clock
    start = process_usage()
    time.sleep(0.3)
    idle = process_usage() - start
    assert idle.cpu_seconds < 0.1
    assert idle.voluntary_switches >= 1  # sleeping gives the CPU up


def test_touching_fresh_memory_counts_minor_page_faults() -> None:
    start = process_usage()
    pages = bytearray(64 * 2**20)  # zeroed by the kernel page by page as it is first touched
    pages[:: 2**12] = b"\x01" * len(range(0, len(pages), 2**12))
    faults = (process_usage() - start).minor_faults
    assert faults >= 64 * 2**20 // 2**21  # at least one a 2 MiB huge page, however mapped


def test_an_actor_call_reads_the_hosting_process() -> None:
    before = process_usage()
    usage = actor_process_usage(object())  # the actor argument is ignored: this process reads
    assert usage.cpu_seconds >= before.cpu_seconds > 0
    assert usage.voluntary_switches >= before.voluntary_switches


def test_proc_stat_aggregate_line_splits_into_busy_idle_and_steal() -> None:
    text = "cpu  200 10 50 1000 30 5 7 40 100 0\ncpu0 100 5 25 500 15 2 3 20 50 0\nintr 12345\n"
    usage = parse_proc_stat(text, ticks_per_second=100)
    # busy: user + nice + system + irq + softirq (guest is inside user already)
    assert usage == MachineUsage(busy_seconds=2.72, idle_seconds=10.3, steal_seconds=0.4)
    spent = usage - MachineUsage(1.0, 0.3, 0.4)
    assert astuple(spent) == pytest.approx((1.72, 10.0, 0.0))
    with pytest.raises(ValueError, match="cpu"):
        parse_proc_stat("intr 1\n", ticks_per_second=100)


def test_busy_work_shows_as_machine_busy_time() -> None:
    start = machine_usage()
    if start is None:
        pytest.fail("no /proc/stat: the benchmarks that read it run on Linux")
    cpu_clock = time.process_time()
    while time.process_time() < cpu_clock + 0.5:
        pass
    spent = machine_usage() - start
    assert spent.busy_seconds >= 0.4  # at least this process's work, in 10 ms ticks
    assert spent.steal_seconds >= 0 and spent.idle_seconds >= 0
