"""The command line: ``python -m orchestrator COMMAND``, one handler per command.

Each command is one small handler that reads its arguments, calls the library (spec, planner,
runner, store, zoo) and prints tables built by :mod:`orchestrator.analysis.report`. Problems the
user can fix (an invalid sweep file, a failed preflight, a missing store, an unknown sweep, a
refused query) print a message to stderr and exit with code 2, without a traceback; unexpected
exceptions still show theirs. ``submit`` exits with 1 when some trials failed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from orchestrator.cli import (
    compare,
    export,
    fits,
    plan,
    query,
    refresh,
    reproduction,
    schedule,
    status,
    submit,
    zoo,
)
from orchestrator.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_USER_ERROR,
    PROG,
    Handler,
    UserError,
    db_parent,
    make_console,
)

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``) and return the process exit code.

    Returns instead of exiting so tests can call it in-process.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:
        return exit_request.code if isinstance(exit_request.code, int) else EXIT_USER_ERROR
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USER_ERROR
    try:
        return handler(args, make_console())
    except UserError as error:
        for line in error.lines:
            print(line, file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser: global ``--db`` and one sub-parser per command."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="SpecSweep: plan, run and inspect speculative-decoding sweeps.",
        epilog=(
            "examples:\n"
            f"  {PROG} plan sweeps/demo.yaml\n"
            f"  {PROG} submit sweeps/demo.yaml\n"
            f"  {PROG} status demo\n"
            f"  {PROG} query \"SELECT policy, speedup FROM trials WHERE status = 'done'\"\n"
            f"\nrun '{PROG} COMMAND --help' for a command's options"
        ),
        parents=[db_parent(None)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    db = [db_parent(argparse.SUPPRESS)]
    submit.add_parser(commands, db)
    plan.add_parser(commands, db)
    status.add_parser(commands, db)
    query.add_parser(commands, db)
    fits.add_parser(commands, db)
    compare.add_parser(commands, db)
    refresh.add_parser(commands, db)
    reproduction.add_parser(commands, db)
    export.add_parser(commands, db)
    schedule.add_parser(commands, db)
    zoo.add_parser(commands)
    return parser
