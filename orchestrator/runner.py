"""The Ray driver: preflight, worker groups per pair, dispatch with retries, results to the store.

``run_sweep`` skips trials the store already has, runs the rest pair by pair (each pair's
models load once; several pairs at once when ``execution.max_concurrent_pairs`` allows), retries
a failed trial on fresh actors, and writes each trial in one transaction as it ends, so a crash
loses only the trials in flight. After a pair's live trials, each trial group's block-aware
cost model is fit over its stored live rounds and stored (``cost_fits``). In ``mode: replay``
the pair's replayed trials then follow group by group (``orchestrator.replay_stage``): traces
recorded once per group by the draft actor (or read back from the store), the fit, the
cross-check of the live check trial, and each replayed trial stored like a live one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from threading import Event, Lock
from typing import Any

import ray
from tqdm import tqdm

from orchestrator.cost_model import CostModelError
from orchestrator.errors import describe_failure
from orchestrator.metrics import trial_metrics
from orchestrator.placement import (
    actor_options_for_rank,
    create_worker_group,
    draft_actor_options,
    remove_worker_group,
)
from orchestrator.planner import (
    LIVE_MODE,
    Plan,
    ReplayGroup,
    Trial,
    fit_group_key,
    replay_groups,
)
from orchestrator.preflight import PreflightError, PreparedInputs, preflight_inputs
from orchestrator.provenance import collect_provenance, stored_provenance_notes
from orchestrator.replay_stage import (
    CrossCheck,
    GroupFit,
    cross_check,
    fit_group,
    replay_rounds,
    replayed_results,
    trace_from_json,
    trace_to_json,
)
from orchestrator.run_fit import TrialCounts, compare_fits
from orchestrator.spec import PairSpec, SweepSpec
from orchestrator.store import Store
from orchestrator.training_stage import JobOutcome, attach_job_drafts, run_training_jobs
from policies.replay import GreedyTrace
from workers.actors import DraftWorker, TargetWorker
from workers.model_spec import ModelSpec, RankSpec
from workers.prompt_format import response_text
from workers.records import BASELINE_POLICY, SamplingConfig
from workers.trial import TrialRequest

#: Tokens decoded (and draft length used) to warm a new worker group up before its trials.
WARMUP_TOKENS = 8
WARMUP_DRAFT_LEN = 2

__all__ = ["PreflightError", "RunOptions", "SweepSummary", "preflight", "run_sweep"]


@dataclass(frozen=True)
class RunOptions:
    """How to run a sweep: the Ray address, a retries override, the progress bar."""

    address: str | None = None
    retries: int | None = None
    progress: bool = True


@dataclass
class SweepSummary:
    """What a run did: trials planned, already done before it, run now, failed.

    ``failures`` has a line per failed trial, ``job_failures`` one per failed training job;
    ``fit_notes`` a line per group's cost fit (stored, or why none), ``cross_checks`` a line
    per replay group's live check; ``traces_recorded``/``traces_reused`` count trace groups.
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


def preflight(spec: SweepSpec, plan: Plan) -> PreparedInputs:
    """Check models, tokenizers and datasets before any trial runs; return the loaded inputs.

    Raises :class:`PreflightError` listing every problem found.
    """
    return preflight_inputs(spec, plan)


def run_sweep(
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
    progress = tqdm(
        total=len(pending),
        desc=f"sweep {plan.sweep}",
        unit="trial",
        disable=not options.progress,
        dynamic_ncols=True,
    )
    run = _SweepRun(spec, plan, store, inputs, artifacts, retries, summary, progress)
    run.run_pairs(by_pair)
    replayed = {group.fit_key for group in run.groups}
    summary.fit_notes += _store_live_fits(spec, plan, store, replayed)
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


class _SweepRun:
    """The pending trials of one run, spread over one thread per pair's worker group.

    Threads share the summary and the progress bar under a lock; ``stop`` tells them to start
    no new trial (Ctrl-C or an error in another thread).
    """

    def __init__(
        self,
        spec: SweepSpec,
        plan: Plan,
        store: Store,
        inputs: PreparedInputs,
        artifacts: dict[str, str],
        retries: int,
        summary: SweepSummary,
        progress: tqdm,
    ) -> None:
        self.spec, self.plan, self.store, self.inputs = spec, plan, store, inputs
        self.artifacts, self.retries = artifacts, retries
        self.summary, self.progress = summary, progress
        self.pairs = {pair.name: pair for pair in spec.pairs}
        self.groups = replay_groups(plan)
        self.lock = Lock()
        self.stop = Event()

    def run_pairs(self, by_pair: dict[str, list[Trial]]) -> None:
        """Run each pair's trials in its own thread, ``max_concurrent_pairs`` at a time."""
        workers = max(1, min(self.spec.execution.max_concurrent_pairs, len(by_pair)))
        pool = ThreadPoolExecutor(max_workers=workers)
        try:
            for future in [pool.submit(self.run_pair, name, by_pair[name]) for name in by_pair]:
                future.result()
        except BaseException:
            # Ctrl-C (or any error): start no new trial; the ones in flight finish and are stored.
            self.stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            self.progress.close()
            raise
        pool.shutdown()
        self.progress.close()

    def run_pair(self, pair_name: str, trials: list[Trial]) -> None:
        """Run one pair's live trials, then replay its replay groups; free its workers."""
        runner = _PairRunner(
            self.pairs[pair_name],
            self.inputs,
            self.spec.execution.record_rounds,
            self.store,
            self.artifacts,
        )
        try:
            for trial in trials:
                if self.stop.is_set():
                    return
                if trial.mode == LIVE_MODE:
                    self.finish(trial, runner.run_with_retries(trial, self.retries))
            self._replay_pair(runner, pair_name, {trial.trial_id for trial in trials})
        finally:
            runner.close()

    def _replay_pair(self, runner: _PairRunner, pair_name: str, pending_ids: set[str]) -> None:
        """Replay the pending trials of the pair's replay groups; note fits and cross-checks."""
        for group in self.groups:
            if self.stop.is_set():
                return
            todo = [t for t in group.replayed if t.trial_id in pending_ids]
            if group.trials[0].pair == pair_name and todo:
                notes = runner.replay_group(self.plan.sweep, group, todo, self.finish)
                with self.lock:
                    self.summary.fit_notes.append(notes.fit)
                    self.summary.cross_checks += notes.checks
                    self.summary.traces_recorded += notes.recorded
                    self.summary.traces_reused += not notes.recorded

    def finish(self, trial: Trial, error: str | None) -> None:
        """Count a finished trial (failed when ``error`` is set) and advance the progress bar."""
        with self.lock:
            self.summary.ran += 1
            if error is not None:
                self.summary.failed += 1
                self.summary.failures.append(f"{trial.trial_id} ({trial.policy}): {error}")
            self.progress.set_postfix_str(f"{trial.policy} {trial.dataset}")
            self.progress.update()


def _store_live_fits(spec: SweepSpec, plan: Plan, store: Store, skip: set[str]) -> list[str]:
    """Fit and store the cost model of every group not in ``skip``; return a note per group."""
    if not spec.execution.record_rounds:
        return ["no cost fit: the sweep ran with record_rounds: false, so no rounds are stored"]
    grouped: dict[str, list[Trial]] = {}
    for trial in plan.trials:
        if trial.mode == LIVE_MODE:
            grouped.setdefault(fit_group_key(trial), []).append(trial)
    notes = []
    for key, trials in grouped.items():
        if key in skip:
            continue
        try:
            fit = _fit_from_store(store, trials)
        except CostModelError as error:
            notes.append(f"no cost fit for {_group_label(trials[0])}: {error}")
            continue
        values = _fit_values(plan.sweep, key, trials[0], fit)
        run_fit = _run_fit_columns(store, trials, fit)
        store.record_cost_fit({**values, **run_fit})
        notes.append(_fit_note(trials[0], fit) + _run_fit_note(run_fit))
    return notes


def _fit_from_store(store: Store, trials: Sequence[Trial]) -> GroupFit:
    """Return the cost fit over the stored rounds of the done live ``trials``."""
    rows = [
        row
        for row in store.trial_rows(t.trial_id for t in trials if t.mode == LIVE_MODE)
        if row["status"] == "done"
    ]
    return fit_group(store.rounds(row["trial_id"] for row in rows), rows)


def _run_fit_columns(store: Store, trials: Sequence[Trial], group: GroupFit) -> dict[str, Any]:
    """Return the run-level fit's ``cost_fits`` columns ({} when it cannot be fit)."""
    rows = store.trial_rows(t.trial_id for t in trials if t.mode == LIVE_MODE)
    counts = [TrialCounts.from_row(row) for row in rows if row["status"] == "done"]
    try:
        return compare_fits(group.fit, group.overhead_seconds, counts).columns()
    except CostModelError:
        return {}


def _group_label(trial: Trial) -> str:
    """Return a short name of a trial's group for messages."""
    return (
        f"{trial.pair} {trial.dataset} (temperature {trial.temperature:g}, "
        f"{trial.max_new_tokens} new tokens)"
    )


def _run_fit_note(columns: dict[str, Any]) -> str:
    """Return the run-level fit's part of a group's fit line ("" when there is none)."""
    if not columns:
        return "; no run-level fit (the trials cannot separate the two costs)"
    return (
        f"; on trial seconds: round fit R² {columns['round_trial_r2']:.3f}, error "
        f"{columns['round_trial_mre']:.1%}, run-level fit R² {columns['run_r2']:.3f}, error "
        f"{columns['run_mre']:.1%}: projecting with the {columns['projection_fit']} fit"
    )


def _fit_note(trial: Trial, group: GroupFit) -> str:
    """Return the one-line summary of a stored group fit."""
    fit = group.fit
    return (
        f"cost fit {_group_label(trial)}: t_draft {fit.t_draft * 1e3:.3f} ms, t_target "
        f"{fit.t_target * 1e3:.3f} ms + {fit.t_per_verified * 1e3:.3f} ms/token, R² round "
        f"{fit.r2_round:.3f} over {fit.n_rounds} rounds of {group.n_trials} trials"
    )


def _fit_values(sweep: str, key: str, trial: Trial, group: GroupFit) -> dict[str, Any]:
    """Return the ``cost_fits`` row of a group's fit (no cross-check)."""
    fit = group.fit
    return {
        "sweep": sweep,
        "group_key": key,
        "pair": trial.pair,
        "dataset": trial.dataset,
        "split": trial.split,
        "samples": trial.samples,
        "max_new_tokens": trial.max_new_tokens,
        "temperature": trial.temperature,
        "t_draft": fit.t_draft,
        "t_target": fit.t_target,
        "t_per_verified": fit.t_per_verified,
        "r2_draft": fit.r2_draft,
        "r2_verify": fit.r2_verify,
        "r2_round": fit.r2_round,
        "n_rounds": fit.n_rounds,
        "n_trials": group.n_trials,
        "overhead_seconds": group.overhead_seconds,
    }


@dataclass(frozen=True)
class _ReplayNotes:
    """What replaying one group did: its fit line, its cross-check lines, traces recorded."""

    fit: str
    checks: list[str]
    recorded: bool


def _ensure_ray(address: str | None) -> None:
    """Connect to Ray: ``address``, else ``RAY_ADDRESS``, else a local instance."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)


class _PairRunner:
    """The worker group of one pair: target ranks and the draft actor, replaced when they die."""

    def __init__(
        self,
        pair: PairSpec,
        inputs: PreparedInputs,
        record_rounds: bool,
        store: Store,
        artifacts: dict[str, str] | None = None,
    ) -> None:
        self.pair = pair
        self.artifacts = artifacts or {}
        self.inputs = inputs
        self.record_rounds = record_rounds
        self.store = store
        self.ranks: list = []
        self.draft = None
        self.group = None

    def run_with_retries(self, trial: Trial, retries: int) -> str | None:
        """Run ``trial`` up to 1 + ``retries`` times; store it; return the last error or None."""
        error = None
        attempts = 0
        for _ in range(retries + 1):
            if not self.store.mark_running(trial):
                return None
            attempts += 1
            try:
                self._start()
                request = self._request(trial)
                results = ray.get(self.draft.run_trial.remote(request))
            except Exception as exc:
                error = describe_failure(exc)
                self.store.record_attempt_error(trial, error)
                if isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.GetTimeoutError):
                    self.close()
                continue
            prepared = self.inputs.prompts[
                (trial.dataset, trial.split, trial.samples, trial.local_path)
            ]
            tokenizer = self.inputs.tokenizer(self.pair.name)
            texts = [response_text(tokenizer, r.output_ids) for r in results]
            self.store.record_trial(
                trial,
                results,
                trial_metrics(results),
                record_rounds=self.record_rounds,
                prompt_ids=[p.id for p in prepared],
                output_texts=texts,
            )
            return None
        self.store.record_failure(trial, error or "unknown error", attempts=None)
        return error

    def replay_group(
        self,
        sweep: str,
        group: ReplayGroup,
        trials: Sequence[Trial],
        finish: Callable[[Trial, str | None], None],
    ) -> _ReplayNotes:
        """Replay ``trials`` of ``group`` and store them; return what was fit and checked.

        Each trial is reported to ``finish`` with its error or None. Without a cost fit
        (the live trials failed, or their rounds cannot identify the costs) every trial fails
        with the reason.
        """
        label = _group_label(group.trials[0])
        try:
            traces, recorded = self._traces(group)
            fit = _fit_from_store(self.store, group.live)
        except (CostModelError, ValueError, ray.exceptions.RayError) as exc:
            reason = f"no cost fit or traces for replay: {describe_failure(exc)}"
            for trial in trials:
                self.store.record_failure(trial, reason, attempts=0)
                finish(trial, reason)
            return _ReplayNotes(f"no cost fit for {label}: {reason}", [], False)
        values = _fit_values(sweep, group.fit_key, group.trials[0], fit)
        values.update(_run_fit_columns(self.store, group.live, fit))
        checks = []
        for check in group.checks:
            result = self._cross_check(check, traces, fit)
            if result is None:
                continue
            checks.append(
                f"cross-check {label} {check.policy} L={check.max_draft_len}: replay "
                f"reproduces {result.same_rounds:.1%} of the live rounds; projected "
                f"{result.projected_tokens_per_s:.2f} vs measured {result.tokens_per_s:.2f} "
                f"tokens/s ({result.error:+.1%})"
            )
            values.update(
                check_trial_id=result.trial_id,
                check_same_rounds=result.same_rounds,
                check_tokens_per_s=result.tokens_per_s,
                check_projected_tokens_per_s=result.projected_tokens_per_s,
                check_error=result.error,
            )
        self.store.record_cost_fit(values)
        for trial in trials:
            finish(trial, self._replay_trial(trial, traces, fit))
        return _ReplayNotes(_fit_note(group.trials[0], fit), checks, recorded)

    def _traces(self, group: ReplayGroup) -> tuple[list[GreedyTrace], bool]:
        """Return the group's traces and whether they were recorded now (else read back)."""
        stored = self.store.traces(group.trace_key)
        if stored is not None:
            return [trace_from_json(t) for t in stored["traces"]], False
        trial = group.trials[0]
        key = (trial.dataset, trial.split, trial.samples, trial.local_path)
        prompts = self.inputs.token_ids(
            self.pair.name, key, trial.max_new_tokens, trial.chat_template
        )
        eos = self.inputs.tokenizer(self.pair.name).eos_token_id
        self._start()
        start = time.perf_counter()
        traces = ray.get(
            self.draft.record_traces.remote(prompts, trial.max_new_tokens, group.cap, eos)
        )
        seconds = time.perf_counter() - start
        self.store.record_traces(
            group.trace_key, group.cap, [trace_to_json(t) for t in traces], seconds
        )
        return traces, True

    def _cross_check(
        self, check: Trial, traces: list[GreedyTrace], fit: GroupFit
    ) -> CrossCheck | None:
        """Return the cross-check of a done live check trial, or None when it is not done."""
        rows = self.store.trial_rows([check.trial_id])
        if not rows or rows[0]["status"] != "done" or not rows[0]["tokens_per_s"]:
            return None
        live_rounds = self.store.rounds([check.trial_id])
        return cross_check(check, live_rounds, rows[0]["tokens_per_s"], traces, fit)

    def _replay_trial(self, trial: Trial, traces: list[GreedyTrace], fit: GroupFit) -> str | None:
        """Replay one trial and store it like a live one; return its error or None."""
        if not self.store.mark_running(trial):
            return None
        try:
            results = replayed_results(replay_rounds(trial, traces), traces, fit)
        except ValueError as exc:
            error = describe_failure(exc)
            self.store.record_failure(trial, error, attempts=1)
            return error
        prepared = self.inputs.prompts[
            (trial.dataset, trial.split, trial.samples, trial.local_path)
        ]
        tokenizer = self.inputs.tokenizer(self.pair.name)
        self.store.record_trial(
            trial,
            results,
            trial_metrics(results),
            record_rounds=True,
            prompt_ids=[p.id for p in prepared],
            output_texts=[response_text(tokenizer, r.output_ids) for r in results],
        )
        return None

    def _request(self, trial: Trial) -> TrialRequest:
        """Build the worker's request for ``trial`` from the prepared prompts."""
        key = (trial.dataset, trial.split, trial.samples, trial.local_path)
        token_ids = self.inputs.token_ids(
            self.pair.name, key, trial.max_new_tokens, trial.chat_template
        )
        return TrialRequest(
            prompts=token_ids,
            sampling=SamplingConfig(
                trial.temperature, trial.top_k, trial.top_p, trial.max_new_tokens
            ),
            policy=trial.policy,
            params=trial.params_dict,
            max_draft_len=trial.max_draft_len,
            seed=trial.seed,
            warmup_samples=min(trial.warmup_samples, len(token_ids)),
            eos_token_id=self.inputs.tokenizer(self.pair.name).eos_token_id,
            artifact_path=self.artifacts[trial.policy_job] if trial.policy_job else None,
        )

    def _start(self) -> None:
        """Create the target ranks and the draft actor unless they are running."""
        if self.draft is not None:
            return

        paths = self.inputs.model_paths[self.pair.name]
        target = ModelSpec(
            str(paths.target), self.pair.target.dtype, self.pair.target.trust_remote_code
        )
        self.group = create_worker_group(self.pair, timeout_s=600)
        tp_size = self.pair.target.tp_size
        deepspeed = self.pair.target.backend == "deepspeed"
        port = _free_port()
        self.ranks = [
            TargetWorker.options(**actor_options_for_rank(self.group, rank)).remote(
                target,
                RankSpec(rank, tp_size, "", port) if deepspeed else None,
            )
            for rank in range(tp_size)
        ]
        draft = (
            ModelSpec(str(paths.draft), self.pair.target.dtype, self.pair.target.trust_remote_code)
            if paths.draft
            else None
        )
        self.draft = DraftWorker.options(**draft_actor_options(self.group)).remote(
            draft, self.ranks
        )
        ray.get([self.draft.node_id.remote(), *(r.node_id.remote() for r in self.ranks)])
        self._warm_up(draft is not None)

    def _warm_up(self, has_draft: bool) -> None:
        """Decode a few tokens of one prompt on the new actors and discard the result.

        The first forwards of a fresh process pay for lazy initialisation and allocator growth;
        without this they would land in whichever trial runs first (often the AR baseline,
        which every speedup divides by). ``warmup_samples`` still warms each trial on top.
        """
        key = next(iter(self.inputs.prompts))
        prompt = self.inputs.token_ids(self.pair.name, key, WARMUP_TOKENS)[:1]
        request = TrialRequest(
            prompts=prompt,
            sampling=SamplingConfig(max_new_tokens=WARMUP_TOKENS),
            policy="static" if has_draft else BASELINE_POLICY,
            max_draft_len=WARMUP_DRAFT_LEN,
        )
        ray.get(self.draft.run_trial.remote(request))

    def close(self) -> None:
        """Kill the pair's actors and free their placement group."""
        for actor in [self.draft, *self.ranks]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        if self.group is not None:
            remove_worker_group(self.group)
        self.draft, self.ranks, self.group = None, [], None


def _free_port() -> int:
    """Return a TCP port that is free on this host now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
