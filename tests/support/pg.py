"""The test PostgreSQL server (``SPECSWEEP_TEST_PG_URL``) and a fresh database on it."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import TypeVar

import pytest
from sqlalchemy import create_engine

from orchestrator.store.db import normalise_url

T = TypeVar("T")

#: The test server's URL, or None where none is configured (then only SQLite is tested).
PG_URL = os.environ.get("SPECSWEEP_TEST_PG_URL")

#: Marks of a test that talks to the test server: ``postgresql`` (the unit tier's timed command
#: deselects it, ``-m "not postgresql"``; the full run keeps it) and a skip where none is set.
POSTGRESQL_MARKS = (
    pytest.mark.postgresql,
    pytest.mark.skipif(PG_URL is None, reason="needs SPECSWEEP_TEST_PG_URL"),
)

#: The store backends a test runs on: SQLite, and PostgreSQL (marked) where a server is set.
BACKENDS = ["sqlite", *([pytest.param("postgresql", marks=POSTGRESQL_MARKS)] if PG_URL else [])]


def needs_postgresql(test: T) -> T:
    """Mark ``test`` as one that needs the test PostgreSQL server (``POSTGRESQL_MARKS``)."""
    for mark in POSTGRESQL_MARKS:
        test = mark(test)
    return test


def worker_pg_url() -> str:
    """Return the URL of this test process's own wiped database on the test server.

    Serial runs use the configured database itself; each pytest-xdist worker (the README's
    test command runs two) gets ``<name>_<worker>``, created here on first use, so two workers
    never wipe each other's tables mid-test.
    """
    assert PG_URL is not None
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return PG_URL
    url = normalise_url(PG_URL)
    name = f"{url.database}_{worker}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        exists = connection.exec_driver_sql(
            "SELECT 1 FROM pg_database WHERE datname = %(name)s", {"name": name}
        ).first()
        if exists is None:
            connection.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """Create an empty database on the test PostgreSQL server; yield its URL, then drop it.

    Its own database (not the wiped one of ``worker_pg_url``), named after
    that one (``<name>_<random>``), so tests running at the same time against the same server
    cannot disturb each other.
    """
    assert PG_URL is not None
    admin = create_engine(normalise_url(PG_URL), isolation_level="AUTOCOMMIT")
    name = f"{normalise_url(PG_URL).database}_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield normalise_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()
