"""Stalls during a sweep on real Ray with the micro zoo: strangers on the target's channel, and a
target that hangs in the middle of a shard.

- Strangers: as soon as a worker group's target rank is up (before its draft actor connects),
  one client connects to the rank's channel and sends nothing and another sends half a message
  and stalls. The draft must still get in, the sweep finish, every sample be stored once, and
  the server close both strangers itself.
- A hung target: the first shard of the static trial finds the target's ``verify`` replaced by
  one that never returns (injected into the live actor through Ray). The driver must give up on
  the shard once its worker reported no progress for ``execution.stall_timeout_seconds``, kill
  the stuck worker group, and retry the shard on a fresh one; every sample is stored once.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import pytest
import ray
import yaml
from support.faults import FaultInjector, process_alive, registered_sweep, sample_counts
from support.sweeps import SAMPLES, sweep_yaml

from orchestrator.run import replica as replica_module
from orchestrator.run.runner import RunOptions, SweepSummary, execute_plan
from orchestrator.store import Store
from orchestrator.sweep.planner import Trial
from orchestrator.sweep.spec import parse_sweep

#: Seconds the whole sweep may take (the unfixed channel and driver hung for ever).
SWEEP_DEADLINE_S = 400.0
#: Seconds the server may take to drop a stranger (its handshake timeout is a few seconds).
STRANGER_DEADLINE_S = 60.0
#: The stall deadline the hung-target sweep runs with.
STALL_S = 5


@pytest.fixture
def zoo_env(micro_zoo: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point zoo references at the session's micro zoo."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    return micro_zoo


def _stall_sweep(name: str, **execution: Any) -> str:
    """Return a micro sweep (AR baseline and static K=4, two prompts) with ``execution`` set."""
    sweep = yaml.safe_load(sweep_yaml(name, policies=[{"name": "static"}]))
    sweep["execution"].update(execution)
    return yaml.safe_dump(sweep, sort_keys=False)


def _sweep_within_deadline(text: str, name: str, tmp_path: Any) -> tuple[SweepSummary, Store]:
    """Run the sweep on a thread; fail if it has not finished within ``SWEEP_DEADLINE_S``."""
    spec = parse_sweep(text, f"{name}.yaml")
    plan, store = registered_sweep(text, name, tmp_path)
    summaries: list[SweepSummary] = []
    errors: list[BaseException] = []

    def sweep() -> None:
        try:
            summaries.append(execute_plan(spec, plan, store, RunOptions(progress=False)))
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    runner = threading.Thread(target=sweep, daemon=True)
    runner.start()
    runner.join(SWEEP_DEADLINE_S)
    assert not errors, errors
    assert summaries, f"the sweep did not finish within {SWEEP_DEADLINE_S} s"
    return summaries[0], store


def _assert_every_sample_stored_once(summary: SweepSummary, store: Store, trials: int) -> None:
    """Every trial done, none failed, each of its samples stored exactly once."""
    assert (summary.ran, summary.failed, summary.failures) == (trials, 0, [])
    for row in store.trials(summary.sweep):
        assert row.status == "done", row.error
        samples = store.sample_outputs(row.trial_id)
        assert [s.sample_index for s in samples] == list(range(SAMPLES))
    assert sample_counts(store) == (SAMPLES * trials, SAMPLES * trials)


def _closed_by_server(sock: socket.socket) -> bool:
    """Read from ``sock`` until the server closes it; True once it has."""
    sock.settimeout(STRANGER_DEADLINE_S)
    with sock:
        try:
            while sock.recv(4096):
                pass
        except ConnectionResetError:
            pass
    return True


@pytest.mark.slow
def test_strangers_on_the_targets_channel_do_not_stall_the_sweep(
    zoo_env: Any, ray_local: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    strangers: list[socket.socket] = []
    original = replica_module.GroupReplica._start_ranks

    def start_ranks(runner: Any, model: Any) -> Any:
        padded = original(runner, model)
        address = ray.get(runner.ranks[0].open_channel.remote())
        idle = socket.create_connection((address.host, address.port))
        stalled = socket.create_connection((address.host, address.port))
        stalled.sendall(b"\x00\x00\x00\x40half")  # a length prefix, 4 of its 64 bytes, silence
        strangers.extend([idle, stalled])
        return padded

    monkeypatch.setattr(replica_module.GroupReplica, "_start_ranks", start_ranks)
    summary, store = _sweep_within_deadline(_stall_sweep("strangers"), "strangers", tmp_path)

    assert strangers, "no worker group was started"
    _assert_every_sample_stored_once(summary, store, trials=2)
    assert all(_closed_by_server(sock) for sock in strangers)
    store.close()


@pytest.mark.slow
def test_a_shard_whose_target_hangs_is_retried_on_a_fresh_group_after_the_stall_deadline(
    zoo_env: Any, ray_local: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def hang_verify(actor: Any) -> int:
        """Inside the live ``TargetWorker`` (pickled by value): make its target's ``verify``
        never return; return the actor's process id."""
        import time

        def verify(*_args: Any) -> None:
            while True:
                time.sleep(3600)

        actor.target.verify = verify
        return os.getpid()

    injector = FaultInjector({})
    injector.install(monkeypatch)
    hung: list[tuple[str, int]] = []
    built = replica_module.GroupReplica._request  # the injector's wrapper

    def request(runner: Any, trial: Trial, indices: Any = None) -> Any:
        made = built(runner, trial, indices)
        if trial.setting.policy == "static" and not hung:
            pid = ray.get(runner.ranks[0].__ray_call__.remote(hang_verify))
            hung.append((trial.trial_id, pid))
        return made

    monkeypatch.setattr(replica_module.GroupReplica, "_request", request)
    text = _stall_sweep("hung", stall_timeout_seconds=STALL_S)
    summary, store = _sweep_within_deadline(text, "hung", tmp_path)

    assert len(hung) == 1
    (trial_id, pid), *_ = hung
    assert not process_alive(pid)  # the stuck worker group was killed
    assert injector.starts == 2  # ... and replaced by a fresh one
    _assert_every_sample_stored_once(summary, store, trials=2)
    rows = {row.trial_id: row for row in store.trials("hung")}
    assert rows[trial_id].attempts == 2
    (error,) = rows[trial_id].attempt_errors
    assert "WorkerStalled" in error and "stall_timeout_seconds" in error, error
    store.close()
