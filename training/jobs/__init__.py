"""Training jobs by kind: KD drafts (DistillSpec, AdaSPEC, EESD early exit), policy heads and
EAGLE feature heads.

``run_job(config, output_dir)`` runs one job to completion (resuming from its last checkpoint
if an earlier run crashed) and returns its ``JobResult``; a job that already finished in
``output_dir`` is not run again. Each kind's module exposes ``run(config, output_dir, progress)``.
A job's ``settings`` may also hold the parallel settings (``workers``, ``parallel``,
``zero_stage``, see ``training.distributed``); they say how Ray Train runs the job and are
split off before the kind sees its settings. Under several ranks only rank 0 writes the result.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path

from training import distributed
from training.job_settings import JobConfigError
from training.jobs.base import (
    JobConfig,
    JobResult,
    finished_result,
    jobs_root,
    write_result,
)

#: Job kind -> module whose ``run`` trains it (imported on first use).
JOB_KINDS: dict[str, str] = {
    "distillspec": "training.jobs.distillspec",
    "adaspec": "training.jobs.adaspec",
    "eesd_exit": "training.jobs.eesd_exit",
    "specdecpp_head": "training.jobs.specdecpp_head",
    "cali_ts_predictor": "training.jobs.cali_ts_predictor",
    "eagle_head": "training.jobs.eagle_head",
}


def kind_config(config: JobConfig) -> tuple[JobConfig, distributed.ParallelSettings]:
    """Return (``config`` with only its kind's settings, its parallel settings)."""
    own, parallel = distributed.split_parallel(config.settings)
    return replace(config, settings=own), parallel


def check_job_config(config: JobConfig) -> None:
    """Raise JobConfigError if ``config``'s kind is unknown or one of its settings is bad."""
    if config.kind not in JOB_KINDS:
        known = sorted(JOB_KINDS)
        raise JobConfigError(f"unknown job kind {config.kind!r}; expected one of {known}")
    own, _ = kind_config(config)
    importlib.import_module(JOB_KINDS[config.kind]).settings_of(own)


def run_job(config: JobConfig, output_dir: Path, progress: bool = True) -> JobResult:
    """Return the result of ``config``'s job in ``output_dir``, training it unless it finished.

    Runs in this process; under Ray Train every rank calls it (``training.ray_job``).
    """
    check_job_config(config)
    done = finished_result(output_dir)
    if done is not None:
        return done
    output_dir.mkdir(parents=True, exist_ok=True)
    module = importlib.import_module(JOB_KINDS[config.kind])
    result: JobResult = module.run(kind_config(config)[0], output_dir, progress)
    if distributed.is_writer():
        write_result(output_dir, config, result)
    return result


__all__ = [
    "JOB_KINDS",
    "JobConfig",
    "JobConfigError",
    "JobResult",
    "check_job_config",
    "jobs_root",
    "kind_config",
    "run_job",
]
