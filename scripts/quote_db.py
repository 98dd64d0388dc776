"""Rewrite what a document quotes from its committed sweep database: the report and the tables.

    .venv/bin/python scripts/quote_db.py docs/reproduction.md sqlite:///docs/reproduce-results.db \
        --sweep sweeps/reproduce.yaml

The ``<!-- report -->`` ... ``<!-- /report -->`` block becomes what ``python -m orchestrator
report --sweep SWEEP --db DB`` prints, less its title line, and the table after each unlabelled
```sql block becomes that query's result (``query --format csv``), as markdown. With ``--key
KEY`` the blocks labelled KEY are rewritten instead (``<!-- report KEY -->``, ```sql KEY): a
document quoting a second database is rewritten by a second call. What
tests/integration/test_reproduction_doc.py checks is what this writes; prose is left alone, so
read it again against the new numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import re
import sys
from pathlib import Path

from orchestrator import cli as orchestrator_cli


def query_block(key: str) -> re.Pattern:
    """Return the pattern of a ```sql block labelled ``key`` (none: unlabelled) and its table."""
    label = f" {key}" if key else ""
    return re.compile(rf"(```sql{label}\n(?P<sql>.*?)\n```\s*\n)(?P<table>(?:\|[^\n]*\|\n)+)", re.S)


def report_block(key: str) -> re.Pattern:
    """Return the pattern of the report block labelled ``key`` (none: unlabelled)."""
    label = f" {key}" if key else ""
    return re.compile(rf"(<!-- report{label} -->\n)(?P<text>.*?)(<!-- /report -->)", re.S)


def cli(*argv: str) -> str:
    """Return what ``python -m orchestrator ARGV`` prints (run in this process); exit with its
    error if it fails."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = orchestrator_cli.main(list(argv))
    if code != 0:
        sys.exit(f"orchestrator {' '.join(argv[:2])} failed:\n{err.getvalue()}")
    return out.getvalue()


def markdown_table(csv_text: str) -> str:
    """Return a CSV result as a markdown table (header, separator, rows)."""
    rows = list(csv.reader(io.StringIO(csv_text)))
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Rewrite the document in place."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("document", type=Path)
    parser.add_argument("db", help="the database URL its SQL blocks and report read")
    parser.add_argument("--sweep", help="the sweep file its report block is of")
    parser.add_argument("--key", default="", help="rewrite the blocks labelled KEY")
    args = parser.parse_args()
    text = args.document.read_text(encoding="utf-8")

    def table(match: re.Match) -> str:
        sql = " ".join(match["sql"].split())
        result = cli("query", "--db", args.db, "--format", "csv", sql)
        return match.group(1) + markdown_table(result)

    text = query_block(args.key).sub(table, text)
    if args.sweep:
        report = cli("report", "--sweep", args.sweep, "--db", args.db)
        body = report.split("\n", 1)[1].lstrip("\n")
        text = report_block(args.key).sub(lambda m: m.group(1) + body + m.group(3), text)
    args.document.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
