"""The documents that quote committed sweep databases: their numbers must be what the CLI returns.

docs/reproduction.md is written from docs/reproduce-results.db (sweeps/reproduce.yaml): its
claims are the output of ``python -m orchestrator report --sweep sweeps/reproduce.yaml``, pasted
between ``<!-- report -->`` and ``<!-- /report -->`` without the report's title line, and its
tables are query results; its KD claims likewise from docs/kd-results.db (sweeps/kd_demo.yaml),
between ``<!-- report kd -->`` and ``<!-- /report -->``, with ```sql kd blocks
(scripts/quote_db.py writes both). docs/lab/demo-sweeps.md quotes docs/demo-results.db
(sweeps/demo.yaml) the same way, report and tables. docs/lab/demo-before-protocol.md is the
earlier reading of the demo sweeps' databases, docs/lab/data/demo-before-protocol.db (the demo
sweep of then, kept as docs/lab/data/demo-before-protocol.yaml) and
docs/lab/data/kd-demo-before-protocol.db (likewise). Each SQL block (```sql for the document's
own database, ```sql KEY for another) is followed by the table of its result; the test runs
every block through ``python -m orchestrator query --format csv`` on its database and compares
cell by cell, and checks that each database holds exactly the trials its current sweep file
plans (so a change to a sweep, or to what a trial measures, forces the documents to be
regenerated).
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

DATABASES = {
    "reproduce": (REPO / "docs" / "reproduce-results.db", REPO / "sweeps" / "reproduce.yaml"),
    "kd": (REPO / "docs" / "kd-results.db", REPO / "sweeps" / "kd_demo.yaml"),
    "demo": (REPO / "docs" / "demo-results.db", REPO / "sweeps" / "demo.yaml"),
    "demo-before": (
        REPO / "docs" / "lab" / "data" / "demo-before-protocol.db",
        REPO / "docs" / "lab" / "data" / "demo-before-protocol.yaml",
    ),
    "kd-demo": (
        REPO / "docs" / "lab" / "data" / "kd-demo-before-protocol.db",
        REPO / "docs" / "lab" / "data" / "kd-demo-before-protocol.yaml",
    ),
}
#: Each document and the database its unlabelled ```sql blocks query.
DOCUMENTS = {
    REPO / "docs" / "reproduction.md": "reproduce",
    REPO / "docs" / "lab" / "demo-sweeps.md": "demo",
    REPO / "docs" / "lab" / "demo-before-protocol.md": "demo-before",
}
QUERY_BLOCK = re.compile(
    r"```sql(?: (?P<db>[a-z-]+))?\n(?P<sql>.*?)\n```\s*\n(?P<table>(?:\|[^\n]*\|\n)+)", re.S
)
REPORT_BLOCK = re.compile(
    r"<!-- report(?: (?P<db>[a-z-]+))? -->\n(?P<text>.*?)<!-- /report -->", re.S
)


def doc_queries(doc: Path) -> list[tuple[str, str, list[list[str]]]]:
    """Return each (database key, SQL, table rows including the header) of ``doc``."""
    queries = []
    for match in QUERY_BLOCK.finditer(doc.read_text(encoding="utf-8")):
        lines = match["table"].strip().splitlines()
        rows = [
            [cell.strip() for cell in line.strip().strip("|").split("|")]
            for index, line in enumerate(lines)
            if index != 1  # the |---| separator
        ]
        queries.append((match["db"] or DOCUMENTS[doc], " ".join(match["sql"].split()), rows))
    return queries


def cli_output(*argv: str) -> str:
    """Return what ``python -m orchestrator ARGV`` prints (it must succeed)."""
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def query_rows(db: Path, sql: str) -> list[list[str]]:
    """Return the CSV rows (header first) that `query` prints for ``sql`` on ``db``."""
    printed = cli_output("query", "--db", f"sqlite:///{db}", "--format", "csv", sql)
    return [row for row in csv.reader(io.StringIO(printed)) if row]


@pytest.mark.parametrize("doc", sorted(DOCUMENTS), ids=lambda doc: doc.name)
def test_every_table_in_the_document_is_what_query_returns(doc: Path) -> None:
    queries = doc_queries(doc)
    assert len(queries) >= 3, "the document should show its numbers as query results"
    assert DOCUMENTS[doc] in {key for key, _, _ in queries}, "its own database is quoted"
    for key, sql, table in queries:
        assert table == query_rows(DATABASES[key][0], sql), sql


def test_every_database_is_quoted() -> None:
    quoted = {key for doc in DOCUMENTS for key, _, _ in doc_queries(doc)}
    assert quoted == set(DATABASES)


REPORTED = [
    (doc, match["db"] or DOCUMENTS[doc], match["text"])
    for doc in sorted(DOCUMENTS)
    for match in REPORT_BLOCK.finditer(doc.read_text("utf-8"))
]


def test_the_reproduction_and_the_demo_carry_their_reports() -> None:
    assert sorted(key for _, key, _ in REPORTED) == ["demo", "kd", "reproduce"]


@pytest.mark.parametrize("doc, key, block", REPORTED, ids=[key for _, key, _ in REPORTED])
def test_the_claims_are_the_report_of_the_committed_database(doc: Path, key: str, block: str):
    db, sweep = DATABASES[key]
    printed = cli_output("--db", f"sqlite:///{db}", "report", "--sweep", str(sweep))
    title, blank, *report = printed.splitlines(keepends=True)
    assert title.startswith("# Reproduction report: ") and blank == "\n"
    assert block == "".join(report)


@pytest.mark.parametrize("key", sorted(DATABASES))
def test_each_database_holds_its_current_sweep(key: str) -> None:
    db, sweep_file = DATABASES[key]
    spec = load_sweep(sweep_file)
    plan = plan_sweep(spec)
    with open_store(f"sqlite:///{db}", read_only=True) as store:
        rows = store.trials(spec.name)
    assert {row.trial_id for row in rows} == {trial.trial_id for trial in plan.trials}
    assert {row.status for row in rows} == {"done"}
