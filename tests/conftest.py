"""Shared fixtures: the ``micro`` model zoo (built once per test session into a temporary
cache), a local two-CPU Ray per test module, and a job directory for training jobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from training.jobs.base import JOBS_DIR_ENV
from training.zoo.build import build_zoo
from training.zoo.cache import ZooManifest


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
