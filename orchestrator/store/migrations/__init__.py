"""Alembic migrations of the SpecSweep store (a package so that setuptools ships them)."""
