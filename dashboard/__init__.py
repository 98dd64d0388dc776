"""SpecSweep dashboard package."""
