"""``python -m orchestrator``: the SpecSweep command line (see :mod:`orchestrator.cli`)."""

from orchestrator.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
