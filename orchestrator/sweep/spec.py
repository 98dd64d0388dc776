"""Sweep files: the typed, validated form of ``sweeps/NAME.yaml``.

``load_sweep(path)`` parses the YAML, validates it into a frozen :class:`SweepSpec` and, on any
problem, raises :class:`SweepError` listing every problem as ``FILE:LINE: field.path: message``.
Validation is pure: it checks names (policies and their parameters, datasets, training jobs),
ranges and cross references, but loads no model; ``check_local_paths`` reports missing local
paths, and the runner's preflight checks models and tokenizers.

Shorthands: a pair's ``target``/``draft`` may be a bare model reference, a temperature a bare
number, a dataset (of the sweep or of a training job) a bare dataset name.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.sweep.yaml_lines import LocatedYaml, YamlSyntaxError, load_yaml_with_lines
from policies import POLICIES, make_policy, policy_parameters
from policies.replay import UNREPLAYABLE_FEATURES
from workers.datasets import validate_dataset_name

T = TypeVar("T")
MAX_DRAFT_LEN_LIMIT = 128
MAX_SAMPLES = 1_000_000
MAX_NEW_TOKENS_LIMIT = 100_000
MAX_TP_SIZE = 64
MAX_GPUS = 64.0
MAX_GRID_TRIALS = 100_000
#: The largest batch size a sweep may measure (``batch_sizes``).
MAX_BATCH_SIZE = 1024
ZOO_PREFIX = "zoo:"
#: A training job's ``base`` of the form ``job:NAME`` starts from another job's draft artifact.
JOB_REF_PREFIX = "job:"

#: Training-job kinds that produce a draft model (usable as a pair's ``draft: {job: ...}``).
DRAFT_JOB_KINDS = frozenset({"distillspec", "adaspec", "eesd_exit"})
#: Training-job kind that produces an EAGLE head (a ``kind: eagle`` draft's ``job``).
EAGLE_JOB_KINDS = frozenset({"eagle_head"})
#: Training-job kinds whose ``base`` is the model they train on and that need no teacher.
TEACHERLESS_JOB_KINDS = frozenset({"eesd_exit", "eagle_head"})
#: Training-job kind whose artifact each trained-head policy loads (``policies[].job``).
POLICY_JOB_KINDS = {"specdecpp": "specdecpp_head", "cali_ts": "cali_ts_predictor"}
#: Policies that cannot run without their trained artifact unless this parameter is set.
ARTIFACT_FALLBACK_PARAMETERS = {"specdecpp": "constant_logit"}

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")]
ModelRef = Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^\S(.*\S)?$")]
ParamValue = StrictBool | StrictInt | StrictFloat | StrictStr | None
JobKind = Literal[
    "distillspec", "adaspec", "specdecpp_head", "eesd_exit", "cali_ts_predictor", "eagle_head"
]


def _non_empty(items: tuple[Any, ...]) -> tuple[Any, ...]:
    """Reject an empty list (checked after the items, so their own errors come first)."""
    if not items:
        raise ValueError("must list at least one entry")
    return items


NonEmpty = Annotated[tuple[T, ...], AfterValidator(_non_empty)]


class SweepError(ValueError):
    """A sweep file is invalid; ``problems`` holds one ``FILE:LINE: field.path: message`` each."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid sweep file:\n" + "\n".join(f"  {p}" for p in self.problems))


class LocatedProblems(ValueError):
    """Problems found by a model validator, each at a field path relative to that model."""

    def __init__(self, problems: Sequence[tuple[tuple[str | int, ...], str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{format_path(loc)}: {msg}" for loc, msg in self.problems))


class _Frozen(BaseModel):
    """Base of every sweep-file model: unknown keys are errors and values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _model_ref_shorthand(value: Any) -> Any:
    """Turn a bare model reference string into ``{"model": value}``."""
    return {"model": value} if isinstance(value, str) else value


def _check_zoo_ref(ref: str | None) -> str | None:
    """Reject ``zoo:`` references without a name after the prefix."""
    if ref is not None and ref.startswith(ZOO_PREFIX) and len(ref) == len(ZOO_PREFIX):
        raise ValueError("a zoo reference needs a name, e.g. 'zoo:smol/target'")
    return ref


class TargetSpec(_Frozen):
    """The target model of a pair and how it is served."""

    model: ModelRef
    backend: Literal["hf", "deepspeed"] = "hf"
    tp_size: int = Field(1, ge=1, le=MAX_TP_SIZE)
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    gpus: float = Field(0.0, ge=0.0, le=MAX_GPUS, description="GPUs per target actor (rank)")
    trust_remote_code: bool = Field(
        False,
        description="run Python code the target's model directory or hub repository ships "
        "(transformers' trust_remote_code) for the target only; the draft has its own flag",
    )

    _zoo = field_validator("model")(_check_zoo_ref)

    @model_validator(mode="after")
    def _hf_is_one_actor(self) -> TargetSpec:
        if self.backend == "hf" and self.tp_size != 1:
            raise LocatedProblems(
                [(("tp_size",), "backend 'hf' runs one actor: tp_size must be 1")]
            )
        return self


#: The kinds of draft a pair may list (``DraftSpec.kind``).
DraftKind = Literal["lm", "ngram", "eagle"]


class DraftSpec(_Frozen):
    """The draft of a pair: a model reference or the name of a training job producing one
    (``kind: lm``, the default), n-gram prompt lookup (``kind: ngram``: no model; ``n_max``,
    ``n_min`` and ``window`` set the lookup, ``workers.proposers.ngram``), or an EAGLE feature
    head over the target (``kind: eagle``: ``model`` the head's directory or zoo reference, or
    ``job`` an ``eagle_head`` training job; ``workers.proposers.eagle``)."""

    kind: DraftKind = "lm"
    model: ModelRef | None = None
    job: Name | None = None
    gpus: float = Field(0.0, ge=0.0, le=MAX_GPUS)
    trust_remote_code: bool = Field(
        False,
        description="run Python code the draft's model directory or hub repository ships "
        "(transformers' trust_remote_code); independent of the target's flag",
    )
    n_max: int = Field(3, ge=1, description="ngram: the longest n looked up")
    n_min: int = Field(1, ge=1, description="ngram: the shortest n looked up")
    window: int | None = Field(None, ge=1, description="ngram: tokens searched back (None: all)")

    _zoo = field_validator("model")(_check_zoo_ref)

    @model_validator(mode="after")
    def _exactly_one_source(self) -> DraftSpec:
        if self.kind == "ngram":
            if self.model is not None or self.job is not None:
                raise ValueError("a draft of kind 'ngram' has no 'model' or 'job'; remove them")
            if self.n_min > self.n_max:
                raise ValueError(f"ngram draft: n_min ({self.n_min}) exceeds n_max ({self.n_max})")
            return self
        if (self.model is None) == (self.job is None):
            what = "the EAGLE head's 'model' (a directory or zoo reference)"
            if self.kind == "lm":
                what = "'model'"
            raise ValueError(f"give exactly one of {what} or 'job'")
        if (self.n_max, self.n_min, self.window) != (3, 1, None):
            raise ValueError("n_max, n_min and window apply to 'kind: ngram' drafts only")
        return self

    def kind_identity(self) -> dict[str, Any]:
        """Return the trial-identity entry of the draft's kind: none for the default ``lm``
        (so older ids are unchanged), else the kind and its settings (an EAGLE head has none
        beyond its ``model`` or ``job``, which the identity holds already)."""
        if self.kind == "lm":
            return {}
        if self.kind == "eagle":
            return {"draft_kind": self.kind, "eagle": {}}
        return {
            "draft_kind": self.kind,
            "ngram": {"n_max": self.n_max, "n_min": self.n_min, "window": self.window},
        }


class PairSpec(_Frozen):
    """A named target and its draft (``draft``) or drafts (``drafts``: the draft kind as a
    sweep axis, every draft measured against the same target).

    The planner serves each draft on its own (one ``ServedPair`` each). A draft that loads a
    model (``lm``, ``eagle``) other than the first runs on its own draft actor, as the worker
    pair :meth:`worker_name` names (``NAME~i``), with its own AR baseline; a lookup draft
    (``ngram``) loads nothing, so its arms join the first draft's worker pair and AR baseline
    (one group, arms interleaved).
    """

    name: Name
    target: TargetSpec
    draft: DraftSpec | None = None
    drafts: tuple[DraftSpec, ...] | None = Field(None, min_length=1)

    @field_validator("target", "draft", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return _model_ref_shorthand(value)

    @field_validator("drafts", mode="before")
    @classmethod
    def _list_shorthand(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [_model_ref_shorthand(item) for item in value]
        return value

    @model_validator(mode="after")
    def _one_draft_field(self) -> PairSpec:
        if self.draft is not None and self.drafts is not None:
            message = (
                "give 'draft' (one draft) or 'drafts' (a list of drafts), not both: move the "
                "'draft' entry into 'drafts'"
            )
            raise LocatedProblems([(("drafts",), message)])
        if self.draft is None and self.drafts is None:
            raise LocatedProblems([((), "needs 'draft' (one draft) or 'drafts' (a list)")])
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for index, draft in enumerate(self.draft_entries):
            if draft in self.draft_entries[:index]:
                first = self.draft_entries.index(draft)
                problems.append((("drafts", index), f"the same draft as drafts[{first}]"))
        if problems:
            raise LocatedProblems(problems)
        return self

    @property
    def draft_entries(self) -> tuple[DraftSpec, ...]:
        """The pair's drafts in order (``draft`` alone, or the ``drafts`` list)."""
        if self.drafts is not None:
            return self.drafts
        assert self.draft is not None  # the validator requires one of the two
        return (self.draft,)

    def draft_loc(self, index: int) -> tuple[str | int, ...]:
        """Return the field path of draft ``index`` inside the pair (``draft`` or
        ``drafts[index]``)."""
        return ("draft",) if self.drafts is None else ("drafts", index)

    def worker_name(self, index: int) -> str:
        """Return the name of the worker pair that runs draft ``index``: the pair's own name
        for the first draft and for every lookup draft (no model to load), else
        ``NAME~index`` (its own draft actor)."""
        if index == 0 or self.draft_entries[index].kind == "ngram":
            return self.name
        return f"{self.name}{WORKER_SEPARATOR}{index}"

    def worker_pairs(self) -> tuple[tuple[int, PairSpec], ...]:
        """Return each worker pair of this pair with the index of its draft: one pair of one
        draft per draft actor (:meth:`worker_name`); a single-draft pair is itself."""
        if self.drafts is None:
            return ((0, self),)
        names = [self.worker_name(index) for index in range(len(self.drafts))]
        return tuple(
            (index, self.model_copy(update={"name": name, "draft": draft, "drafts": None}))
            for index, (name, draft) in enumerate(zip(names, self.drafts, strict=True))
            if index == 0 or name != self.name
        )


#: Joins a pair's name and a draft's index into the worker pair of a further draft model
#: (pair names never contain it).
WORKER_SEPARATOR = "~"


def worker_pairs(pairs: Sequence[PairSpec]) -> tuple[PairSpec, ...]:
    """Return the worker pairs of ``pairs`` in order (:meth:`PairSpec.worker_pairs`): what
    the runner starts a draft actor for, and what preflight, placement and estimates count."""
    return tuple(member for pair in pairs for _, member in pair.worker_pairs())


class HoldoutSpec(_Frozen):
    """A dataset entry's split of its prompts into dev prompts (where a best setting is
    chosen) and disjoint test prompts (where it is measured): a seeded permutation of the
    prompt positions, its first round(samples · dev_fraction) dev. Analysis only: trials run
    every prompt and their ids do not depend on it (``orchestrator.analysis.holdout``)."""

    dev_fraction: float = Field(gt=0.0, lt=1.0)
    seed: int = Field(0, ge=0, le=2**63 - 1)


class _DataSource(_Frozen):
    """A dataset by name, split (None = the dataset's default) and optional local path.

    The name is stored in its canonical form (``openai/gsm8k`` becomes ``gsm8k``); a bare
    string is the name.
    """

    name: str = Field(min_length=1)
    split: str | None = None
    local_path: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _name_shorthand(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("name")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        return validate_dataset_name(value)


class DatasetEntry(_DataSource):
    """A prompt set: a dataset (name, split, local path), its size and the output length.

    ``chat_template``: give each prompt to the target as one user turn through its tokenizer's
    chat template (followed by the assistant header); None (default) does so when the tokenizer
    has a chat template, False never, True requires one. ``holdout``: dev and test prompts
    (:class:`HoldoutSpec`); None (default) chooses and measures best settings on the same
    prompts.
    """

    samples: int = Field(64, ge=1, le=MAX_SAMPLES)
    max_new_tokens: int = Field(128, ge=1, le=MAX_NEW_TOKENS_LIMIT)
    chat_template: bool | None = None
    holdout: HoldoutSpec | None = None

    @model_validator(mode="after")
    def _holdout_needs_two_prompts(self) -> DatasetEntry:
        if self.holdout is not None and self.samples < 2:
            raise LocatedProblems(
                [
                    (
                        ("holdout",),
                        f"a dev/test split needs at least 2 samples, this entry has "
                        f"{self.samples}: raise samples or remove holdout",
                    )
                ]
            )
        return self


class TemperatureSpec(_Frozen):
    """Sampling settings; temperature 0 is greedy, top_k 0 disables top-k."""

    temperature: float = Field(ge=0.0, le=100.0)
    top_k: int = Field(0, ge=0, le=10_000_000)
    top_p: float = Field(1.0, gt=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _number_shorthand(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return {"temperature": value}
        return value


class PolicySpec(_Frozen):
    """A draft-length policy with fixed parameters and a grid over others.

    ``job`` names the training job whose artifact a trained-head policy loads (SpecDec++ head,
    Cali-TS predictor). ``pairs`` restricts the policy to the named pairs (a head trained for
    one draft is meaningless on another); by default it runs on every pair. ``draft_kinds``
    restricts it to drafts of those kinds (``lm``, ``ngram``, ``eagle``: e.g. sampled arms for
    the draft model only, where a lookup's point-mass proposals rarely survive); by default,
    every kind the pair drafts with. ``temperatures``
    restricts it to those of the sweep's temperatures (e.g. a full threshold grid where greedy
    trials replay cheaply, one threshold where sampled trials run live); by default, all.
    ``max_draft_lens`` replaces the sweep's list of max draft lengths for this entry.
    """

    name: str
    params: dict[str, ParamValue] = Field(default_factory=dict)
    grid: dict[str, tuple[ParamValue, ...]] = Field(default_factory=dict)
    job: Name | None = None
    pairs: tuple[Name, ...] | None = None
    draft_kinds: tuple[DraftKind, ...] | None = Field(None, min_length=1)
    temperatures: tuple[Annotated[float, Field(ge=0.0, le=100.0)], ...] | None = None
    max_draft_lens: tuple[Annotated[int, Field(ge=1, le=MAX_DRAFT_LEN_LIMIT)], ...] | None = Field(
        None, min_length=1
    )

    @model_validator(mode="after")
    def _check_parameters(self) -> PolicySpec:
        if self.name not in POLICIES:
            known = ", ".join(sorted(POLICIES))
            raise LocatedProblems([(("name",), f"unknown policy {self.name!r}; known: {known}")])
        defaults = policy_parameters(self.name)
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for key, value in self.params.items():
            problems += _param_problems(defaults, key, value, ("params", key))
        for key, values in self.grid.items():
            if key in self.params:
                problems.append((("grid", key), "set in both 'params' and 'grid'"))
            if not values:
                problems.append((("grid", key), "a grid list must not be empty"))
            for index, value in enumerate(values):
                problems += _param_problems(defaults, key, value, ("grid", key, index))
        if not problems and self.grid_size() > MAX_GRID_TRIALS:
            problems.append((("grid",), f"expands to {self.grid_size()} settings"))
        if not problems:
            problems += self._construction_problems()
        if problems:
            raise LocatedProblems(problems)
        return self

    def _construction_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Return the policy's own objections to any parameter setting (e.g. a sigma of 0)."""
        messages: dict[str, None] = {}
        for setting in self.settings():
            try:
                make_policy(self.name, MAX_DRAFT_LEN_LIMIT, **setting)
            except (TypeError, ValueError) as error:
                messages[str(error)] = None
        problems = [(("params",), message) for message in messages]
        fallback = ARTIFACT_FALLBACK_PARAMETERS.get(self.name)
        if fallback and self.job is None and any(s[fallback] is None for s in self.settings()):
            message = f"needs a trained artifact: set 'job' or params.{fallback}"
            problems.append(((), message))
        return problems

    def grid_size(self) -> int:
        """Return how many parameter settings the grid expands to."""
        return math.prod(len(values) for values in self.grid.values())

    def replayable(self, batch_size: int = 1) -> bool:
        """True when greedy trials of this entry replay exactly at ``batch_size`` (no trained
        artifact, no setting reads hidden states, which a greedy trace does not store). A
        policy told the batch size (``batch_schedule``) replays too: the queue simulator tells
        it the rows of every round (``costs.batch_replay.batch_replayed_rounds``)."""
        return self.job is None and not _replay_problems(self.name, self.settings())

    def settings(self) -> list[dict[str, Any]]:
        """Return every full parameter setting: defaults, then fixed params, then the grid product.

        Values are coerced to their default's type, so equal settings compare (and hash) equal.
        """
        defaults = policy_parameters(self.name)
        fixed = {**defaults, **self.params}
        names = sorted(self.grid)
        settings = []
        for values in itertools.product(*(self.grid[name] for name in names)):
            merged = {**fixed, **dict(zip(names, values, strict=True))}
            settings.append(
                {key: coerce_param_value(defaults[key], v) for key, v in merged.items()}
            )
        return settings


def _param_problems(
    defaults: dict[str, Any], key: str, value: Any, loc: tuple[str | int, ...]
) -> list[tuple[tuple[str | int, ...], str]]:
    """Return the problems of one policy parameter value (empty when it is valid)."""
    if key not in defaults:
        known = ", ".join(sorted(defaults)) or "none"
        return [(loc, f"unknown parameter {key!r}; this policy takes: {known}")]
    try:
        coerce_param_value(defaults[key], value)
    except ValueError as error:
        return [(loc, str(error))]
    return []


def coerce_param_value(default: Any, value: Any) -> Any:
    """Return ``value`` converted to the type of the parameter's ``default``.

    Exists so that ``1`` and ``1.0`` name the same setting (trial ids hash the coerced value).
    Raises ValueError for a wrong type, a non-finite number, or a negative value of a parameter
    with a numeric default (thresholds, lengths, priors, sigmas: all ≥ 0). Parameters defaulting
    to None (e.g. SpecDec++'s ``constant_logit``) take any finite number.
    """
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false (got {value!r})")
        return value
    if isinstance(value, bool) and default is not None:
        raise ValueError(f"must be a {type(default).__name__} (got {value!r})")
    if isinstance(default, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ValueError(f"must be an integer (got {value!r})")
    elif isinstance(default, float):
        if not isinstance(value, int | float):
            raise ValueError(f"must be a number (got {value!r})")
        value = float(value)
    elif isinstance(default, str) and not isinstance(value, str):
        raise ValueError(f"must be a string (got {value!r})")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"must be finite (got {value!r})")
        if value < 0 and isinstance(default, int | float):
            raise ValueError(f"must be ≥ 0 (got {value!r})")
    return value


class TrainingDataSpec(_DataSource):
    """The data a training job learns from: a dataset (name, split, local path) and how many
    of its rows."""

    samples: int = Field(1000, ge=1, le=MAX_SAMPLES)


class TrainingJobSpec(_Frozen):
    """A knowledge-distillation or head-training job; ``config`` holds kind-specific settings.

    ``base`` is the model the job starts from (the draft to distil, or the target for
    ``eesd_exit`` and ``eagle_head``); ``teacher`` the target it learns from (defaults to
    ``base`` for those two).
    """

    name: Name
    kind: JobKind
    base: ModelRef
    teacher: ModelRef | None = None
    dataset: TrainingDataSpec
    epochs: int = Field(1, ge=1, le=1000)
    config: dict[str, JsonValue] = Field(default_factory=dict)

    _zoo = field_validator("base", "teacher")(_check_zoo_ref)

    @model_validator(mode="after")
    def _teacher_needed(self) -> TrainingJobSpec:
        if self.teacher is None and self.kind not in TEACHERLESS_JOB_KINDS:
            raise LocatedProblems([(("teacher",), f"kind {self.kind!r} needs a teacher model")])
        return self

    @model_validator(mode="after")
    def _known_settings(self) -> TrainingJobSpec:
        """Check ``config`` with the job kind's own settings parser (names the bad setting)."""
        from training.jobs import JobConfig, JobConfigError, check_job_config

        job = JobConfig(
            kind=self.kind,
            name=self.name,
            base=self.base,
            teacher=self.teacher,
            dataset=self.dataset.name,
            epochs=self.epochs,
            settings=self.config,
        )
        try:
            check_job_config(job)
        except JobConfigError as exc:
            raise LocatedProblems([(("config",), str(exc))]) from None
        return self


@dataclass(frozen=True)
class LiveCheck:
    """One live check as a group plans it: policy, full settings, max draft length, and the
    draft kinds it runs on (None: every kind)."""

    policy: str
    settings: dict[str, Any]
    max_draft_len: int
    draft_kinds: tuple[str, ...] | None = None


class LiveCheckSpec(_Frozen):
    """A live speculative trial per group of a replay sweep (cost fit and cross-check).

    ``max_draft_len`` None means half the sweep's largest max draft length (at least 1).
    ``draft_kinds`` restricts the check to groups whose draft is of those kinds (by default
    every kind; a policy that reads a feature only one kind shows runs on that kind only): a
    lookup's AdaEDL drafts exactly its static K's rounds (its proposals have entropy 0), so
    a lookup's second check is better a policy that does other work (``ngram_match``).
    """

    policy: str = "static"
    params: dict[str, ParamValue] = Field(default_factory=dict)
    max_draft_len: int | None = Field(None, ge=1, le=MAX_DRAFT_LEN_LIMIT)
    draft_kinds: tuple[DraftKind, ...] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _check_policy(self) -> LiveCheckSpec:
        if self.policy not in POLICIES:
            known = ", ".join(sorted(POLICIES))
            message = f"unknown policy {self.policy!r}; known: {known}"
            raise LocatedProblems([(("policy",), message)])
        defaults = policy_parameters(self.policy)
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for key, value in self.params.items():
            problems += _param_problems(defaults, key, value, ("params", key))
        if not problems:
            problems += [(("params",), m) for m in _replay_problems(self.policy, [self.settings()])]
        if problems:
            raise LocatedProblems(problems)
        return self

    def settings(self) -> dict[str, Any]:
        """Return the full parameter setting: defaults, then ``params`` (coerced)."""
        defaults = policy_parameters(self.policy)
        merged = {**defaults, **self.params}
        return {key: coerce_param_value(defaults[key], v) for key, v in merged.items()}


#: Tags of ``execution.live_check``'s two forms (one mapping, a list), dropped from error paths.
_ONE_CHECK, _CHECK_LIST = "<one check>", "<check list>"
UNION_TAGS = frozenset({_ONE_CHECK, _CHECK_LIST})


def _check_form(value: Any) -> str:
    """Return which form of ``live_check`` ``value`` is (a list, or one mapping)."""
    return _CHECK_LIST if isinstance(value, list | tuple) else _ONE_CHECK


LiveChecks = Annotated[
    Annotated[LiveCheckSpec, Tag(_ONE_CHECK)]
    | Annotated[NonEmpty[LiveCheckSpec], Tag(_CHECK_LIST)],
    Discriminator(_check_form),
]

#: The live checks of a replaying sweep that names none: the old single check first (static at
#: half the largest max draft length, its trial id unchanged), then static at the largest, an
#: entropy rule (AdaEDL) and a Thompson-sampling rule (Beta-TS) at the largest, each with its
#: default parameters. ``None`` as a max draft length means the largest here.
DEFAULT_LIVE_CHECKS: tuple[tuple[str, int | None], ...] = (
    ("static", None),
    ("adaedl", None),
    ("beta_ts", None),
)


def _replay_problems(name: str, settings: Sequence[dict[str, Any]]) -> list[str]:
    """Return why policy ``name`` with these settings cannot be replayed (empty if it can)."""
    messages: dict[str, None] = {}
    for setting in settings:
        try:
            features = make_policy(name, MAX_DRAFT_LEN_LIMIT, **setting).features
        except (TypeError, ValueError) as error:
            messages[str(error)] = None
            continue
        hidden = sorted(features & UNREPLAYABLE_FEATURES)
        if hidden:
            messages[_hidden_state_message(name, hidden)] = None
    return list(messages)


def _hidden_state_message(name: str, features: Sequence[str]) -> str:
    """Return the refusal of a policy that reads hidden states in a replay sweep."""
    return (
        f"policy {name!r} reads {', '.join(features)}, which a greedy trace does not store, so "
        "mode: replay cannot reproduce it; run it in a sweep with mode: live, or give it a "
        "constant instead of a trained artifact"
    )


class ExecutionSpec(_Frozen):
    """How the runner executes trials.

    ``mode: replay`` runs, per group, the AR baseline and the ``live_check`` trial live,
    records one greedy trace per prompt, and replays every other trial over the traces
    (``policies.replay``), timing them by the group's cost fit (greedy only).
    ``mode: mixed`` replays what replays exactly (temperature 0, policies that read no hidden
    states: :meth:`PolicySpec.replayable`) the same way and runs every other trial live, so
    one sweep holds both.

    A live trial's prompts run in shards of ``shard_prompts`` (a trial whose policy keeps
    state across requests stays one shard), spread over ``replicas`` replicas of each worker
    group (default: as many as the cluster holds, counting a group's GPUs whole so that no two
    replicas time-share a GPU, shared among the ``max_concurrent_pairs`` groups run at once, at
    most one per pending shard). Pairs with identical targets share one
    worker group (``orchestrator.sweep.target_sets``), which counts once here.

    Each new draft actor decodes untimed for ``warmup_seconds`` (default: 20 s when its worker
    group uses a GPU, else one short pass) before its first timed shard; ``warmup_samples``
    prompts of each trial are then decoded untimed on a replica's first shard of that trial.

    For each prompt, a group's AR baseline and live trials run back to back in a seeded
    balanced order (interleaved arms); ``repeats`` runs each (prompt, arm) that many times,
    the repeats stored as extra samples of the same prompt (repeat r of prompt i is sample
    r * samples + i) and summed within the prompt by the intervals.

    A shard whose worker answers no target call for ``stall_timeout_seconds`` (a hung worker)
    has its worker group replaced and is retried (``orchestrator.run.stall_watch``); it must exceed
    the longest single target call, an AR baseline request's whole decode.
    """

    retries: int = Field(2, ge=0, le=100)
    warmup_samples: int = Field(1, ge=0, le=1000)
    warmup_seconds: float | None = Field(None, ge=0.0, le=3600.0)
    record_rounds: bool = True
    max_concurrent_pairs: int = Field(1, ge=1, le=1024)
    shard_prompts: int = Field(4, ge=1, le=1_000_000)
    replicas: int | None = Field(None, ge=1, le=4096)
    mode: Literal["live", "replay", "mixed"] = "live"
    live_check: LiveChecks | None = None
    stall_timeout_seconds: float = Field(600.0, gt=0.0, le=86400.0)
    repeats: int = Field(1, ge=1, le=1000)


class DraftComparisonSpec(_Frozen):
    """Two pairs' drafts compared by the reproduction report under one policy: pair ``a``'s
    draft against pair ``b``'s (same target), each at its best setting of ``policy`` chosen on
    the dev prompts, on speed, and on acceptance at ``b``'s chosen setting."""

    a: Name
    b: Name
    policy: str = "static"


class PolicyComparisonSpec(_Frozen):
    """Two policies compared by the reproduction report: policy ``a``'s best setting against
    policy ``b``'s (each chosen on the dev prompts) in every cell that runs both."""

    a: str
    b: str


class ReportSpec(_Frozen):
    """The comparisons the reproduction report makes besides each policy against the best
    static K (``orchestrator.analysis.reproduction``): declared here, never guessed."""

    drafts: tuple[DraftComparisonSpec, ...] = ()
    policies: tuple[PolicyComparisonSpec, ...] = ()


class SweepSpec(_Frozen):
    """A whole sweep: the grid to expand (see ``orchestrator.sweep.planner``) and how to run it."""

    name: Name
    description: str = ""
    pairs: NonEmpty[PairSpec]
    datasets: NonEmpty[DatasetEntry]
    temperatures: NonEmpty[TemperatureSpec]
    policies: NonEmpty[PolicySpec]
    max_draft_lens: NonEmpty[Annotated[int, Field(ge=1, le=MAX_DRAFT_LEN_LIMIT)]]
    seeds: NonEmpty[Annotated[int, Field(ge=0, lt=2**32)]] = (0,)
    batch_sizes: NonEmpty[Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]] = (1,)
    training_jobs: tuple[TrainingJobSpec, ...] = ()
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    report: ReportSpec = Field(default_factory=ReportSpec)

    @model_validator(mode="after")
    def _cross_references(self) -> SweepSpec:
        problems = _duplicate_names("pairs", [p.name for p in self.pairs])
        problems += _duplicate_names("training_jobs", [j.name for j in self.training_jobs])
        jobs = {job.name: job for job in self.training_jobs}
        for index, pair in enumerate(self.pairs):
            for position, draft in enumerate(pair.draft_entries):
                if draft.job is not None:
                    loc = ("pairs", index, *pair.draft_loc(position), "job")
                    kinds = EAGLE_JOB_KINDS if draft.kind == "eagle" else DRAFT_JOB_KINDS
                    problems += _job_problems(jobs, draft.job, kinds, loc)
        for index, policy in enumerate(self.policies):
            needed = POLICY_JOB_KINDS.get(policy.name)
            if policy.job is not None and needed is None:
                problems.append(
                    (("policies", index, "job"), "this policy loads no trained artifact")
                )
            elif policy.job is not None and needed is not None:
                loc = ("policies", index, "job")
                problems += _job_problems(jobs, policy.job, frozenset({needed}), loc)
            problems += self._restriction_problems(index, policy)
        for index, job in enumerate(self.training_jobs):
            upstream = job_base_reference(job.base)
            if upstream is not None:
                loc = ("training_jobs", index, "base")
                problems += _job_problems(jobs, upstream, DRAFT_JOB_KINDS, loc)
        problems += _job_cycles(jobs)
        if self.execution.mode == "replay":
            problems += self._replay_problems()
        if self.execution.mode != "live":
            problems += self._record_rounds_problems()
        problems += self._batch_problems()
        problems += self._report_problems()
        problems += self._live_check_kind_problems()
        size = self.grid_size()
        if size > MAX_GRID_TRIALS:
            problems.append(((), f"the grid expands to {size} trials (limit {MAX_GRID_TRIALS})"))
        if problems:
            raise LocatedProblems(problems)
        return self

    def _restriction_problems(
        self, index: int, policy: PolicySpec
    ) -> list[tuple[tuple[str | int, ...], str]]:
        """Return the problems of a policy's ``pairs``, ``draft_kinds`` and ``temperatures``
        restrictions: each must name a pair, a draft kind, or a temperature, that the sweep has."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        pair_names = {pair.name for pair in self.pairs}
        for position, name in enumerate(policy.pairs or ()):
            if name not in pair_names:
                loc = ("policies", index, "pairs", position)
                problems.append((loc, f"no pair named {name!r} (defined: {sorted(pair_names)})"))
        problems += self._draft_kind_problems(policy.draft_kinds, ("policies", index))
        temperatures = sorted({t.temperature for t in self.temperatures})
        for position, value in enumerate(policy.temperatures or ()):
            if value not in temperatures:
                loc = ("policies", index, "temperatures", position)
                problems.append((loc, f"the sweep has no temperature {value:g} ({temperatures})"))
        return problems

    def policy_pairs(self, name: str) -> set[str]:
        """Return the names of the pairs that some ``policies[]`` entry named ``name`` runs on."""
        every = {pair.name for pair in self.pairs}
        entries = [policy for policy in self.policies if policy.name == name]
        return {pair for policy in entries for pair in (policy.pairs or every)}

    def _report_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Return the problems of ``report``: each comparison must name two different pairs of
        one target (drafts) or two different policies of the sweep, run on a common pair."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for index, draft in enumerate(self.report.drafts):
            problems += self._draft_comparison_problems(("report", "drafts", index), draft)
        for index, policy in enumerate(self.report.policies):
            problems += self._policy_comparison_problems(("report", "policies", index), policy)
        return problems

    def _policy_comparison_problems(
        self, loc: tuple[str | int, ...], policy: PolicyComparisonSpec
    ) -> list[tuple[tuple[str | int, ...], str]]:
        """Return the problems of one ``report.policies`` entry (its fields named in ``loc``)."""
        named = sorted({p.name for p in self.policies})
        problems = [
            ((*loc, side), f"no policies[] entry named {name!r} (defined: {named})")
            for side, name in (("a", policy.a), ("b", policy.b))
            if name not in named
        ]
        if problems:
            return problems
        if policy.a == policy.b:
            return [((*loc, "b"), f"compares policy {policy.a!r} with itself")]
        if not self.policy_pairs(policy.a) & self.policy_pairs(policy.b):
            message = f"no pair runs both {policy.a!r} and {policy.b!r} (policies[].pairs)"
            return [((*loc, "b"), message)]
        return []

    def _draft_comparison_problems(
        self, loc: tuple[str | int, ...], draft: DraftComparisonSpec
    ) -> list[tuple[tuple[str | int, ...], str]]:
        """Return the problems of one ``report.drafts`` entry (its fields named in ``loc``)."""
        pairs = {pair.name: pair for pair in self.pairs}
        problems = [
            ((*loc, side), f"no pair named {name!r} (defined: {sorted(pairs)})")
            for side, name in (("a", draft.a), ("b", draft.b))
            if name not in pairs
        ]
        if problems:
            return problems
        if draft.a == draft.b:
            return [((*loc, "b"), f"compares pair {draft.a!r} with itself")]
        if pairs[draft.a].target != pairs[draft.b].target:
            message = (
                f"pairs {draft.a!r} and {draft.b!r} have different targets; a draft comparison "
                "needs one target, so that only the draft differs"
            )
            return [((*loc, "b"), message)]
        if not {draft.a, draft.b} <= self.policy_pairs(draft.policy):
            message = (
                f"no policies[] entry named {draft.policy!r} runs on both pairs {draft.a!r} "
                f"and {draft.b!r}"
            )
            return [((*loc, "policy"), message)]
        return []

    def _replay_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Return what a ``mode: replay`` sweep cannot replay exactly (policies.replay)."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for index, sampling in enumerate(self.temperatures):
            if sampling.temperature > 0:
                problems.append(
                    (
                        ("temperatures", index, "temperature"),
                        f"mode: replay is exact only for greedy decoding (temperature 0), got "
                        f"{sampling.temperature:g}: under sampling the draft's tokens and the "
                        "target's acceptance draws depend on earlier rounds, so one recorded "
                        "run determines no other policy's rounds; use temperature 0 or a "
                        "sweep with mode: live",
                    )
                )
        for index, policy in enumerate(self.policies):
            if policy.job is not None:
                features = ["hidden"] if policy.name == "specdecpp" else ["hidden", "target_hidden"]
                message = _hidden_state_message(policy.name, features)
                problems.append((("policies", index, "job"), message))
                continue
            for message in _replay_problems(policy.name, policy.settings()):
                problems.append((("policies", index), message))
        return problems

    def _batch_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Return what cannot run at a batch size above 1: a deepspeed target, a draft other
        than a model, a policy whose state persists across requests (each request of a batch
        gets its own policy)."""
        batched = [size for size in self.batch_sizes if size > 1]
        if not batched:
            return []
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for index, pair in enumerate(self.pairs):
            if pair.target.backend != "hf":
                loc = ("pairs", index, "target", "backend")
                message = f"batch sizes {batched} (batch_sizes) need backend hf"
                problems.append((loc, message))
            for draft_index, draft in enumerate(pair.draft_entries):
                if draft.kind != "lm":
                    loc = ("pairs", index, *pair.draft_loc(draft_index), "kind")
                    message = f"batch sizes {batched} (batch_sizes) need a draft model (kind lm)"
                    problems.append((loc, message))
        for index, policy in enumerate(self.policies):
            if any(setting.get("persist_across_requests") for setting in policy.settings()):
                message = (
                    f"batch sizes {batched} (batch_sizes) give each request its own policy, so "
                    "persist_across_requests must be false"
                )
                problems.append((("policies", index), message))
        return problems

    def _record_rounds_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Return the refusal of a replaying sweep that would not store rounds."""
        if self.execution.record_rounds:
            return []
        message = (
            f"mode: {self.execution.mode} fits its cost model on the stored rounds of the live "
            "trials; set record_rounds: true"
        )
        return [(("execution", "record_rounds"), message)]

    def live_check_max_draft_len(self, check: LiveCheckSpec | None = None) -> int:
        """Return a live check's max draft length (default: half the largest, ≥ 1)."""
        chosen = (check or LiveCheckSpec()).max_draft_len
        return chosen if chosen is not None else max(1, max(self.max_draft_lens) // 2)

    def live_checks(self) -> tuple[LiveCheck, ...]:
        """Return each live check of a replaying group: policy, full settings, max draft length
        and the draft kinds it is restricted to (None: every kind).

        ``execution.live_check`` as one mapping gives one check, as a list one per entry; left
        out, the checks are the old single one followed by ``DEFAULT_LIVE_CHECKS``.
        """
        chosen = self.execution.live_check
        if chosen is None:
            first = LiveCheckSpec()
            largest = max(self.max_draft_lens)
            rest = [
                LiveCheck(name, LiveCheckSpec(policy=name).settings(), largest)
                for name, _ in DEFAULT_LIVE_CHECKS
            ]
            return (
                LiveCheck(first.policy, first.settings(), self.live_check_max_draft_len()),
                *rest,
            )
        listed = chosen if isinstance(chosen, tuple) else (chosen,)
        return tuple(
            LiveCheck(
                check.policy,
                check.settings(),
                self.live_check_max_draft_len(check),
                check.draft_kinds,
            )
            for check in listed
        )

    def _live_check_kind_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Return the problems of the live checks' ``draft_kinds``: each must be a kind the
        sweep's pairs draft with."""
        chosen = self.execution.live_check
        listed = () if chosen is None else chosen if isinstance(chosen, tuple) else (chosen,)
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for index, check in enumerate(listed):
            where = (index,) if isinstance(chosen, tuple) else ()
            problems += self._draft_kind_problems(
                check.draft_kinds, ("execution", "live_check", *where)
            )
        return problems

    def _draft_kind_problems(
        self, named: Sequence[str] | None, loc: tuple[str | int, ...]
    ) -> list[tuple[tuple[str | int, ...], str]]:
        """Return a problem at ``loc`` + ``("draft_kinds", position)`` for each of the
        ``named`` draft kinds that no pair of the sweep drafts with."""
        kinds = sorted({draft.kind for pair in self.pairs for draft in pair.draft_entries})
        message = "no draft of kind {!r} in the sweep's pairs ({})"
        return [
            ((*loc, "draft_kinds", position), message.format(kind, kinds))
            for position, kind in enumerate(named or ())
            if kind not in kinds
        ]

    def policy_max_draft_lens(self, policy: PolicySpec) -> tuple[int, ...]:
        """Return the distinct max draft lengths of one policy entry, ascending (its own list,
        else the sweep's)."""
        return tuple(sorted(set(policy.max_draft_lens or self.max_draft_lens)))

    def grid_size(self) -> int:
        """Return an upper bound on the number of policy trials (before de-duplication)."""
        settings = sum(
            policy.grid_size() * len(self.policy_max_draft_lens(policy)) for policy in self.policies
        )
        return (
            sum(len(pair.draft_entries) for pair in self.pairs)
            * len(self.datasets)
            * len(self.temperatures)
            * settings
            * len(self.seeds)
            * len(self.batch_sizes)
        )


def job_base_reference(base: str) -> str | None:
    """Return the job name of a ``job:NAME`` base, or None for a model reference."""
    return base[len(JOB_REF_PREFIX) :] if base.startswith(JOB_REF_PREFIX) else None


def _job_cycles(jobs: dict[str, TrainingJobSpec]) -> list[tuple[tuple[str | int, ...], str]]:
    """Return a problem for each job whose ``job:`` base chain leads back to itself."""
    order = list(jobs)
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for name in order:
        seen = [name]
        current = job_base_reference(jobs[name].base)
        while current is not None and current in jobs and current not in seen:
            seen.append(current)
            current = job_base_reference(jobs[current].base)
        if current == name:
            chain = " -> ".join([*seen, name])
            problems.append((("training_jobs", order.index(name), "base"), f"cycle: {chain}"))
    return problems


def _duplicate_names(field: str, names: list[str]) -> list[tuple[tuple[str | int, ...], str]]:
    """Return a problem for each name used a second time in list ``field``."""
    seen: set[str] = set()
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for index, name in enumerate(names):
        if name in seen:
            problems.append(((field, index, "name"), f"duplicate name {name!r}"))
        seen.add(name)
    return problems


def _job_problems(
    jobs: dict[str, TrainingJobSpec],
    name: str,
    kinds: frozenset[str],
    loc: tuple[str | int, ...],
) -> list[tuple[tuple[str | int, ...], str]]:
    """Return a problem if ``name`` is not a training job of one of ``kinds``."""
    if name not in jobs:
        known = ", ".join(sorted(jobs)) or "none"
        return [(loc, f"no training job named {name!r} (defined: {known})")]
    if jobs[name].kind not in kinds:
        wanted = " or ".join(sorted(kinds))
        return [(loc, f"job {name!r} is a {jobs[name].kind} job; this needs {wanted}")]
    return []


def format_path(loc: Sequence[str | int]) -> str:
    """Return a field path such as ``pairs[0].target.tp_size`` (``(root)`` for the top)."""
    text = ""
    for element in loc:
        text += f"[{element}]" if isinstance(element, int) else f".{element}"
    return text.lstrip(".") or "(root)"


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file; raises SweepError naming file, line and field per problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SweepError([f"{path}: cannot read: {error.strerror or error}"]) from error
    return parse_sweep(text, str(path))


def parse_sweep(text: str, filename: str = "<sweep>") -> SweepSpec:
    """Validate sweep YAML text (``filename`` only labels messages); raises SweepError."""
    try:
        located = load_yaml_with_lines(text)
    except YamlSyntaxError as error:
        raise SweepError([f"{filename}:{error.line}: (yaml): {error.message}"]) from error
    if not isinstance(located.data, dict):
        raise SweepError([f"{filename}:1: (root): a sweep file must be a YAML mapping"])
    try:
        return SweepSpec.model_validate(located.data)
    except ValidationError as error:
        raise SweepError(_located_messages(error, located, filename)) from None


def _located_messages(error: ValidationError, located: LocatedYaml, filename: str) -> list[str]:
    """Turn pydantic errors (and LocatedProblems inside them) into ``FILE:LINE: path: msg``."""
    messages: list[tuple[int, str]] = []
    for item in error.errors():
        loc = tuple(part for part in item["loc"] if part not in UNION_TAGS)
        cause = (item.get("ctx") or {}).get("error")
        if isinstance(cause, LocatedProblems):
            entries = [((*loc, *sub_loc), msg) for sub_loc, msg in cause.problems]
        else:
            entries = [(loc, _clean_message(item["msg"]))]
        for entry_loc, msg in entries:
            line = located.line_of(entry_loc)
            messages.append((line, f"{filename}:{line}: {format_path(entry_loc)}: {msg}"))
    return [text for _, text in sorted(messages, key=lambda pair: pair[0])]


def _clean_message(message: str) -> str:
    """Drop pydantic's ``Value error, `` prefix from messages raised by our validators."""
    return message.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def check_local_paths(spec: SweepSpec) -> list[str]:
    """Return one message per non-``zoo:`` reference that looks like a local path but is missing.

    A reference looks local when it is absolute or starts with ``.``/``~``; ``org/name`` is taken
    for a hub id unless it exists on disk. Dataset ``local_path`` values must always exist.
    """
    problems: list[str] = []
    for index, pair in enumerate(spec.pairs):
        refs = [("target.model", pair.target.model)]
        for position, draft in enumerate(pair.draft_entries):
            refs.append((format_path((*pair.draft_loc(position), "model")), draft.model))
        for field, ref in refs:
            if ref is not None and _missing_local_path(ref):
                problems.append(f"pairs[{index}].{field}: local path {ref!r} does not exist")
    for index, job in enumerate(spec.training_jobs):
        for field, ref in (("base", job.base), ("teacher", job.teacher)):
            if ref is not None and _missing_local_path(ref):
                problems.append(
                    f"training_jobs[{index}].{field}: local path {ref!r} does not exist"
                )
        local = job.dataset.local_path
        if local is not None and not Path(local).expanduser().exists():
            problems.append(f"training_jobs[{index}].dataset.local_path: {local!r} does not exist")
    for index, dataset in enumerate(spec.datasets):
        local = dataset.local_path
        if local is not None and not Path(local).expanduser().exists():
            problems.append(f"datasets[{index}].local_path: {local!r} does not exist")
    return problems


def _missing_local_path(ref: str) -> bool:
    """True when ``ref`` is written like a filesystem path and nothing exists there."""
    if ref.startswith(ZOO_PREFIX):
        return False
    looks_local = ref.startswith(("/", ".", "~")) or "\\" in ref
    return looks_local and not Path(ref).expanduser().exists()
