"""docs/reproduction.md quotes the demo sweep's database: its numbers must be what `query` returns.

The database the document was written from is committed (docs/demo-results.db). Each SQL block
in the document is followed by the table of its result; the test runs every block through
``python -m orchestrator query --format csv`` on that database and compares cell by cell, and
checks that the database holds exactly the trials the current sweeps/demo.yaml plans (so a
change to the demo, or to what a trial measures, forces the document to be regenerated).
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.planner import plan_sweep
from orchestrator.spec import load_sweep
from orchestrator.store import open_store

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "reproduction.md"
DB = REPO / "docs" / "demo-results.db"
QUERY_BLOCK = re.compile(r"```sql\n(?P<sql>.*?)\n```\s*\n(?P<table>(?:\|[^\n]*\|\n)+)", re.S)


def doc_queries() -> list[tuple[str, list[list[str]]]]:
    """Return each (SQL, table rows including the header) pair of the document."""
    pairs = []
    for match in QUERY_BLOCK.finditer(DOC.read_text(encoding="utf-8")):
        lines = match["table"].strip().splitlines()
        rows = [
            [cell.strip() for cell in line.strip().strip("|").split("|")]
            for index, line in enumerate(lines)
            if index != 1  # the |---| separator
        ]
        pairs.append((" ".join(match["sql"].split()), rows))
    return pairs


def query_rows(sql: str) -> list[list[str]]:
    """Return the CSV rows (header first) that `query` prints for ``sql`` on the demo DB."""
    command = [sys.executable, "-m", "orchestrator", "query", "--db", f"sqlite:///{DB}"]
    result = subprocess.run(
        [*command, "--format", "csv", sql],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [row for row in csv.reader(io.StringIO(result.stdout)) if row]


def test_every_table_in_the_document_is_what_query_returns() -> None:
    queries = doc_queries()
    assert len(queries) >= 3, "the document should show its numbers as query results"
    for sql, table in queries:
        assert table == query_rows(sql), sql


def test_the_demo_database_holds_the_current_demo_sweep() -> None:
    plan = plan_sweep(load_sweep(REPO / "sweeps" / "demo.yaml"))
    with open_store(f"sqlite:///{DB}", read_only=True) as store:
        rows = store.trials("demo")
    assert {row.trial_id for row in rows} == {trial.trial_id for trial in plan.trials}
    assert {row.status for row in rows} == {"done"}
