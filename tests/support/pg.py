"""The test PostgreSQL server (``SPECSWEEP_TEST_PG_URL``) and a fresh database on it."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine

from orchestrator.store.db import normalise_url

#: The test server's URL, or None where none is configured (then only SQLite is tested).
PG_URL = os.environ.get("SPECSWEEP_TEST_PG_URL")


BACKENDS = ["sqlite", *(["postgresql"] if PG_URL else [])]


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """Create an empty database on the test PostgreSQL server; yield its URL, then drop it.

    Its own database (not the shared one that ``tests/unit/test_store.py`` wipes), named after
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
