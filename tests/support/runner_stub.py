"""A stand-in ``orchestrator.run.runner``: CLI tests check ``submit`` without Ray or models."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import orchestrator.run
from orchestrator.store import Store
from orchestrator.sweep.planner import Plan
from orchestrator.sweep.spec import SweepSpec


@dataclass(frozen=True)
class FakeRunOptions:
    address: str | None = None
    retries: int | None = None
    progress: bool = True


@dataclass
class FakeSweepSummary:
    sweep: str
    planned: int
    already_done: int
    ran: int
    failed: int
    seconds: float
    jobs_trained: int = 0
    jobs_reused: int = 0
    failures: list[str] = field(default_factory=list)
    job_failures: list[str] = field(default_factory=list)


class FakePreflightError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass
class FakeRunner:
    """Records calls; ``preflight_problems`` makes preflight fail; ``run`` simulates a run."""

    preflight_problems: list[str] = field(default_factory=list)
    run: Any = None
    calls: list[str] = field(default_factory=list)
    options: list[Any] = field(default_factory=list)

    def module(self) -> types.ModuleType:
        module = types.ModuleType("orchestrator.run.runner")
        module.RunOptions = FakeRunOptions  # type: ignore[attr-defined]
        module.SweepSummary = FakeSweepSummary  # type: ignore[attr-defined]
        module.PreflightError = FakePreflightError  # type: ignore[attr-defined]
        module.preflight = self.preflight  # type: ignore[attr-defined]
        module.execute_plan = self.execute_plan  # type: ignore[attr-defined]
        return module

    def preflight(self, spec: SweepSpec, plan: Plan) -> str:
        self.calls.append("preflight")
        if self.preflight_problems:
            raise FakePreflightError(self.preflight_problems)
        return "prepared inputs"

    def execute_plan(
        self,
        spec: SweepSpec,
        plan: Plan,
        store: Store,
        options: FakeRunOptions,
        inputs: str | None = None,
    ) -> FakeSweepSummary:
        self.calls.append("execute_plan")
        self.options.append(options)
        assert inputs == "prepared inputs", "execute_plan should reuse what preflight loaded"
        assert self.run is not None, "execute_plan should not have been called"
        return self.run(spec, plan, store)


@pytest.fixture
def fake_runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunner]:
    """Install a :class:`FakeRunner` as ``orchestrator.run.runner`` for one test."""
    runner = FakeRunner()
    module = runner.module()
    monkeypatch.setitem(sys.modules, "orchestrator.run.runner", module)
    monkeypatch.setattr(orchestrator.run, "runner", module, raising=False)
    yield runner
