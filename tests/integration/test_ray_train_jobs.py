"""Training jobs through Ray Train on real Ray and SQLite: ranks shard each batch (DDP over gloo,
DeepSpeed ZeRO-2 on the CPU accelerator) and give the one-worker weights; a job waiting for CPUs
is recorded queued, then running, then done."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from orchestrator.run.training_stage import QUEUED, WORKER_PID_FILE, job_config, run_training_jobs
from orchestrator.store import Store, open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep
from training.distributed import ParallelSettings, shard_rows, split_parallel
from training.jobs import JobConfig, JobConfigError, check_job_config, run_job
from training.jobs.base import CHECKPOINT_DIR

torch.set_num_threads(1)

JOB = """
  - name: NAME
    kind: distillspec
    base: "zoo:micro/draft-xs"
    teacher: "zoo:micro/target"
    dataset: {name: "builtin:code", samples: 24}
    config: {lr: 3.0e-3, batch_size: 3, block_len: 32, prompt_tokens: 16, max_steps: 6,
             eval_blocks: 8, device: cpu, EXTRA}
"""
SWEEP = """
name: ray-train
pairs:
  - name: distilled
    target: {model: "zoo:micro/target"}
    draft: {job: ddp}
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 8}
temperatures: [0.0]
policies: [{name: static}]
max_draft_lens: [4]
seeds: [0]
training_jobs:
"""
#: Two jobs alike but for how their 2 ranks step: 2 + 2 CPUs asked of a 2-CPU Ray, so one waits.
JOBS = {
    "ddp": "workers: 2, parallel: ddp",
    "zero": "workers: 2, parallel: zero, zero_stage: 2",
}


class StatusWatcher(threading.Thread):
    """Polls the store's training_jobs rows (as ``query`` would) and keeps each job's statuses
    in the order seen, with the time each was first seen."""

    def __init__(self, store: Store) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.seen: dict[str, list[tuple[str, float]]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while True:
            stopping = self.stopping.is_set()
            for row in self.store.training_jobs():
                history = self.seen.setdefault(row.name, [])
                if not history or history[-1][0] != row.status:
                    history.append((row.status, time.monotonic()))
            if stopping:
                return
            time.sleep(0.05)

    def statuses(self, name: str) -> list[str]:
        return [status for status, _ in self.seen[name]]

    def first(self, name: str, status: str) -> float:
        return next(at for seen, at in self.seen[name] if seen == status)


def artifact_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(path) / "model.safetensors"))


@pytest.mark.slow
def test_ranks_shard_batches_to_the_one_worker_weights_and_wait_queued(
    micro_zoo, job_env, ray_local, tmp_path
):
    text = SWEEP + "".join(
        JOB.replace("NAME", name).replace("EXTRA", extra) for name, extra in JOBS.items()
    )
    spec = parse_sweep(text, "ray-train.yaml")
    plan = plan_sweep(spec)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    store = open_store(url)
    store.register_sweep(spec, plan)
    watcher = StatusWatcher(open_store(url))
    watcher.start()
    started = time.perf_counter()
    outcomes = run_training_jobs(plan.jobs, store, retries=0, progress=False)
    seconds = time.perf_counter() - started
    watcher.stopping.set()
    watcher.join()
    assert {name: outcome.error for name, outcome in outcomes.items()} == dict.fromkeys(JOBS)

    expected = list(dict.fromkeys(["pending", QUEUED, "running", "done"]))
    for name in JOBS:
        assert watcher.statuses(name) == expected, (name, watcher.seen[name])
    # 4 CPUs asked of 2: one job stayed queued until the other had finished.
    assert any(
        watcher.first(a, "running") > watcher.first(b, "done") for a in JOBS for b in JOBS
    ), watcher.seen

    rows = {row.name: row for row in store.training_jobs()}
    weights = {}
    for name in JOBS:
        row, path = rows[name], outcomes[name].artifact_path
        assert row.status == "done" and row.attempts == 1 and row.error is None
        metrics = row.metrics
        assert metrics["steps"] == 6 and metrics["tokens_seen"] == 6 * 3 * 32
        assert metrics["heldout_kl"] < metrics["initial_heldout_kl"]
        assert store.artifacts(row.job_id)[0].path == path
        AutoModelForCausalLM.from_pretrained(path)
        weights[name] = artifact_tensors(path)
        job_dir = job_env / row.job_id
        assert int((job_dir / WORKER_PID_FILE).read_text()) > 0
        checkpoint = torch.load(
            next((job_dir / CHECKPOINT_DIR / "draft").glob("step-*.pt")), weights_only=True
        )
        # ZeRO's optimiser state is partitioned: the checkpoint holds each rank's part.
        partitions = checkpoint["optimizer"]
        assert isinstance(partitions, list) == (name == "zero")
        if name == "zero":
            assert len(partitions) == 2
    # The same job in this one process (as ``python -m training`` or a 1-worker Ray Train run
    # executes it): same seeded batches, so the 2-rank weights are its weights up to float
    # rounding (the ranks' sums are taken in another order).
    job = next(job for job in plan.jobs if job.name == "ddp")
    alone = run_job(job_config(job), tmp_path / "alone", progress=False)
    reference = artifact_tensors(alone.artifact_path)
    base = artifact_tensors(micro_zoo.model_path("draft-xs"))
    assert any(not torch.allclose(base[key], reference[key]) for key in base)
    for name in JOBS:
        for key, value in reference.items():
            torch.testing.assert_close(weights[name][key], value, rtol=1e-4, atol=1e-5)
    gap = max((reference[key] - weights["ddp"][key]).abs().max().item() for key in reference)
    t0 = min(at for history in watcher.seen.values() for _, at in history)
    timeline = {n: [(s, round(at - t0, 1)) for s, at in h] for n, h in watcher.seen.items()}
    print(f"{len(JOBS)} Ray Train jobs in {seconds:.1f} s ({timeline}); weight gap {gap:.2e}")


def test_shards_cover_the_batch_and_weight_the_mean():
    indices = torch.tensor([7, 3, 5])
    shards = [shard_rows(indices, rank, 2) for rank in range(2)]
    assert [s.rows.tolist() for s in shards] == [[7, 3], [5]]
    assert [s.share for s in shards] == [2 / 3, 1 / 3]
    assert sum(s.weight for s in shards) / 2 == pytest.approx(1.0)
    # A short last batch leaves a rank without rows: it runs one row at weight 0.
    empty = shard_rows(torch.tensor([4]), 1, 2)
    assert (empty.rows.tolist(), empty.weight, empty.share) == ([4], 0.0, 0.0)


def _config(settings: dict[str, Any]) -> JobConfig:
    return JobConfig(
        kind="distillspec", name="x", base="b", teacher="t", dataset="d", settings=settings
    )


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"workers": 0}, "workers"),
        ({"workers": "2"}, "workers"),
        ({"parallel": "fsdp"}, "parallel"),
        ({"zero_stage": 3}, "zero_stage"),
    ],
)
def test_bad_parallel_settings_name_the_key(settings, key):
    with pytest.raises(JobConfigError, match=key):
        check_job_config(_config(settings))


def test_parallel_settings_split_from_the_kinds_own():
    own, parallel = split_parallel({"lr": 1e-3, "workers": 2, "parallel": "ddp"})
    assert own == {"lr": 1e-3}
    assert parallel == ParallelSettings(workers=2, parallel="ddp")
    assert not parallel.uses_zero()
    check_job_config(_config({"lr": 1e-3, "workers": 2, "zero_stage": 1}))
