"""One driver per shard: shard leases in the store, and two ``submit`` of one sweep at once.

The store-level tests drive :meth:`Store.claim_shard` and friends as two drivers would (two
handles, two driver ids) on SQLite and PostgreSQL: a live lease refuses the other driver, an
expired or released one is taken over, a heartbeat renews it, and a race for the same shards
gives each shard to exactly one driver. The end-to-end test starts two real ``submit`` commands
of one sweep at the same time (each its own local Ray) and checks that every shard ran once
and that each summary says what it ran and what the other driver ran.

PostgreSQL runs when ``SPECSWEEP_TEST_PG_URL`` is set; each test gets its own database there.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from alembic import command
from rich.console import Console
from sqlalchemy import inspect
from support.paths import REPO
from support.pg import BACKENDS, fresh_pg_database
from support.processes import (
    Proc,
    describe_processes,
    kill_processes,
    ray_processes_of,
    submit_command,
    submit_env,
    wait_until_gone,
)
from support.sweeps import sweep_yaml
from tqdm import tqdm

from orchestrator.cli.submit import report_run
from orchestrator.run.driver_lease import (
    HEARTBEAT_ENV,
    HEARTBEAT_SECONDS,
    LEASE_ENV,
    LEASE_SECONDS,
    Heartbeat,
    LeaseSettingError,
    LeaseTiming,
    lease_timing,
)
from orchestrator.run.runner import ShardTally, SweepSummary, _SweepRun
from orchestrator.run.scheduler import Deferred, Scheduler
from orchestrator.store import (
    LeaseHolder,
    ShardClaim,
    ShardOutput,
    Store,
    StoredShard,
    open_store,
)
from orchestrator.store.db import alembic_config
from orchestrator.sweep.planner import Plan, Trial, plan_sweep
from orchestrator.sweep.spec import parse_sweep
from orchestrator.sweep.work_units import ArmShard, WorkUnit, trial_units
from workers.records import GenerationResult, RoundRecord

pytestmark = pytest.mark.ray

#: Prompts per trial; with ``shard_prompts: 1`` each is one shard.
E2E_SAMPLES = 4
#: The two submits' heartbeat (``HEARTBEAT_ENV``): a driver finding a shard held by the other
#: looks at it again one heartbeat later, so after this 1 s rather than the default 5 s.
E2E_HEARTBEAT_S = 1.0


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a database nobody has opened yet: a new SQLite file or PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'results.db'}"
        return
    with fresh_pg_database() as url:
        yield url


@pytest.fixture
def plan(db_url: str) -> Plan:
    """A registered one-pair sweep whose first trial's shards the tests lease."""
    spec = parse_sweep(sweep_yaml("leases"))
    planned = plan_sweep(spec)
    with open_store(db_url) as store:
        store.register_sweep(spec, planned)
    return planned


def _shard(url: str, trial: Trial, shard: int = 0) -> StoredShard:
    with open_store(url, read_only=True) as store:
        return next(s for s in store.trial_shards([trial.trial_id]) if s.shard == shard)


def _output(shard: int) -> ShardOutput:
    """A finished one-prompt shard: prompt ``shard``, six tokens in three rounds."""
    rounds = [RoundRecord(2, 1, False, 2, 0.01, 0.02) for _ in range(3)]
    return ShardOutput(shard, (shard,), [GenerationResult([7, shard], list(range(6)), rounds, 0.5)])


A = LeaseHolder("a" * 32, "host-a:101")
B = LeaseHolder("b" * 32, "host-b:202")


def test_a_live_lease_refuses_another_driver_and_its_holder_renews_it(
    db_url: str, plan: Plan
) -> None:
    trial = plan.trials[0]
    with open_store(db_url) as store:
        assert store.claim_shard(trial, 0, [0], A, lease_s=30) == ShardClaim("acquired")
        first = _shard(db_url, trial)
        assert (first.status, first.attempts, first.driver_id, first.driver) == (
            "running",
            1,
            A.driver_id,
            A.name,
        )
        held = store.claim_shard(trial, 0, [0], B, lease_s=30)
        assert (held.outcome, held.driver) == ("held", A.name)
        assert held.expires_in is not None and 0 < held.expires_in <= 30
        assert _shard(db_url, trial).attempts == 1  # a refused claim is no attempt

        assert store.renew_leases(B, lease_s=30) == 0
        assert store.renew_leases(A, lease_s=600) == 1
        renewed = _shard(db_url, trial)
        assert renewed.lease_expires_at is not None and first.lease_expires_at is not None
        assert renewed.lease_expires_at > first.lease_expires_at
        assert store.claim_shard(trial, 0, [0], B, lease_s=30).expires_in > 300
        # the holder's own retry is a new attempt under the same lease
        assert store.claim_shard(trial, 0, [0], A, lease_s=30) == ShardClaim("acquired")
        assert _shard(db_url, trial).attempts == 2
        assert store.trial_rows([trial.trial_id])[0].attempts == 2


def test_a_lapsed_lease_is_taken_over_and_no_longer_renewed_by_its_old_holder(
    db_url: str, plan: Plan
) -> None:
    trial = plan.trials[0]
    with open_store(db_url) as store:
        assert store.claim_shard(trial, 0, [0], A, lease_s=0).outcome == "acquired"  # lapsed
        assert store.claim_shard(trial, 0, [0], B, lease_s=30) == ShardClaim("acquired", A.name)
        taken = _shard(db_url, trial)
        assert (taken.attempts, taken.driver, taken.driver_id) == (2, B.name, B.driver_id)
        assert store.renew_leases(A, lease_s=30) == 0
        assert store.claim_shard(trial, 0, [0], A, lease_s=30).outcome == "held"


def test_released_leases_are_free_at_once_and_a_stored_shard_names_its_driver(
    db_url: str, plan: Plan
) -> None:
    trial = plan.trials[0]
    with open_store(db_url) as store:
        for shard in (0, 1):
            assert store.claim_shard(trial, shard, [shard], A, lease_s=30).outcome == "acquired"
        assert store.record_shard(trial, _output(0), holder=A)
        assert store.release_leases(A) == 1  # shard 1: shard 0 is stored, its lease ended
        assert store.claim_shard(trial, 1, [1], B, lease_s=30) == ShardClaim("acquired", A.name)
        assert store.claim_shard(trial, 0, [0], B, lease_s=30) == ShardClaim("done", A.name)
        assert store.claim_shard(trial, 0, [0], A, lease_s=30) == ShardClaim("done", None)
        assert store.record_shard(trial, _output(1), holder=B)
        stored = {s.shard: s for s in store.trial_shards([trial.trial_id])}
        assert [(s.status, s.driver, s.lease_expires_at) for s in stored.values()] == [
            ("done", A.name, None),
            ("done", B.name, None),
        ]
        assert store.renew_leases(B, lease_s=30) == 0


def test_a_group_shard_tried_again_counts_an_arm_another_driver_stored_once(
    db_url: str, plan: Plan
) -> None:
    stored, held = plan.trials[0], plan.trials[1]
    unit = WorkUnit(
        "g0", "micro", arms=(ArmShard(stored.trial_id, (0,)), ArmShard(held.trial_id, (0,)))
    )
    with open_store(db_url) as store:
        assert store.claim_shard(stored, 0, [0], B, lease_s=30).outcome == "acquired"
        assert store.record_shard(stored, _output(0), holder=B)
        assert store.claim_shard(held, 0, [0], A, lease_s=600).outcome == "acquired"
        summary = SweepSummary("leases", planned=len(plan.trials), already_done=0)
        run = _SweepRun(None, plan, store, None, {}, summary, lease_timing())  # type: ignore[arg-type]
        for _ in range(3):  # the held arm defers the unit; each try finds the stored arm again
            with pytest.raises(Deferred):
                run.run_shard(None, unit)  # type: ignore[arg-type]
    assert (summary.shards.by_others, summary.shards.others) == (1, [B.name])
    assert (summary.shards.ran, summary.shards.taken_over) == (0, 0)


#: A child process: one driver claiming every shard of the first trial as fast as it can, once
#: both are ready; prints the shards it acquired.
CLAIMER = """
import json, sys, time
from pathlib import Path
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep
from orchestrator.store import LeaseHolder, open_store

url, sweep, name, shards, go = sys.argv[1:6]
trial = plan_sweep(parse_sweep(Path(sweep).read_text())).trials[0]
holder = LeaseHolder(name * 32, name)
order = range(int(shards)) if name == "a" else reversed(range(int(shards)))
with open_store(url) as store:
    Path(f"{go}-{name}").touch()
    while not Path(go).exists():
        time.sleep(0.005)
    won = [s for s in order if store.claim_shard(trial, s, [s], holder, 30).outcome == "acquired"]
print(json.dumps(won))
"""


def test_two_driver_processes_racing_for_the_same_shards_get_each_exactly_once(
    db_url: str, plan: Plan, tmp_path: Path
) -> None:
    sweep = tmp_path / "leases.yaml"
    sweep.write_text(sweep_yaml("leases"))
    go, shards = tmp_path / "go", 60
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, db_url, str(sweep), name, str(shards), str(go)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    deadline = time.monotonic() + 120
    while not all(Path(f"{go}-{n}").exists() for n in "ab") and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    outputs = [child.communicate(timeout=300) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err for _, err in outputs]
    won = [set(json.loads(out)) for out, _ in outputs]
    assert won[0].isdisjoint(won[1]) and won[0] | won[1] == set(range(shards))
    with open_store(db_url, read_only=True) as store:
        rows = store.trial_shards([plan.trials[0].trial_id])
    assert [(row.attempts, row.driver) for row in rows] == [
        (1, "a" if row.shard in won[0] else "b") for row in rows
    ]


def test_the_heartbeat_renews_while_it_runs_and_releases_on_leaving(
    db_url: str, plan: Plan
) -> None:
    trial = plan.trials[0]
    timing = LeaseTiming(lease_s=3.0, heartbeat_s=0.1)
    with open_store(db_url) as store, Heartbeat(store, A, timing):
        assert store.claim_shard(trial, 0, [0], A, timing.lease_s).outcome == "acquired"
        first = _shard(db_url, trial).lease_expires_at
        deadline = time.monotonic() + 30
        while _shard(db_url, trial).lease_expires_at == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _shard(db_url, trial).lease_expires_at > first
    assert _shard(db_url, trial).lease_expires_at is None
    with open_store(db_url) as store:
        assert store.claim_shard(trial, 0, [0], B, 30) == ShardClaim("acquired", A.name)


def test_lease_timing_comes_from_the_environment_and_bad_values_name_the_variable() -> None:
    assert lease_timing({}) == LeaseTiming(LEASE_SECONDS, HEARTBEAT_SECONDS) == LeaseTiming()
    assert lease_timing({LEASE_ENV: "6", HEARTBEAT_ENV: "1.5"}) == LeaseTiming(6.0, 1.5)
    for environ in ({LEASE_ENV: "soon"}, {LEASE_ENV: "-3"}, {HEARTBEAT_ENV: "0"}):
        with pytest.raises(LeaseSettingError, match=next(iter(environ))):
            lease_timing(environ)
    with pytest.raises(LeaseSettingError, match=f"{HEARTBEAT_ENV}=20 .* {LEASE_ENV}=30"):
        lease_timing({HEARTBEAT_ENV: "20"})


def test_the_lease_migration_keeps_every_shard_from_revision_0006_and_back(
    db_url: str, plan: Plan
) -> None:
    trial = plan.trials[0]
    with open_store(db_url) as store:
        store.claim_shard(trial, 0, [0], A, lease_s=30)
        store.record_shard(trial, _output(0), holder=A)
        store.claim_shard(trial, 1, [1], A, lease_s=30)
        _migrate(store, "0006")
        with store.engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("trial_shards")}
            rows = connection.exec_driver_sql("SELECT shard, status FROM trial_shards").all()
        assert "driver" not in columns and sorted(rows) == [(0, "done"), (1, "running")]
        _migrate(store, "head")
        shards = store.trial_shards([trial.trial_id])
        assert [(s.status, s.driver, s.lease_expires_at) for s in shards] == [
            ("done", None, None),
            ("running", None, None),
        ]
        # a shard left running by a driver of the old code is free to take
        assert store.claim_shard(trial, 1, [1], B, lease_s=30) == ShardClaim("acquired")


def _migrate(store: Store, revision: str) -> None:
    """Upgrade (``head``) or downgrade ``store``'s schema to ``revision``."""
    config = alembic_config()
    with store.engine.connect() as connection:
        config.attributes["connection"] = connection
        if revision == "head":
            command.upgrade(config, revision)
        else:
            command.downgrade(config, revision)
        connection.commit()


@dataclass
class DeferringWorker:
    """Defers the units in ``held`` that many times (as if another driver ran them), then runs."""

    group: str
    held: dict[str, int]
    ran: list[str] = field(default_factory=list)

    def run(self, unit: WorkUnit) -> None:
        if self.held.get(unit.key, 0) > 0:
            self.held[unit.key] -= 1
            raise Deferred(0.05)
        self.ran.append(unit.key)

    def give_up(self, unit: WorkUnit, error: str) -> None:
        raise AssertionError(f"{unit.key} given up: {error}")

    def close(self) -> None:
        pass


def test_a_deferred_unit_waits_behind_the_others_and_costs_no_retry() -> None:
    units = trial_units("t", "g", samples=4, shard_prompts=1)
    worker = DeferringWorker("g", held={"t/0": 3})
    result = Scheduler(units, retries=0, progress=tqdm(disable=True)).run([worker])
    assert worker.ran == ["t/1", "t/2", "t/3", "t/0"]
    assert result.done == {unit.key for unit in units} and not result.failed


# ---------------------------------------------------------------------------------------------
# Two real `submit` commands of one sweep at the same time
# ---------------------------------------------------------------------------------------------

#: The summary's shard line: "ran X of the N shards left to run; Y were run by another driver
#: (host:pid) at the same time" (the second part only when Y > 0).
SHARD_LINE = re.compile(
    r"ran (\d+) of the (\d+) shards? left to run"
    r"(?:; (\d+) (?:was|were) run by another driver \(([^)]*)\) at the same time)?"
)


def _one_sweep() -> str:
    """A greedy micro sweep of 3 trials x 4 prompts, one prompt per shard, one replica each."""
    dataset = {"name": "builtin:code", "samples": E2E_SAMPLES, "max_new_tokens": 48}
    policies = [{"name": "static"}, {"name": "svip", "grid": {"threshold": [0.6]}}]
    sweep = yaml.safe_load(sweep_yaml("twice", policies=policies, datasets=[dataset]))
    sweep["execution"].update({"shard_prompts": 1, "replicas": 1})
    return yaml.safe_dump(sweep, sort_keys=False)


def _run_together(commands: list[list[str]], env: dict[str, str], logs: list[Path]) -> list[Any]:
    """Start ``commands`` at once, wait (up to 9 min) for all; return their processes.

    Every Ray process they started must have exited 30 s after them.
    """
    files = [log.open("w") for log in logs]
    processes = [
        subprocess.Popen(command, cwd=REPO, env=env, stdout=file, stderr=subprocess.STDOUT)
        for command, file in zip(commands, files, strict=True)
    ]
    seen: set[Proc] = set()
    try:
        deadline = time.monotonic() + 540
        while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
            for process in processes:
                seen |= ray_processes_of(process.pid)
            time.sleep(0.5)
        leftover = wait_until_gone(seen, timeout_s=30)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        kill_processes(seen)
        for file in files:
            file.close()
    assert not leftover, describe_processes(leftover)
    return processes


@pytest.mark.slow
def test_two_submits_of_one_sweep_run_every_shard_once_and_say_who_ran_what(
    db_url: str, micro_zoo: Any, tmp_path: Path
) -> None:
    sweep_file = tmp_path / "twice.yaml"
    sweep_file.write_text(_one_sweep())
    plan = plan_sweep(parse_sweep(sweep_file.read_text(), str(sweep_file)))
    total = E2E_SAMPLES * len(plan.trials)
    logs = [tmp_path / f"submit-{n}.log" for n in (1, 2)]
    command = submit_command(sweep_file, db_url)
    env = {**submit_env(micro_zoo), HEARTBEAT_ENV: str(E2E_HEARTBEAT_S)}
    processes = _run_together([command, command], env, logs)
    outputs = [log.read_text() for log in logs]
    assert [process.returncode for process in processes] == [0, 0], outputs

    with open_store(db_url, read_only=True) as store:
        rows = store.trials("twice")
        shards = store.trial_shards(trial.trial_id for trial in plan.trials)
    assert all(row.status == "done" for row in rows), outputs
    assert len(shards) == total
    assert [(s.status, s.attempts) for s in shards] == [("done", 1)] * total, outputs
    assert all(row.attempts == 1 for row in rows)

    names = [f"{socket.gethostname()}:{process.pid}" for process in processes]
    stored_by = Counter(shard.driver for shard in shards)
    assert set(stored_by) <= set(names)
    for own, other, output in zip(names, names[::-1], outputs, strict=True):
        found = SHARD_LINE.search(output)
        assert found is not None, output
        ran, left = int(found[1]), int(found[2])
        by_other = int(found[3] or 0)
        assert ran == stored_by[own], output
        assert ran + by_other == left <= total, output
        assert (found[4] == other) if by_other else found[4] is None, output
    assert sum(stored_by.values()) == total


def test_the_summary_says_what_this_run_and_the_other_drivers_ran() -> None:
    shards = ShardTally(left=12, ran=5, by_others=6, others=["host-b:202"], taken_over=1)
    shards.stopped.append("host-c:303")
    summary = SweepSummary("s", planned=3, already_done=0, ran=1, finished_by_others=2)
    summary.shards = shards
    console = Console(record=True, width=400)
    assert report_run(console, summary, [], "s.yaml", "sqlite:///r.db") == 0
    text = console.export_text()
    assert "3 trials planned, 0 already done, 1 ran, 2 finished by another driver, 0 failed" in text
    assert (
        "ran 5 of the 12 shards left to run; 6 were run by another driver (host-b:202) at the "
        "same time; 1 taken over from another driver (host-c:303), which stopped (its lease "
        "lapsed or was released)"
    ) in text
    alone = SweepSummary("s", planned=3, already_done=0, ran=3, shards=ShardTally(left=1, ran=1))
    report_run(console, alone, [], "s.yaml", "sqlite:///r.db")
    assert console.export_text().splitlines()[-1] == "ran 1 of the 1 shard left to run"


def test_submit_refuses_a_bad_lease_setting_before_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from orchestrator import cli

    monkeypatch.setenv("SPECSWEEP_LEASE_SECONDS", "soon")
    demo = REPO / "sweeps" / "demo.yaml"
    assert cli.main(["--db", f"sqlite:///{tmp_path / 'r.db'}", "submit", str(demo)]) == 2
    err = capsys.readouterr().err
    assert "SPECSWEEP_LEASE_SECONDS='soon' is not a positive number of seconds" in err
    assert "Traceback" not in err
    assert not (tmp_path / "r.db").exists()
