"""Checks that run before any trial: models resolve, tokenizers agree, datasets load.

A missing model path, a draft whose tokenizer differs from the target's, a dataset that cannot
be loaded or has fewer rows than ``samples``, or an output (``max_new_tokens``) that leaves no
room for a prompt in the target's or the draft's context is reported here, all problems at
once, and nothing runs; so is an EAGLE head that does not fit its pair's target
(``orchestrator.run.eagle_checks``). What the checks load (model paths, tokenizers, context
sizes, prompts) is kept for the run. Each model loads its repository's code only when its own
``trust_remote_code`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer

from orchestrator.run.eagle_checks import eagle_pair_problems
from orchestrator.sweep.planner import Plan, prompt_set
from orchestrator.sweep.spec import (
    MAX_DRAFT_LEN_LIMIT,
    DatasetEntry,
    PairSpec,
    SweepSpec,
    format_path,
    job_base_reference,
)
from orchestrator.sweep.trial import PromptKey, Trial
from training.gguf_import import GGUFImportError
from training.zoo.refs import is_model_ref, resolve_model_ref
from workers.datasets import DatasetSpec, DatasetUnavailable, Prompt, UnknownDataset, load_prompts
from workers.prompt_format import encode_prompts, uses_chat_template

#: The fewest tokens a left-trimmed prompt keeps (``PreparedInputs.token_ids``).
MIN_PROMPT_TOKENS = 8
#: Positions a trimmed prompt leaves free beyond the output: the largest verify block
#: (``MAX_DRAFT_LEN_LIMIT`` drafts and the bonus token) and one spare.
VERIFY_RESERVE = MAX_DRAFT_LEN_LIMIT + 2
#: Config fields that hold a model's context length, in the order they are looked for.
CONTEXT_FIELDS = (
    "max_position_embeddings",
    "n_positions",
    "max_sequence_length",
    "seq_length",
    "n_ctx",
)
#: The context assumed for a model whose config names none of ``CONTEXT_FIELDS``.
DEFAULT_CONTEXT = 2048


class PreflightError(Exception):
    """The sweep cannot run; ``problems`` says why, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ModelPaths:
    """Local directories of one pair's target and draft (None: a baseline-only pair)."""

    target: Path
    draft: Path | None


@dataclass
class PreparedInputs:
    """What preflight loaded: model paths, one tokenizer and context size per pair (the smaller
    of its target's and draft's), prompts."""

    model_paths: dict[str, ModelPaths] = field(default_factory=dict)
    tokenizers: dict[str, Any] = field(default_factory=dict)
    max_positions: dict[str, int] = field(default_factory=dict)
    prompts: dict[PromptKey, list[Prompt]] = field(default_factory=dict)

    def tokenizer(self, pair: str) -> Any:
        """Return the target tokenizer of ``pair``."""
        return self.tokenizers[pair]

    def token_ids(
        self, pair: str, key: PromptKey, max_new_tokens: int, chat_template: bool | None = None
    ) -> list[list[int]]:
        """Return the prompts of ``key`` tokenized for ``pair``, left-truncated to fit.

        A prompt keeps its last tokens so that prompt + output + a draft block fit in the
        context of both models (preflight refuses outputs too long for even a short prompt).
        ``chat_template`` is the dataset's setting (see ``uses_chat_template``).
        """
        budget = max(MIN_PROMPT_TOKENS, self.max_positions[pair] - max_new_tokens - VERIFY_RESERVE)
        tokenizer = self.tokenizers[pair]
        texts = [p.text for p in self.prompts[key]]
        return encode_prompts(tokenizer, texts, budget, chat_template)


def preflight_inputs(spec: SweepSpec, plan: Plan) -> PreparedInputs:
    """Resolve and check everything the plan's trials need; raise PreflightError on problems."""
    problems: list[str] = []
    inputs = PreparedInputs()
    job_bases = _check_training_jobs(spec, problems)
    contexts: dict[str, list[ModelContext]] = {}
    for index, pair in enumerate(spec.pairs):
        for position, member in pair.worker_pairs():
            where = (f"pairs[{index}]", format_path(pair.draft_loc(position)))
            contexts[member.name] = _check_pair(where, member, job_bases, inputs, problems)
    _check_chat_templates(plan, inputs, problems)
    problems += context_problems(spec, plan, contexts)
    _load_trial_prompts(plan, inputs, problems)
    problems += row_problems(spec, inputs)
    if problems:
        raise PreflightError(problems)
    return inputs


def _check_pair(
    location: tuple[str, str],
    pair: PairSpec,
    job_bases: dict[str, tuple[str, Path | None]],
    inputs: PreparedInputs,
    problems: list[str],
) -> list[ModelContext]:
    """Resolve worker pair ``pair``'s models, load the target's tokenizer (and check the
    draft's against it) into ``inputs``; return the context of each model whose config says it.
    ``location`` is the sweep pair's field path and the draft's inside it (``draft`` or
    ``drafts[i]``)."""
    where, draft_field = location
    draft_at = f"{where}.{draft_field}"
    assert pair.draft is not None  # a worker pair has its one draft
    target = _resolve(pair.target.model, f"{where}.target.model", problems)
    draft = None
    draft_ref = pair.draft.model
    if pair.draft.job is not None:
        draft_ref, draft = job_bases[pair.draft.job]
    elif pair.draft.model is not None:
        draft = _resolve(pair.draft.model, f"{draft_at}.model", problems)
    if target is None:
        return []
    inputs.model_paths[pair.name] = ModelPaths(target, None if pair.draft.job else draft)
    trust = pair.target.trust_remote_code
    tokenizer = _load_tokenizer(target, f"{where}.target.model", problems, trust)
    if tokenizer is None:
        return []
    inputs.tokenizers[pair.name] = tokenizer
    target_config = AutoConfig.from_pretrained(target, trust_remote_code=trust)
    contexts = [_model_context("target", pair.target.model, target_config)]
    if pair.draft.kind == "eagle":
        problems += eagle_pair_problems(where, pair, draft, target, target_config, draft_at)
    elif draft is not None:
        trust = pair.draft.trust_remote_code
        draft_tokenizer = _load_tokenizer(draft, f"{draft_at}.model", problems, trust)
        if draft_tokenizer is not None and draft_tokenizer.get_vocab() != tokenizer.get_vocab():
            problems.append(
                f"{where}: the draft's tokenizer ({draft_ref}) differs from the "
                f"target's ({pair.target.model}); speculative decoding needs one vocabulary"
            )
        if draft_tokenizer is not None:
            config = AutoConfig.from_pretrained(draft, trust_remote_code=trust)
            contexts.append(_model_context("draft", str(draft_ref), config))
    known = [context.limit for context in contexts if context.field is not None]
    inputs.max_positions[pair.name] = min(known, default=DEFAULT_CONTEXT)
    return contexts


def _load_trial_prompts(plan: Plan, inputs: PreparedInputs, problems: list[str]) -> None:
    """Load the prompts of every trial's dataset into ``inputs`` (once per dataset)."""
    for trial in plan.trials:
        prompts = trial.prompts
        key = prompts.key
        if key in inputs.prompts or any(p.startswith(f"dataset {key[0]}") for p in problems):
            continue
        try:
            inputs.prompts[key] = load_prompts(
                DatasetSpec(prompts.dataset, prompts.split, prompts.samples, 0, prompts.local_path)
            )
        except (DatasetUnavailable, UnknownDataset, OSError, ValueError) as exc:
            problems.append(f"dataset {prompts.dataset}: {exc}")


@dataclass(frozen=True)
class ModelContext:
    """How many positions a pair's ``role`` model ("target" or "draft") holds, and the config
    field that says so (None: its config names none, so nothing is checked)."""

    role: str
    ref: str
    field: str | None
    limit: int


def _model_context(role: str, ref: str, config: Any) -> ModelContext:
    """Return the context of the model whose config is ``config`` (the first field of
    ``CONTEXT_FIELDS`` its ``config.json`` holds as a positive integer)."""
    values = config.to_dict()
    for name in CONTEXT_FIELDS:
        value = values.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return ModelContext(role, ref, name, value)
    return ModelContext(role, ref, None, DEFAULT_CONTEXT)


def context_problems(
    spec: SweepSpec, plan: Plan, contexts: dict[str, list[ModelContext]]
) -> list[str]:
    """Return a problem for each dataset and model of a pair whose context cannot hold the
    output, the largest verify block of the pair's trials on it and ``MIN_PROMPT_TOKENS``.

    Longer prompts are left-trimmed to fit (``PreparedInputs.token_ids``), so they are not
    problems; an output that leaves no room for a prompt is.
    """
    problems: list[str] = []
    for index, dataset in enumerate(spec.datasets):
        for pair in plan.pairs:
            drafts = [
                trial.setting.max_draft_len
                for trial in plan.trials
                if trial.pair == pair.name and _same_dataset(trial, dataset)
            ]
            if not drafts:
                continue
            for context in contexts.get(pair.name, []):
                problem = _context_problem(
                    index, dataset.max_new_tokens, max(drafts), pair.name, context
                )
                if problem is not None:
                    problems.append(problem)
    return problems


def _context_problem(
    index: int, new_tokens: int, max_draft_len: int, pair: str, context: ModelContext
) -> str | None:
    """Return the problem of ``new_tokens`` outputs with ``max_draft_len`` drafts in ``context``
    (None when they fit or the context is unknown)."""
    block = max_draft_len + 1
    needed = new_tokens + block + MIN_PROMPT_TOKENS
    if context.field is None or needed <= context.limit:
        return None
    most = context.limit - block - MIN_PROMPT_TOKENS
    fix = f"lower max_new_tokens to at most {most}" if most >= 1 else "lower max_draft_lens"
    return (
        f"datasets[{index}].max_new_tokens: {new_tokens} does not fit the context of pair "
        f"{pair}'s {context.role} {context.ref} ({context.field} = {context.limit}): "
        f"{new_tokens} new tokens + {block} for the largest verify block (max_draft_len "
        f"{max_draft_len} + 1) + at least {MIN_PROMPT_TOKENS} prompt tokens need {needed} "
        f"positions; {fix} or use a model with a longer context"
    )


def _same_dataset(trial: Trial, dataset: DatasetEntry) -> bool:
    """True when ``trial`` runs on the prompt set and output length of sweep entry ``dataset``."""
    return (trial.prompts, trial.sampling.max_new_tokens) == (
        prompt_set(dataset),
        dataset.max_new_tokens,
    )


def row_problems(spec: SweepSpec, inputs: PreparedInputs) -> list[str]:
    """Return a problem for each sweep dataset whose loaded rows are fewer than its ``samples``
    (every trial would otherwise fail on a missing prompt)."""
    problems: list[str] = []
    for index, dataset in enumerate(spec.datasets):
        key = (dataset.name, dataset.split, dataset.samples, dataset.local_path)
        rows = len(inputs.prompts.get(key, ()))
        if key not in inputs.prompts or rows >= dataset.samples:
            continue
        if dataset.local_path is not None:
            source, fix = f"the local file {dataset.local_path}", "a file with more rows"
        else:
            split = f" (split {dataset.split})" if dataset.split else ""
            source, fix = f"dataset {dataset.name}{split}", "a larger split"
        problems.append(
            f"datasets[{index}].samples: {dataset.samples} but {source} has only {rows} rows; "
            f"lower samples to {rows} or give {fix}"
        )
    return problems


def _check_chat_templates(plan: Plan, inputs: PreparedInputs, problems: list[str]) -> None:
    """Record a problem for each dataset that asks for a chat template its target lacks."""
    for trial in plan.trials:
        tokenizer = inputs.tokenizers.get(trial.pair)
        if (
            not trial.prompts.chat_template
            or tokenizer is None
            or uses_chat_template(tokenizer, None)
        ):
            continue
        problem = (
            f"dataset {trial.prompts.dataset}: chat_template is true but the target of pair "
            f"{trial.pair} ({trial.served.target}) has no chat template"
        )
        if problem not in problems:
            problems.append(problem)


def _check_training_jobs(
    spec: SweepSpec, problems: list[str]
) -> dict[str, tuple[str, Path | None]]:
    """Resolve every job's models and load its training data; return (base ref, path) by name.

    A job's base is the model its draft starts from, so a pair whose draft the job trains is
    checked against the target's tokenizer through it.
    """
    bases: dict[str, tuple[str, Path | None]] = {}
    jobs = {job.name: job for job in spec.training_jobs}
    for index, job in enumerate(spec.training_jobs):
        where = f"training_jobs[{index}]"
        if job_base_reference(job.base) is None:
            bases[job.name] = (job.base, _resolve(job.base, f"{where}.base", problems))
        if job.teacher is not None:
            _resolve(job.teacher, f"{where}.teacher", problems)
        data = job.dataset
        try:
            load_prompts(
                DatasetSpec(data.name, data.split or "train", data.samples, 0, data.local_path)
            )
        except (DatasetUnavailable, UnknownDataset, OSError, ValueError) as exc:
            problems.append(f"{where}.dataset {data.name}: {exc}")
    for job in spec.training_jobs:
        root = job
        while (upstream := job_base_reference(root.base)) is not None:
            root = jobs[upstream]
        bases[job.name] = bases[root.name]
    return bases


def resolve_model_path(ref: str) -> Path:
    """Return the local directory (or hub id as a path) of model ``ref``; build zoo models.

    Raises ValueError saying why ``ref`` cannot be used: not a model directory, or neither local
    nor reachable on the hub.
    """
    if is_model_ref(ref):
        return resolve_model_ref(ref)
    path = Path(ref).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve()
    if path.exists() or ref.startswith((".", "/", "~")):
        raise ValueError(f"{ref!r} is not a model directory (no config.json there)")
    try:
        AutoConfig.from_pretrained(ref)
    except OSError as exc:
        raise ValueError(
            f"cannot load {ref!r}: not a local directory and not reachable on the hub "
            f"({str(exc).splitlines()[0]}); download it and give its local path"
        ) from None
    return Path(ref)


def _resolve(ref: str, where: str, problems: list[str]) -> Path | None:
    """Return the local directory of model ``ref``, or record a problem naming the field."""
    try:
        return resolve_model_path(ref)
    except (ValueError, GGUFImportError) as exc:
        problems.append(f"{where}: {exc}")
        return None


def _load_tokenizer(path: Path, where: str, problems: list[str], trust: bool) -> Any:
    """Load the tokenizer at ``path`` or record a problem naming the field."""
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    except (OSError, ValueError) as exc:
        problems.append(f"{where}: cannot load a tokenizer from {path}: {exc}")
        return None
