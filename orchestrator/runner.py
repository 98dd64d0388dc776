"""The Ray driver: preflight, worker groups per pair, dispatch with retries, results to the store.

``run_sweep`` skips trials the store already has, runs the rest pair by pair (each pair's
models load once; several pairs at once when ``execution.max_concurrent_pairs`` allows), retries
a failed trial on fresh actors, and writes each trial in one transaction as it ends, so a crash
loses only the trials in flight.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from threading import Event, Lock

import ray
from tqdm import tqdm

from orchestrator.errors import describe_failure
from orchestrator.metrics import trial_metrics
from orchestrator.placement import (
    actor_options_for_rank,
    create_worker_group,
    draft_actor_options,
    remove_worker_group,
)
from orchestrator.planner import Plan, Trial
from orchestrator.preflight import PreflightError, PreparedInputs, preflight_inputs
from orchestrator.spec import PairSpec, SweepSpec
from orchestrator.store import Store
from orchestrator.training_stage import attach_job_drafts, run_training_jobs
from workers.actors import DraftWorker, ModelSpec, RankSpec, TargetWorker
from workers.records import SamplingConfig
from workers.trial import BASELINE_POLICY, TrialRequest

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

    ``failures`` has a line per failed trial, ``job_failures`` one per failed training job.
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
    if not pending:
        return summary
    inputs = inputs or preflight(spec, plan)
    _ensure_ray(options.address)
    retries = spec.execution.retries if options.retries is None else options.retries
    jobs = run_training_jobs(plan.jobs, store, retries, options.progress)
    summary.jobs_reused = sum(outcome.reused for outcome in jobs.values())
    summary.jobs_trained = sum(not outcome.reused for outcome in jobs.values())
    for outcome in jobs.values():
        if outcome.error is not None:
            summary.job_failures.append(f"training job {outcome.job.name}: {outcome.error}")
    artifacts = attach_job_drafts(spec, inputs, jobs)
    pairs = {pair.name: pair for pair in spec.pairs}
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
    progress = tqdm(
        total=len(pending),
        desc=f"sweep {plan.sweep}",
        unit="trial",
        disable=not options.progress,
        dynamic_ncols=True,
    )
    lock = Lock()
    stop = Event()

    def run_pair(pair_name: str) -> None:
        runner = _PairRunner(
            pairs[pair_name], inputs, spec.execution.record_rounds, store, artifacts
        )
        try:
            for trial in by_pair[pair_name]:
                if stop.is_set():
                    return
                error = runner.run_with_retries(trial, retries)
                with lock:
                    summary.ran += 1
                    if error is not None:
                        summary.failed += 1
                        summary.failures.append(f"{trial.trial_id} ({trial.policy}): {error}")
                    progress.set_postfix_str(f"{trial.policy} {trial.dataset}")
                    progress.update()
        finally:
            runner.close()

    workers = max(1, min(spec.execution.max_concurrent_pairs, len(by_pair)))
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        for future in [pool.submit(run_pair, name) for name in by_pair]:
            future.result()
    except BaseException:
        # Ctrl-C (or any error): start no new trial; the ones in flight finish and are stored.
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        progress.close()
        raise
    pool.shutdown()
    progress.close()
    summary.seconds = time.perf_counter() - start
    return summary


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
            texts = [self.inputs.tokenizer(self.pair.name).decode(r.output_ids) for r in results]
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

    def _request(self, trial: Trial) -> TrialRequest:
        """Build the worker's request for ``trial`` from the prepared prompts."""
        key = (trial.dataset, trial.split, trial.samples, trial.local_path)
        token_ids = self.inputs.token_ids(self.pair.name, key, trial.max_new_tokens)
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
