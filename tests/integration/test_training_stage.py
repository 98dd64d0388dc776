"""A sweep's training jobs on real Ray (Ray Train) and SQLite: run before the trials, recorded,
reused, and resumed from their checkpoint after the rank-0 process training them is SIGKILLed
mid-epoch."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from orchestrator.run.runner import RunOptions, execute_plan, preflight
from orchestrator.run.training_stage import WORKER_PID_FILE, run_training_jobs
from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep
from training.jobs.base import CHECKPOINT_DIR, RESULT_FILE, finished_result

SWEEP = """
name: kd-stage
pairs:
  - name: distilled
    target: {model: "zoo:micro/target"}
    draft: {job: kd}
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 12}
temperatures: [0.0]
policies:
  - name: static
  - name: specdecpp
    job: head
max_draft_lens: [4]
seeds: [0]
execution: {retries: 1, warmup_samples: 0}
training_jobs:
  - name: kd
    kind: distillspec
    base: "zoo:micro/draft-xs"
    teacher: "zoo:micro/target"
    dataset: {name: "builtin:code", samples: KD_SAMPLES}
    epochs: 1
    config: {lr: 1.0e-3, batch_size: 4, block_len: 32, prompt_tokens: 16}
  - name: head
    kind: specdecpp_head
    base: "job:kd"
    teacher: "zoo:micro/target"
    dataset: {name: "builtin:code", samples: 16}
    epochs: 1
    config: {lr: 1.0e-3}
"""


def _sweep(samples: int) -> tuple:
    spec = parse_sweep(SWEEP.replace("KD_SAMPLES", str(samples)), "kd-stage.yaml")
    return spec, plan_sweep(spec)


@pytest.mark.slow
def test_jobs_run_before_trials_are_recorded_and_reused(job_env, ray_local, tmp_path):
    spec, plan = _sweep(samples=32)
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    inputs = preflight(spec, plan)
    assert inputs.model_paths["distilled"].draft is None  # known only once the job has run
    summary = execute_plan(spec, plan, store, RunOptions(progress=False), inputs)
    assert (summary.jobs_trained, summary.jobs_reused, summary.failed) == (2, 0, 0), summary
    assert summary.ran == len(plan.trials)
    by_name = {job.name: job for job in plan.jobs}
    for name, kind in (("kd", "draft"), ("head", "specdecpp_head")):
        artifacts = store.artifacts(by_name[name].job_id)
        assert [a.kind for a in artifacts] == [kind]
        assert Path(artifacts[0].path).is_relative_to(job_env / by_name[name].job_id)
        assert Path(artifacts[0].path).exists()
    kd_artifact = Path(store.artifacts(by_name["kd"].job_id)[0].path)
    assert inputs.model_paths["distilled"].draft == kd_artifact
    # The head was trained on the KD draft it is used with (base job:kd), after the KD job.
    head = finished_result(job_env / by_name["head"].job_id)
    head_config = json.loads((job_env / by_name["head"].job_id / RESULT_FILE).read_text())
    assert head is not None and head_config["config"]["base"] == str(kd_artifact)
    rows = store.trials("kd-stage")
    assert {row.status for row in rows} == {"done"}
    outputs = {row.policy: store.sample_outputs(row.trial_id) for row in rows}
    # Greedy decoding is lossless: the distilled draft and the trained head change speed only.
    assert [s.output_ids for s in outputs["static"]] == [s.output_ids for s in outputs["ar"]]
    assert [s.output_ids for s in outputs["specdecpp"]] == [s.output_ids for s in outputs["ar"]]

    again = run_training_jobs(plan.jobs, store, retries=0, progress=False)
    assert all(outcome.reused for outcome in again.values())
    assert {name: o.artifact_path for name, o in again.items()} == {
        name: store.artifacts(job.job_id)[0].path for name, job in by_name.items()
    }


def _kill_after_first_checkpoint(job_dir: Path, killed: list[int], ended: threading.Event) -> None:
    """SIGKILL the process training the job in ``job_dir`` once it has written a checkpoint;
    give up once ``ended`` is set (the run returned). No fixed deadline: on a loaded machine
    the job's first checkpoint came more than two minutes after the run began."""
    pid_file = job_dir / WORKER_PID_FILE
    while not ended.is_set():
        if pid_file.exists() and any((job_dir / CHECKPOINT_DIR).rglob("step-*.pt")):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.01)


#: Documents of the killed job: packed into 423 blocks, 106 steps of 4, the first checkpoint at
#: step 10 (``checkpoint_every``), so the kill lands with 96 steps still to run.
KILLED_JOB_SAMPLES = 48


@pytest.mark.slow
def test_job_killed_mid_epoch_resumes_from_its_checkpoint(job_env, ray_local, tmp_path):
    spec, plan = _sweep(samples=KILLED_JOB_SAMPLES)
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    kd = next(job for job in plan.jobs if job.name == "kd")
    killed: list[int] = []
    ended = threading.Event()
    killer = threading.Thread(
        target=_kill_after_first_checkpoint, args=(job_env / kd.job_id, killed, ended)
    )
    killer.start()
    try:
        summary = execute_plan(spec, plan, store, RunOptions(progress=False))
    finally:
        ended.set()
        killer.join()
    assert len(killed) == 1, "the job finished before a checkpoint could be caught"
    result = finished_result(job_env / kd.job_id)
    assert result is not None and result.resumed_from_step > 0
    assert (summary.failed, summary.ran) == (0, len(plan.trials))
    assert {row.status for row in store.trials("kd-stage")} == {"done"}
    jobs = {row.name: row for row in store.training_jobs()}
    assert jobs["kd"].status == "done" and jobs["kd"].attempts == 2
    assert jobs["kd"].error is None
    assert any("died" in e or "crash" in e.lower() for e in jobs["kd"].attempt_errors)
