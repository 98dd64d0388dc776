"""SpecSweep orchestrator package."""
