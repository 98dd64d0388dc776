"""Faults during a sweep: killed workers, a killed driver, and errors inside a trial.

- Worker faults: a :class:`FaultInjector` wraps the runner's ``GroupReplica`` so the test knows
  the actors of the current worker group (and their process ids) and when a trial's request has
  just been built for them; it then kills the draft or the target actor, with ``ray.kill`` or
  SIGKILL, and waits until the process is gone, so the trial is sent to a group with a dead
  actor at a known point (never after a wall-clock timer, which raced the trial's end). The
  runner itself is unchanged: it has to survive a real actor death.
- Driver fault: ``python -m orchestrator submit`` runs as a subprocess and is SIGKILLed mid-sweep;
  its Ray processes must exit, and a second ``submit`` must finish the sweep without touching
  the trials already stored.
- Model errors: a trial that raises inside the worker is stored as failed with its reason, and
  the other trials go on.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from sqlalchemy import func, select
from support.faults import FaultInjector, process_alive, registered_sweep, sample_counts
from support.paths import REPO
from support.processes import (
    Proc,
    describe_processes,
    kill_processes,
    ray_processes_of,
    submit_command,
    submit_env,
    wait_until_gone,
)
from support.sweeps import CODE_DATASET, SAMPLES, sweep_yaml

from orchestrator.run.driver_lease import HEARTBEAT_ENV, LEASE_ENV
from orchestrator.run.runner import RunOptions, execute_plan
from orchestrator.store import Store, StoredTrial, open_store
from orchestrator.store.models import RoundRow
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep

pytestmark = pytest.mark.ray

#: Ray's exception type names for an actor that died (``ray.kill`` or a killed process).
ACTOR_DEATH = ("ActorDiedError", "RayActorError", "ActorUnavailableError")

#: The killed-driver test must catch a trial running after one is done: with 12 new tokens a
#: micro trial ran for too short a time for its poll to see that on a fast VM (the sweep ended
#: first), so its trials decode longer.
DRIVER_DATASET = {**CODE_DATASET, "max_new_tokens": 160}
#: Two datasets are two groups: a group's arms run interleaved and finish together, so the kill
#: lands once the first group is done and the second is running.
DRIVER_DATASETS = [DRIVER_DATASET, {**DRIVER_DATASET, "name": "builtin:math"}]


#: One group shard (the baseline and four trials, two prompts): each fault fails it once.
FAULT_SWEEP = sweep_yaml("faults", retries=4)
#: (actor, how): one fault per trial after the baseline, in plan order.
FAULTS = (
    ("draft", "ray.kill"),
    ("target", "sigkill"),
    ("target", "ray.kill"),
    ("draft", "sigkill"),
)


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A fresh local Ray instance (never another process's cluster) with one pair's 2 CPUs."""
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
    )
    yield
    ray.shutdown()


@pytest.fixture
def zoo_env(micro_zoo: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point zoo references at the session's micro zoo."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    return micro_zoo


def _round_count(store: Store, trial_id: str) -> int:
    with store.engine.connect() as connection:
        query = select(func.count()).select_from(RoundRow).where(RoundRow.trial_id == trial_id)
        return int(connection.scalar(query) or 0)


@pytest.mark.slow
def test_killed_draft_and_target_actors_are_replaced_and_every_trial_is_stored_once(
    zoo_env: Any,
    ray_local: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    spec = parse_sweep(FAULT_SWEEP, "faults.yaml")
    plan, store = registered_sweep(FAULT_SWEEP, "faults", tmp_path)
    assert [t.setting.policy for t in plan.trials] == ["ar", "static", "svip", "svip", "adaedl"]
    hit = {trial.trial_id: fault for trial, fault in zip(plan.trials[1:], FAULTS, strict=True)}
    injector = FaultInjector(hit)
    injector.install(monkeypatch)

    summary = execute_plan(spec, plan, store, RunOptions(progress=False))

    assert [(i.trial_id, (i.role, i.how)) for i in injector.injected] == list(hit.items())
    assert len({i.pid for i in injector.injected}) == len(FAULTS)  # a fresh process each time
    assert not any(process_alive(i.pid) for i in injector.injected)
    assert injector.starts == 1 + len(FAULTS)  # the first group, then one per actor death
    assert (summary.ran, summary.failed, summary.failures) == (len(plan.trials), 0, [])

    rows = {row.trial_id: row for row in store.trials("faults")}
    assert list(rows) == [trial.trial_id for trial in plan.trials]
    for trial_id, row in rows.items():
        assert row.status == "done", row.error
        # every arm of the group shard ran in each attempt, each ended by one actor death
        assert row.attempts == 1 + len(FAULTS), row.attempt_errors
        assert len(row.attempt_errors) == len(FAULTS)
        for error in row.attempt_errors:
            assert any(name in error for name in ACTOR_DEATH), (trial_id, error)
        samples = store.sample_outputs(trial_id)
        assert [s.sample_index for s in samples] == list(range(SAMPLES))
        assert _round_count(store, trial_id) == sum(s.n_rounds for s in samples)
    assert sample_counts(store) == (SAMPLES * len(plan.trials), SAMPLES * len(plan.trials))

    # Greedy speculative decoding is lossless, so every retried trial must reproduce the
    # baseline's tokens: a retry that resumed a half-updated KV cache would not.
    baseline = [s.output_ids for s in store.sample_outputs(plan.trials[0].trial_id)]
    for trial in plan.trials[1:]:
        assert [s.output_ids for s in store.sample_outputs(trial.trial_id)] == baseline

    kinds = sorted({rows[i.trial_id].attempt_errors[0].split(":")[0] for i in injector.injected})
    with capsys.disabled():
        print(
            f"\n[faults] injected {len(injector.injected)} worker faults "
            f"({', '.join(f'{i.role} {i.how}' for i in injector.injected)}); errors recorded: "
            f"{', '.join(kinds)}; {len(rows)} trials stored, 0 lost, "
            f"{sample_counts(store)[0]} sample rows"
        )
    store.close()


EMPTY_PROMPT_FILE = [
    {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return"},
    {"task_id": "HumanEval/1", "prompt": "", "canonical_solution": "    pass"},
]


@pytest.mark.slow
def test_a_model_error_fails_only_its_trials_with_the_reason_and_the_sweep_goes_on(
    zoo_env: Any,
    ray_local: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """Two real run-time errors: an empty prompt (the model cannot run on zero tokens) and a
    Cali-TS sigma that passes validation but whose square underflows to 0 in the posterior."""
    local = tmp_path / "humaneval.jsonl"
    local.write_text("".join(json.dumps(row) + "\n" for row in EMPTY_PROMPT_FILE))
    humaneval = {"name": "humaneval", "local_path": str(local), "samples": SAMPLES}
    text = sweep_yaml(
        "model-error",
        policies=[{"name": "static"}, {"name": "cali_ts", "params": {"sigma_model": 1.0e-200}}],
        datasets=[CODE_DATASET, {**humaneval, "max_new_tokens": 12}],
        retries=1,
        warmup_samples=0,
    )
    spec = parse_sweep(text, "model-error.yaml")
    plan, store = registered_sweep(text, "model-error", tmp_path)
    injector = FaultInjector({})
    injector.install(monkeypatch)

    summary = execute_plan(spec, plan, store, RunOptions(progress=False))

    empty_prompt = "ValueError: the model was given no tokens to run (an empty prompt?)"
    expected = {
        ("builtin:code", "ar"): None,
        ("builtin:code", "static"): None,
        ("builtin:code", "cali_ts"): "ZeroDivisionError: float division by zero",
        ("humaneval", "ar"): empty_prompt,
        ("humaneval", "static"): empty_prompt,
        # Cali-TS raises on the first prompt, before the empty one is reached.
        ("humaneval", "cali_ts"): "ZeroDivisionError: float division by zero",
    }
    rows = store.trials("model-error")
    assert sorted((row.dataset, row.policy) for row in rows) == sorted(expected)
    for row in rows:
        reason = expected[(row.dataset, row.policy)]
        samples = store.sample_outputs(row.trial_id)
        if reason is None:
            assert (row.status, row.attempts, row.error) == ("done", 1, None)
            assert len(samples) == SAMPLES
        else:
            assert row.status == "failed"
            assert reason in row.error
            assert row.attempts == 2  # retries: 1
            assert len(row.attempt_errors) == 2
            assert all(reason in error for error in row.attempt_errors)
            assert samples == []
    assert (summary.ran, summary.failed) == (len(plan.trials), 4)
    assert injector.starts == 1  # a model error is not an actor death: the actors are kept
    with capsys.disabled():
        print(f"\n[model-error] {len(rows)} trials: 2 stored done, 4 failed with their reason")
    store.close()


# ---------------------------------------------------------------------------------------------
# The driver killed: `submit` as a subprocess, SIGKILLed mid-sweep, then submitted again
# ---------------------------------------------------------------------------------------------

#: Command-line fragments of Ray's per-node agents; after an unclean raylet death they exit only
#: once a 60 s error report to the (dead) GCS times out (``publish_error_to_driver``).
RAY_AGENTS = (b"DashboardAgent", b"RuntimeEnvAgent", b"dashboard/agent.py", b"runtime_env/agent")
#: Seconds after the kill by which every process of the killed driver must have exited.
AGENT_EXIT_S = 120.0
#: Shard leases of the two submits: the killed driver's lapse 6 s after its last heartbeat, so
#: the resubmitted one takes its running shards over then (after up to 30 s by default).
DRIVER_LEASE = {LEASE_ENV: "6", HEARTBEAT_ENV: "2"}


def _status_counts(db: Path) -> dict[str, int]:
    """Return {status: trials} read straight from the SQLite file (empty before it exists)."""
    if not db.exists():
        return {}
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
            query = "SELECT status, count(*) FROM trials GROUP BY status"
            return dict(connection.execute(query).fetchall())
    except sqlite3.Error:  # not created or not migrated yet
        return {}


def _kill_mid_sweep(process: subprocess.Popen, db: Path, total: int, timeout_s: float) -> set[Proc]:
    """SIGKILL ``process`` once ≥1 trial is done and one is running; return its Ray processes."""
    deadline = time.monotonic() + timeout_s
    started: set[Proc] = set()
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"submit ended (code {process.returncode}) before the kill")
        started |= ray_processes_of(process.pid)
        counts = _status_counts(db)
        if 1 <= counts.get("done", 0) < total and counts.get("running", 0) >= 1:
            process.send_signal(signal.SIGKILL)
            return started
        time.sleep(0.1)
    raise AssertionError(f"no trial was done within {timeout_s} s: {_status_counts(db)}")


def _is_ray_agent(proc: Proc) -> bool:
    """True for Ray's per-node dashboard and runtime-env agents."""
    try:
        command = Path(f"/proc/{proc[0]}/cmdline").read_bytes()
    except OSError:
        return False
    return any(name in command for name in RAY_AGENTS)


def _wait_collecting(process: subprocess.Popen, timeout_s: float) -> set[Proc]:
    """Wait for ``process`` to exit; return the Ray processes it had while it ran."""
    deadline = time.monotonic() + timeout_s
    seen: set[Proc] = set()
    while process.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"submit did not finish within {timeout_s} s")
        seen |= ray_processes_of(process.pid)
        time.sleep(0.5)
    return seen


def _done_trials(url: str, sweep: str) -> tuple[dict[str, StoredTrial], dict[str, Any]]:
    """Return the sweep's trial rows and, per done trial, (finished_at, attempts, samples)."""
    with open_store(url, read_only=True) as store:
        rows = {row.trial_id: row for row in store.trials(sweep)}
        done = {
            trial_id: (row.finished_at, row.attempts, store.sample_outputs(trial_id))
            for trial_id, row in rows.items()
            if row.status == "done"
        }
    return rows, done


@pytest.mark.slow
def test_killed_driver_resubmitted_keeps_done_trials_redoes_the_rest_and_leaves_no_ray(
    zoo_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep_file = tmp_path / "driver.yaml"
    sweep_file.write_text(sweep_yaml("driver", datasets=DRIVER_DATASETS))
    plan = plan_sweep(parse_sweep(sweep_file.read_text(), str(sweep_file)))
    url = f"sqlite:///{tmp_path / 'results.db'}"
    logs = [(tmp_path / f"submit-{n}.log").open("w") for n in (1, 2)]
    first = subprocess.Popen(
        submit_command(sweep_file, url),
        cwd=REPO,
        env={**submit_env(zoo_env), **DRIVER_LEASE},
        stdout=logs[0],
        stderr=subprocess.STDOUT,
    )
    second: subprocess.Popen | None = None
    killed: set[Proc] = set()
    started: set[Proc] = set()
    try:
        killed = _kill_mid_sweep(first, tmp_path / "results.db", len(plan.trials), timeout_s=400)
        killed_at = time.monotonic()
        assert first.wait(timeout=30) == -signal.SIGKILL
        agents = {proc for proc in killed if _is_ray_agent(proc)}
        lingering = wait_until_gone(killed - agents, timeout_s=30)
        assert not lingering, describe_processes(lingering)

        before, kept = _done_trials(url, "driver")
        interrupted = [tid for tid, row in before.items() if row.status == "running"]
        assert {row.status for row in before.values()} <= {"done", "running", "pending"}
        assert kept and interrupted and len(kept) < len(plan.trials)

        second = subprocess.Popen(
            submit_command(sweep_file, url),
            cwd=REPO,
            env={**submit_env(zoo_env), **DRIVER_LEASE},
            stdout=logs[1],
            stderr=subprocess.STDOUT,
        )
        # The agents wait for Ray's 60 s publish-error timeout on the dead GCS, then exit.
        lingering = wait_until_gone(agents, timeout_s=AGENT_EXIT_S - (time.monotonic() - killed_at))
        assert not lingering, describe_processes(lingering)
        started = _wait_collecting(second, timeout_s=500)
        leftover = wait_until_gone(started, timeout_s=30)
        assert not leftover, describe_processes(leftover)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        kill_processes(killed | started)
        for log in logs:
            log.close()
    output = (tmp_path / "submit-2.log").read_text()
    assert second.returncode == 0, output[-3000:]
    assert f"{len(plan.trials)} trials planned, {len(kept)} already done" in output

    after, done = _done_trials(url, "driver")
    assert list(after) == [trial.trial_id for trial in plan.trials]
    assert set(done) == set(after)
    for trial_id, untouched in kept.items():
        assert done[trial_id] == untouched  # same finish time, attempts and sample rows (ids)
    for trial_id in interrupted:
        assert after[trial_id].attempts == 2  # the killed attempt and the redone one
    baseline = [s.output_ids for s in done[plan.trials[0].trial_id][2]]
    for _, _, samples in done.values():
        assert [s.sample_index for s in samples] == list(range(SAMPLES))
        assert [s.output_ids for s in samples] == baseline
    with open_store(url, read_only=True) as store:
        stored = sample_counts(store)
    assert stored == (SAMPLES * len(plan.trials), SAMPLES * len(plan.trials))
    with capsys.disabled():
        print(
            f"\n[driver] SIGKILLed submit with {len(kept)} trials done and {len(interrupted)} "
            f"running; its {len(killed)} Ray processes all exited ({len(agents)} agents after "
            f"Ray's 60 s timeout); resubmitted: {len(after)} trials stored, 0 lost, "
            f"{len(kept)} kept untouched"
        )


def _default_sigint() -> None:
    """Give the child process the default SIGINT disposition (run before it starts)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_stops_submit_promptly_and_keeps_every_finished_trial(
    zoo_env: Any, tmp_path: Path
) -> None:
    sweep_file = tmp_path / "interrupt.yaml"
    # Trials long enough (seconds each) that the interrupt lands while later ones are pending;
    # two datasets are two groups (a group's arms run interleaved and finish together), run
    # one after the other, each in one-prompt shards: the interrupt lands once the first group
    # is done, the second group's shard in flight is stored, and its other shards never start.
    long_trials = [
        {**CODE_DATASET, "samples": 4, "max_new_tokens": 48},
        {"name": "builtin:math", "samples": 4, "max_new_tokens": 48},
    ]
    sweep_file.write_text(
        sweep_yaml("interrupt", datasets=long_trials, execution={"shard_prompts": 1})
    )
    plan = plan_sweep(parse_sweep(sweep_file.read_text(), str(sweep_file)))
    db = tmp_path / "results.db"
    url = f"sqlite:///{db}"
    log = (tmp_path / "submit.log").open("w")
    process = subprocess.Popen(
        submit_command(sweep_file, url),
        cwd=REPO,
        env=submit_env(zoo_env),
        stdout=log,
        stderr=subprocess.STDOUT,
        # As in a terminal: a shell that started these tests in the background (``cmd &``)
        # made its children ignore SIGINT, and Python then installs no KeyboardInterrupt.
        preexec_fn=_default_sigint,
    )
    started: set[Proc] = set()
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert process.poll() is None, "submit ended before it could be interrupted"
            started |= ray_processes_of(process.pid)
            counts = _status_counts(db)
            if counts.get("done", 0) >= 1 and counts.get("running", 0) >= 1:
                break
            time.sleep(0.1)
        interrupted_at = time.monotonic()
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=120)
        seconds = time.monotonic() - interrupted_at
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        kill_processes(started)
        log.close()
    output = (tmp_path / "submit.log").read_text()
    assert code == 130, output[-3000:]
    assert "interrupted: finished trials are stored" in output
    counts = _status_counts(db)
    # The group shard in flight finishes and is stored; no new one starts, none is left running.
    assert counts.get("running", 0) == 0
    assert 1 <= counts.get("done", 0) < len(plan.trials), (counts, seconds)
    assert seconds < 60
