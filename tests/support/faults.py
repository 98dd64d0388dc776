"""Fault injection into a running sweep: kill a worker group's draft or target actor."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import ray
from sqlalchemy import func, select

from orchestrator.run import replica as replica_module
from orchestrator.store import Store, open_store
from orchestrator.store.models import SampleResultRow
from orchestrator.sweep.planner import Plan, Trial, plan_sweep
from orchestrator.sweep.spec import parse_sweep

#: Seconds a killed actor's process may take to exit.
EXIT_TIMEOUT_S = 30.0


@dataclass
class Injection:
    """One fault that was injected: which trial, which actor, how, and the killed process."""

    trial_id: str
    role: str
    how: str
    pid: int


@dataclass
class FaultInjector:
    """Kills an actor of the pair's worker group while chosen trials' requests are built (first
    attempt of each only, and at most one fault per set of fresh actors: a group shard builds
    every arm's request in one attempt)."""

    faults: dict[str, tuple[str, str]]
    starts: int = 0
    last_start: int = 0
    actors: dict[str, Any] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    injected: list[Injection] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Wrap ``GroupReplica._draft`` (to see fresh actors) and ``_request`` (shard sent)."""
        pair_runner = replica_module.GroupReplica
        original_draft, original_request = pair_runner._draft, pair_runner._request

        def draft(runner: Any, pair: str) -> Any:
            fresh = not runner.ranks
            actor = original_draft(runner, pair)
            if fresh:
                self.starts += 1
                self.actors = {"draft": actor, "target": runner.ranks[0]}
                self.pids = {
                    role: ray.get(actor.__ray_call__.remote(lambda _actor: os.getpid()))
                    for role, actor in self.actors.items()
                }
            return actor

        def request(runner: Any, trial: Trial, indices: Any = None) -> Any:
            built = original_request(runner, trial, indices)
            done = {injection.trial_id for injection in self.injected}
            fresh = self.starts > self.last_start
            if trial.trial_id in self.faults and trial.trial_id not in done and fresh:
                self.last_start = self.starts
                role, how = self.faults[trial.trial_id]
                self.injected.append(Injection(trial.trial_id, role, how, self.pids[role]))
                self._kill(role, how)
            return built

        monkeypatch.setattr(pair_runner, "_draft", draft)
        monkeypatch.setattr(pair_runner, "_request", request)

    def _kill(self, role: str, how: str) -> None:
        """Kill the actor and return once its process has exited."""
        if how == "ray.kill":
            ray.kill(self.actors[role], no_restart=True)
        else:
            os.kill(self.pids[role], signal.SIGKILL)
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while process_alive(self.pids[role]):
            assert time.monotonic() < deadline, f"the killed {role} actor did not exit"
            time.sleep(0.05)


def sample_counts(store: Store) -> tuple[int, int]:
    """Return (sample rows, distinct (trial, sample index) pairs) in the whole store."""
    pairs = select(SampleResultRow.trial_id, SampleResultRow.sample_index).distinct().subquery()
    with store.engine.connect() as connection:
        rows = connection.scalar(select(func.count()).select_from(SampleResultRow))
        distinct = connection.scalar(select(func.count()).select_from(pairs))
    return int(rows or 0), int(distinct or 0)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def registered_sweep(text: str, name: str, tmp_path: Path) -> tuple[Plan, Store]:
    """Plan the sweep file ``text`` and register it in a new SQLite store under ``tmp_path``."""
    spec = parse_sweep(text, f"{name}.yaml")
    plan = plan_sweep(spec)
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    return plan, store
