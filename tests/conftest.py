"""Shared fixtures: the ``micro`` model zoo, built once per test session into a temporary cache."""

from __future__ import annotations

import pytest

from training.zoo import ZooManifest, build_zoo


@pytest.fixture(scope="session")
def micro_zoo(tmp_path_factory: pytest.TempPathFactory) -> ZooManifest:
    """Return the manifest of the ``micro`` zoo (tokenizer, target and three distilled drafts).

    Built from scratch into a session temporary cache (about 30 s on 2 CPU cores), so tests never
    depend on, or write to, the user's cache.
    """
    return build_zoo("micro", cache_dir=tmp_path_factory.mktemp("zoo-cache"), progress=False)
