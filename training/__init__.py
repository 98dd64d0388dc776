"""SpecSweep training package."""
