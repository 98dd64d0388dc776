"""docs/reproduction.md quotes the demo sweeps' databases: its numbers must be what `query` returns.

The databases the document was written from are committed: docs/demo-results.db
(sweeps/demo.yaml) and docs/kd-demo-results.db (sweeps/kd_demo.yaml). Each SQL block in the
document (```sql for the demo's database, ```sql kd-demo for the KD demo's) is followed by the
table of its result; the test runs every block through ``python -m orchestrator query --format
csv`` on its database and compares cell by cell, and checks that each database holds exactly the
trials its current sweep file plans (so a change to a demo, or to what a trial measures, forces
the document to be regenerated).
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import load_sweep

DOC = REPO / "docs" / "reproduction.md"
DATABASES = {
    "demo": (REPO / "docs" / "demo-results.db", REPO / "sweeps" / "demo.yaml"),
    "kd-demo": (REPO / "docs" / "kd-demo-results.db", REPO / "sweeps" / "kd_demo.yaml"),
}
QUERY_BLOCK = re.compile(
    r"```sql(?: (?P<db>[a-z-]+))?\n(?P<sql>.*?)\n```\s*\n(?P<table>(?:\|[^\n]*\|\n)+)", re.S
)


def doc_queries() -> list[tuple[str, str, list[list[str]]]]:
    """Return each (database key, SQL, table rows including the header) of the document."""
    queries = []
    for match in QUERY_BLOCK.finditer(DOC.read_text(encoding="utf-8")):
        lines = match["table"].strip().splitlines()
        rows = [
            [cell.strip() for cell in line.strip().strip("|").split("|")]
            for index, line in enumerate(lines)
            if index != 1  # the |---| separator
        ]
        queries.append((match["db"] or "demo", " ".join(match["sql"].split()), rows))
    return queries


def query_rows(db: Path, sql: str) -> list[list[str]]:
    """Return the CSV rows (header first) that `query` prints for ``sql`` on ``db``."""
    command = [sys.executable, "-m", "orchestrator", "query", "--db", f"sqlite:///{db}"]
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
    assert {key for key, _, _ in queries} == set(DATABASES), "both databases are quoted"
    for key, sql, table in queries:
        assert table == query_rows(DATABASES[key][0], sql), sql


@pytest.mark.parametrize("key", sorted(DATABASES))
def test_each_database_holds_its_current_sweep(key: str) -> None:
    db, sweep_file = DATABASES[key]
    spec = load_sweep(sweep_file)
    plan = plan_sweep(spec)
    with open_store(f"sqlite:///{db}", read_only=True) as store:
        rows = store.trials(spec.name)
    assert {row.trial_id for row in rows} == {trial.trial_id for trial in plan.trials}
    assert {row.status for row in rows} == {"done"}
