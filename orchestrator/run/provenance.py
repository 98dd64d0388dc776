"""What a sweep run ran on: code commit, library versions, device, threads.

:func:`collect_provenance` reads the git files, the installed distributions, ``/proc/cpuinfo``
and torch (the side effects); the record it returns, :class:`Provenance`, and the pure
comparison behind the resubmission note live in ``orchestrator.store.provenance_record``.
"""

from __future__ import annotations

import importlib.metadata
import platform
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.run.git_state import git_state
from orchestrator.store.provenance_record import Provenance, provenance_note

if TYPE_CHECKING:
    from orchestrator.store import Store

_REPO = Path(__file__).resolve().parents[2]
#: Distributions whose versions are recorded (None when not installed).
_LIBRARIES = ("specsweep", "torch", "transformers", "ray", "deepspeed")


def stored_provenance_notes(
    store: Store, trial_ids: Iterable[str], provenance: Provenance
) -> list[str]:
    """Return :func:`provenance_note`'s lines for the runs that measured these stored trials."""
    counts = Counter(trial.run_id for trial in store.trial_rows(trial_ids))
    runs = {run.id: run for run in store.runs(key for key in counts if key is not None)}
    return provenance_note(runs, counts, provenance)


def _version(name: str) -> str | None:
    """Return an installed distribution's version, None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    """Return the CPU model name (``/proc/cpuinfo`` on Linux, else the platform's)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def local_gpu_count() -> int:
    """Return the CUDA GPUs this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _gpu() -> tuple[str | None, str | None, int]:
    """Return (GPU name, driver version, count) when CUDA is available, else (None, None, 0)."""
    import torch

    if local_gpu_count() == 0:
        return None, None, 0
    driver = None
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        driver = str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # the driver version is optional; fall back to the CUDA version
        driver = f"cuda {torch.version.cuda}"
    return torch.cuda.get_device_name(0), driver, torch.cuda.device_count()


def collect_provenance() -> Provenance:
    """Return the provenance of a run driven from this process (its checkout's commit and
    dirtiness, its libraries and device; the workers' torch threads)."""
    git = git_state(_REPO)
    versions = {name: _version(name) for name in _LIBRARIES}
    gpu_name, gpu_driver, gpu_count = _gpu()
    return Provenance(
        commit=git.commit,
        dirty=git.dirty,
        specsweep_version=versions["specsweep"],
        torch_version=versions["torch"],
        transformers_version=versions["transformers"],
        ray_version=versions["ray"],
        deepspeed_version=versions["deepspeed"],
        python_version=platform.python_version(),
        cpu=_cpu_model(),
        gpu_name=gpu_name,
        gpu_driver=gpu_driver,
        gpu_count=gpu_count,
        torch_threads=worker_torch_threads(),
    )


def worker_torch_threads() -> int:
    """Return the torch threads each worker actor decodes with (not this driver's).

    Ray starts an actor's process with ``OMP_NUM_THREADS`` set to its CPU count, and every
    target rank and draft actor reserves ``bundles.CPUS_PER_ACTOR`` CPUs; torch sizes its
    intra-op pool from it (checked against a real actor in tests/test_cli_stats.py).
    """
    from orchestrator.sweep.bundles import CPUS_PER_ACTOR

    return max(1, int(CPUS_PER_ACTOR))
