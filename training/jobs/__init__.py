"""Training jobs by kind: KD drafts (DistillSpec, AdaSPEC, EESD early exit) and policy heads.

``run_job(config, output_dir)`` runs one job to completion (resuming from its last checkpoint
if an earlier run crashed) and returns its ``JobResult``; a job that already finished in
``output_dir`` is not run again. Each kind's module exposes ``run(config, output_dir, progress)``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from training.jobs.base import (
    JobConfig,
    JobConfigError,
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
}


def check_job_config(config: JobConfig) -> None:
    """Raise JobConfigError if ``config``'s kind is unknown or one of its settings is bad."""
    if config.kind not in JOB_KINDS:
        known = sorted(JOB_KINDS)
        raise JobConfigError(f"unknown job kind {config.kind!r}; expected one of {known}")
    importlib.import_module(JOB_KINDS[config.kind]).settings_of(config)


def run_job(config: JobConfig, output_dir: Path, progress: bool = True) -> JobResult:
    """Return the result of ``config``'s job in ``output_dir``, training it unless it finished."""
    check_job_config(config)
    done = finished_result(output_dir)
    if done is not None:
        return done
    output_dir.mkdir(parents=True, exist_ok=True)
    module = importlib.import_module(JOB_KINDS[config.kind])
    result: JobResult = module.run(config, output_dir, progress)
    write_result(output_dir, config, result)
    return result


__all__ = [
    "JOB_KINDS",
    "JobConfig",
    "JobConfigError",
    "JobResult",
    "check_job_config",
    "jobs_root",
    "run_job",
]
