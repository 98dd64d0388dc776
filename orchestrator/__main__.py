"""``python -m orchestrator``: the SpecSweep command line (see :mod:`orchestrator.cli`)."""

from orchestrator.cli import main
from workers.accelerator_probe import name_cpu_accelerator_when_no_cuda

if __name__ == "__main__":
    name_cpu_accelerator_when_no_cuda()
    raise SystemExit(main())
