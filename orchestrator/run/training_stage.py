"""The training stage of a sweep: its KD and head-training jobs, run on Ray before the trials.

Each job runs through Ray Train (``training.ray_job.train_with_ray``, launched from a
zero-CPU Ray task so several jobs run at once as the cluster's CPUs allow) on its ``workers``
ranks, writing into its own directory ``<jobs root>/<job id>``, so a retried or re-submitted job
resumes from its last checkpoint and a finished one is never trained twice. The store records
every job's status (``queued`` when submitted, ``running`` once its ranks have started,
then ``done`` or ``failed``), attempts, error, metrics and seconds, and its artifact's path. The
jobs root is ``$SPECSWEEP_JOBS_DIR`` or ``<SpecSweep cache>/jobs``; on a multi-node cluster it
must be a directory every node mounts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from tqdm import tqdm

from orchestrator.run.errors import describe_failure
from orchestrator.run.preflight import ModelPaths, PreparedInputs
from orchestrator.run.scheduler import Scheduler
from orchestrator.store import Store
from orchestrator.sweep.planner import TrainingJob
from orchestrator.sweep.spec import SweepSpec, job_base_reference, worker_pairs
from orchestrator.sweep.work_units import JOB_GROUP, WorkUnit, job_key
from training.jobs import JobConfig, JobResult, jobs_root
from training.ray_job import WORKER_PID_FILE, clear_started, started, train_with_ray

#: The store's status of a submitted job whose ranks Ray has not started yet (queued for
#: resources); it becomes "running" when rank 0 starts.
QUEUED = "pending"
#: Seconds between checks for queued jobs whose ranks have started.
POLL_SECONDS = 0.5

__all__ = [
    "POLL_SECONDS",
    "QUEUED",
    "WORKER_PID_FILE",
    "JobOutcome",
    "attach_job_drafts",
    "job_config",
    "run_training_jobs",
]


@dataclass(frozen=True)
class JobOutcome:
    """How one training job ended: its artifact's path, or the error that stopped it."""

    job: TrainingJob
    artifact_path: str | None
    error: str | None = None
    reused: bool = False


def job_config(job: TrainingJob, artifacts: dict[str, str] | None = None) -> JobConfig:
    """Return the training package's config of a planned job (what ``run_job`` takes).

    A ``job:NAME`` base becomes NAME's artifact directory, taken from ``artifacts``.
    """
    upstream = job_base_reference(job.base)
    return JobConfig(
        kind=job.kind,
        name=job.name,
        base=job.base if upstream is None else (artifacts or {})[upstream],
        teacher=job.teacher,
        dataset=job.dataset,
        split=job.split or "train",
        samples=job.samples,
        local_path=job.local_path,
        epochs=job.epochs,
        settings=job.config,
    )


def _run_job(config: JobConfig, output_dir: str) -> dict[str, Any]:
    """Run one job through Ray Train (from a Ray task); return its result as plain values."""
    return train_with_ray(config, Path(output_dir)).to_json()


def run_training_jobs(
    jobs: tuple[TrainingJob, ...],
    store: Store,
    retries: int,
    progress: bool = True,
    root: Path | None = None,
) -> dict[str, JobOutcome]:
    """Run every job not yet done (in parallel as resources allow); return outcomes by job name.

    A job the store has as done, whose artifact still exists, is reused. A failed attempt is
    recorded with its error and retried (resuming from its checkpoint) up to ``retries`` times.
    A job whose base is another job's draft (``job:NAME``) starts once NAME has its artifact,
    and fails without running if NAME failed. A job is recorded ``queued`` when submitted and
    ``running`` once its ranks have started (its rank 0 marks the start in its directory).
    Dispatch, retries and the progress bar are the scheduler's (``orchestrator.run.scheduler``).
    """
    done = store.completed_job_ids(job.job_id for job in jobs)
    stage = _TrainingStage(store, root or jobs_root(), {job.name: job for job in jobs})
    units = []
    for job in jobs:
        artifact = _recorded_artifact(store, job) if job.job_id in done else None
        if artifact is not None:
            stage.outcomes[job.name] = JobOutcome(job, artifact, reused=True)
            continue
        upstream = job_base_reference(job.base)
        after = () if upstream is None or upstream in stage.outcomes else (job_key(upstream),)
        units.append(WorkUnit(key=job_key(job.name), group=JOB_GROUP, job=job.name, after=after))
    if units:
        bar = tqdm(total=len(units), desc="training jobs", unit="job", disable=not progress)
        Scheduler(units, retries, bar).run([_JobWorker(stage) for _ in units])
    return stage.outcomes


@dataclass
class _TrainingStage:
    """The training jobs of one run: where they write, and how each one ended."""

    store: Store
    root: Path
    jobs: dict[str, TrainingJob]
    outcomes: dict[str, JobOutcome] = field(default_factory=dict)
    attempts: Counter[str] = field(default_factory=Counter)

    def run_job(self, job: TrainingJob) -> None:
        """Run one attempt of ``job`` as a Ray task; store its outcome, or raise its error."""
        upstream = job_base_reference(job.base)
        if upstream is not None and self.outcomes[upstream].artifact_path is None:
            self.fail(job, f"its base job {upstream!r} failed")
            return
        self.attempts[job.name] += 1
        attempts = self.attempts[job.name]
        output_dir = self.root / job.job_id
        clear_started(output_dir)
        self.store.record_training_job(job, QUEUED, attempts=attempts)
        task = ray.remote(num_cpus=0, max_retries=0)(_run_job)
        ref = task.remote(job_config(job, _artifacts(self.outcomes)), str(output_dir))
        marked = False
        while True:
            finished = bool(ray.wait([ref], timeout=POLL_SECONDS)[0])
            if not marked and started(output_dir):
                self.store.record_training_job(job, "running", attempts=attempts)
                marked = True
            if finished:
                break
        try:
            result = JobResult(**ray.get(ref))
        except Exception as exc:
            self.store.record_job_attempt_error(job, describe_failure(exc))
            raise
        self.store.record_training_job(job, "done", metrics=result.metrics, seconds=result.seconds)
        self.store.record_artifact(job.job_id, result.artifact_kind, result.artifact_path)
        self.outcomes[job.name] = JobOutcome(job, result.artifact_path)

    def fail(self, job: TrainingJob, error: str) -> None:
        """Record ``job`` as failed for good with ``error``."""
        self.store.record_training_job(job, "failed", error=error)
        self.outcomes[job.name] = JobOutcome(job, None, error=error)


@dataclass
class _JobWorker:
    """A scheduler worker that runs training jobs (each one a Ray task)."""

    stage: _TrainingStage
    group: str = JOB_GROUP

    def run(self, unit: WorkUnit) -> None:
        """Run one attempt of the unit's job."""
        self.stage.run_job(self.stage.jobs[str(unit.job)])

    def give_up(self, unit: WorkUnit, error: str) -> None:
        """Record the unit's job as failed."""
        self.stage.fail(self.stage.jobs[str(unit.job)], error)

    def close(self) -> None:
        """Nothing to release: a job's task ends with it."""


def _artifacts(outcomes: dict[str, JobOutcome]) -> dict[str, str]:
    """Return the artifact path of every job that has one, by job name."""
    return {
        name: outcome.artifact_path
        for name, outcome in outcomes.items()
        if outcome.artifact_path is not None
    }


def _recorded_artifact(store: Store, job: TrainingJob) -> str | None:
    """Return the newest recorded artifact path of ``job`` if it still exists on disk."""
    artifacts = store.artifacts(job.job_id)
    if artifacts and Path(artifacts[-1].path).exists():
        return str(artifacts[-1].path)
    return None


def attach_job_drafts(
    spec: SweepSpec, inputs: PreparedInputs, outcomes: dict[str, JobOutcome]
) -> dict[str, str]:
    """Point each pair whose draft a job trains at that job's artifact; return paths by job name.

    Pairs whose draft job failed keep no draft path (their trials are recorded as failed by the
    runner instead of running).
    """
    artifacts = _artifacts(outcomes)
    for pair in worker_pairs(spec.pairs):
        if pair.draft is None or pair.draft.job is None or pair.name not in inputs.model_paths:
            continue
        path = artifacts.get(pair.draft.job)
        target = inputs.model_paths[pair.name].target
        inputs.model_paths[pair.name] = ModelPaths(target, Path(path) if path else None)
    return artifacts
