"""workers.process_usage: what a process has used, read before and after a piece of work."""

from __future__ import annotations

import time

import pytest

from workers.process_usage import ProcessUsage, actor_process_usage, process_usage


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
