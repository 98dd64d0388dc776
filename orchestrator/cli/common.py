"""What the commands share: exit codes, user-fixable errors, the console, ``--db``, the store."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

from orchestrator.analysis import report
from orchestrator.store import (
    Store,
    StoredTrial,
    StoreError,
    display_url,
    open_store,
)
from orchestrator.sweep.spec import SweepError, SweepSpec, load_sweep

EXIT_OK = 0
EXIT_TRIALS_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
DEFAULT_CLUSTER_FILE = Path(__file__).resolve().parents[2] / "cluster.yaml"
PROG = "python -m orchestrator"
WIDE_OUTPUT_COLUMNS = 200


class UserError(Exception):
    """A problem the user can fix; ``lines`` are printed to stderr and the CLI exits with 2."""

    def __init__(self, lines: Sequence[str] | str) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))


Handler = Callable[[argparse.Namespace, Console], int]


def make_console() -> Console:
    """Return a stdout console; wide when stdout is not a terminal, so piped tables don't wrap."""
    width = None if sys.stdout.isatty() else WIDE_OUTPUT_COLUMNS
    return Console(file=sys.stdout, width=width, highlight=False)


def non_negative_int(text: str) -> int:
    """Parse a retry count (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0 (got {value})")
    return value


def db_parent(default: Any) -> argparse.ArgumentParser:
    """Return a parent parser holding ``--db`` (accepted before or after the command)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--db",
        metavar="URL",
        default=default,
        help="results store URL (default: $SPECSWEEP_DB or sqlite:///results.db); for "
        "PostgreSQL set $SPECSWEEP_DB and keep the password in ~/.pgpass instead of typing it "
        "here, where other users and shell history can see it",
    )
    return parent


def help_handler(parser: argparse.ArgumentParser) -> Handler:
    """Return a handler that prints ``parser``'s help to stderr (a command group run bare)."""

    def print_help(_args: argparse.Namespace, _console: Console) -> int:
        parser.print_help(sys.stderr)
        return EXIT_USER_ERROR

    return print_help


def add_command(
    commands: Any, name: str, handler: Handler, help_text: str, epilog: str, parents: list[Any]
) -> argparse.ArgumentParser:
    """Add one sub-command with its one-line help, its description and an examples epilog."""
    command = commands.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=epilog,
        parents=parents,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.set_defaults(handler=handler)
    return command


def positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    """Return an argparse type parsing a number of ``kind`` (int or float) that is > 0."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
        return value

    return parse


def load_sweep_file(path: str) -> SweepSpec:
    """Return the validated sweep at ``path``; a SweepError becomes a UserError listing problems."""
    try:
        return load_sweep(path)
    except SweepError as error:
        count = len(error.problems)
        raise UserError(
            [
                f"error: {path} is not a valid sweep ({count} problem{'s' * (count != 1)}):",
                *(f"  {problem}" for problem in error.problems),
                "fix the fields named above (FILE:LINE: field.path: message) and run again",
            ]
        ) from None


@contextmanager
def opened_store(url: str | None, read_only: bool) -> Iterator[Store]:
    """Yield the store at ``url``; a bad URL or a missing/unmigrated store becomes a UserError."""
    shown = display_url(url)
    try:
        store = open_store(url, read_only=read_only)
    except StoreError as error:
        raise UserError([f"error: cannot open the store {shown}: {error}", STORE_HINT]) from None
    except (ArgumentError, NoSuchModuleError) as error:
        raise UserError(f"error: --db {shown!r} is not a usable database URL: {error}") from None
    except ImportError as error:
        raise UserError(
            f"error: the driver for {shown} is not installed ({error}); for PostgreSQL: "
            "pip install 'specsweep[postgres]'"
        ) from None
    except OperationalError as error:
        raise UserError(f"error: cannot connect to the store {shown}: {error.orig}") from None
    with store:
        yield store


STORE_HINT = "submit a sweep to create it, or point --db (or $SPECSWEEP_DB) at an existing one"


def require_sweep(store: Store, name: str) -> None:
    """Raise UserError unless a sweep called ``name`` is stored."""
    names = store.sweep_names()
    if name not in names:
        known = ", ".join(names) or "none"
        raise UserError(f"error: no sweep named {name!r} in the store (stored sweeps: {known})")


def print_table(console: Console, rows: Sequence[Any], columns: Sequence[str], title: str) -> None:
    """Print ``rows`` as a table titled ``title``."""
    console.print(report.render_table(rows, columns, title=title))


def print_failures(console: Console, rows: Sequence[StoredTrial], sweep: str) -> None:
    """Print the failed trials among ``rows`` with their errors' last lines."""
    failed = report.failed_rows(rows)
    if not failed:
        return
    print_table(console, failed, report.FAILED_COLUMNS, f"failed trials of sweep {sweep}")
    console.print(
        f'full error text: {PROG} query "SELECT trial_id, error FROM trials '
        f"WHERE status = 'failed'\"",
        markup=False,
    )
