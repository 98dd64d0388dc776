"""Alembic revisions of the SpecSweep store."""
