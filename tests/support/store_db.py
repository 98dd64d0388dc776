"""The store tests' sweep and database fixtures (SQLite per test, the wiped PostgreSQL test
database too when ``SPECSWEEP_TEST_PG_URL`` is set); test modules bind the fixtures by name."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.store import Store, open_store
from orchestrator.store.db import make_engine
from orchestrator.sweep.planner import Plan, plan_sweep
from orchestrator.sweep.spec import SweepSpec, parse_sweep
from support.pg import BACKENDS, worker_pg_url

SWEEP = """\
name: store
pairs:
  - name: demo
    target: zoo:micro/target
    draft: zoo:micro/draft-s
datasets: [{name: "builtin:code", samples: 2, max_new_tokens: 8}]
temperatures: [0]
policies:
  - name: static
  - name: svip
    grid: {threshold: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]}
max_draft_lens: [4, 8]
training_jobs:
  - {name: head, kind: specdecpp_head, base: zoo:micro/draft-s, teacher: zoo:micro/target,
     dataset: "builtin:code"}
"""


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of an empty database: a fresh SQLite file, or this process's wiped PostgreSQL
    test database (``worker_pg_url``)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    url = worker_pg_url()
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql("DROP SCHEMA public CASCADE")
        connection.exec_driver_sql("CREATE SCHEMA public")
    engine.dispose()
    return url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """The store at ``db_url``, opened for this test and closed after it."""
    with open_store(db_url) as opened:
        yield opened


def spec_and_plan(text: str = SWEEP) -> tuple[SweepSpec, Plan]:
    """Parse and plan the sweep file ``text`` (dedented)."""
    spec = parse_sweep(textwrap.dedent(text))
    return spec, plan_sweep(spec)
