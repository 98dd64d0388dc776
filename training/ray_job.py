"""Run one training job through Ray Train: ``workers`` ranks of ``run_job`` under a TorchTrainer.

``train_with_ray(config, output_dir)`` blocks until the job ends and returns its ``JobResult``.
Ray Train starts the job's ranks (one CPU each, or one GPU each when the cluster has GPUs),
sets up their torch process group (gloo on CPU, NCCL on GPU) and runs ``run_job`` on each;
``training.distributed`` then shards every batch over the ranks and lets rank 0 alone write
checkpoints, data, the artifact and the result. Ray Train keeps its own run state under
``<output_dir>/ray_train``.

Rank 0 writes ``started`` (when the ranks got their resources and began) and ``worker.pid``
(its process id, for an operator or a fault test) into ``output_dir``. A failed rank fails the
whole run (no Ray Train retries): the caller retries, and the job resumes from its checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from training.jobs.base import JobConfig, JobResult, finished_result

WORKER_PID_FILE = "worker.pid"
STARTED_FILE = "started"
RAY_TRAIN_DIR = "ray_train"


def started(output_dir: Path) -> bool:
    """Return True once the job's ranks have started in ``output_dir`` (see ``clear_started``)."""
    return (output_dir / STARTED_FILE).exists()


def clear_started(output_dir: Path) -> None:
    """Forget an earlier attempt's start, so ``started`` reports this attempt's."""
    (output_dir / STARTED_FILE).unlink(missing_ok=True)


def _train_loop(values: dict[str, Any]) -> None:
    """Ray Train's per-rank function: mark the start (rank 0), then run the job."""
    import torch

    from training.distributed import is_writer, parallel_settings
    from training.jobs import kind_config, run_job

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    config = JobConfig(**values["config"])
    directory = Path(values["output_dir"])
    if is_writer():
        directory.mkdir(parents=True, exist_ok=True)
        (directory / WORKER_PID_FILE).write_text(str(os.getpid()))
        (directory / STARTED_FILE).write_text(str(os.getpid()))
    with parallel_settings(kind_config(config)[1]):
        run_job(config, directory, progress=False)


def train_with_ray(config: JobConfig, output_dir: Path) -> JobResult:
    """Run ``config``'s job on Ray Train with its ``workers`` ranks; return its result.

    Needs a running Ray (``ray.init``); waits while the cluster lacks the ranks' resources.
    Raises the run's error (``ray.train.TrainingFailedError``) if a rank fails.
    """
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from training.jobs import kind_config
    from training.jobs.base import resolve_ref

    for ref in (config.base, config.teacher):
        if ref:
            # Zoo models are built here, in one ordinary process, before any rank starts: a
            # rank building them would save nothing (transformers writes no files on a
            # torch.distributed rank other than 0).
            resolve_ref(ref)
    parallel = kind_config(config)[1]
    output_dir.mkdir(parents=True, exist_ok=True)
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"config": config.to_json(), "output_dir": str(output_dir)},
        scaling_config=ScalingConfig(num_workers=parallel.workers, use_gpu=use_gpu),
        run_config=RunConfig(
            storage_path=str(output_dir),
            name=RAY_TRAIN_DIR,
            failure_config=FailureConfig(max_failures=0),
        ),
    )
    outcome = trainer.fit()
    if outcome.error is not None:
        raise outcome.error
    result = finished_result(output_dir)
    if result is None:
        raise RuntimeError(f"the Ray Train run of job {config.name!r} wrote no result")
    return result
