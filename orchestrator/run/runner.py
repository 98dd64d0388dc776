"""The Ray driver: preflight, training jobs, group shards over group replicas, results stored.

``execute_plan`` skips trials the store already has and groups each pair's remaining live trials
by their AR baseline (:func:`arm_groups`: the baseline and the trials measured against it). A
group's prompts are cut into shards (``execution.shard_prompts``; a group holding a policy that
keeps state across requests stays one shard), each carrying every arm of the group, leaving out
the arms' shards a previous run stored; on a replica the arms decode each prompt back to back in
a seeded, balanced order (``workers.trial.run_arms``). One scheduler
(``orchestrator.run.scheduler``) runs the shards over ``execution.replicas`` replicas of each
worker group (``orchestrator.run.replica``), ``execution.max_concurrent_pairs`` groups at a time,
retrying a failed shard on live actors. Pairs whose targets are identical share one worker
group (``orchestrator.sweep.target_sets``): their units carry the set's name as their group, and a
replica of it runs any of them, each on its pair's draft actor, with the target loaded once.
Replicas on one node share each model's one-token step choice (``orchestrator.run.step_choices``).
Each arm's shard is stored in one transaction as the group shard ends; when a trial's last shard
is stored, its metrics and intervals are computed from all its samples and the trial is marked
done, so a crash loses only the shards in flight. After the live shards, each trial group's
block-aware cost model is fit over its stored live rounds and stored (``cost_fits``). In
``mode: replay`` each pair's replayed trials follow once its live shards are settled, group by
group (``GroupReplica.replay_group``), on a replica of the pair's worker group.

Each arm's shard is leased to this driver in the store before it runs
(``orchestrator.run.driver_lease``), so two drivers of one sweep never run one shard: the arms
this driver leased run, and a group shard with an arm another live driver holds is put
back and looked at again each heartbeat until that driver stores it (counted in the summary as
run by that driver) or its lease lapses (the driver died: this one takes the shard over).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from threading import Lock

import ray
from tqdm import tqdm

from orchestrator.analysis.metrics import trial_metrics
from orchestrator.run.driver_lease import Heartbeat, LeaseTiming, lease_timing, this_driver
from orchestrator.run.errors import describe_failure
from orchestrator.run.group_fits import store_live_fits
from orchestrator.run.placement import alive_node_resources
from orchestrator.run.preflight import PreflightError, PreparedInputs, preflight_inputs
from orchestrator.run.provenance import collect_provenance, stored_provenance_notes
from orchestrator.run.replica import GroupReplica
from orchestrator.run.scheduler import Deferred, Scheduler
from orchestrator.run.step_choices import SingleStepChoices
from orchestrator.run.training_stage import JobOutcome, attach_job_drafts, run_training_jobs
from orchestrator.store import LeaseHolder, ShardClaim, ShardOutput, Store
from orchestrator.sweep.bundles import groups_held
from orchestrator.sweep.planner import LIVE_MODE, Plan, Trial, replay_groups
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.target_sets import SharedTarget, shared_targets, split_to_fit
from orchestrator.sweep.work_units import (
    ArmShard,
    WorkUnit,
    arm_groups,
    live_group_units,
    missing_arms,
    replay_unit,
    shard_key,
)

__all__ = [
    "PreflightError",
    "RunOptions",
    "ShardTally",
    "SweepSummary",
    "arm_groups",
    "execute_plan",
    "preflight",
]


@dataclass(frozen=True)
class RunOptions:
    """How to run a sweep: the Ray address, a retries override, the progress bar, the shard
    leases' timing (default: ``driver_lease.lease_timing()``, from the environment)."""

    address: str | None = None
    retries: int | None = None
    progress: bool = True
    lease: LeaseTiming = field(default_factory=lease_timing)


@dataclass
class ShardTally:
    """What a run did with its live shards, and what other drivers did with them meanwhile.

    ``left``: the shards it found to run; ``ran``: those it ran and stored; ``by_others``:
    those another driver stored while it ran (``others``: those drivers' ``host:pid``);
    ``taken_over``: those it ran after another driver stopped (its lease lapsed or was
    released; ``stopped``: those drivers).
    """

    left: int = 0
    ran: int = 0
    by_others: int = 0
    others: list[str] = field(default_factory=list)
    taken_over: int = 0
    stopped: list[str] = field(default_factory=list)


@dataclass
class SweepSummary:
    """What a run did: trials planned, already done before it, run now, failed.

    ``failures`` has a line per failed trial, ``job_failures`` one per failed training job;
    ``fit_notes`` a line per group's cost fit (stored, or why none), ``cross_checks`` a line
    per replay group's live check; ``traces_recorded``/``traces_reused`` count trace groups.
    ``finished_by_others`` counts trials another driver finished while this run went on;
    ``shards`` tallies the live shards (see :class:`ShardTally`).
    """

    sweep: str
    planned: int
    already_done: int
    ran: int = 0
    failed: int = 0
    jobs_trained: int = 0
    jobs_reused: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    job_failures: list[str] = field(default_factory=list)
    fit_notes: list[str] = field(default_factory=list)
    cross_checks: list[str] = field(default_factory=list)
    traces_recorded: int = 0
    traces_reused: int = 0
    provenance_notes: list[str] = field(default_factory=list)
    finished_by_others: int = 0
    shards: ShardTally = field(default_factory=ShardTally)


def preflight(spec: SweepSpec, plan: Plan) -> PreparedInputs:
    """Check models, tokenizers and datasets before any trial runs; return the loaded inputs.

    Raises :class:`PreflightError` listing every problem found.
    """
    return preflight_inputs(spec, plan)


def execute_plan(
    spec: SweepSpec,
    plan: Plan,
    store: Store,
    options: RunOptions,
    inputs: PreparedInputs | None = None,
) -> SweepSummary:
    """Run every trial of ``plan`` that ``store`` does not have yet; return the summary."""
    start = time.perf_counter()
    done = store.completed_trial_ids(trial.trial_id for trial in plan.trials)
    pending = [trial for trial in plan.trials if trial.trial_id not in done]
    summary = SweepSummary(sweep=plan.sweep, planned=len(plan.trials), already_done=len(done))
    provenance = collect_provenance()
    summary.provenance_notes = stored_provenance_notes(store, done, provenance)
    if not pending:
        return summary
    store.record_run(plan.sweep, provenance)
    inputs = inputs or preflight(spec, plan)
    _ensure_ray(options.address)
    retries = spec.execution.retries if options.retries is None else options.retries
    jobs = _train_jobs(plan, store, retries, options.progress, summary)
    artifacts = attach_job_drafts(spec, inputs, jobs)
    by_pair = _trials_by_pair(pending, jobs, store, summary)
    run = _SweepRun(spec, plan, store, inputs, artifacts, summary, options.lease)
    run.run_pairs(by_pair, retries, options.progress)
    summary.finished_by_others = run.finished_by_others()
    replayed = {group.fit_key for group in run.groups}
    summary.fit_notes += store_live_fits(spec, plan, store, replayed)
    summary.seconds = time.perf_counter() - start
    return summary


def _train_jobs(
    plan: Plan, store: Store, retries: int, progress: bool, summary: SweepSummary
) -> dict[str, JobOutcome]:
    """Run (or reuse) the plan's training jobs; count them and their failures in ``summary``."""
    jobs = run_training_jobs(plan.jobs, store, retries, progress)
    summary.jobs_reused = sum(outcome.reused for outcome in jobs.values())
    summary.jobs_trained = sum(not outcome.reused for outcome in jobs.values())
    for outcome in jobs.values():
        if outcome.error is not None:
            summary.job_failures.append(f"training job {outcome.job.name}: {outcome.error}")
    return jobs


def _trials_by_pair(
    pending: Sequence[Trial], jobs: dict[str, JobOutcome], store: Store, summary: SweepSummary
) -> dict[str, list[Trial]]:
    """Group ``pending`` by pair; store as failed (and count) the trials a failed job blocks."""
    by_pair: dict[str, list[Trial]] = {}
    for trial in pending:
        blocked = [name for name in trial.requires_jobs if jobs[name].artifact_path is None]
        if blocked:
            reason = f"training job {blocked[0]} failed: {jobs[blocked[0]].error}"
            store.record_failure(trial, reason, attempts=0)
            summary.ran += 1
            summary.failed += 1
            continue
        by_pair.setdefault(trial.pair, []).append(trial)
    return by_pair


class ArmsFailed(RuntimeError):
    """Arms of a group shard raised (each its own error, recorded); the others were stored."""


class _SweepRun:
    """The pending work of one run: its trials' shards and replays, and the summary they fill.

    Worker threads share the summary under a lock.
    """

    def __init__(
        self,
        spec: SweepSpec,
        plan: Plan,
        store: Store,
        inputs: PreparedInputs,
        artifacts: dict[str, str],
        summary: SweepSummary,
        lease: LeaseTiming,
    ) -> None:
        self.spec, self.plan, self.store, self.inputs = spec, plan, store, inputs
        self.artifacts, self.summary = artifacts, summary
        #: This driver in the shard leases, and their timing.
        self.holder: LeaseHolder = this_driver()
        self.lease = lease
        #: Keys of the shards this run stored, and of those it counted as another driver's
        #: (once each); trials it counted; drivers it waited on.
        self.stored_here: set[str] = set()
        self.stored_elsewhere: set[str] = set()
        self.counted_ids: set[str] = set()
        self.waited_on: set[str] = set()
        self.pairs = {pair.name: pair for pair in plan.pairs}
        self.trials = {trial.trial_id: trial for trial in plan.trials}
        self.groups = replay_groups(plan)
        self.pending_ids: set[str] = set()
        self.failed_ids: set[str] = set()
        #: The errors of the arms that raised in a group shard's last attempt, by unit key.
        self.arm_errors: dict[str, dict[str, str]] = {}
        #: The pair each replay unit replays, by unit key.
        self.replays: dict[str, str] = {}
        #: One-token step choices, one per model and node, shared by every replica.
        self.step_choices = SingleStepChoices()
        self.lock = Lock()

    def run_pairs(self, by_pair: dict[str, list[Trial]], retries: int, progress: bool) -> None:
        """Run every pair's pending shards and replays on replicas of its worker group."""
        self.pending_ids = {trial.trial_id for trials in by_pair.values() for trial in trials}
        paths = {name: paths.target for name, paths in self.inputs.model_paths.items()}
        sets = shared_targets([self.pairs[name] for name in by_pair], paths)
        sets = split_to_fit(sets, alive_node_resources())
        group_of = {pair: shared.name for shared in sets for pair in shared.pair_names}
        units = [
            unit
            for name, trials in by_pair.items()
            for unit in self._pair_units(name, group_of[name], trials)
        ]
        workers = [
            _ReplicaWorker(self, self._replica(shared))
            for shared in sets
            for _ in range(self._replica_count(shared, units, len(sets)))
        ]
        bar = tqdm(
            total=len(units),
            desc=f"sweep {self.plan.sweep}",
            unit="shard",
            disable=not progress,
            dynamic_ncols=True,
        )
        limit = self.spec.execution.max_concurrent_pairs
        self.summary.shards.left = sum(len(unit.arms) for unit in units)
        with Heartbeat(self.store, self.holder, self.lease):
            Scheduler(units, retries, bar, max_groups=limit).run(workers)

    def _pair_units(self, name: str, group: str, trials: list[Trial]) -> list[WorkUnit]:
        """Return the pair's missing live group shards, then its replay unit (after those
        shards), each run by a replica of worker group ``group``.

        The pair's live trials are grouped by their AR baseline (the baseline and the trials
        measured against it: ``work_units.live_group_units``, which the cost estimate plans
        with too); each group's shards carry all its arms. A trial whose every shard is stored
        already (a run stopped before it was finished) is finished here.
        """
        live = [trial for trial in trials if trial.mode == LIVE_MODE]
        stored = self.store.stored_prompts(trial.trial_id for trial in live)
        shard_prompts = self.spec.execution.shard_prompts
        units = missing_arms(live_group_units(live, group, shard_prompts), stored)
        running = {arm.trial_id for unit in units for arm in unit.arms}
        for trial in live:
            if trial.trial_id not in running:
                self.finish_if_complete(trial)
        if any(trial.mode != LIVE_MODE for trial in trials):
            replay = replay_unit(name, group, [unit.key for unit in units])
            units.append(replay)
            self.replays[replay.key] = name
        return units

    def _replica_count(self, shared: SharedTarget, units: Sequence[WorkUnit], groups: int) -> int:
        """Return how many replicas of ``shared``'s worker group to start (``execution.replicas``
        or the cluster's share), at most one per pending unit of the group."""
        wanted = self.spec.execution.replicas
        if wanted is None:
            held = groups_held(shared.pairs, alive_node_resources())
            wanted = held // min(self.spec.execution.max_concurrent_pairs, groups)
        mine = sum(unit.group == shared.name for unit in units)
        return max(1, min(wanted, mine))

    def _replica(self, shared: SharedTarget) -> GroupReplica:
        """Return a new (not yet started) replica of ``shared``'s worker group."""
        execution = self.spec.execution
        return GroupReplica(
            shared,
            self.inputs,
            execution.record_rounds,
            self.store,
            self.artifacts,
            warmup_seconds=execution.warmup_seconds,
            step_choices=self.step_choices,
            stall_seconds=execution.stall_timeout_seconds,
        )

    def run_shard(self, replica: GroupReplica, unit: WorkUnit) -> None:
        """Lease each arm's shard of a group shard, run the arms leased on ``replica``
        interleaved and store each; finish a trial once all its shards are stored. An arm
        another live driver holds is deferred (see the module doc), after the others ran."""
        mine: list[tuple[Trial, ArmShard]] = []
        held: ShardClaim | None = None
        with self.lock:
            self.arm_errors.pop(unit.key, None)
        for arm in unit.arms:
            trial = self.trials[arm.trial_id]
            if trial.trial_id in self.failed_ids:
                continue
            claim = self.store.claim_shard(
                trial, unit.shard, arm.samples, self.holder, self.lease.lease_s
            )
            if claim.outcome == "acquired":
                mine.append((trial, arm))
                if claim.driver is not None:
                    self._tally(claim.driver, taken_over=True)
            elif claim.outcome == "held":
                held = claim
            else:
                self._stored_elsewhere(trial, unit.shard, claim)
        if mine:
            self._run_arms(replica, unit, mine)
        if held is not None:
            self._note_wait(held)
            raise Deferred(self.lease.heartbeat_s)

    def _run_arms(
        self, replica: GroupReplica, unit: WorkUnit, arms: list[tuple[Trial, ArmShard]]
    ) -> None:
        """Run the leased ``arms`` of a group shard on ``replica``, store each arm's shard and
        finish the trials whose last shard it was; raise :class:`ArmsFailed` after storing the
        others when an arm raised (the retry reruns only the arms not stored)."""
        try:
            done = replica.run_arms(unit, arms)
        except Exception as exc:
            for trial, _ in arms:
                self.store.record_attempt_error(trial, describe_failure(exc))
            raise
        failed: dict[str, str] = {}
        for (trial, _), output in zip(arms, done.outputs, strict=True):
            if output is None:
                failed[trial.trial_id] = describe_failure(done.errors[trial.trial_id])
                self.store.record_attempt_error(trial, failed[trial.trial_id])
                continue
            self._store_arm(trial, unit.shard, output)
        if failed:
            with self.lock:
                self.arm_errors[unit.key] = failed
            raise ArmsFailed("; ".join(f"{key}: {error}" for key, error in failed.items()))

    def _store_arm(self, trial: Trial, shard: int, output: ShardOutput) -> None:
        """Store one arm's shard, count it, and finish its trial once all its shards are."""
        stored = self.store.record_shard(
            trial, output, self.spec.execution.record_rounds, holder=self.holder
        )
        if stored:
            with self.lock:
                self.stored_here.add(shard_key(trial.trial_id, shard))
                self.summary.shards.ran += 1
        else:
            self._count_elsewhere(trial, shard, None)
        self.finish_if_complete(trial)

    def _stored_elsewhere(self, trial: Trial, shard: int, claim: ShardClaim) -> None:
        """Settle an arm's shard found stored (by another driver unless this run stored it):
        count it and finish its trial."""
        self._count_elsewhere(trial, shard, claim.driver)
        self.finish_if_complete(trial)

    def _count_elsewhere(self, trial: Trial, shard: int, driver: str | None) -> None:
        """Count an arm's shard another driver stored, once: a group shard deferred and tried
        again finds the same stored shards again."""
        key = shard_key(trial.trial_id, shard)
        with self.lock:
            if key in self.stored_here or key in self.stored_elsewhere:
                return
            self.stored_elsewhere.add(key)
        self._tally(driver, taken_over=False)

    def _tally(self, driver: str | None, taken_over: bool) -> None:
        """Count a shard another driver ran (or, ``taken_over``, left to this run)."""
        shards = self.summary.shards
        with self.lock:
            if taken_over:
                shards.taken_over += 1
            else:
                shards.by_others += 1
            names = shards.stopped if taken_over else shards.others
            if driver is not None and driver not in names:
                names.append(driver)

    def _note_wait(self, claim: ShardClaim) -> None:
        """Say once per other driver that this run waits for the shards it holds."""
        with self.lock:
            first = str(claim.driver) not in self.waited_on
            self.waited_on.add(str(claim.driver))
        if first:
            tqdm.write(
                f"another driver ({claim.driver}) is running shards of sweep {self.plan.sweep}: "
                f"this run waits for them, and takes over any whose lease lapses (that driver "
                f"stopped: no heartbeat for {self.lease.lease_s:g} s)",
                file=sys.stderr,
            )

    def finished_by_others(self) -> int:
        """Return how many of the run's pending trials are done now though it did not count them
        (another driver finished them meanwhile)."""
        done = self.store.completed_trial_ids(self.pending_ids)
        return len(done - self.counted_ids)

    def finish_if_complete(self, trial: Trial) -> None:
        """Mark ``trial`` done, with metrics from all its samples, once every shard is stored."""
        found = self.store.shard_results(trial.trial_id)
        if len(found) < trial.prompts.samples * trial.repeats:
            return
        blocks = [index % trial.prompts.samples for index, _ in found]
        metrics = trial_metrics([result for _, result in found], blocks)
        if self.store.finish_trial(trial, metrics):
            self.count(trial, None)

    def fail_shard(self, unit: WorkUnit, error: str) -> None:
        """Record a group shard given up after its retries: each arm's shard not stored, and its
        trial failed (counted once), with the arm's own last error when it raised one."""
        stored = self.store.stored_prompts(arm.trial_id for arm in unit.arms)
        own = self.arm_errors.get(unit.key, {})
        for arm in unit.arms:
            if set(arm.samples) <= stored.get(arm.trial_id, set()):
                continue
            trial = self.trials[arm.trial_id]
            if self.store.record_shard_failure(trial, unit.shard, own.get(arm.trial_id, error)):
                with self.lock:
                    first = trial.trial_id not in self.failed_ids
                    self.failed_ids.add(trial.trial_id)
                if first:
                    self.count(trial, own.get(arm.trial_id, error))

    def replay_pair(self, replica: GroupReplica, unit: WorkUnit) -> None:
        """Replay the pending trials of the replay unit's pair's replay groups on ``replica``;
        note fits and checks."""
        pair = self.replays[unit.key]
        for group in self.groups:
            todo = [t for t in group.replayed if t.trial_id in self.pending_ids]
            if group.trials[0].pair == pair and todo:
                notes = replica.replay_group(self.plan.sweep, group, todo, self.count)
                with self.lock:
                    self.summary.fit_notes.append(notes.fit)
                    self.summary.cross_checks += notes.checks
                    self.summary.traces_recorded += notes.recorded
                    self.summary.traces_reused += not notes.recorded

    def count(self, trial: Trial, error: str | None) -> None:
        """Count a finished trial in the summary (failed when ``error`` is set)."""
        with self.lock:
            self.counted_ids.add(trial.trial_id)
            self.summary.ran += 1
            if error is not None:
                self.summary.failed += 1
                self.summary.failures.append(f"{trial.trial_id} ({trial.setting.policy}): {error}")


@dataclass
class _ReplicaWorker:
    """A scheduler worker: one replica of a worker group running the units of its pairs."""

    sweep: _SweepRun
    replica: GroupReplica
    group: str = field(init=False)

    def __post_init__(self) -> None:
        self.group = self.replica.name

    def run(self, unit: WorkUnit) -> None:
        """Run a group shard, or (a pair's replay unit) that pair's replay groups."""
        if unit.arms:
            self.sweep.run_shard(self.replica, unit)
        else:
            self.sweep.replay_pair(self.replica, unit)

    def give_up(self, unit: WorkUnit, error: str) -> None:
        """Record the unit's shards (and so their trials) failed."""
        if unit.arms:
            self.sweep.fail_shard(unit, error)

    def close(self) -> None:
        """Kill the replica's actors and free its placement group."""
        self.replica.close()


def _ensure_ray(address: str | None) -> None:
    """Connect to Ray: ``address``, else ``RAY_ADDRESS``, else a local instance."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
