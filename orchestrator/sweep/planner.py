"""Expand a validated sweep into trials and training jobs (pure; no I/O, no models).

Each (pair, dataset, temperature, seed) cell of the grid builds its trials' parts once (the
served pair, the prompt set, the ``SamplingConfig`` the worker receives unchanged) and one
policy setting per trial; :mod:`orchestrator.sweep.trial` composes them and derives every id.

Identity: a trial's id is the first 16 hex digits of the sha256 of the canonical JSON of
everything that affects its measurement: the models and how they are served (target ref,
backend, tp_size, dtype, trust_remote_code; draft ref or the *id* of the training job producing
it), the prompt set (dataset, split, samples, local path), max_new_tokens, sampling (normalised:
greedy ignores top-k/top-p), the policy with *all* its parameters (defaults filled in, values
coerced to the default's type), the trained artifact's job id, max draft length, seed, warm-up
samples and ``CODE_VERSION``. It excludes labels and placement: the sweep's and the pair's names,
the description, GPU fractions, retries. So the same measurement in two sweeps (or under two pair
names) is one trial, stored once, and resubmitting a sweep skips trials already done. A draft's
own ``trust_remote_code`` enters the identity only when set, so older ids are unchanged.

An AR baseline (policy ``ar``, max draft length 0) is added per (pair, dataset, temperature,
seed, batch size); it keeps the draft in its identity because speedups compare against the same
pair's worker processes. Each trial carries its baseline's id. A batch size enters an id only
when it is not 1 (``Trial.batch_entry``), so ids planned before batch sizes existed stay.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.sweep.spec import (
    DatasetEntry,
    DraftSpec,
    PairSpec,
    PolicySpec,
    SweepSpec,
    TargetSpec,
    TemperatureSpec,
    TrainingJobSpec,
    job_base_reference,
    worker_pairs,
)
from orchestrator.sweep.trial import (
    CODE_VERSION,
    LIVE_MODE,
    REPLAY_MODE,
    ParamItems,
    PolicySetting,
    PromptSet,
    ServedPair,
    Trial,
    canonical_json,
    config_id,
    fit_group_key,
    fit_pool_of,
    fit_pools,
    trace_key,
)
from policies import POLICIES
from workers.records import BASELINE_POLICY, SamplingConfig

MIXED_MODE = "mixed"
#: Step features one draft kind alone shows (``workers.proposers``): a policy reading one
#: is planned only for drafts of that kind (skipped for the others of a pair's ``drafts``).
KIND_FEATURES = {"match_length": "ngram"}
#: Draft kinds whose greedy trials replay from a greedy trace (``workers.trace``,
#: ``workers.eagle.trace``): every kind a sweep may name.
REPLAYABLE_KINDS = ("lm", "ngram", "eagle")


@dataclass(frozen=True)
class TrainingJob:
    """One training job to run before the trials that need its artifact."""

    job_id: str
    name: str
    kind: str
    base: str
    teacher: str | None
    dataset: str
    split: str | None
    samples: int
    local_path: str | None
    epochs: int
    config_json: str

    @property
    def config(self) -> dict[str, Any]:
        """Return the kind-specific settings as a fresh dict."""
        return json.loads(self.config_json)


@dataclass(frozen=True)
class SkippedGroup:
    """Trials the planner did not create, and why."""

    pair: str
    dataset: str
    temperature: float
    seed: int
    policy: str
    n_trials: int
    reason: str
    draft: str = ""


@dataclass(frozen=True)
class PairResources:
    """What one pair's worker group asks Ray for: target ranks plus one draft actor."""

    pair: str
    backend: str
    target_actors: int
    gpus_per_target_actor: float
    draft_gpus: float
    cpus: int
    gpus: float


@dataclass(frozen=True)
class Plan:
    """The expanded sweep: ordered trials, training jobs, skipped groups."""

    sweep: str
    trials: tuple[Trial, ...]
    jobs: tuple[TrainingJob, ...]
    skipped: tuple[SkippedGroup, ...]
    pairs: tuple[PairSpec, ...] = field(repr=False)

    def counts(self) -> dict[str, int]:
        """Return trial counts: total, baselines, policy trials, skipped, jobs."""
        baselines = sum(trial.is_baseline for trial in self.trials)
        return {
            "trials": len(self.trials),
            "baselines": baselines,
            "policy_trials": len(self.trials) - baselines,
            "skipped": sum(group.n_trials for group in self.skipped),
            "jobs": len(self.jobs),
        }

    def counts_by_pair(self) -> dict[str, int]:
        """Return the number of trials per pair name (in plan order)."""
        return dict(Counter(trial.pair for trial in self.trials))

    def resources(self) -> list[PairResources]:
        """Return the resources each pair's worker group needs (one CPU per actor)."""
        result = []
        for pair in self.pairs:
            actors = pair.target.tp_size
            result.append(
                PairResources(
                    pair=pair.name,
                    backend=pair.target.backend,
                    target_actors=actors,
                    gpus_per_target_actor=pair.target.gpus,
                    draft_gpus=pair.draft.gpus,
                    cpus=actors + 1,
                    gpus=actors * pair.target.gpus + pair.draft.gpus,
                )
            )
        return result


def plan_sweep(spec: SweepSpec) -> Plan:
    """Expand ``spec`` into an ordered, de-duplicated :class:`Plan`.

    Order: by pair (each pair's models load once), then dataset, temperature, seed and batch
    size, with the AR baseline (at the group's batch size) first in each group that has a
    trial to measure against it; a pair's drafts follow its first (``PairSpec.drafts``: a
    lookup draft's trials share its worker pair's baseline, a further draft model has its
    own). Greedy-only policies are skipped at
    temperature > 0, a policy reading a feature only one draft kind shows for the other kinds
    (:data:`KIND_FEATURES`). In
    ``mode: replay`` each group has the live baseline, then the live check trials
    (``execution.live_check``: one or a list), then every policy trial in mode ``replay``.
    """
    job_ids: dict[str, str] = {}
    planned: dict[str, TrainingJob] = {}
    for job in _upstream_first(spec.training_jobs):
        planned[job.name] = _training_job(job, job_ids)
        job_ids[job.name] = planned[job.name].job_id
    jobs = tuple(planned[job.name] for job in _upstream_first(spec.training_jobs))
    trials: dict[str, Trial] = {}
    skipped: list[SkippedGroup] = []
    for pair in spec.pairs:
        for worker, members in _draft_members(pair, job_ids).items():
            for dataset, temperature, seed, batch_size in itertools.product(
                spec.datasets,
                spec.temperatures,
                sorted(set(spec.seeds)),
                sorted(set(spec.batch_sizes)),
            ):
                sampling = _sampling(temperature, dataset.max_new_tokens)
                groups = [
                    _TrialGroup(
                        spec,
                        worker,
                        served,
                        prompt_set(dataset),
                        sampling,
                        seed,
                        job_ids,
                        batch_size,
                    )
                    for served in members
                ]
                baseline = groups[0].baseline()
                arms = [a for g in groups for a in g.arms(pair.name, baseline.trial_id, skipped)]
                if not arms:  # nothing of this worker pair runs here: no baseline either
                    continue
                trials.setdefault(baseline.trial_id, baseline)
                for trial in arms:
                    trials.setdefault(trial.trial_id, trial)
    return Plan(
        sweep=spec.name,
        trials=tuple(trials.values()),
        jobs=jobs,
        skipped=tuple(dict.fromkeys(skipped)),
        pairs=worker_pairs(spec.pairs),
    )


def _draft_members(pair: PairSpec, job_ids: dict[str, str]) -> dict[str, list[ServedPair]]:
    """Return the served pair of each of ``pair``'s drafts by the worker pair that runs it
    (``PairSpec.worker_name``), the first draft first: one AR baseline per worker pair."""
    members: dict[str, list[ServedPair]] = {}
    for index, draft in enumerate(pair.draft_entries):
        served = _served_pair(pair.target, draft, job_ids)
        members.setdefault(pair.worker_name(index), []).append(served)
    return members


def _served_pair(target: TargetSpec, draft: DraftSpec, job_ids: dict[str, str]) -> ServedPair:
    """Return the served-pair part of a draft's trials (a job-made draft by its job's id)."""
    return ServedPair(
        target=target.model,
        backend=target.backend,
        tp_size=target.tp_size,
        dtype=target.dtype,
        trust_remote_code=target.trust_remote_code,
        draft=draft.model,
        draft_job=draft.job,
        draft_job_id=job_ids[draft.job] if draft.job else None,
        draft_trust_remote_code=draft.trust_remote_code,
        draft_kind=draft.kind,
        draft_settings=tuple(sorted(draft.kind_identity().get(draft.kind, {}).items())),
    )


def prompt_set(dataset: DatasetEntry) -> PromptSet:
    """Return the prompt-set part of ``dataset``'s trials."""
    return PromptSet(
        dataset=dataset.name,
        split=dataset.split,
        samples=dataset.samples,
        local_path=dataset.local_path,
        chat_template=dataset.chat_template,
    )


def _sampling(sampling: TemperatureSpec, max_new_tokens: int) -> SamplingConfig:
    """Return the decoding settings of a group; greedy decoding ignores top-k and top-p."""
    if sampling.temperature <= 0:
        return SamplingConfig(max_new_tokens=max_new_tokens)
    return SamplingConfig(
        float(sampling.temperature), sampling.top_k, float(sampling.top_p), max_new_tokens
    )


def _policy_applies(policy: PolicySpec, pair: str, kind: str, temperature: float) -> bool:
    """Return whether ``policy`` runs on ``pair``'s draft of ``kind`` at ``temperature`` (its
    restrictions)."""
    if policy.pairs is not None and pair not in policy.pairs:
        return False
    if policy.draft_kinds is not None and kind not in policy.draft_kinds:
        return False
    return policy.temperatures is None or temperature in policy.temperatures


def _upstream_first(jobs: tuple[TrainingJobSpec, ...]) -> list[TrainingJobSpec]:
    """Return ``jobs`` ordered so that a job whose base is ``job:NAME`` comes after NAME."""
    by_name = {job.name: job for job in jobs}
    ordered: dict[str, TrainingJobSpec] = {}

    def visit(job: TrainingJobSpec) -> None:
        upstream = job_base_reference(job.base)
        if upstream is not None and upstream not in ordered:
            visit(by_name[upstream])
        ordered.setdefault(job.name, job)

    for job in jobs:
        visit(job)
    return list(ordered.values())


def _training_job(job: TrainingJobSpec, job_ids: dict[str, str]) -> TrainingJob:
    """Return the planned job, its id hashed from everything but its name.

    A ``job:NAME`` base enters the identity as NAME's job id, so retraining the upstream job
    with other settings gives this job a new id too.
    """
    upstream = job_base_reference(job.base)
    identity = {
        "kind": job.kind,
        "base": job.base if upstream is None else f"job-id:{job_ids[upstream]}",
        "teacher": job.teacher,
        "dataset": job.dataset.model_dump(),
        "epochs": job.epochs,
        "config": job.config,
        "code_version": CODE_VERSION,
    }
    return TrainingJob(
        job_id=config_id(identity),
        name=job.name,
        kind=job.kind,
        base=job.base,
        teacher=job.teacher,
        dataset=job.dataset.name,
        split=job.dataset.split,
        samples=job.dataset.samples,
        local_path=job.dataset.local_path,
        epochs=job.epochs,
        config_json=canonical_json(job.config),
    )


def _sorted_items(settings: list[dict[str, Any]]) -> list[ParamItems]:
    """Return each parameter setting as a tuple of (name, value) pairs sorted by name."""
    return [tuple(sorted(setting.items())) for setting in settings]


@dataclass(frozen=True)
class _TrialGroup:
    """One (pair, dataset, sampling, seed, batch size) cell of the grid; builds its trials from
    its parts."""

    spec: SweepSpec
    pair: str
    served: ServedPair
    prompts: PromptSet
    sampling: SamplingConfig
    seed: int
    job_ids: dict[str, str]
    batch_size: int = 1

    @property
    def temperature(self) -> float:
        """The group's temperature (0 = greedy)."""
        return self.sampling.temperature

    @property
    def replays(self) -> bool:
        """True when this group replays trials: a replay sweep, or a mixed sweep's greedy group
        with a replayable policy. A draft model's, a lookup's and an EAGLE head's greedy
        traces replay (``policies.replay``)."""
        if self.served.draft_kind not in REPLAYABLE_KINDS:
            return False
        mode = self.spec.execution.mode
        if mode == MIXED_MODE:
            return self.temperature == 0 and any(
                p.replayable(self.batch_size) for p in self.spec.policies
            )
        return mode == REPLAY_MODE

    def _trial(
        self,
        setting: PolicySetting,
        baseline_id: str | None,
        mode: str = LIVE_MODE,
    ) -> Trial:
        """Return one trial of this group with ``setting`` (its id hashes every part)."""
        return Trial(
            sweep=self.spec.name,
            pair=self.pair,
            served=self.served,
            prompts=self.prompts,
            sampling=self.sampling,
            setting=setting,
            seed=self.seed,
            warmup_samples=self.spec.execution.warmup_samples,
            baseline_id=baseline_id,
            mode=mode,
            repeats=self.spec.execution.repeats,
            batch_size=self.batch_size,
        )

    def _setting(
        self, policy: str, params: ParamItems, max_draft_len: int, job: str | None = None
    ) -> PolicySetting:
        """Return a policy setting, a trained artifact's job by its id too."""
        job_id = self.job_ids[job] if job else None
        return PolicySetting(policy, params, max_draft_len, job, job_id)

    def baseline(self) -> Trial:
        """Return the target-only AR baseline of this group."""
        return self._trial(self._setting(BASELINE_POLICY, (), 0), None)

    def live_checks(self, baseline_id: str) -> list[Trial]:
        """Return the group's live check trials of a replaying sweep (``spec.live_checks``):
        those restricted to other draft kinds, or reading a feature this group's draft kind
        does not show, left out."""
        kind = self.served.draft_kind
        return [
            replace(
                self._trial(
                    self._setting(
                        check.policy, _sorted_items([check.settings])[0], check.max_draft_len
                    ),
                    baseline_id,
                ),
                is_check=True,
            )
            for check in self.spec.live_checks()
            if (check.draft_kinds is None or kind in check.draft_kinds)
            and self._skip_reason(check.policy) is None
        ]

    def policy_trials(self, policy: PolicySpec, baseline_id: str) -> list[Trial]:
        """Return the trials of one policy entry: parameter settings × max draft lengths."""
        mode = REPLAY_MODE if self.replays and policy.replayable(self.batch_size) else LIVE_MODE
        return [
            self._trial(self._setting(policy.name, params, length, policy.job), baseline_id, mode)
            for params in _sorted_items(policy.settings())
            for length in self.spec.policy_max_draft_lens(policy)
        ]

    def arms(self, pair: str, baseline_id: str, skipped: list[SkippedGroup]) -> list[Trial]:
        """Return this group's trials measured against ``baseline_id``: its live checks when it
        replays, then each policy entry that applies to the sweep's pair ``pair`` at this
        temperature; append to ``skipped`` the entries left out (:meth:`_skip_reason`)."""
        trials = self.live_checks(baseline_id) if self.replays else []
        for policy in self.spec.policies:
            if not _policy_applies(policy, pair, self.served.draft_kind, self.temperature):
                continue
            reason = self._skip_reason(policy.name)
            if reason is not None:
                n_trials = policy.grid_size() * len(self.spec.policy_max_draft_lens(policy))
                skipped.append(self.skip(policy.name, n_trials, reason))
                continue
            trials += self.policy_trials(policy, baseline_id)
        return trials

    def _skip_reason(self, policy: str) -> str | None:
        """Return why ``policy`` has no trials in this group (None: it has): a greedy-only
        policy above temperature 0, or a feature only another draft kind shows."""
        policy_class = POLICIES[policy]
        if policy_class.greedy_only and self.temperature > 0:
            return "greedy-only policy"
        declared = policy_class.features  # a property where the setting decides (not these)
        features = declared if isinstance(declared, frozenset) else frozenset()
        for feature, kind in KIND_FEATURES.items():
            if feature in features and self.served.draft_kind != kind:
                return (
                    f"reads {feature}, which only {kind} drafts show, not {self.served.draft_kind}"
                )
        return None

    def skip(self, policy: str, n_trials: int, reason: str) -> SkippedGroup:
        """Return the record of this group's trials of ``policy`` that are not planned."""
        return SkippedGroup(
            pair=self.pair,
            draft=self.served.draft_label,
            dataset=self.prompts.dataset,
            temperature=self.temperature,
            seed=self.seed,
            policy=policy,
            n_trials=n_trials,
            reason=f"{reason} at temperature {self.temperature:g}" + self._batch_note(),
        )

    def _batch_note(self) -> str:
        """Return ", batch size B" for a batch size other than 1 (else nothing)."""
        return "" if self.batch_size == 1 else f", batch size {self.batch_size}"


@dataclass(frozen=True)
class ReplayGroup:
    """The trials of a replay sweep that share one prompt set and so one set of traces.

    ``trials`` are the group's trials in plan order (live baselines and checks included);
    ``cap`` is the trace cap (the largest max draft length among them), ``trace_key`` the
    identity of the traces (models, prompts, output length, cap: no seed, since a greedy
    trace does not depend on it), ``fit_key`` the key the group's cost fit is stored under.
    ``pool`` holds the live trials the fit is made over: every live trial of the plan in the
    group's cost-fit pool (``trial.fit_pools``: the pair at one sampling setting across its
    datasets, or the group alone where each group runs enough checks), this group's among
    them.
    """

    fit_key: str
    trace_key: str
    cap: int
    trials: tuple[Trial, ...]
    pool: tuple[Trial, ...] = ()

    @property
    def live(self) -> tuple[Trial, ...]:
        """The trials run on the models (baselines and live checks)."""
        return tuple(trial for trial in self.trials if trial.mode == LIVE_MODE)

    @property
    def replayed(self) -> tuple[Trial, ...]:
        """The trials replayed over the traces."""
        return tuple(trial for trial in self.trials if trial.mode == REPLAY_MODE)

    @property
    def checks(self) -> tuple[Trial, ...]:
        """The live check trials (the cross-check of replay against live rounds); a mixed
        sweep's other live trials in the group are not replayable and check nothing."""
        return tuple(trial for trial in self.live if trial.is_check)

    @property
    def pool_checks(self) -> tuple[Trial, ...]:
        """The live check trials of the whole pool: each is held out of the pooled fit in turn
        for its out-of-sample error."""
        return tuple(trial for trial in self.pool if trial.is_check)


def replay_groups(plan: Plan) -> list[ReplayGroup]:
    """Return the plan's groups that hold replayed trials, in plan order (empty when live)."""
    grouped: dict[str, list[Trial]] = {}
    for trial in plan.trials:
        grouped.setdefault(fit_group_key(trial), []).append(trial)
    pools = fit_pools(plan.trials)
    groups = []
    for key, members in grouped.items():
        if not any(trial.mode == REPLAY_MODE for trial in members):
            continue
        cap = max(trial.setting.max_draft_len for trial in members)
        pool = tuple(fit_pool_of(pools, members[0]))
        groups.append(ReplayGroup(key, trace_key(members[0], cap), cap, tuple(members), pool))
    return groups
