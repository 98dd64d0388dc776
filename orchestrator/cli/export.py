"""``export``: a sweep's trial rows written to a CSV or Parquet file."""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.analysis import report
from orchestrator.cli.common import (
    EXIT_OK,
    PROG,
    UserError,
    add_command,
    opened_store,
    require_sweep,
)

EXPORT_FORMATS = ("csv", "parquet")


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``export``."""
    command = add_command(
        commands,
        "export",
        handle,
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


def _export_format(out: Path, requested: str | None) -> str:
    """Return the export format: ``requested``, else inferred from ``out``'s suffix."""
    if requested is not None:
        return requested
    suffix = out.suffix.lower().lstrip(".")
    if suffix in EXPORT_FORMATS:
        return suffix
    raise UserError(f"error: cannot tell the format of {out}: pass --format csv or parquet")


def handle(args: argparse.Namespace, console: Console) -> int:
    """``export``: write a sweep's trial rows to CSV or Parquet."""
    file_format = _export_format(args.out, args.format)
    with opened_store(args.db, read_only=True) as store:
        require_sweep(store, args.sweep)
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
