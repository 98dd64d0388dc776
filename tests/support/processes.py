"""``submit`` as a test subprocess, and the processes (Ray's included) a driver leaves behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from support.faults import process_alive


def submit_command(sweep_file: Path, url: str) -> list[str]:
    """Return the ``python -m orchestrator submit`` command line of a test subprocess."""
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "--db",
        url,
        "submit",
        str(sweep_file),
        "--no-progress",
    ]


def submit_env(zoo: Any) -> dict[str, str]:
    """Return the environment of a ``submit`` subprocess: the session's zoo, its own local Ray."""
    return {
        **os.environ,
        "SPECSWEEP_CACHE": str(zoo.root.parent.parent),
        "RAY_ADDRESS": "local",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _parents() -> dict[int, int]:
    """Return {pid: parent pid} of every process now running."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _start_tick(pid: int) -> int | None:
    """Return when ``pid`` started (clock ticks since boot), or None if it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


#: A process, told apart from a later one that reuses its pid: (pid, start tick).
Proc = tuple[int, int]


def _is_running(proc: Proc) -> bool:
    """True while the very process ``proc`` runs (not a zombie, pid not reused)."""
    return _start_tick(proc[0]) == proc[1] and process_alive(proc[0])


def ray_processes_of(driver_pid: int) -> set[Proc]:
    """Return the processes a driver started: its descendants and its Ray session's processes.

    Ray names a local session ``session_<date>_<time>_<micro>_<driver pid>``; processes that
    left the driver's tree still carry that name in their command line (only those started
    after the driver count, so an old session of a recycled pid is never taken for ours).
    """
    driver_start = _start_tick(driver_pid)
    if driver_start is None:  # gone: its pid may name another process by now
        return set()
    parents = _parents()
    found = {driver_pid}
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in found}
        grew = not children <= found
        found |= children
    marker = re.compile(rf"session_\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_{driver_pid}(?!\d)")
    for pid in parents:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker.search(command) and (_start_tick(pid) or -1) >= driver_start:
            found.add(pid)
    ticks = {pid: _start_tick(pid) for pid in found - {driver_pid}}
    return {(pid, tick) for pid, tick in ticks.items() if tick is not None}


def wait_until_gone(procs: set[Proc], timeout_s: float) -> set[Proc]:
    """Wait up to ``timeout_s`` for ``procs`` to exit; return those still running."""
    deadline = time.monotonic() + timeout_s
    alive = {proc for proc in procs if _is_running(proc)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = {proc for proc in alive if _is_running(proc)}
    return alive


def kill_processes(procs: set[Proc]) -> None:
    """SIGKILL each of ``procs`` (processes this test started) that still runs."""
    for proc in procs:
        if _is_running(proc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc[0], signal.SIGKILL)


def describe_processes(procs: set[Proc]) -> list[str]:
    """Return ``pid: command`` of each of ``procs`` (for failure messages)."""
    lines = []
    for pid, _tick in sorted(procs):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            lines.append(f"{pid}: {command.decode(errors='replace')[:150]}")
    return lines
