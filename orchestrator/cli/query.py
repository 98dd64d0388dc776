"""``query``: one read-only SQL statement on the store, within limits, and its refusals."""

from __future__ import annotations

import argparse
import csv
import sys
from typing import Any

from rich.console import Console
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from orchestrator.analysis import report
from orchestrator.cli.common import (
    EXIT_OK,
    PROG,
    UserError,
    add_command,
    opened_store,
    positive,
)
from orchestrator.store import (
    NotAStatement,
    PrivilegedRoleRefused,
    QueryLimitExceeded,
    QueryLimits,
    QueryRefused,
    default_url,
    reader_role_sql,
)

#: SQLSTATE of PostgreSQL's "cannot execute ... in a read-only transaction".
PG_READ_ONLY_SQLSTATE = "25006"
READ_ONLY_MARKERS = ("readonly", "read-only", "read only", "query_only")
#: ``query``'s limit flags, by QueryLimits field.
QUERY_LIMIT_FLAGS = {"timeout_s": "--timeout", "max_rows": "--max-rows", "max_bytes": "--max-bytes"}


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``query``."""
    limits = QueryLimits()
    command = add_command(
        commands,
        "query",
        handle,
        "run one read-only SQL statement on the store and print the rows",
        "Tables: sweeps, sweep_trials, trials, sample_results, rounds, position_acceptance,\n"
        "accepted_lengths, runs, training_jobs, artifacts, cost_fits, traces.\n"
        "Runs one SELECT, WITH, VALUES or EXPLAIN (without ANALYZE) statement, or a PRAGMA\n"
        "that only reads on SQLite, in a read-only transaction; anything else is refused\n"
        "(exit code 2), as is a query past --timeout, --max-rows or --max-bytes.\n"
        "On PostgreSQL, connect as a role that may only read the store (a superuser is\n"
        "refused; the message shows the SQL that creates such a role), and give its URL in\n"
        "$SPECSWEEP_DB with the password in ~/.pgpass, not on the command line.\n\n"
        "examples:\n"
        f'  {PROG} query "SELECT policy, threshold, max_draft_len, speedup FROM trials '
        "WHERE dataset = 'builtin:code' ORDER BY speedup DESC LIMIT 10\"\n"
        f'  {PROG} query "SELECT * FROM trials" --format csv > trials.csv',
        db,
    )
    command.add_argument("sql", metavar="SQL", help="one SQL statement (quote it)")
    command.add_argument(
        "--format", choices=("table", "csv"), default="table", help="output format"
    )
    command.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive(float),
        default=limits.timeout_s,
        help=f"stop the query after this long (default: {limits.timeout_s:g})",
    )
    command.add_argument(
        "--max-rows",
        metavar="N",
        type=positive(int),
        default=limits.max_rows,
        help=f"stop when the result has more rows than this (default: {limits.max_rows})",
    )
    command.add_argument(
        "--max-bytes",
        metavar="N",
        type=positive(int),
        default=limits.max_bytes,
        help=f"stop when the values returned exceed this many bytes (default: {limits.max_bytes},"
        " 64 MiB)",
    )
    command.add_argument(
        "--allow-superuser",
        action="store_true",
        help="on PostgreSQL, run even as a superuser or a role that may run server programs, "
        "read or write server files or signal other sessions. The statement checks and the "
        "READ ONLY transaction still apply, but a way around them would run with those powers "
        "(COPY ... TO PROGRAM runs a shell command as the database server's OS user)",
    )


def handle(args: argparse.Namespace, console: Console) -> int:
    """``query``: run one read-only statement within the limits and print its rows."""
    limits = QueryLimits(args.timeout, args.max_rows, args.max_bytes)
    with opened_store(args.db, read_only=True) as store:
        try:
            result = store.query(args.sql, limits, allow_superuser=args.allow_superuser)
        except PrivilegedRoleRefused as error:
            raise UserError(privileged_role_message(error, args.db)) from None
        except NotAStatement as error:
            raise UserError(f"error: query failed: {error}") from None
        except QueryRefused as error:
            raise UserError(f"error: query refused: {error}") from None
        except QueryLimitExceeded as error:
            raise UserError(query_limit_message(error)) from None
        except DBAPIError as error:
            raise UserError(query_error_message(error)) from None
    if result is None:
        console.print("the statement returned no result set")
        return EXIT_OK
    if args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows(result.rows)
        return EXIT_OK
    columns = report.unique_names(result.columns)
    rows = [dict(zip(columns, row, strict=True)) for row in result.rows]
    console.print(report.render_table(rows, columns, headers={}))
    console.print(f"{len(rows)} row{'s' * (len(rows) != 1)}")
    return EXIT_OK


def query_error_message(error: DBAPIError) -> str:
    """Return the message for a query the database failed, saying plainly when it refused a
    write (SQLite's read-only messages, PostgreSQL's SQLSTATE 25006), not from the SQL text."""
    original = error.orig
    text = str(original).strip()
    refused = getattr(original, "sqlstate", None) == PG_READ_ONLY_SQLSTATE or any(
        marker in text.lower() for marker in READ_ONLY_MARKERS
    )
    if refused:
        return (
            "error: query refused: 'query' opens the store read-only, so statements that write "
            f"(INSERT, UPDATE, DELETE, CREATE, DROP, ...) cannot run. The database said: {text}"
        )
    return f"error: query failed: {text}"


def query_limit_message(error: QueryLimitExceeded) -> str:
    """Return the message for a query stopped by a limit: which limit, and the flag to raise."""
    flag = QUERY_LIMIT_FLAGS[error.limit]
    if error.limit == "timeout_s":
        return (
            f"error: query stopped: it ran past the {error.value:g} s time limit; narrow the "
            f"query or raise the limit with {flag} SECONDS"
        )
    what = "rows" if error.limit == "max_rows" else "bytes"
    return (
        f"error: query stopped: it returned more than {error.value:g} {what}; add a LIMIT or "
        f"select less, or raise the cap with {flag} N"
    )


def privileged_role_message(error: PrivilegedRoleRefused, url: str | None) -> list[str]:
    """Return the refusal of a superuser-like role, with how to create and use a reader role."""
    found = error.found
    parsed = make_url(url or default_url())
    host, port = parsed.host or "localhost", parsed.port or 5432
    reader = f"{parsed.drivername.split('+')[0]}://specsweep_reader@{host}:{port}/{found.database}"
    return [
        f"error: query refused: {error}: a statement that got past the checks of 'query' "
        "could run programs on the database server, read its files or stop other sessions.",
        "Query as a role that may only read the store. Create it once as a superuser (psql), "
        "with a password of your own:",
        *(f"  {line}" for line in reader_role_sql(found.database, found.owner, found.schema)),
        "Then put its URL, without the password, in $SPECSWEEP_DB, and this line, with the "
        "password, in ~/.pgpass (chmod 600 ~/.pgpass), never the password on the command line:",
        f"  export SPECSWEEP_DB={reader}",
        f"  {host}:{port}:{found.database}:specsweep_reader:PASSWORD",
        f'  {PROG} query "SELECT ..."',
        "To run as this role anyway, add --allow-superuser (the statement checks and the "
        "READ ONLY transaction still apply).",
    ]
