"""The scheduler's dispatch on plain Python workers (no Ray): retries, give-up, deps, pair limit,
and the pure helpers of shard-level resume and replica counts."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field

import pytest
from support.paths import REPO
from tqdm import tqdm

from orchestrator.run.scheduler import Scheduler
from orchestrator.sweep.bundles import groups_held
from orchestrator.sweep.spec import PairSpec
from orchestrator.sweep.work_units import WorkUnit, missing_units, trial_units


@dataclass
class Log:
    """What the workers did, in order (shared by all of them)."""

    ran: list[tuple[str, str]] = field(default_factory=list)
    given_up: list[tuple[str, str]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    active: dict[str, int] = field(default_factory=dict)
    most_groups: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class FakeWorker:
    """Runs units of one group; fails the units in ``fail`` that many times."""

    group: str
    name: str
    log: Log
    fail: dict[str, int]

    def run(self, unit: WorkUnit) -> None:
        with self.log.lock:
            self.log.ran.append((self.name, unit.key))
            self.log.active[self.group] = self.log.active.get(self.group, 0) + 1
            busy = sum(1 for count in self.log.active.values() if count)
            self.log.most_groups = max(self.log.most_groups, busy)
            left = self.fail.get(unit.key, 0)
            self.fail[unit.key] = left - 1
        try:
            if left > 0:
                raise RuntimeError(f"boom {unit.key}")
        finally:
            with self.log.lock:
                self.log.active[self.group] -= 1

    def give_up(self, unit: WorkUnit, error: str) -> None:
        self.log.given_up.append((unit.key, error))

    def close(self) -> None:
        self.log.closed.append(self.name)


def _bar(total: int) -> tqdm:
    return tqdm(total=total, disable=True)


def test_every_unit_runs_once_retries_then_gives_up_with_the_error() -> None:
    units = trial_units("t", "pair-a", samples=8, shard_prompts=2)
    log = Log()
    fail = {units[1].key: 1, units[2].key: 5}
    workers = [FakeWorker("pair-a", f"r{i}", log, fail) for i in range(3)]
    result = Scheduler(units, retries=2, progress=_bar(len(units))).run(workers)
    assert result.done == {units[0].key, units[1].key, units[3].key}
    assert result.failed == {units[2].key: "RuntimeError: boom t/2"}
    assert log.given_up == [(units[2].key, "RuntimeError: boom t/2")]
    tries = [key for _, key in log.ran]
    assert tries.count(units[0].key) == 1 and tries.count(units[1].key) == 2
    assert tries.count(units[2].key) == 3  # 1 + retries
    assert sorted(log.closed) == ["r0", "r1", "r2"]


def test_a_unit_waits_for_its_after_units_and_groups_are_limited() -> None:
    a = trial_units("a", "pair-a", samples=4, shard_prompts=1)
    b = trial_units("b", "pair-b", samples=4, shard_prompts=1)
    replay = WorkUnit(key="replay:pair-a", group="pair-a", after=tuple(u.key for u in a))
    log = Log()
    workers = [
        FakeWorker(group, f"{group}-{i}", log, {})
        for group in ("pair-a", "pair-b")
        for i in range(2)
    ]
    units = [*a, replay, *b]
    result = Scheduler(units, retries=0, progress=_bar(len(units)), max_groups=1).run(workers)
    assert result.done == {u.key for u in units}
    order = [key for _, key in log.ran]
    assert order.index(replay.key) > max(order.index(u.key) for u in a)
    assert log.most_groups == 1  # one pair at a time
    assert max(order.index(u.key) for u in a) < min(order.index(u.key) for u in b)


def test_missing_units_skip_stored_prompts_and_keep_the_rest() -> None:
    units = trial_units("t", "p", samples=7, shard_prompts=3)
    left = missing_units(units, {0, 1, 2, 4})
    assert [(u.shard, u.prompts) for u in left] == [(1, (3, 5)), (2, (6,))]
    assert missing_units(units, set(range(7))) == []


@pytest.mark.parametrize(
    "nodes,expected",
    [([{"CPU": 2, "GPU": 1}] * 3, 3), ([{"CPU": 16, "GPU": 8}], 8), ([{"CPU": 1, "GPU": 4}], 0)],
)
def test_groups_held_counts_whole_groups_per_node(nodes, expected) -> None:
    pair = PairSpec.model_validate(
        {"name": "p", "target": {"model": "t", "gpus": 1}, "draft": {"model": "d"}}
    )
    assert groups_held([pair], nodes) == expected


@pytest.mark.parametrize("gpus,expected", [(1, 1), (2, 2), (3, 3)])
def test_groups_held_never_lets_two_replicas_share_a_gpu(gpus, expected) -> None:
    pair = PairSpec.model_validate(
        {
            "name": "p",
            "target": {"model": "t", "gpus": 0.4},
            "draft": {"model": "d", "gpus": 0.1},
        }
    )
    assert groups_held([pair], [{"CPU": 16, "GPU": gpus}]) == expected


# A scheduler in its own process whose one unit takes 2 s; it reports when the unit started and
# what had happened when run() gave the interrupt back.
_INTERRUPTED_RUN = textwrap.dedent(
    """
    import sys, time
    from tqdm import tqdm
    from orchestrator.run.scheduler import Scheduler
    from orchestrator.sweep.work_units import WorkUnit

    class SlowWorker:
        group = "g"
        finished = False
        def run(self, unit):
            print("started", flush=True)
            time.sleep(2.0)
            self.finished = True
        def give_up(self, unit, error):
            pass
        def close(self):
            pass

    worker = SlowWorker()
    units = [WorkUnit(key=f"u{i}", group="g") for i in range(3)]
    try:
        Scheduler(units, 0, tqdm(disable=True)).run([worker])
    except KeyboardInterrupt:
        print("interrupted; unit finished:", worker.finished, flush=True)
    """
)


def test_ctrl_c_returns_only_after_the_unit_in_flight_has_finished() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED_RUN],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "started"
    time.sleep(0.5)  # the main thread is waiting for its worker now
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    # The unit in flight ran to its end, and no further unit started.
    assert output.strip().splitlines() == ["interrupted; unit finished: True"]
