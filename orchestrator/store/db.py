"""Database engines for the store: URL defaults, SQLite/PostgreSQL settings and migrations.

Writers get SQLite in WAL mode with a busy timeout, and every SQLite transaction starts with
``BEGIN IMMEDIATE`` so concurrent writers queue on the lock instead of failing when a read
transaction tries to upgrade. Readers open SQLite with ``mode=ro`` (plus ``query_only``) and
PostgreSQL with ``default_transaction_read_only``, so writes fail in the database itself.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool

DEFAULT_URL = "sqlite:///results.db"
URL_ENV = "SPECSWEEP_DB"
SQLITE_BUSY_TIMEOUT_S = 60.0
STORE_DIR = Path(__file__).resolve().parent


class StoreError(RuntimeError):
    """The store cannot be opened as asked (missing database, schema not migrated...)."""


def default_url() -> str:
    """Return the store URL from ``$SPECSWEEP_DB``, else ``sqlite:///results.db``."""
    return os.environ.get(URL_ENV) or DEFAULT_URL


def display_url(url: str | None) -> str:
    """Return the store URL as shown to users (the default filled in, password hidden)."""
    url = url or default_url()
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return url


def normalise_url(url: str) -> URL:
    """Parse ``url``; plain ``postgresql://``/``postgres://`` use the psycopg (v3) driver."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url.removeprefix("postgres://")
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def make_engine(url: str, read_only: bool = False) -> Engine:
    """Return an engine for ``url`` with the store's SQLite or PostgreSQL session settings."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, read_only)
    engine = create_engine(parsed, pool_pre_ping=True)
    if read_only:
        event.listen(engine, "connect", _postgres_read_only)
    return engine


def _sqlite_engine(url: URL, read_only: bool) -> Engine:
    """Return a SQLite engine: WAL and IMMEDIATE transactions (writers) or ``mode=ro`` (readers)."""
    database = url.database
    in_memory = database in (None, "", ":memory:")
    kwargs: dict[str, Any] = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
    if in_memory:
        if read_only:
            raise StoreError("an in-memory SQLite store cannot be opened read-only")
        kwargs["poolclass"] = StaticPool
        kwargs["connect_args"]["check_same_thread"] = False
    elif read_only:
        path = Path(database).expanduser().resolve()
        if not path.is_file():
            raise StoreError(f"no store at {path}: nothing has been written there yet")
        url = url.set(database=f"file:{path}", query={"mode": "ro", "uri": "true"})
    else:
        Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, **kwargs)
    begin = "BEGIN" if read_only else "BEGIN IMMEDIATE"

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if read_only:
            cursor.execute("PRAGMA query_only = ON")
        elif not in_memory:
            _switch_to_wal(cursor)
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql(begin)

    return engine


def _switch_to_wal(cursor: Any) -> None:
    """Put the SQLite database in WAL mode, waiting up to the busy timeout for other writers.

    Leaving rollback-journal mode needs an exclusive lock, and while another connection holds a
    write lock SQLite answers "database is locked" at once, without its busy handler. Two
    processes opening a fresh database together hit exactly that, so the switch is retried.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _postgres_read_only(dbapi_connection: Any, _record: Any) -> None:
    """Make every transaction on a new PostgreSQL connection read-only.

    ``prepare_threshold = 0`` sends every statement through the extended protocol, which runs
    one statement per call: otherwise a script such as ``SET TRANSACTION READ WRITE; DELETE
    ...; COMMIT`` (psycopg's simple protocol runs it whole) would undo the read-only setting.
    """
    dbapi_connection.prepare_threshold = 0
    cursor = dbapi_connection.cursor()
    cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    cursor.close()
    dbapi_connection.commit()


def alembic_config() -> Config:
    """Return the Alembic config of the packaged migrations (``alembic.ini`` beside this file)."""
    config = Config(str(STORE_DIR / "alembic.ini"))
    config.set_main_option("script_location", str(STORE_DIR / "migrations"))
    return config


def head_revision() -> str:
    """Return the newest migration revision id."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise StoreError("the packaged migrations have no head revision")
    return head


def current_revision(engine: Engine) -> str | None:
    """Return the database's migration revision (None for a database never migrated)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade_to_head(engine: Engine) -> None:
    """Migrate the database to the newest revision; a no-op when it is already there.

    The upgrade runs in one transaction (an IMMEDIATE one on SQLite, under an advisory lock on
    PostgreSQL), so writers opening a fresh database at the same time migrate it once.
    """
    if current_revision(engine) == head_revision():
        return
    config = alembic_config()
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        connection.commit()


def check_readable(engine: Engine) -> None:
    """Raise StoreError unless the database has been migrated to the packaged head revision."""
    if not inspect(engine).has_table("alembic_version"):
        raise StoreError("the database holds no SpecSweep store (never opened by a writer)")
    revision = current_revision(engine)
    if revision != head_revision():
        raise StoreError(
            f"the store's schema is at revision {revision}, this code needs {head_revision()}: "
            "open it once as a writer to migrate"
        )
