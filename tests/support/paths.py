"""Paths of the repository the tests run in."""

from pathlib import Path

#: The repository's root (``tests/support/paths.py`` is two folders below it).
REPO = Path(__file__).resolve().parents[2]
#: Checked-in files the tests read (``tests/data``).
TEST_DATA = REPO / "tests" / "data"
