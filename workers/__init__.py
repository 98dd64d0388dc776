"""SpecSweep workers package."""
