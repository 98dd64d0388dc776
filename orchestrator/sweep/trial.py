"""A planned trial, composed of typed parts, and the projections its ids and keys hash.

A :class:`Trial` is a served pair (:class:`ServedPair`), a prompt set (:class:`PromptSet`), the
decoding settings the worker receives unchanged (``workers.records.SamplingConfig``: temperature,
top-k, top-p and the output length ``max_new_tokens``), a policy setting (:class:`PolicySetting`),
a seed and the warm-up. Each part has one ``identity()`` (what it adds to an id) and one
``columns()`` (its named values for the store); the trial id, the cost-fit group key, the trace
key and the store's trial columns are combinations of those, never a retyped field list. A
cost fit is made over a pool of groups (:func:`fit_pool_key`: the pair at one sampling
setting) and stored under each group's key.

``max_new_tokens`` lives in the sampling part, not the prompt set: the worker stops decoding by
it as it warps by the temperature, so the planner hands the worker one ``SamplingConfig`` and
the worker needs nothing else of the trial to decode a prompt.

Entries that appeared after ids were first committed (a draft's ``trust_remote_code``, a
prompt set's ``chat_template``, a non-live ``mode``) enter an identity only when they differ
from their default, so older ids are unchanged (``tests/unit/test_trial_identity.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Any

from workers.records import SamplingConfig

#: Bump when a change to the engine, workers or metrics changes what a trial measures; it is
#: part of every trial and job id, so old results are then no longer reused.
CODE_VERSION = "2"
ID_LENGTH = 16
LIVE_MODE = "live"
REPLAY_MODE = "replay"

#: The parameter reported in the store's ``threshold`` column: every threshold policy
#: (max_confidence λ, adaedl λ, svip h, specdecpp h) names its main threshold so.
THRESHOLD_PARAMETER = "threshold"

ParamItems = tuple[tuple[str, Any], ...]
#: A prompt set as the prompt caches key it: (dataset, split, samples, local path).
PromptKey = tuple[str, str | None, int, str | None]


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
class ServedPair:
    """The models of a trial and how they are served (the pair's name and placement excluded).

    ``draft`` is the draft's model ref, or None when the training job ``draft_job`` (a name;
    its id ``draft_job_id``) makes it. ``draft_kind`` is how candidates are proposed
    (``workers.proposers``: ``lm`` a draft model, ``ngram`` prompt lookup) with its
    ``draft_settings``; a kind other than ``lm`` enters every projection, the default none, so
    ids planned before draft kinds existed are unchanged.
    """

    target: str
    backend: str
    tp_size: int
    dtype: str
    trust_remote_code: bool
    draft: str | None
    draft_job: str | None = None
    draft_job_id: str | None = None
    draft_trust_remote_code: bool = False
    draft_kind: str = "lm"
    draft_settings: tuple[tuple[str, Any], ...] = ()

    def kind_identity(self) -> dict[str, Any]:
        """Return the draft kind's part of an identity: none for ``lm``, else the kind and its
        settings."""
        if self.draft_kind == "lm":
            return {}
        return {"draft_kind": self.draft_kind, self.draft_kind: dict(self.draft_settings)}

    @property
    def draft_label(self) -> str:
        """The draft as people read it: its model ref, ``job:NAME``, or the kind with its
        settings (``ngram(n_max=3,n_min=1)``)."""
        if self.draft is not None:
            return self.draft
        if self.draft_job is not None:
            return f"job:{self.draft_job}"
        settings = ",".join(f"{k}={v}" for k, v in self.draft_settings if v is not None)
        return f"{self.draft_kind}({settings})"

    def _serving(self) -> dict[str, Any]:
        """Return the entries every projection of the pair shares."""
        kind = self.kind_identity()
        return {
            "target": self.target,
            "backend": self.backend,
            "tp_size": self.tp_size,
            "dtype": self.dtype,
            "trust_remote_code": self.trust_remote_code,
            "draft": self.draft,
            **kind,
        }

    def models(self) -> dict[str, Any]:
        """Return what the models' outputs depend on: both models (a job-made draft by its job's
        id) and how the target is served."""
        return {**self._serving(), "draft_job_id": self.draft_job_id}

    def identity(self) -> dict[str, Any]:
        """Return the pair's part of a trial id: :meth:`models`, and the draft's trust flag
        when set (the trace key leaves the flag out, as it always has)."""
        trust = {"draft_trust_remote_code": True} if self.draft_trust_remote_code else {}
        return {**self.models(), **trust}

    def columns(self) -> dict[str, Any]:
        """Return the pair's named values in the store's trial record (the draft kind always,
        ``lm`` too, for the store's ``draft_kind`` column)."""
        return {**self._serving(), "draft_job": self.draft_job, "draft_kind": self.draft_kind}


@dataclass(frozen=True)
class PromptSet:
    """Which prompts a trial decodes and how they are formatted (``chat_template`` None: the
    target tokenizer's template when it has one)."""

    dataset: str
    split: str | None
    samples: int
    local_path: str | None
    chat_template: bool | None = None

    @property
    def key(self) -> PromptKey:
        """The prompt caches' key of this set (the formatting is applied per pair)."""
        return (self.dataset, self.split, self.samples, self.local_path)

    def identity(self) -> dict[str, Any]:
        """Return the prompt set's part of an id (``chat_template`` only when set)."""
        explicit = {} if self.chat_template is None else {"chat_template": self.chat_template}
        return {
            "dataset": self.dataset,
            "split": self.split,
            "samples": self.samples,
            "local_path": self.local_path,
            **explicit,
        }

    def columns(self) -> dict[str, Any]:
        """Return the prompt set's named values in the store's trial record."""
        return asdict(self)


@dataclass(frozen=True)
class PolicySetting:
    """A policy with all its parameters (defaults filled in, sorted by name), the training job
    whose artifact it loads (``job``, its id ``job_id``) and the max draft length it is built
    with (the one place the cap reaches the policy)."""

    policy: str
    params: ParamItems
    max_draft_len: int
    job: str | None = None
    job_id: str | None = None

    @property
    def params_dict(self) -> dict[str, Any]:
        """Return the parameters as a fresh dict."""
        return dict(self.params)

    @property
    def threshold(self) -> float | None:
        """The main threshold (the store's ``threshold`` column), None for a policy without."""
        value = self.params_dict.get(THRESHOLD_PARAMETER)
        return float(value) if value is not None else None

    def identity(self) -> dict[str, Any]:
        """Return the setting's part of a trial id."""
        return {
            "policy": self.policy,
            "params": self.params_dict,
            "policy_job_id": self.job_id,
            "max_draft_len": self.max_draft_len,
        }

    def columns(self) -> dict[str, Any]:
        """Return the setting's named values in the store's trial record."""
        return {
            "policy": self.policy,
            "params": self.params_dict,
            "policy_job": self.job,
            "max_draft_len": self.max_draft_len,
            "threshold": self.threshold,
        }


@dataclass(frozen=True)
class Trial:
    """One measurement: a served pair, a prompt set, sampling, a policy setting and a seed.

    ``pair`` is the pair's name (a label: not in the id). ``baseline_id`` is the id of the
    group's AR baseline (None for the baseline itself). ``is_check`` marks a replaying group's
    live check (not part of the identity). ``repeats`` is how often each prompt is decoded
    (``execution.repeats``); it enters the id and the columns only when it is not 1, so the
    ids of trials planned before repeats existed are unchanged. ``batch_size`` is how many of
    its prompts decode together (``batch_sizes``); it enters the id and the columns only when it
    is not 1, as ``repeats`` does, and the group's AR baseline runs at the same batch size.
    """

    sweep: str
    pair: str
    served: ServedPair
    prompts: PromptSet
    sampling: SamplingConfig
    setting: PolicySetting
    seed: int
    warmup_samples: int
    baseline_id: str | None
    mode: str = LIVE_MODE
    is_check: bool = False
    code_version: str = CODE_VERSION
    repeats: int = 1
    batch_size: int = 1

    def identity(self) -> dict[str, Any]:
        """Return what the trial id hashes: every part's identity, the seed, the warm-up, the
        code version, the mode when it is not ``live``, the repeats and the batch size when
        not 1."""
        mode = {} if self.mode == LIVE_MODE else {"mode": self.mode}
        return {
            **self.served.identity(),
            **self.prompts.identity(),
            **asdict(self.sampling),
            **self.setting.identity(),
            "seed": self.seed,
            "warmup_samples": self.warmup_samples,
            "code_version": self.code_version,
            **mode,
            **self._repeats(),
            **self.batch_entry(),
        }

    @cached_property
    def trial_id(self) -> str:
        """The trial's id: the short hash of :meth:`identity`."""
        return config_id(self.identity())

    @property
    def is_baseline(self) -> bool:
        """True for the group's target-only AR baseline."""
        return self.baseline_id is None

    @property
    def requires_jobs(self) -> tuple[str, ...]:
        """The names of the training jobs this trial waits for (the draft's, the policy's)."""
        return tuple(job for job in (self.served.draft_job, self.setting.job) if job is not None)

    @property
    def job_ids(self) -> tuple[str, ...]:
        """The ids of :attr:`requires_jobs`, in the same order."""
        ids = (self.served.draft_job_id, self.setting.job_id)
        return tuple(job_id for job_id in ids if job_id is not None)

    def columns(self) -> dict[str, Any]:
        """Return the trial as one flat JSON-ready mapping: the store's ``config`` and the
        values its trial columns are picked from."""
        return {
            "trial_id": self.trial_id,
            "sweep": self.sweep,
            "pair": self.pair,
            **self.served.columns(),
            **self.prompts.columns(),
            **asdict(self.sampling),
            **self.setting.columns(),
            "seed": self.seed,
            "warmup_samples": self.warmup_samples,
            "is_baseline": self.is_baseline,
            "baseline_id": self.baseline_id,
            "requires_jobs": list(self.requires_jobs),
            "job_ids": list(self.job_ids),
            "code_version": self.code_version,
            "mode": self.mode,
            "is_check": self.is_check,
            **self._repeats(),
            **self.batch_entry(),
        }

    def _repeats(self) -> dict[str, int]:
        """Return the identity and column entry of ``repeats`` (none for the default 1)."""
        return {} if self.repeats == 1 else {"repeats": self.repeats}

    def batch_entry(self) -> dict[str, int]:
        """Return the identity and column entry of ``batch_size`` (none for the default 1)."""
        return {} if self.batch_size == 1 else {"batch_size": self.batch_size}


def fit_group_identity(trial: Trial) -> dict[str, Any]:
    """Return what a cost-fit group is: the pair (by name), the draft kind when not ``lm``
    (a lookup draft shares its worker pair with the first draft but not its draft costs), the
    prompt set and the sampling.

    Seeds and policies share a group: the cost of a forward depends on neither. The batch size
    does, so it enters when it is not 1 (keys of batch-1 groups are unchanged).
    """
    return {
        "pair": trial.pair,
        **trial.served.kind_identity(),
        **trial.prompts.identity(),
        **asdict(trial.sampling),
        **trial.batch_entry(),
    }


def fit_group_key(trial: Trial) -> str:
    """Return the id of the trial's cost-fit group (:func:`fit_group_identity`): the key its
    ``cost_fits`` row is stored under (the fit in it is its pool's, :func:`fit_pool_key`)."""
    return config_id(fit_group_identity(trial))


def record_fit_group_key(record: Mapping[str, Any]) -> str:
    """Return the cost-fit group key of a stored trial from its record (``Trial.columns``, the
    store's ``config``): the key :func:`fit_group_key` gives the planned trial."""
    kind = record.get("draft_kind", "lm")
    prompts = PromptSet(**{f.name: record.get(f.name) for f in fields(PromptSet)})
    sampling = SamplingConfig(**{f.name: record[f.name] for f in fields(SamplingConfig)})
    batch_size = record.get("batch_size", 1)
    return config_id(
        {
            "pair": record["pair"],
            **({} if kind == "lm" else {"draft_kind": kind, kind: record[kind]}),
            **prompts.identity(),
            **asdict(sampling),
            **({} if batch_size == 1 else {"batch_size": batch_size}),
        }
    )


def record_baseline_work_key(record: Mapping[str, Any]) -> str:
    """Return the id of the work a stored AR baseline measures, from its record
    (``Trial.columns``): the target and how it is served, the prompt set, the sampling, the
    seed and the batch size; not the pair or its draft, so baselines of one target's worker
    pairs over the same prompts share it."""
    prompts = PromptSet(**{f.name: record.get(f.name) for f in fields(PromptSet)})
    sampling = SamplingConfig(**{f.name: record[f.name] for f in fields(SamplingConfig)})
    serving = ("target", "backend", "tp_size", "dtype", "trust_remote_code")
    return config_id(
        {
            "kind": "baseline-work",
            **{name: record.get(name) for name in serving},
            **prompts.identity(),
            **asdict(sampling),
            "seed": record.get("seed"),
            "batch_size": record.get("batch_size", 1),
        }
    )


def fit_pool_identity(trial: Trial) -> dict[str, Any]:
    """Return what a cost fit is made over: the pair (by name) and its draft kind (when not
    ``lm``: a lookup's draft costs are not a draft model's) at one sampling setting
    (temperature, top-k, top-p) and batch size (when not 1), across its datasets and output
    lengths.

    A forward's cost depends on the context it runs at, which the per-step model's context
    terms carry, not on which dataset the context came from; pooling a pair's datasets gives
    the fit every block size any of them measured (``docs/lab/replay-validation.md``: 1.1%
    out-of-sample error pooled, 2.1% per dataset).
    """
    sampling = asdict(trial.sampling)
    sampling.pop("max_new_tokens")
    return {
        "kind": "cost-fit-pool",
        "pair": trial.pair,
        **trial.served.kind_identity(),
        **sampling,
        **trial.batch_entry(),
    }


def fit_pool_key(trial: Trial) -> str:
    """Return the id of the trial's cost-fit pool (:func:`fit_pool_identity`)."""
    return config_id(fit_pool_identity(trial))


#: A pool's dataset groups are fit each on its own when every one of them runs at least this
#: many live checks: with four checks per group a group's own fit held each out at 1.7% mean
#: absolute error where the pooled fit erred by 2.5% (an entropy check's feature cost was
#: learned from the other dataset's alone); with two per group a group lacks block sizes and
#: the pooled fit is the better one (``docs/lab/replay-validation.md``; three, between them, is
#: not measured).
OWN_FIT_MIN_CHECKS = 3


def fit_pools(trials: Iterable[Trial]) -> dict[str, list[Trial]]:
    """Return the live ``trials`` by the cost fit they make, in plan order: under
    :func:`fit_pool_key` the pair's datasets pooled, or, where each dataset group of that pool
    runs at least ``OWN_FIT_MIN_CHECKS`` live checks, each group on its own under its
    :func:`fit_group_key`. :func:`fit_pool_of` finds a trial's pool."""
    pooled: dict[str, list[Trial]] = {}
    for trial in trials:
        if trial.mode == LIVE_MODE:
            pooled.setdefault(fit_pool_key(trial), []).append(trial)
    pools: dict[str, list[Trial]] = {}
    for key, members in pooled.items():
        groups: dict[str, list[Trial]] = {}
        for trial in members:
            groups.setdefault(fit_group_key(trial), []).append(trial)
        checks = [sum(trial.is_check for trial in group) for group in groups.values()]
        if len(groups) > 1 and min(checks) >= OWN_FIT_MIN_CHECKS:
            pools.update(groups)
        else:
            pools[key] = members
    return pools


def fit_pool_of(pools: Mapping[str, list[Trial]], trial: Trial) -> list[Trial]:
    """Return the live trials of ``trial``'s cost fit among ``pools`` (:func:`fit_pools`;
    empty when its pool ran none)."""
    own = pools.get(fit_group_key(trial))
    return own if own is not None else pools.get(fit_pool_key(trial), [])


def trace_key(trial: Trial, cap: int) -> str:
    """Return the id of the greedy traces ``trial``'s prompts have at ``cap``.

    Hashes what a trace depends on: both models and how the target is served, the prompt set,
    the output length, the cap and the code version (a greedy trace has no other sampling
    setting, and no seed).
    """
    return config_id(
        {
            "kind": "greedy-trace",
            **trial.served.models(),
            **trial.prompts.identity(),
            "max_new_tokens": trial.sampling.max_new_tokens,
            "cap": cap,
            "code_version": trial.code_version,
        }
    )
