"""Expand a validated sweep into trials and training jobs (pure; no I/O, no models).

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
seed); it keeps the draft in its identity because speedups compare against the same pair's
worker processes. Each trial carries its baseline's id.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from orchestrator.sweep.spec import (
    DatasetEntry,
    PairSpec,
    PolicySpec,
    SweepSpec,
    TemperatureSpec,
    TrainingJobSpec,
    job_base_reference,
)
from policies import POLICIES
from workers.records import BASELINE_POLICY

#: Bump when a change to the engine, workers or metrics changes what a trial measures; it is
#: part of every trial and job id, so old results are then no longer reused.
CODE_VERSION = "2"
ID_LENGTH = 16
LIVE_MODE = "live"
REPLAY_MODE = "replay"
MIXED_MODE = "mixed"

#: The parameter reported in the store's ``threshold`` column: every threshold policy
#: (max_confidence λ, adaedl λ, svip h, specdecpp h) names its main threshold so.
THRESHOLD_PARAMETER = "threshold"

ParamItems = tuple[tuple[str, Any], ...]


def canonical_json(value: Any) -> str:
    """Return JSON with sorted keys, no spaces and shortest round-trip floats.

    Exists so that equal configs hash equally whatever the key order or number spelling.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def config_id(config: dict[str, Any]) -> str:
    """Return the short sha256 of ``config``'s canonical JSON (trial and job identity)."""
    return hashlib.sha256(canonical_json(config).encode("utf-8")).hexdigest()[:ID_LENGTH]


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
class Trial:
    """One measurement: a pair, a prompt set, sampling settings, a policy setting, a cap, a seed.

    ``draft`` is the draft's model ref, or None when ``draft_job`` (a training job *name*) makes
    it; ``policy_job`` names the job whose artifact a trained-head policy loads. ``requires_jobs``
    lists the job names this trial waits for; ``job_ids`` their ids (part of the identity).
    ``is_check`` marks a replaying group's live check (not part of the identity).
    """

    trial_id: str
    sweep: str
    pair: str
    target: str
    backend: str
    tp_size: int
    dtype: str
    trust_remote_code: bool
    draft: str | None
    draft_job: str | None
    dataset: str
    split: str | None
    samples: int
    local_path: str | None
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    policy: str
    params: ParamItems
    policy_job: str | None
    max_draft_len: int
    seed: int
    warmup_samples: int
    is_baseline: bool
    baseline_id: str | None
    requires_jobs: tuple[str, ...]
    job_ids: tuple[str, ...]
    threshold: float | None
    code_version: str = CODE_VERSION
    mode: str = LIVE_MODE
    chat_template: bool | None = None
    is_check: bool = False
    # Draft kinds (issue #44): the draft's kind and its settings (``DraftSpec.kind_identity``).
    draft_kind: str = "lm"
    draft_settings: ParamItems = ()

    @property
    def params_dict(self) -> dict[str, Any]:
        """Return the policy parameters (defaults filled in) as a fresh dict."""
        return dict(self.params)

    def to_dict(self) -> dict[str, Any]:
        """Return the trial as JSON-ready plain data (params as a mapping)."""
        data = asdict(self)
        data["params"] = self.params_dict
        data["requires_jobs"] = list(self.requires_jobs)
        data["job_ids"] = list(self.job_ids)
        return data


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

    Order: by pair (each pair's models load once), then dataset, temperature and seed, with the
    AR baseline first in each group. Greedy-only policies are skipped at temperature > 0. In
    ``mode: replay`` each group has the live baseline, then the live check trial
    (``execution.live_check``), then every policy trial in mode ``replay``.
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
        for dataset, sampling, seed in itertools.product(
            spec.datasets, spec.temperatures, sorted(set(spec.seeds))
        ):
            group = _TrialGroup(spec, pair, dataset, _normalised_sampling(sampling), seed, job_ids)
            baseline = group.baseline()
            trials.setdefault(baseline.trial_id, baseline)
            if group.replays:
                check = group.live_check(baseline.trial_id)
                trials.setdefault(check.trial_id, check)
            for policy in spec.policies:
                if not _policy_applies(policy, pair.name, group.temperature):
                    continue
                if POLICIES[policy.name].greedy_only and group.temperature > 0:
                    n_trials = policy.grid_size() * len(spec.policy_max_draft_lens(policy))
                    skipped.append(group.skip(policy.name, n_trials, "greedy-only policy"))
                    continue
                for trial in group.policy_trials(policy, baseline.trial_id):
                    trials.setdefault(trial.trial_id, trial)
    return Plan(
        sweep=spec.name,
        trials=tuple(trials.values()),
        jobs=jobs,
        skipped=tuple(dict.fromkeys(skipped)),
        pairs=tuple(spec.pairs),
    )


def _normalised_sampling(sampling: TemperatureSpec) -> tuple[float, int, float]:
    """Return (temperature, top_k, top_p); greedy decoding ignores top-k and top-p."""
    if sampling.temperature <= 0:
        return 0.0, 0, 1.0
    return float(sampling.temperature), sampling.top_k, float(sampling.top_p)


def _policy_applies(policy: PolicySpec, pair: str, temperature: float) -> bool:
    """Return whether ``policy`` runs on ``pair`` at ``temperature`` (its restrictions)."""
    if policy.pairs is not None and pair not in policy.pairs:
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
    """One (pair, dataset, sampling, seed) cell of the grid; builds its trials."""

    spec: SweepSpec
    pair: PairSpec
    dataset: DatasetEntry
    sampling: tuple[float, int, float]
    seed: int
    job_ids: dict[str, str]

    @property
    def temperature(self) -> float:
        """The group's temperature (0 = greedy)."""
        return self.sampling[0]

    @property
    def replays(self) -> bool:
        """True when this group replays trials: a replay sweep, or a mixed sweep's greedy group
        with a replayable policy. A draft of another kind than ``lm`` runs live (greedy traces
        record a draft model's predictions; issue #44 leaves replaying lookups to come)."""
        if self.pair.draft.kind != "lm":
            return False
        mode = self.spec.execution.mode
        if mode == MIXED_MODE:
            return self.temperature == 0 and any(p.replayable() for p in self.spec.policies)
        return mode == REPLAY_MODE

    def _identity(self) -> dict[str, Any]:
        """Return the identity fields shared by every trial in this group."""
        target, draft = self.pair.target, self.pair.draft
        return {
            "target": target.model,
            "backend": target.backend,
            "tp_size": target.tp_size,
            "dtype": target.dtype,
            "trust_remote_code": target.trust_remote_code,
            "draft": draft.model,
            "draft_job_id": self.job_ids.get(draft.job) if draft.job else None,
            "dataset": self.dataset.name,
            "split": self.dataset.split,
            "samples": self.dataset.samples,
            "local_path": self.dataset.local_path,
            "max_new_tokens": self.dataset.max_new_tokens,
            "temperature": self.sampling[0],
            "top_k": self.sampling[1],
            "top_p": self.sampling[2],
            "seed": self.seed,
            "warmup_samples": self.spec.execution.warmup_samples,
            "code_version": CODE_VERSION,
            **_prompt_format(self.dataset.chat_template),
            **_draft_trust(draft.trust_remote_code),
            # Draft kinds (issue #44): only a non-default kind enters the identity.
            **draft.kind_identity(),
        }

    def _trial(
        self,
        policy: str,
        params: ParamItems,
        max_draft_len: int,
        baseline_id: str | None,
        policy_job: str | None,
        mode: str = LIVE_MODE,
    ) -> Trial:
        """Return one trial of this group with its id computed from the identity fields.

        The mode enters the identity only when it is not ``live``, so live trial ids are the
        same as before replay mode existed.
        """
        requires = tuple(name for name in (self.pair.draft.job, policy_job) if name is not None)
        job_ids = tuple(self.job_ids[name] for name in requires)
        identity = {
            **self._identity(),
            "policy": policy,
            "params": dict(params),
            "policy_job_id": self.job_ids[policy_job] if policy_job else None,
            "max_draft_len": max_draft_len,
        }
        if mode != LIVE_MODE:
            identity["mode"] = mode
        threshold = dict(params).get(THRESHOLD_PARAMETER)
        return Trial(
            trial_id=config_id(identity),
            sweep=self.spec.name,
            pair=self.pair.name,
            target=self.pair.target.model,
            backend=self.pair.target.backend,
            tp_size=self.pair.target.tp_size,
            dtype=self.pair.target.dtype,
            trust_remote_code=self.pair.target.trust_remote_code,
            draft=self.pair.draft.model,
            draft_job=self.pair.draft.job,
            dataset=self.dataset.name,
            split=self.dataset.split,
            samples=self.dataset.samples,
            local_path=self.dataset.local_path,
            max_new_tokens=self.dataset.max_new_tokens,
            temperature=self.sampling[0],
            top_k=self.sampling[1],
            top_p=self.sampling[2],
            policy=policy,
            params=params,
            policy_job=policy_job,
            max_draft_len=max_draft_len,
            seed=self.seed,
            warmup_samples=self.spec.execution.warmup_samples,
            is_baseline=baseline_id is None,
            baseline_id=baseline_id,
            requires_jobs=requires,
            job_ids=job_ids,
            threshold=float(threshold) if threshold is not None else None,
            mode=mode,
            chat_template=self.dataset.chat_template,
            draft_kind=self.pair.draft.kind,
            draft_settings=tuple(sorted(self.pair.draft.kind_identity().get("ngram", {}).items())),
        )

    def baseline(self) -> Trial:
        """Return the target-only AR baseline of this group."""
        return self._trial(BASELINE_POLICY, (), 0, None, None)

    def live_check(self, baseline_id: str) -> Trial:
        """Return the group's one live speculative trial of a replay sweep."""
        check = self.spec.execution.live_check
        params = _sorted_items([check.settings()])[0]
        max_draft_len = self.spec.live_check_max_draft_len()
        trial = self._trial(check.policy, params, max_draft_len, baseline_id, None)
        return replace(trial, is_check=True)

    def policy_trials(self, policy: PolicySpec, baseline_id: str) -> list[Trial]:
        """Return the trials of one policy entry: parameter settings × max draft lengths."""
        mode = REPLAY_MODE if self.replays and policy.replayable() else LIVE_MODE
        return [
            self._trial(policy.name, params, max_draft_len, baseline_id, policy.job, mode)
            for params in _sorted_items(policy.settings())
            for max_draft_len in self.spec.policy_max_draft_lens(policy)
        ]

    def skip(self, policy: str, n_trials: int, reason: str) -> SkippedGroup:
        """Return the record of this group's trials of ``policy`` that are not planned."""
        return SkippedGroup(
            pair=self.pair.name,
            dataset=self.dataset.name,
            temperature=self.temperature,
            seed=self.seed,
            policy=policy,
            n_trials=n_trials,
            reason=f"{reason} at temperature {self.temperature:g}",
        )


@dataclass(frozen=True)
class ReplayGroup:
    """The trials of a replay sweep that share one prompt set and so one set of traces.

    ``trials`` are the group's trials in plan order (live baselines and checks included);
    ``cap`` is the trace cap (the largest max draft length among them), ``trace_key`` the
    identity of the traces (models, prompts, output length, cap: no seed, since a greedy
    trace does not depend on it), ``fit_key`` the identity of the group's cost fit.
    """

    fit_key: str
    trace_key: str
    cap: int
    trials: tuple[Trial, ...]

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


def fit_group_key(trial: Trial) -> str:
    """Return the id of the trial's cost-fit group: pair, prompt set, output length, sampling.

    Seeds and policies share a group: the cost of a forward depends on neither.
    """
    return config_id(
        {
            "pair": trial.pair,
            "dataset": trial.dataset,
            "split": trial.split,
            "samples": trial.samples,
            "local_path": trial.local_path,
            "max_new_tokens": trial.max_new_tokens,
            "temperature": trial.temperature,
            "top_k": trial.top_k,
            "top_p": trial.top_p,
            **_prompt_format(trial.chat_template),
        }
    )


def _draft_trust(trust_remote_code: bool) -> dict[str, bool]:
    """Return the identity entry of a draft that runs its repository's code (none when it does
    not, so the ids of trials that existed before drafts had their own flag are unchanged)."""
    return {"draft_trust_remote_code": True} if trust_remote_code else {}


def _prompt_format(chat_template: bool | None) -> dict[str, bool]:
    """Return the identity entry of an explicit ``chat_template`` setting (none for the default).

    The default (None: the template is used when the target's tokenizer has one) adds nothing,
    so the ids of trials that existed before the setting are unchanged.
    """
    return {} if chat_template is None else {"chat_template": chat_template}


def trace_key(trial: Trial, cap: int) -> str:
    """Return the id of the greedy traces ``trial``'s prompts have at ``cap``.

    Hashes what a trace depends on: both models and how the target is served, the prompt set,
    the output length, the cap and ``CODE_VERSION``.
    """
    draft_job_id = None
    if trial.draft_job is not None:
        draft_job_id = trial.job_ids[trial.requires_jobs.index(trial.draft_job)]
    return config_id(
        {
            "kind": "greedy-trace",
            "target": trial.target,
            "backend": trial.backend,
            "tp_size": trial.tp_size,
            "dtype": trial.dtype,
            "trust_remote_code": trial.trust_remote_code,
            "draft": trial.draft,
            "draft_job_id": draft_job_id,
            "dataset": trial.dataset,
            "split": trial.split,
            "samples": trial.samples,
            "local_path": trial.local_path,
            "max_new_tokens": trial.max_new_tokens,
            "cap": cap,
            "code_version": trial.code_version,
            **_prompt_format(trial.chat_template),
        }
    )


def replay_groups(plan: Plan) -> list[ReplayGroup]:
    """Return the plan's groups that hold replayed trials, in plan order (empty when live)."""
    grouped: dict[str, list[Trial]] = {}
    for trial in plan.trials:
        grouped.setdefault(fit_group_key(trial), []).append(trial)
    groups = []
    for key, members in grouped.items():
        if not any(trial.mode == REPLAY_MODE for trial in members):
            continue
        cap = max(trial.max_draft_len for trial in members)
        groups.append(ReplayGroup(key, trace_key(members[0], cap), cap, tuple(members)))
    return groups
