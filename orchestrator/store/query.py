"""Run one hand-written read-only statement on the store, within time, row and byte limits.

Every backend gets the same gate first (:func:`~orchestrator.store.sql_guard.check_read_only`:
one SELECT / WITH / VALUES / EXPLAIN statement), then its own fences:

- SQLite (opened ``mode=ro`` with ``query_only``): an authorizer that allows reading only and
  records what it denied (ATTACH, ``load_extension()``, a PRAGMA write...), a progress handler
  that aborts past the deadline, and ``SQLITE_LIMIT_LENGTH`` so one huge value (``zeroblob``)
  fails at once instead of being allocated.
- PostgreSQL: a role that is a superuser, or may run server programs, read or write server
  files or signal sessions, is refused unless the caller allows it; the statement runs in a
  READ ONLY transaction with ``statement_timeout`` and ``lock_timeout`` and is never committed.
  A SELECT goes through a server-side cursor, so rows past the caps are never fetched.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from orchestrator.store.records import QueryResult
from orchestrator.store.sql_guard import QueryRefused, check_read_only, tokenize

LimitName = Literal["timeout_s", "max_rows", "max_bytes"]
READER_ROLE = "specsweep_reader"
READER_PASSWORD = "choose-a-password"
#: Roles whose members reach outside the database (besides superusers).
SERVER_ROLES = (
    "pg_execute_server_program",
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_signal_backend",
)
LOCK_TIMEOUT_S = 5.0
FETCH_ROWS = 1000
#: SQLite VM instructions between two deadline checks.
PROGRESS_STEPS = 10_000
#: SQLite's per-value length limit is never set below this, so a small byte cap cannot break
#: reading the schema; values between the cap and this are caught when counted.
SQLITE_LENGTH_FLOOR = 1 << 20
#: SQLite pragmas that only describe the database, allowed with an argument.
SQLITE_INTROSPECTION = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_info",
        "index_xinfo",
        "index_list",
        "foreign_key_list",
        "foreign_key_check",
        "integrity_check",
        "quick_check",
        "collation_list",
        "function_list",
        "module_list",
        "pragma_list",
        "database_list",
        "compile_options",
    }
)
#: SQLite pragmas that act even without an argument.
SQLITE_ACTING_PRAGMAS = frozenset({"optimize", "wal_checkpoint", "incremental_vacuum"})
_SQLITE_READS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
_SQLITE_ACTION_NAMES = (
    "ALTER_TABLE",
    "ANALYZE",
    "ATTACH",
    "CREATE_INDEX",
    "CREATE_TABLE",
    "CREATE_TEMP_INDEX",
    "CREATE_TEMP_TABLE",
    "CREATE_TEMP_TRIGGER",
    "CREATE_TEMP_VIEW",
    "CREATE_TRIGGER",
    "CREATE_VIEW",
    "CREATE_VTABLE",
    "DELETE",
    "DETACH",
    "DROP_INDEX",
    "DROP_TABLE",
    "DROP_TEMP_INDEX",
    "DROP_TEMP_TABLE",
    "DROP_TEMP_TRIGGER",
    "DROP_TEMP_VIEW",
    "DROP_TRIGGER",
    "DROP_VIEW",
    "DROP_VTABLE",
    "INSERT",
    "REINDEX",
    "SAVEPOINT",
    "TRANSACTION",
    "UPDATE",
)
_SQLITE_ACTIONS = {
    getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ") for name in _SQLITE_ACTION_NAMES
}
_SIMPLE_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_PRIVILEGES = """
SELECT current_user, current_database(), current_schema(),
       (SELECT tableowner FROM pg_tables
         WHERE schemaname = current_schema() AND tablename = 'alembic_version'),
       ARRAY(SELECT r.rolname FROM pg_roles r
              WHERE (r.rolsuper OR r.rolname = ANY(%s))
                AND pg_has_role(current_user, r.oid, 'MEMBER')
              ORDER BY r.rolname),
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
"""


@dataclass(frozen=True)
class QueryLimits:
    """How long a query may run and how much it may return."""

    timeout_s: float = 60.0
    max_rows: int = 100_000
    max_bytes: int = 64 * 2**20


class QueryLimitExceeded(Exception):
    """A query ran past one of its :class:`QueryLimits` (``limit`` names the field)."""

    def __init__(self, limit: LimitName, value: float) -> None:
        self.limit = limit
        self.value = value
        super().__init__(f"the query ran past its {limit} limit of {value:g}")


@dataclass(frozen=True)
class PrivilegedRole:
    """A PostgreSQL login that reaches outside the database, and where its store lives."""

    role: str
    superuser: bool
    powers: list[str]
    database: str
    schema: str
    owner: str


class PrivilegedRoleRefused(QueryRefused):
    """``query`` was asked to run as a superuser (or similar) without the explicit override."""

    def __init__(self, found: PrivilegedRole) -> None:
        self.found = found
        what = "a superuser" if found.superuser else "a member of " + ", ".join(found.powers)
        super().__init__(f"the PostgreSQL role {found.role!r} is {what}")


def reader_role_sql(
    database: str, owner: str, schema: str = "public", role: str = READER_ROLE
) -> list[str]:
    """Return the statements that create a login role able to read the store and nothing more.

    ``owner`` is the role that creates the store's tables (its writer): tables a later
    migration adds become readable too.
    """
    role, database, schema, owner = (_quoted(name) for name in (role, database, schema, owner))
    return [
        f"CREATE ROLE {role} LOGIN PASSWORD '{READER_PASSWORD}';",
        f"GRANT CONNECT ON DATABASE {database} TO {role};",
        f"GRANT USAGE ON SCHEMA {schema} TO {role};",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role};",
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema} "
        f"GRANT SELECT ON TABLES TO {role};",
    ]


def _quoted(name: str) -> str:
    """Return ``name`` as a PostgreSQL identifier (double-quoted unless plain lowercase)."""
    if _SIMPLE_NAME.fullmatch(name):
        return name
    return '"' + name.replace('"', '""') + '"'


def run_query(
    engine: Engine, sql: str, limits: QueryLimits, allow_superuser: bool = False
) -> QueryResult | None:
    """Run ``sql`` (checked to be one read-only statement) and return its rows.

    Raises QueryRefused, QueryLimitExceeded, or SQLAlchemy's DBAPIError for the database's own
    errors. The connection is discarded afterwards, whatever happened.
    """
    dialect = engine.dialect.name
    check_read_only(sql, dialect)
    dbapi_error = engine.dialect.loaded_dbapi.Error
    with engine.connect() as connection:
        raw = connection.connection.driver_connection
        try:
            if dialect == "sqlite":
                return _run_sqlite(raw, sql, limits)
            return _run_postgres(raw, sql, limits, allow_superuser)
        except dbapi_error as error:
            raise DBAPIError.instance(sql, None, error, dbapi_error) from None
        finally:
            connection.invalidate()


# SQLite
# ---------------------------------------------------------------------------------------------


@dataclass
class _SqliteFence:
    """The authorizer and progress handler of one SQLite query, and what they stopped."""

    deadline: float
    refused: list[str] = field(default_factory=list)
    timed_out: bool = False

    def authorize(self, action: int, arg1: str | None, arg2: str | None, *_rest: Any) -> int:
        """SQLite authorizer: allow reads, record and deny the rest."""
        refusal = sqlite_refusal(action, arg1, arg2)
        if refusal is None:
            return sqlite3.SQLITE_OK
        self.refused.append(refusal)
        return sqlite3.SQLITE_DENY

    def progress(self) -> int:
        """SQLite progress handler: non-zero (abort) once the deadline has passed."""
        self.timed_out = time.monotonic() > self.deadline
        return int(self.timed_out)


def sqlite_refusal(action: int, arg1: str | None, arg2: str | None) -> str | None:
    """Return what a SQLite authorizer call asks for when ``query`` must deny it, else None."""
    if action in _SQLITE_READS:
        return None
    if action == sqlite3.SQLITE_FUNCTION:
        name = (arg2 or "").lower()
        return "load_extension() (it loads native code)" if name == "load_extension" else None
    if action == sqlite3.SQLITE_PRAGMA:
        name = (arg1 or "").lower()
        if name in SQLITE_INTROSPECTION or (arg2 is None and name not in SQLITE_ACTING_PRAGMAS):
            return None
        return f"PRAGMA {name}" + ("" if arg2 is None else f" = {arg2}")
    if action == sqlite3.SQLITE_ATTACH:
        return f"ATTACH {arg1!r} (it can create files)"
    what = _SQLITE_ACTIONS.get(action, f"action {action}")
    return f"{what} {arg1 or ''}".strip()


def _run_sqlite(raw: sqlite3.Connection, sql: str, limits: QueryLimits) -> QueryResult | None:
    """Run ``sql`` on a read-only SQLite connection behind the authorizer and the limits."""
    fence = _SqliteFence(deadline=time.monotonic() + limits.timeout_s)
    raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(limits.max_bytes, SQLITE_LENGTH_FLOOR))
    raw.execute(f"PRAGMA busy_timeout = {max(1, int(limits.timeout_s * 1000))}")
    raw.set_authorizer(fence.authorize)
    raw.set_progress_handler(fence.progress, PROGRESS_STEPS)
    try:
        cursor = raw.execute(sql)
        return _collect(cursor, limits)
    except sqlite3.Error as error:
        if fence.refused:
            raise QueryRefused(
                "'query' only reads; SQLite was asked for " + "; ".join(fence.refused)
            ) from None
        if fence.timed_out:
            raise QueryLimitExceeded("timeout_s", limits.timeout_s) from None
        if getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_TOOBIG:
            raise QueryLimitExceeded("max_bytes", limits.max_bytes) from None
        raise


# PostgreSQL
# ---------------------------------------------------------------------------------------------


def _run_postgres(
    raw: Any, sql: str, limits: QueryLimits, allow_superuser: bool
) -> QueryResult | None:
    """Run ``sql`` in a READ ONLY transaction with timeouts; roll it back whatever happens."""
    import psycopg

    deadline = time.monotonic() + limits.timeout_s
    raw.rollback()
    try:
        with raw.cursor() as setup:
            setup.execute("SET TRANSACTION READ ONLY")
            setup.execute("SET LOCAL standard_conforming_strings = on")
            lock_ms = int(min(LOCK_TIMEOUT_S, limits.timeout_s) * 1000)
            setup.execute(f"SET LOCAL lock_timeout = {max(1, lock_ms)}")
            _statement_time(setup, deadline, limits)
            found = _privileged_role(setup)
            if found is not None and not allow_superuser:
                raise PrivilegedRoleRefused(found)
            explain = _first_word(sql) == "explain"
            with raw.cursor() if explain else raw.cursor("specsweep_query") as cursor:
                cursor.execute(sql)
                return _collect(cursor, limits, lambda: _statement_time(setup, deadline, limits))
    except psycopg.errors.QueryCanceled:
        raise QueryLimitExceeded("timeout_s", limits.timeout_s) from None
    finally:
        raw.rollback()


def _first_word(sql: str) -> str:
    """Return the statement's first word, lowercased (the gate has accepted ``sql``)."""
    words = [token.text for token in tokenize(sql, "postgresql") if token.kind == "word"]
    return words[0] if words else ""


def _statement_time(cursor: Any, deadline: float, limits: QueryLimits) -> None:
    """Set the transaction's statement timeout to the time left before ``deadline``."""
    left_ms = int((deadline - time.monotonic()) * 1000)
    if left_ms <= 0:
        raise QueryLimitExceeded("timeout_s", limits.timeout_s)
    cursor.execute(f"SET LOCAL statement_timeout = {left_ms}")


def _privileged_role(cursor: Any) -> PrivilegedRole | None:
    """Return the connected role when it is a superuser or a member of a server role."""
    cursor.execute(_PRIVILEGES, [list(SERVER_ROLES)])
    role, database, schema, owner, powers, superuser = cursor.fetchone()
    if not superuser and not powers:
        return None
    return PrivilegedRole(
        role=role,
        superuser=bool(superuser),
        powers=list(powers),
        database=database,
        schema=schema or "public",
        owner=owner or role,
    )


# Both
# ---------------------------------------------------------------------------------------------


def _collect(
    cursor: Any, limits: QueryLimits, before_fetch: Callable[[], None] = lambda: None
) -> QueryResult | None:
    """Fetch the cursor's rows in batches, stopping past the row or byte cap."""
    if cursor.description is None:
        return None
    columns = [column[0] for column in cursor.description]
    rows: list[tuple[Any, ...]] = []
    size = 0
    while True:
        before_fetch()
        batch = cursor.fetchmany(FETCH_ROWS)
        if not batch:
            return QueryResult(columns=columns, rows=rows)
        rows.extend(tuple(row) for row in batch)
        if len(rows) > limits.max_rows:
            raise QueryLimitExceeded("max_rows", limits.max_rows)
        size += sum(_value_bytes(value) for row in batch for value in row)
        if size > limits.max_bytes:
            raise QueryLimitExceeded("max_bytes", limits.max_bytes)


def _value_bytes(value: Any) -> int:
    """Return a value's size as returned: bytes as they are, text as UTF-8, others as text."""
    if value is None:
        return 0
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    return len(str(value).encode("utf-8", "replace"))
