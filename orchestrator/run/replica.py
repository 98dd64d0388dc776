"""One replica of a worker group: the target ranks, loaded once, and a draft actor per pair.

The group serves the pairs that share one target (``orchestrator.sweep.target_sets``), all in one
placement group. A replica runs one unit at a time, so the target serves one request at a
time: shards of any of its pairs' groups' prompts, every arm of the group interleaved
(``run_arms``, on that pair's draft actor) and, in replay mode, a pair's replay groups
(``replay_group``: traces recorded once per group by the pair's draft actor or read back from
the store, the group's cost fit, the cross-check of the live check trial, each replayed trial
stored like a live one). The target ranks start
with the replica's first unit, a pair's draft actor with the first unit of that pair (lazily:
a pair with nothing left to run loads no draft). When any actor dies, all are closed and
restarted by the next unit. The driver's wait on a shard (and on a new draft actor's warm-up)
ends once the draft actor has reported no progress for ``stall_seconds``
(``orchestrator.run.stall_watch``): the stuck actors are closed like dead ones and the shard is
retried. Each new draft actor warms up on a few tokens before its first timed shard, and a
trial's ``warmup_samples`` run on a replica's first shard of that trial. A deepspeed target's
rendezvous port is picked on the node of rank 0 (:func:`rendezvous_port`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.analysis.costs.batch_replay import (
    BatchGroupFit,
    BatchHeldOut,
    batch_cross_check,
    batch_replayed_rounds,
    replayed_queue_results,
)
from orchestrator.analysis.costs.model import CostModelError
from orchestrator.analysis.costs.replay import (
    GroupFit,
    cross_check,
    replay_rounds,
    trace_from_json,
    trace_to_json,
    trial_results,
)
from orchestrator.analysis.costs.validation import HeldOut
from orchestrator.analysis.metrics import trial_metrics
from orchestrator.run.batch_fits import (
    batch_fit_note,
    batch_fit_values,
    fit_batch_from_store,
    replay_queues,
    stored_queues,
)
from orchestrator.run.errors import describe_failure
from orchestrator.run.group_fits import (
    fit_from_store,
    fit_note,
    fit_values,
    group_label,
    run_fit_columns,
)
from orchestrator.run.placement import (
    actor_options_for_rank,
    create_worker_group,
    draft_actor_options,
    group_node,
    remove_worker_group,
)
from orchestrator.run.preflight import PreparedInputs
from orchestrator.run.stall_watch import WorkerStalled, wait_with_progress
from orchestrator.run.step_choices import SingleStepChoices, StepKey
from orchestrator.store import ShardOutput, Store
from orchestrator.sweep.planner import ReplayGroup, Trial
from orchestrator.sweep.spec import ExecutionSpec
from orchestrator.sweep.target_sets import SharedTarget
from orchestrator.sweep.work_units import ArmShard, WorkUnit
from policies.replay import GreedyTrace
from workers.actors import DraftWorker, TargetWorker
from workers.model_spec import EagleHeadSpec, ModelSpec, RankSpec, SingleStep, free_port
from workers.prompt_format import response_text
from workers.proposers.ngram import NgramSettings
from workers.records import BASELINE_POLICY, GenerationResult, SamplingConfig
from workers.step_plan import StepPlan
from workers.trial import (
    GPU_WARMUP_SECONDS,
    ArmRequest,
    ArmSample,
    GroupRequest,
    GroupResults,
    TrialRequest,
)

#: Tokens decoded (and draft length used) to warm a new worker group up before its trials.
WARMUP_TOKENS = 8
WARMUP_DRAFT_LEN = 2
#: Calls a draft actor runs at once: the driver's call, and the progress query beside it.
DRAFT_CONCURRENCY = 2

#: A replay group's cost fit: the per-step model (batch size 1) or the cost table (above 1).
F = TypeVar("F", GroupFit, BatchGroupFit)
#: Reports a replayed trial's error (None: stored) to the caller.
Finish = Callable[[Trial, str | None], None]


@dataclass(frozen=True)
class GroupShard:
    """A group shard's outcome: one output per arm to store (None for an arm that raised: its
    error is in ``errors``, by trial id), and every sample in the order it ran
    (``workers.trial.ArmSample``: arm, sample index, start and end)."""

    outputs: list[ShardOutput | None]
    log: tuple[ArmSample, ...]
    errors: dict[str, Exception]


@dataclass(frozen=True)
class ReplayNotes:
    """What replaying one group did: its fit line, its cross-check lines, traces recorded."""

    fit: str
    checks: list[str]
    recorded: bool


@dataclass(frozen=True)
class FittedGroup(Generic[F]):
    """A replay group ready to replay: its label, the pool its cost ``fit`` is over, and its
    traces."""

    label: str
    pool: Sequence[Trial]
    traces: list[GreedyTrace]
    fit: F


class GroupReplica:
    """One replica of the worker group of a set of pairs sharing a target: the target ranks
    and each pair's draft actor (``drafts``, by pair name), all replaced when one dies;
    ``node`` is where they run, ``rendezvous`` the ranks' port (deepspeed); a draft actor
    that reports no progress for ``stall_seconds`` counts as dead.
    """

    def __init__(
        self,
        shared: SharedTarget,
        inputs: PreparedInputs,
        record_rounds: bool,
        store: Store,
        artifacts: dict[str, str] | None = None,
        warmup_seconds: float | None = None,
        step_choices: SingleStepChoices | None = None,
        stall_seconds: float = ExecutionSpec().stall_timeout_seconds,
    ) -> None:
        self.shared = shared
        self.stall_seconds = stall_seconds
        self.name = shared.name
        self.artifacts = artifacts or {}
        self.inputs = inputs
        self.record_rounds = record_rounds
        self.warmup_seconds = group_warmup_seconds(warmup_seconds, shared)
        self.store = store
        self.step_choices = step_choices or SingleStepChoices()
        self.ranks: list = []
        self.drafts: dict[str, Any] = {}
        self.group = None
        self.node: str | None = None
        self.rendezvous: Rendezvous | None = None
        #: Trials whose ``warmup_samples`` already ran on the current actors.
        self.warmed: set[str] = set()

    def run_arms(self, unit: WorkUnit, arms: Sequence[tuple[Trial, ArmShard]]) -> GroupShard:
        """Run one group shard's ``arms`` interleaved on their pair's draft actor; return each
        arm's output to store (in ``arms``' order), the errors of arms that raised, and the
        order the samples ran in.

        Starts (or restarts) the actors first; an actor death, or a draft actor that stalled,
        closes them all, so the shard's retry, on whichever replica takes it, finds live ones.
        The arms' order is seeded by the group's seed (its trials share one).
        """
        first = arms[0][0]
        try:
            draft = self._draft(first.pair)
            requests = tuple(
                ArmRequest(trial.trial_id, self._request(trial, arm.samples)) for trial, arm in arms
            )
            start = time.perf_counter()
            group = GroupRequest(requests, seed=first.seed, shard=unit.shard)
            ref = draft.run_arms.remote(group)
            done: GroupResults = self._wait(draft, ref)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError, WorkerStalled):
            self.close()
            raise
        seconds = time.perf_counter() - start
        self.warmed.update(trial.trial_id for trial, _ in arms)
        outputs = [
            self._output(trial, unit.shard, arm.samples, done.results[trial.trial_id], seconds)
            if trial.trial_id in done.results
            else None
            for trial, arm in arms
        ]
        return GroupShard(outputs, done.log, done.errors)

    def _output(
        self,
        trial: Trial,
        shard: int,
        samples: Sequence[int],
        results: Sequence[GenerationResult],
        seconds: float,
    ) -> ShardOutput:
        """Return what to store of one arm's results in shard ``shard`` (the group shard's
        ``seconds``); a repeat keeps its prompt's id."""
        prepared = self.inputs.prompts[trial.prompts.key]
        tokenizer = self.inputs.tokenizer(trial.pair)
        return ShardOutput(
            shard=shard,
            indices=tuple(samples),
            results=results,
            prompt_ids=[prepared[index % len(prepared)].id for index in samples],
            output_texts=[response_text(tokenizer, r.output_ids) for r in results],
            node_id=self.node,
            seconds=seconds,
        )

    def replay_group(
        self,
        sweep: str,
        group: ReplayGroup,
        trials: Sequence[Trial],
        finish: Finish,
    ) -> ReplayNotes:
        """Replay ``trials`` of ``group`` and store them; return what was fit and checked.

        The cost model is fit over the live trials of the group's pool (``ReplayGroup.pool``:
        the pair at this sampling setting, every dataset), each of the pool's live checks held
        out in turn for the out-of-sample error. Each trial is reported to ``finish`` with its
        error or None. Without a cost fit (the live trials failed, or their rounds cannot
        identify the costs) every trial fails with the reason.

        At a batch size above 1 (``run.batch_fits``) the fit is the cost table over the pool's
        live queues at that size, and each trial's batch-1 replayed rounds are decoded as its
        AR baseline's queues and timed by the table.
        """
        if group.trials[0].batch_size > 1:
            return self._replay_fitted(
                group,
                trials,
                finish,
                fit_batch_from_store,
                lambda fitted: self._record_batch_fit(sweep, group, fitted),
                self._batch_results,
            )
        return self._replay_fitted(
            group,
            trials,
            finish,
            fit_from_store,
            lambda fitted: self._record_fit(sweep, group, fitted),
            _replayed_results,
        )

    def _replay_fitted(
        self,
        group: ReplayGroup,
        trials: Sequence[Trial],
        finish: Finish,
        fit_from: Callable[[Store, Sequence[Trial], Collection[str]], F],
        record: Callable[[FittedGroup[F]], tuple[str, list[str]]],
        results: Callable[[Trial, FittedGroup[F]], list[GenerationResult]],
    ) -> ReplayNotes:
        """Read or record ``group``'s traces and fit its costs by ``fit_from`` over its pool
        (the pool's live checks held out), or fail every one of ``trials`` for want of them;
        then ``record`` the fit (it returns the fit's line and the checks' lines) and replay
        each trial by ``results``, storing it and reporting it to ``finish``."""
        label = group_label(group.trials[0])
        pool = group.pool or group.live
        try:
            traces, recorded = self._traces(group)
            fit = fit_from(self.store, pool, {t.trial_id for t in group.pool_checks})
        except (CostModelError, ValueError, ray.exceptions.RayError) as exc:
            return self._fail_group(label, trials, finish, exc)
        fitted = FittedGroup(label, pool, traces, fit)
        note, checks = record(fitted)
        for trial in trials:
            replayed = partial(results, trial, fitted)
            finish(trial, self._replay_trial(trial, fit.out_of_sample_error, replayed))
        return ReplayNotes(note, [check for check in checks if check], recorded)

    def _fail_group(
        self,
        label: str,
        trials: Sequence[Trial],
        finish: Finish,
        exc: Exception,
    ) -> ReplayNotes:
        """Fail every one of ``trials`` for want of a cost fit or traces (``exc``)."""
        reason = f"no cost fit or traces for replay: {describe_failure(exc)}"
        for trial in trials:
            self.store.record_failure(trial, reason, attempts=0)
            finish(trial, reason)
        return ReplayNotes(f"no cost fit for {label}: {reason}", [], False)

    def _record_fit(
        self, sweep: str, group: ReplayGroup, fitted: FittedGroup[GroupFit]
    ) -> tuple[str, list[str]]:
        """Store a batch-1 group's fit with its first done live check's figures; return the
        fit's line and each live check's line."""
        values = fit_values(sweep, group.fit_key, group.trials[0], fitted.fit)
        values.update(run_fit_columns(self.store, fitted.pool, fitted.fit))
        checks = [self._check_note(fitted, check, values) for check in group.checks]
        self.store.record_cost_fit(values)
        return fit_note(fitted.pool, fitted.fit), checks

    def _record_batch_fit(
        self, sweep: str, group: ReplayGroup, fitted: FittedGroup[BatchGroupFit]
    ) -> tuple[str, list[str]]:
        """Store a group's cost table at its batch size; return the table's line and each
        live check's line."""
        self.store.record_cost_fit(
            batch_fit_values(sweep, group.fit_key, group.trials[0], fitted.fit)
        )
        checks = [self._batch_check_note(fitted, check) for check in group.checks]
        return batch_fit_note(fitted.pool, fitted.fit), checks

    def _batch_check_note(self, fitted: FittedGroup[BatchGroupFit], check: Trial) -> str:
        """Return one live check's line at its batch size ("" when it is not done)."""
        measured = self._done_tokens_per_s(check)
        if measured is None:
            return ""
        queues = [
            [i for i in queue if i < len(fitted.traces)]
            for queue in stored_queues(self.store, check.trial_id)
        ]
        result = batch_cross_check(
            check,
            self.store.rounds([check.trial_id]),
            measured,
            fitted.traces,
            fitted.fit.table,
            [queue for queue in queues if queue],
        )
        out_of_sample = _out_of_sample_text(fitted.fit.checks, check.trial_id)
        return (
            f"cross-check {fitted.label} {check.setting.policy} L={check.setting.max_draft_len} "
            f"at batch size {check.batch_size}: replay reproduces {result.same_rounds:.1%} of "
            f"the live rounds; projected {result.projected_tokens_per_s:.2f} vs measured "
            f"{result.tokens_per_s:.2f} tokens/s per sequence ({result.error:+.1%} with it in "
            f"the fit, {out_of_sample} out of sample)"
        )

    def _batch_results(
        self, trial: Trial, fitted: FittedGroup[BatchGroupFit]
    ) -> list[GenerationResult]:
        """Return one trial's results replayed at its batch size: its rounds decoded as its AR
        baseline's queues (``batch_replayed_rounds``), timed by the group's cost table."""
        queues = replay_queues(self.store, trial, len(fitted.traces))
        table = fitted.fit.table
        rounds = batch_replayed_rounds(trial, fitted.traces, queues, table.batch_size)
        return replayed_queue_results(rounds, fitted.traces, table, queues)

    def _traces(self, group: ReplayGroup) -> tuple[list[GreedyTrace], bool]:
        """Return the group's traces and whether they were recorded now (else read back)."""
        stored = self.store.traces(group.trace_key)
        if stored is not None:
            return [trace_from_json(t) for t in stored.traces], False
        trial = group.trials[0]
        new_tokens = trial.sampling.max_new_tokens
        prompts = self.inputs.token_ids(
            trial.pair, trial.prompts.key, new_tokens, trial.prompts.chat_template
        )
        eos = self.inputs.tokenizer(trial.pair).eos_token_id
        draft = self._draft(trial.pair)
        start = time.perf_counter()
        lookup = None
        if trial.served.draft_kind == "ngram":
            lookup = NgramSettings(**dict(trial.served.draft_settings))
        traces = ray.get(draft.record_traces.remote(prompts, new_tokens, group.cap, eos, lookup))
        seconds = time.perf_counter() - start
        self.store.record_traces(
            group.trace_key, group.cap, [trace_to_json(t) for t in traces], seconds
        )
        return traces, True

    def _check_note(
        self, fitted: FittedGroup[GroupFit], check: Trial, values: dict[str, Any]
    ) -> str:
        """Return one live check's line (its rounds reproduced, its out-of-sample error) and
        put the first check's figures into the ``cost_fits`` row ``values`` ("" if not done)."""
        measured = self._done_tokens_per_s(check)
        if measured is None:
            return ""
        live_rounds = self.store.rounds([check.trial_id])
        result = cross_check(check, live_rounds, measured, fitted.traces, fitted.fit)
        out_of_sample = _out_of_sample_text(fitted.fit.checks, check.trial_id)
        if values.get("check_trial_id") is None:
            values.update(
                check_trial_id=result.trial_id,
                check_same_rounds=result.same_rounds,
                check_tokens_per_s=result.tokens_per_s,
                check_projected_tokens_per_s=result.projected_tokens_per_s,
                check_error=result.error,
            )
        return (
            f"cross-check {fitted.label} {check.setting.policy} "
            f"L={check.setting.max_draft_len}: replay reproduces "
            f"{result.same_rounds:.1%} of the live rounds; projected "
            f"{result.projected_tokens_per_s:.2f} vs measured {result.tokens_per_s:.2f} tokens/s "
            f"({result.error:+.1%} with it in the fit, {out_of_sample} out of sample)"
        )

    def _done_tokens_per_s(self, check: Trial) -> float | None:
        """Return the measured tokens/s of live check ``check``, or None when it is not done."""
        rows = self.store.trial_rows([check.trial_id])
        if not rows or rows[0].status != "done" or not rows[0].tokens_per_s:
            return None
        return rows[0].tokens_per_s

    def _replay_trial(
        self,
        trial: Trial,
        fit_error: float | None,
        results: Callable[[], list[GenerationResult]],
    ) -> str | None:
        """Replay one trial by ``results`` and store it like a live one (its intervals widened
        by its fit's out-of-sample ``fit_error``); return its error or None."""
        if not self.store.mark_running(trial):
            return None
        try:
            replayed = results()
        except ValueError as exc:
            error = describe_failure(exc)
            self.store.record_failure(trial, error, attempts=1)
            return error
        self._store_replayed(trial, replayed, fit_error)
        return None

    def _store_replayed(
        self, trial: Trial, results: list[GenerationResult], error: float | None
    ) -> None:
        """Store a replayed trial's results like a live trial's, its intervals widened by its
        fit's out-of-sample ``error``."""
        prepared = self.inputs.prompts[trial.prompts.key]
        tokenizer = self.inputs.tokenizer(trial.pair)
        metrics = trial_metrics(results, cost_model_error=error)
        self.store.record_trial(
            trial,
            results,
            metrics,
            record_rounds=True,
            prompt_ids=[p.id for p in prepared],
            output_texts=[response_text(tokenizer, r.output_ids) for r in results],
        )
        return None

    def _request(self, trial: Trial, indices: Sequence[int] | None = None) -> TrialRequest:
        """Build the worker's request for ``trial``'s samples at ``indices`` (default: one per
        prompt; sample r * prompts + i is repeat r of prompt i).

        The trial's ``warmup_samples`` (of these prompts) run only on the replica's first shard
        of the trial; the replica's own warm-up ran when its actors started.
        """
        prompts, sampling, setting = trial.prompts, trial.sampling, trial.setting
        all_ids = self.inputs.token_ids(
            trial.pair, prompts.key, sampling.max_new_tokens, prompts.chat_template
        )
        indices = tuple(range(len(all_ids))) if indices is None else tuple(indices)
        token_ids = [all_ids[index % len(all_ids)] for index in indices]
        warmup = 0 if trial.trial_id in self.warmed else trial.warmup_samples
        return TrialRequest(
            prompts=token_ids,
            indices=indices,
            sampling=sampling,
            policy=setting.policy,
            params=setting.params_dict,
            max_draft_len=setting.max_draft_len,
            seed=trial.seed,
            warmup_samples=min(warmup, len(token_ids)),
            eos_token_id=self.inputs.tokenizer(trial.pair).eos_token_id,
            artifact_path=self.artifacts[setting.job] if setting.job else None,
            draft_kind=trial.served.draft_kind,
            draft_settings=dict(trial.served.draft_settings),
            batch_size=trial.batch_size,
        )

    def _draft(self, pair: str) -> Any:
        """Return ``pair``'s draft actor, starting the target ranks and it when not running."""
        self._start()
        if pair not in self.drafts:
            self._start_draft(pair)
        return self.drafts[pair]

    def _start(self) -> None:
        """Reserve the placement group and create the target ranks unless they are running.

        The ranks load with the one-token step choice made for this target on this node, or
        make it (``orchestrator.run.step_choices``).
        """
        if self.ranks:
            return
        target = self.shared.target
        path = self.inputs.model_paths[self.shared.pairs[0].name].target
        self.group = create_worker_group(self.shared.pairs, timeout_s=600)
        deepspeed = target.backend == "deepspeed"
        self.rendezvous = rendezvous_port(self.group) if deepspeed else None
        key = StepKey(group_node(self.group), str(path), target.dtype, target.tp_size)
        self.step_choices.load(
            key, lambda mode: self._start_ranks(self._model(path, mode, target.trust_remote_code))
        )
        self.warmed = set()

    def _model(self, path: Path, single_step: SingleStep, trust_remote_code: bool) -> ModelSpec:
        """Return the spec of the model at ``path`` as this group's target settings load it
        (``trust_remote_code``: that model's own flag, the target's or a draft's)."""
        return ModelSpec(str(path), self.shared.target.dtype, trust_remote_code, single_step)

    def _start_ranks(self, model: ModelSpec) -> StepPlan | None:
        """Create the target ranks loading ``model``; once they are up, return the step plan
        rank 0's calibration chose (None when it did not calibrate)."""
        target = self.shared.target
        port = self.rendezvous.port if self.rendezvous else 0
        drafts = len(self.shared.pairs)
        self.ranks = [
            TargetWorker.options(**actor_options_for_rank(self.group, rank, drafts)).remote(
                model, RankSpec(rank, target.tp_size, "", port) if self.rendezvous else None
            )
            for rank in range(target.tp_size)
        ]
        self.node, *_ = ray.get([rank.node_id.remote() for rank in self.ranks])
        return _step_plan(self.ranks[0], model.single_step)

    def _start_draft(self, pair: str) -> None:
        """Create ``pair``'s draft actor in its bundle, next to the running ranks, with the
        node's one-token step choice for its model (an EAGLE head: over the target's frozen
        parts, no step choice); warm it up."""
        path = self.inputs.model_paths[pair].draft
        draft = self.shared.pairs[self.shared.pair_names.index(pair)].draft
        if path is None:
            self._create_draft(pair, None)
        elif draft.kind == "eagle":
            self._create_draft(pair, EagleHeadSpec(str(path), self._target_model(pair)))
        else:
            key = StepKey(str(self.node), str(path), self.shared.target.dtype)
            trust = draft.trust_remote_code
            self.step_choices.load(
                key, lambda mode: self._create_draft(pair, self._model(path, mode, trust))
            )
        self._warm_up(pair, draft.kind if path is not None else None)

    def _target_model(self, pair: str) -> ModelSpec:
        """Return the spec of ``pair``'s target as an EAGLE head's draft actor loads it (for
        its frozen embeddings, norm and LM head only: no step choice)."""
        path = self.inputs.model_paths[pair].target
        return self._model(path, "plain", self.shared.target.trust_remote_code)

    def _create_draft(self, pair: str, model: ModelSpec | EagleHeadSpec | None) -> StepPlan | None:
        """Create ``pair``'s draft actor loading ``model`` (None: target-only pair); return the
        step plan its calibration chose (None when it did not calibrate)."""
        index = self.shared.pair_names.index(pair)
        options = draft_actor_options(self.group, index, len(self.shared.pairs))
        options = {**options, "max_concurrency": DRAFT_CONCURRENCY}
        self.drafts[pair] = DraftWorker.options(**options).remote(model, self.ranks)
        ray.get(self.drafts[pair].node_id.remote())
        if not isinstance(model, ModelSpec):
            return None
        return _step_plan(self.drafts[pair], model.single_step)

    def _warm_up(self, pair: str, kind: str | None) -> None:
        """Decode one prompt's first tokens on ``pair``'s new draft actor, untimed, for
        ``warmup_seconds`` (at least once): speculatively with its draft of ``kind``, or
        target-only when it holds none (``kind`` None).

        The first forwards of a fresh process pay for lazy initialisation and allocator growth
        (on a GPU, seconds of slower steps: ``workers.trial.GPU_WARMUP_SECONDS``); without this
        they would land in whichever trial runs first (often the AR baseline, which every
        speedup divides by). ``warmup_samples`` still warms each trial on top.
        """
        key = next(iter(self.inputs.prompts))
        prompt = self.inputs.token_ids(pair, key, WARMUP_TOKENS)[:1]
        request = TrialRequest(
            prompts=prompt,
            sampling=SamplingConfig(max_new_tokens=WARMUP_TOKENS),
            policy=BASELINE_POLICY if kind is None else "static",
            max_draft_len=WARMUP_DRAFT_LEN,
            draft_kind=kind or "lm",
        )
        draft = self.drafts[pair]
        self._wait(draft, draft.warm_up.remote(request, self.warmup_seconds))

    def _wait(self, draft: Any, ref: ray.ObjectRef) -> Any:
        """Return the result of ``draft``'s call ``ref``; raise ``WorkerStalled`` once the draft
        actor has reported no progress for ``stall_seconds``."""
        return wait_with_progress(ref, draft.progress.remote, self.stall_seconds)

    def close(self) -> None:
        """Kill the group's actors (every draft and rank) and free their placement group."""
        for actor in [*self.drafts.values(), *self.ranks]:
            ray.kill(actor, no_restart=True)
        if self.group is not None:
            remove_worker_group(self.group)
        self.drafts, self.ranks, self.group = {}, [], None


def _replayed_results(trial: Trial, fitted: FittedGroup[GroupFit]) -> list[GenerationResult]:
    """Return one trial's results replayed at batch size 1, timed by the group's per-step
    model at the level of the trial's group."""
    rounds = replay_rounds(trial, fitted.traces)
    return trial_results(trial, rounds, fitted.traces, fitted.fit)


def _out_of_sample_text(checks: Sequence[HeldOut | BatchHeldOut], trial_id: str) -> str:
    """Return live check ``trial_id``'s out-of-sample error as a cross-check line prints it."""
    held = next((h for h in checks if h.trial_id == trial_id), None)
    error = held.error if held is not None else None
    return f"{error:+.1%}" if error is not None else "not identified without it"


def _step_plan(actor: Any, single_step: SingleStep) -> StepPlan | None:
    """Return the step plan ``actor``'s model calibrated, when it was asked to (``single_step``
    "auto"), else None."""
    if single_step != "auto":
        return None
    calibration = ray.get(actor.single_step_calibration.remote())
    return None if calibration is None else calibration.plan


def group_warmup_seconds(setting: float | None, shared: SharedTarget) -> float:
    """Return how long a new draft actor of ``shared``'s group warms up: ``setting`` when
    given, else ``GPU_WARMUP_SECONDS`` when the target or any draft uses a GPU, else 0 (one
    pass)."""
    if setting is not None:
        return setting
    uses_gpu = any(pair.target.gpus > 0 or pair.draft.gpus > 0 for pair in shared.pairs)
    return GPU_WARMUP_SECONDS if uses_gpu else 0.0


@dataclass(frozen=True)
class Rendezvous:
    """The port the tensor-parallel ranks of a group meet on, and the node that picked it."""

    port: int
    node_id: str


def _free_port_here() -> Rendezvous:
    """Return a TCP port that is free now on the node this runs on, and that node's id."""
    return Rendezvous(free_port(), ray.get_runtime_context().get_node_id())


def rendezvous_port(group: PlacementGroup) -> Rendezvous:
    """Return a port free on the node of ``group``'s bundle 0 (where rank 0 runs).

    Asked of a zero-CPU task placed in that bundle, so on a multi-node cluster the port is
    free where the ranks meet, not on the driver's host.
    """
    task = ray.remote(num_cpus=0, max_retries=0)(_free_port_here)
    strategy = PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=0
    )
    return ray.get(task.options(scheduling_strategy=strategy).remote())
