"""Shared fixtures: the ``micro`` model zoo (built once per test session into a temporary
cache), a local two-CPU Ray per test module (``RAY_ADDRESS`` is ``local`` in test processes),
and a job directory for training jobs.

The tiers: ``tests/unit`` needs neither the zoo nor Ray (collection fails if one of its tests
asks for those fixtures), nor, under its timed command ``-m "not postgresql"``, the PostgreSQL
test server; ``tests/integration`` holds the rest. Tests that use the zoo fixtures are marked
``zoo``, those that use ``ray_local`` are marked ``ray``, those that talk to the test server
``postgresql`` (``support.pg``); shared helpers live in ``tests/support`` (imported as
``support.<module>``: ``tests`` is on ``pythonpath``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray

from training.jobs.base import JOBS_DIR_ENV
from training.zoo.build import build_zoo
from training.zoo.cache import ZooManifest

# Every Ray a test starts without an address is a new local one, never a cluster that another
# test process (the README's command runs two pytest-xdist workers) or the user started.
os.environ["RAY_ADDRESS"] = "local"

#: Fixtures that build or point at the micro zoo (a test using one is marked ``zoo``).
ZOO_FIXTURES = frozenset({"micro_zoo", "job_env"})
#: Fixtures that start Ray (a test using one is marked ``ray``).
RAY_FIXTURES = frozenset({"ray_local"})
#: The fast tier's folder: its tests may use none of the fixtures above.
UNIT_DIR = Path(__file__).resolve().parent / "unit"


@pytest.fixture(scope="session")
def micro_zoo(tmp_path_factory: pytest.TempPathFactory) -> ZooManifest:
    """Return the manifest of the ``micro`` zoo (tokenizer, target and three distilled drafts).

    Built from scratch into a session temporary cache (about 30 s on 2 CPU cores), so tests never
    depend on, or write to, the user's cache.
    """
    return build_zoo("micro", cache_dir=tmp_path_factory.mktemp("zoo-cache"), progress=False)


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance with two CPUs (one pair's actors, or two training ranks)."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def job_env(micro_zoo: ZooManifest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Zoo refs resolve to the session's micro zoo; jobs write under this test's directory."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    monkeypatch.setenv(JOBS_DIR_ENV, str(tmp_path / "jobs"))
    return tmp_path / "jobs"


def tier_violations(items: list[pytest.Item]) -> list[str]:
    """Return ``test id: fixtures`` for each test under ``tests/unit`` using zoo or Ray fixtures."""
    found = []
    for item in items:
        heavy = sorted((ZOO_FIXTURES | RAY_FIXTURES) & set(getattr(item, "fixturenames", ())))
        if heavy and item.path.is_relative_to(UNIT_DIR):
            found.append(f"{item.nodeid}: {', '.join(heavy)}")
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by the fixtures they use; refuse a unit-tier test that needs the zoo or Ray."""
    violations = tier_violations(items)
    if violations:
        raise pytest.UsageError(
            "tests/unit must not use the micro zoo or Ray (move these tests to "
            "tests/integration):\n  " + "\n  ".join(violations)
        )
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & ZOO_FIXTURES:
            item.add_marker(pytest.mark.zoo)
        if used & RAY_FIXTURES:
            item.add_marker(pytest.mark.ray)
