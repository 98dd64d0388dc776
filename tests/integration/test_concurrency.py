"""Two sweeps writing one database at once, as two real processes, on SQLite WAL and PostgreSQL.

The sweeps have different names and share some trials (a trial's id is the hash of what it
measures, not of its sweep). First two processes drive the store the way the runner does
(register, mark running, a failed attempt, record) as fast as they can, starting together on a
fresh database; then two real ``submit`` commands run end to end at the same time. Either way no
row may be lost, no constraint violated, and every trial stored once.

PostgreSQL runs when ``SPECSWEEP_TEST_PG_URL`` is set; each test gets its own database there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from support.paths import REPO
from support.pg import BACKENDS, PG_URL, fresh_pg_database
from support.processes import (
    Proc,
    describe_processes,
    kill_processes,
    ray_processes_of,
    submit_command,
    submit_env,
    wait_until_gone,
)
from support.sweeps import SAMPLES, sweep_yaml

from orchestrator.run.driver_lease import HEARTBEAT_ENV
from orchestrator.store import Store, open_store
from orchestrator.store.models import RoundRow, SampleResultRow, SweepTrialRow, TrialRow
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep

pytestmark = pytest.mark.ray

#: The submits' heartbeat (``HEARTBEAT_ENV``): a driver finding a shard of a shared trial held
#: by the other looks at it again one heartbeat later, so after this 1 s rather than 5 s.
HEARTBEAT_S = 1.0


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a database nobody has opened yet: a new SQLite file or PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'results.db'}"
        return
    with fresh_pg_database() as url:
        yield url


def _counts(store: Store) -> dict[str, int]:
    """Return row counts: done trials, all trials, samples, distinct samples, rounds, links."""
    distinct = select(SampleResultRow.trial_id, SampleResultRow.sample_index).distinct()
    queries = {
        "done": select(func.count()).select_from(TrialRow).where(TrialRow.status == "done"),
        "trials": select(func.count()).select_from(TrialRow),
        "samples": select(func.count()).select_from(SampleResultRow),
        "distinct_samples": select(func.count()).select_from(distinct.subquery()),
        "rounds": select(func.count()).select_from(RoundRow),
        "links": select(func.count()).select_from(SweepTrialRow),
    }
    with store.engine.connect() as connection:
        return {name: int(connection.scalar(query) or 0) for name, query in queries.items()}


# ---------------------------------------------------------------------------------------------
# Two writer processes driving the store like the runner, as fast as they can
# ---------------------------------------------------------------------------------------------

#: A child process: say it is ready (file ``GO-ORDER``), wait for the go file, open the fresh
#: store, register the sweep, then run its trials in the given order: mark running, a failed
#: first attempt for every third trial, mark running again, record. Prints how many trials it
#: recorded and how many it found done by the other process.
WRITER = """
import json, sys, time
from pathlib import Path
from orchestrator.analysis.metrics import trial_metrics
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import load_sweep
from orchestrator.store import open_store
from workers.records import GenerationResult, RoundRecord

url, sweep_file, order, go = sys.argv[1:5]
spec = load_sweep(sweep_file)
plan = plan_sweep(spec)
trials = list(plan.trials) if order == "forward" else list(plan.trials)[::-1]
Path(f"{go}-{order}").touch()
while not Path(go).exists():
    time.sleep(0.01)
recorded = skipped = 0
with open_store(url) as store:
    store.register_sweep(spec, plan)
    for index, trial in enumerate(trials):
        if not store.mark_running(trial):
            skipped += 1
            continue
        if index % 3 == 0:
            store.record_attempt_error(trial, f"RuntimeError: attempt 1 of {trial.trial_id}")
            if not store.mark_running(trial):
                skipped += 1
                continue
        rounds = [RoundRecord(2, 1, False, 2, 0.01, 0.02) for _ in range(3)]
        results = [
            GenerationResult([7, sample], list(range(6)), rounds, seconds=0.5)
            for sample in range(2)
        ]
        recorded += store.record_trial(trial, results, trial_metrics(results))
print(json.dumps({"recorded": recorded, "skipped": skipped}))
"""


def _writer_sweep(name: str, svip: list[float], adaedl: list[float]) -> str:
    policies = [
        {"name": "static"},
        {"name": "svip", "grid": {"threshold": svip}},
        {"name": "adaedl", "grid": {"threshold": adaedl}},
    ]
    return sweep_yaml(name, policies=policies)


def test_two_writer_processes_on_a_fresh_database_store_every_trial_once(
    db_url: str, tmp_path: Path
) -> None:
    thresholds = [round(0.05 * i, 2) for i in range(1, 20)]
    files = {
        "left": _writer_sweep("left", thresholds[:14], thresholds[:6]),
        "right": _writer_sweep("right", thresholds[6:], thresholds[:10]),
    }
    plans = {}
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        plans[name] = plan_sweep(parse_sweep(text))
    ids = {name: {trial.trial_id for trial in plan.trials} for name, plan in plans.items()}
    shared = ids["left"] & ids["right"]
    union = ids["left"] | ids["right"]
    assert len(shared) >= 10 and len(union) >= 30  # real overlap and real contention

    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, db_url, str(tmp_path / f"{name}.yaml"), order, str(go)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, order in (("left", "forward"), ("right", "backward"))
    ]
    deadline = time.monotonic() + 120
    ready = [Path(f"{go}-{order}") for order in ("forward", "backward")]
    while not all(path.exists() for path in ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()  # both have imported everything: they start together on the unmigrated database
    outputs = [child.communicate(timeout=300) for child in children]
    for child, (_out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err[-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]

    assert sum(report["recorded"] for report in reports) == len(union)
    with open_store(db_url, read_only=True) as store:
        counts = _counts(store)
        assert counts == {
            "done": len(union),
            "trials": len(union),
            "samples": 2 * len(union),
            "distinct_samples": 2 * len(union),
            "rounds": 2 * 3 * len(union),
            "links": len(ids["left"]) + len(ids["right"]),
        }
        for name, plan in plans.items():
            rows = store.trials(name)
            assert [row.trial_id for row in rows] == [t.trial_id for t in plan.trials]
            assert all(row.status == "done" for row in rows)
            for row in rows:
                errors = row.attempt_errors or []
                assert all(error.endswith(row.trial_id) for error in errors)
                assert row.attempts >= 1 + len(errors)


# ---------------------------------------------------------------------------------------------
# Two real `submit` commands at once, each with its own local Ray
# ---------------------------------------------------------------------------------------------


def _submit_sweeps() -> dict[str, str]:
    """Two greedy sweeps sharing the baseline, static K=4 and SVIP 0.6 (5 trials in all)."""
    left = [{"name": "static"}, {"name": "svip", "grid": {"threshold": [0.3, 0.6]}}]
    right = [
        {"name": "static"},
        {"name": "svip", "grid": {"threshold": [0.6]}},
        {"name": "adaedl", "grid": {"threshold": [0.5]}},
    ]
    return {"left": sweep_yaml("left", left), "right": sweep_yaml("right", right)}


@pytest.fixture
def zoo(micro_zoo: Any) -> Any:
    return micro_zoo


@pytest.fixture
def e2e_db_url(tmp_path: Path) -> Iterator[str]:
    """PostgreSQL when configured (CI), else SQLite: one end-to-end run (~2 min) is the budget;
    the multi-process test above covers both databases."""
    if PG_URL is None:
        yield f"sqlite:///{tmp_path / 'results.db'}"
        return
    with fresh_pg_database() as url:
        yield url


@pytest.mark.slow
def test_two_submits_at_once_on_one_database_store_every_trial_once(
    e2e_db_url: str, zoo: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    db_url = e2e_db_url
    plans = {}
    for name, text in _submit_sweeps().items():
        (tmp_path / f"{name}.yaml").write_text(text)
        plans[name] = plan_sweep(parse_sweep(text))
    union = {trial.trial_id for plan in plans.values() for trial in plan.trials}
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in plans}
    processes = {
        name: subprocess.Popen(
            submit_command(tmp_path / f"{name}.yaml", db_url),
            cwd=REPO,
            env={**submit_env(zoo), HEARTBEAT_ENV: str(HEARTBEAT_S)},
            stdout=logs[name],
            stderr=subprocess.STDOUT,
        )
        for name in plans
    }
    seen: set[Proc] = set()
    try:
        deadline = time.monotonic() + 560
        while any(p.poll() is None for p in processes.values()) and time.monotonic() < deadline:
            for process in processes.values():
                seen |= ray_processes_of(process.pid)
            time.sleep(0.5)
        codes = {name: process.poll() for name, process in processes.items()}
        leftover = wait_until_gone(seen, timeout_s=30)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        kill_processes(seen)
        for log in logs.values():
            log.close()
    output = {name: (tmp_path / f"{name}.log").read_text() for name in plans}
    assert codes == {"left": 0, "right": 0}, output
    assert not leftover, describe_processes(leftover)

    with open_store(db_url, read_only=True) as store:
        counts = _counts(store)
        for name, plan in plans.items():
            rows = store.trials(name)
            assert [row.trial_id for row in rows] == [t.trial_id for t in plan.trials]
            assert all(row.status == "done" for row in rows), output[name]
        baseline_id = plans["left"].trials[0].trial_id
        baseline = [s.output_ids for s in store.sample_outputs(baseline_id)]
        for trial_id in union:  # greedy and lossless: every trial decodes the baseline's tokens
            assert [s.output_ids for s in store.sample_outputs(trial_id)] == baseline
    assert counts["done"] == counts["trials"] == len(union)
    assert counts["samples"] == counts["distinct_samples"] == SAMPLES * len(union)
    assert counts["links"] == sum(len(plan.trials) for plan in plans.values())
    with capsys.disabled():
        backend = db_url.split(":", 1)[0]
        print(
            f"\n[concurrency {backend}] two submits at once: {len(union)} distinct trials "
            f"({counts['links']} sweep memberships) stored once each, "
            f"{counts['samples']} sample rows, 0 lost"
        )
