"""Results stores for the dashboard tests: a real micro-zoo sweep, or synthetic trials.

``seed_real_sweep`` runs a small sweep on the micro zoo through ``execute_plan`` (real Ray actors,
real models, real timings); an older second sweep over a subset of the same trials gives the
comparison page two sweeps. ``seed_synthetic_sweeps`` records hand-made engine results
through the same store API in a second or so: the rounds follow an exact cost model
(:data:`SYNTHETIC_T_DRAFT`, :data:`SYNTHETIC_T_TARGET`) so tests can check values end to end,
and one pair drafts with a KD job's draft so the AdaSPEC table has rows.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from orchestrator.analysis.metrics import trial_metrics
from orchestrator.store import open_store
from orchestrator.sweep.planner import Trial, plan_sweep
from orchestrator.sweep.spec import parse_sweep
from workers.records import GenerationResult, RoundRecord

if TYPE_CHECKING:
    from orchestrator.run.runner import SweepSummary
    from orchestrator.store import Store
    from orchestrator.sweep.planner import Plan
    from orchestrator.sweep.spec import SweepSpec

REAL_SWEEP = """
name: dashboard-real
pairs:
  - name: micro
    target: {model: "zoo:micro/target"}
    draft: {model: "zoo:micro/draft-s"}
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 12}
temperatures: [0.0, 1.0]
policies:
  - name: static
  - name: adaedl
    grid: {threshold: [0.3, 0.6]}
  - name: svip
    grid: {threshold: [0.3, 0.5]}
  - name: oracle
max_draft_lens: [2, 4]
seeds: [0]
execution: {retries: 1, warmup_samples: 1, record_rounds: true}
"""
#: The same trials as a subset (greedy, static and adaedl): nothing new to run.
REAL_SUBSET_SWEEP = (
    REAL_SWEEP.replace("name: dashboard-real", "name: dashboard-real-greedy")
    .replace("temperatures: [0.0, 1.0]", "temperatures: [0.0]")
    .replace("  - name: svip\n    grid: {threshold: [0.3, 0.5]}\n", "")
)

SYNTHETIC_SWEEP = """
name: synthetic-a
pairs:
  - name: micro
    target: {model: "zoo:micro/target"}
    draft: {model: "zoo:micro/draft-s"}
  - name: micro-kd
    target: {model: "zoo:micro/target"}
    draft: {job: kd-adaspec}
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 12}
  - {name: "builtin:math", samples: 2, max_new_tokens: 12}
temperatures: [0.0, 1.0]
policies:
  - name: static
  - name: adaedl
    grid: {threshold: [0.3, 0.6]}
  - name: svip
    grid: {threshold: [0.3, 0.5]}
  - name: oracle
max_draft_lens: [2, 4]
seeds: [0]
training_jobs:
  - {name: kd-adaspec, kind: adaspec, base: "zoo:micro/draft-s", teacher: "zoo:micro/target",
     dataset: "builtin:code"}
"""
#: An older, smaller sweep with twice-as-fast synthetic timings (for the comparison page).
SYNTHETIC_SWEEP_B = """
name: synthetic-b
pairs:
  - name: micro
    target: {model: "zoo:micro/target"}
    draft: {model: "zoo:micro/draft-s"}
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 16}
temperatures: [0.0]
policies:
  - name: static
  - name: adaedl
    grid: {threshold: [0.3]}
max_draft_lens: [4]
seeds: [0]
"""
#: One pair with a draft model and an n-gram lookup (``drafts``), for the draft-kind views.
SYNTHETIC_DRAFTS_SWEEP = """
name: synthetic-drafts
pairs:
  - name: micro
    target: {model: "zoo:micro/target"}
    drafts: [{model: "zoo:micro/draft-s"}, {kind: ngram, n_max: 3}]
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 12}
temperatures: [0.0]
policies:
  - name: static
  - name: adaedl
    grid: {threshold: [0.3, 0.6]}
max_draft_lens: [2, 4]
seeds: [0]
"""
SYNTHETIC_T_DRAFT = 0.01
SYNTHETIC_T_TARGET = 0.05
SYNTHETIC_B_SCALE = 0.5
#: The synthetic trial recorded as failed (policy, threshold) in every pair/dataset/temperature.
SYNTHETIC_FAILED = ("svip", 0.5)


def seed_real_sweep(url: str, zoo_root: Path) -> int:
    """Run :data:`REAL_SWEEP` on the micro zoo at ``zoo_root`` into the store at ``url``.

    Returns the number of trials run now: 0 when the store already holds them all (so test
    modules can share one store), without starting Ray. Otherwise starts (and stops) a
    2-CPU local Ray unless one is running; Ray and the runner are imported here only, so the
    synthetic seeding stays quick to import. Raises AssertionError if a trial failed.
    """
    spec = parse_sweep(REAL_SWEEP, "dashboard-real.yaml")
    plan = plan_sweep(spec)
    subset = parse_sweep(REAL_SUBSET_SWEEP, "dashboard-real-greedy.yaml")
    with open_store(url) as store:
        store.register_sweep(subset, plan_sweep(subset))
        store.register_sweep(spec, plan)
        done = store.completed_trial_ids(trial.trial_id for trial in plan.trials)
        if len(done) == len(plan.trials):
            return 0
        summary = _run_on_ray(spec, plan, store, zoo_root)
    assert summary.failed == 0, summary.failures
    return summary.ran


def _run_on_ray(spec: SweepSpec, plan: Plan, store: Store, zoo_root: Path) -> SweepSummary:
    """Run ``plan`` with ``execute_plan`` on a local 2-CPU Ray, zoo refs resolved under zoo_root."""
    import ray

    from orchestrator.run.runner import RunOptions, execute_plan

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECSWEEP_CACHE", str(zoo_root.parent.parent))
        started = not ray.is_initialized()
        if started:
            ray.init(
                num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False
            )
        try:
            return execute_plan(spec, plan, store, RunOptions(progress=False))
        finally:
            if started:
                ray.shutdown()


def seed_synthetic_sweeps(url: str) -> dict[str, list[Trial]]:
    """Record :data:`SYNTHETIC_SWEEP_B` then :data:`SYNTHETIC_SWEEP` with synthetic results.

    Returns each sweep's planned trials by sweep name. Sweep B's timings are scaled by
    :data:`SYNTHETIC_B_SCALE`; in sweep A the trials of :data:`SYNTHETIC_FAILED` are failed.
    Each sweep records a run (provenance) and the runner's cost fits of its groups.
    """
    from orchestrator.run.group_fits import store_live_fits
    from orchestrator.run.provenance import collect_provenance

    planned = {}
    with open_store(url) as store:
        for text, scale in ((SYNTHETIC_SWEEP_B, SYNTHETIC_B_SCALE), (SYNTHETIC_SWEEP, 1.0)):
            spec = parse_sweep(text, "synthetic.yaml")
            plan = plan_sweep(spec)
            store.register_sweep(spec, plan)
            store.record_run(spec.name, collect_provenance())
            for trial in plan.trials:
                if (trial.setting.policy, trial.setting.threshold) == SYNTHETIC_FAILED:
                    store.record_failure(trial, "synthetic failure", attempts=1)
                    continue
                results = [synthetic_result(trial, sample, scale) for sample in range(2)]
                store.record_trial(trial, results, trial_metrics(results))
            store_live_fits(spec, plan, store, set())  # the fits a real run would store
            planned[spec.name] = plan.trials
    return planned


def seed_draft_kinds_sweep(url: str) -> list[Trial]:
    """Record :data:`SYNTHETIC_DRAFTS_SWEEP` with synthetic results (a lookup's rounds drafted
    as a model's, its draft forwards none); return its planned trials."""
    with open_store(url) as store:
        spec = parse_sweep(SYNTHETIC_DRAFTS_SWEEP, "synthetic-drafts.yaml")
        plan = plan_sweep(spec)
        store.register_sweep(spec, plan)
        for trial in plan.trials:
            results = [synthetic_result(trial, sample, 1.0) for sample in range(2)]
            if trial.served.draft_kind == "ngram":
                results = [_without_forwards(result) for result in results]
            store.record_trial(trial, results, trial_metrics(results))
    return list(plan.trials)


def _without_forwards(result: GenerationResult) -> GenerationResult:
    """Return ``result`` as a lookup ran it: no draft forward, no draft seconds."""
    rounds = [replace(r, draft_forwards=0, draft_seconds=0.0) for r in result.rounds]
    seconds = sum(r.verify_seconds for r in rounds)
    return replace(result, rounds=rounds, seconds=seconds)


def synthetic_rounds(trial: Trial, sample: int) -> list[tuple[int, int]]:
    """Return (drafted, accepted) per round of a synthetic sample, until max_new_tokens.

    The baseline emits one token per round; static drafts K, the oracle min(K, 2) all accepted,
    threshold policies K − ⌊10·threshold⌋ mod K (at least 1); accepted is about half.
    """
    rounds: list[tuple[int, int]] = []
    emitted = 0
    while emitted < trial.sampling.max_new_tokens:
        if trial.is_baseline:
            drafted = accepted = 0
        elif trial.setting.policy == "oracle":
            drafted = accepted = min(trial.setting.max_draft_len, 2)
        else:
            cut = (
                0
                if trial.setting.threshold is None
                else int(10 * trial.setting.threshold) % trial.setting.max_draft_len
            )
            drafted = max(1, trial.setting.max_draft_len - cut)
            accepted = (drafted + len(rounds) + sample + int(trial.sampling.temperature == 0)) // 2
            accepted = min(accepted, drafted)
        rounds.append((drafted, accepted))
        emitted += accepted + 1
    return rounds


def synthetic_result(trial: Trial, sample: int, scale: float) -> GenerationResult:
    """Return a GenerationResult whose rounds cost exactly scale·(t_draft·forwards + t_target)."""
    records = [
        RoundRecord(
            drafted=drafted,
            accepted=accepted,
            bonus=drafted > 0 and accepted == drafted,
            draft_forwards=drafted,
            draft_seconds=scale * SYNTHETIC_T_DRAFT * drafted,
            verify_seconds=scale * SYNTHETIC_T_TARGET,
        )
        for drafted, accepted in synthetic_rounds(trial, sample)
    ]
    generated = sum(record.accepted + 1 for record in records)
    return GenerationResult(
        prompt_ids=[1, 2, 3 + sample],
        output_ids=[7] * generated,
        rounds=records,
        seconds=sum(r.draft_seconds + r.verify_seconds for r in records),
    )


BATCH_SWEEP = """
name: synthetic-batches
pairs:
  - name: micro
    target: {model: "zoo:micro/target"}
    draft: {model: "zoo:micro/draft-s"}
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 12}
temperatures: [0.0]
policies:
  - name: static
max_draft_lens: [2, 4]
batch_sizes: [1, 4, 16]
"""
#: How much a synthetic verify slows per drafted token and extra row of the batch.
BATCH_VERIFY_GROWTH = 0.2


def seed_synthetic_batches(url: str) -> list[Trial]:
    """Record :data:`BATCH_SWEEP` with synthetic results whose speedup falls with the batch size:
    a round's verify costs t_target · (1 + growth · (B − 1) · drafted), and each sample's share
    of the batch's wall time is its seconds / B. Returns the planned trials."""
    spec = parse_sweep(BATCH_SWEEP, "batches.yaml")
    plan = plan_sweep(spec)
    with open_store(url) as store:
        store.register_sweep(spec, plan)
        for trial in plan.trials:
            results = [batched_result(trial, sample) for sample in range(2)]
            store.record_trial(trial, results, trial_metrics(results))
    return list(plan.trials)


def batched_result(trial: Trial, sample: int) -> GenerationResult:
    """Return a synthetic result of ``trial`` at its batch size (:func:`seed_synthetic_batches`)."""
    alone = synthetic_result(trial, sample, 1.0)
    growth = BATCH_VERIFY_GROWTH * (trial.batch_size - 1)
    rounds = [
        RoundRecord(
            r.drafted,
            r.accepted,
            r.bonus,
            r.draft_forwards,
            r.draft_seconds,
            r.verify_seconds * (1 + growth * r.drafted),
        )
        for r in alone.rounds
    ]
    seconds = sum(r.draft_seconds + r.verify_seconds for r in rounds)
    return GenerationResult(
        prompt_ids=alone.prompt_ids,
        output_ids=alone.output_ids,
        rounds=rounds,
        seconds=seconds,
        prefill_seconds=0.0,
        decode_seconds=seconds,
        batch_seconds=seconds / trial.batch_size if trial.batch_size > 1 else None,
    )
