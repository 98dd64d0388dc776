"""Checks that run before any trial: models resolve, tokenizers agree, datasets load.

A missing model path, a draft whose tokenizer differs from the target's, or a dataset that
cannot be loaded is reported here, all problems at once, and nothing runs. What the checks load
(model paths, tokenizers, prompts) is kept for the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer

from orchestrator.planner import Plan
from orchestrator.spec import SweepSpec, job_base_reference
from training.gguf_import import GGUFImportError
from training.zoo.refs import is_model_ref, resolve_model_ref
from workers.datasets import DatasetSpec, DatasetUnavailable, Prompt, UnknownDataset, load_prompts
from workers.prompt_format import encode_prompts, uses_chat_template

PromptKey = tuple[str, str | None, int, str | None]


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
    """What preflight loaded: model paths, one tokenizer and context size per pair, prompts."""

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
        model's context. ``chat_template`` is the dataset's setting (see ``uses_chat_template``).
        """
        budget = max(8, self.max_positions[pair] - max_new_tokens - 130)
        tokenizer = self.tokenizers[pair]
        texts = [p.text for p in self.prompts[key]]
        return encode_prompts(tokenizer, texts, budget, chat_template)


def preflight_inputs(spec: SweepSpec, plan: Plan) -> PreparedInputs:
    """Resolve and check everything the plan's trials need; raise PreflightError on problems."""
    problems: list[str] = []
    inputs = PreparedInputs()
    job_bases = _check_training_jobs(spec, problems)
    for index, pair in enumerate(spec.pairs):
        where = f"pairs[{index}]"
        target = _resolve(pair.target.model, f"{where}.target.model", problems)
        draft = None
        draft_ref = pair.draft.model
        if pair.draft.job is not None:
            draft_ref, draft = job_bases[pair.draft.job]
        elif pair.draft.model is not None:
            draft = _resolve(pair.draft.model, f"{where}.draft.model", problems)
        if target is None:
            continue
        inputs.model_paths[pair.name] = ModelPaths(target, None if pair.draft.job else draft)
        tokenizer = _load_tokenizer(
            target, f"{where}.target.model", problems, pair.target.trust_remote_code
        )
        if tokenizer is None:
            continue
        inputs.tokenizers[pair.name] = tokenizer
        config = AutoConfig.from_pretrained(target, trust_remote_code=pair.target.trust_remote_code)
        inputs.max_positions[pair.name] = int(getattr(config, "max_position_embeddings", 2048))
        if draft is not None:
            draft_tokenizer = _load_tokenizer(
                draft, f"{where}.draft.model", problems, pair.target.trust_remote_code
            )
            if draft_tokenizer is not None and draft_tokenizer.get_vocab() != tokenizer.get_vocab():
                problems.append(
                    f"{where}: the draft's tokenizer ({draft_ref}) differs from the "
                    f"target's ({pair.target.model}); speculative decoding needs one vocabulary"
                )
    _check_chat_templates(plan, inputs, problems)
    for trial in plan.trials:
        key = (trial.dataset, trial.split, trial.samples, trial.local_path)
        if key in inputs.prompts or any(p.startswith(f"dataset {key[0]}") for p in problems):
            continue
        try:
            inputs.prompts[key] = load_prompts(
                DatasetSpec(trial.dataset, trial.split, trial.samples, 0, trial.local_path)
            )
        except (DatasetUnavailable, UnknownDataset, OSError, ValueError) as exc:
            problems.append(f"dataset {trial.dataset}: {exc}")
    if problems:
        raise PreflightError(problems)
    return inputs


def _check_chat_templates(plan: Plan, inputs: PreparedInputs, problems: list[str]) -> None:
    """Record a problem for each dataset that asks for a chat template its target lacks."""
    for trial in plan.trials:
        tokenizer = inputs.tokenizers.get(trial.pair)
        if not trial.chat_template or tokenizer is None or uses_chat_template(tokenizer, None):
            continue
        problem = (
            f"dataset {trial.dataset}: chat_template is true but the target of pair "
            f"{trial.pair} ({trial.target}) has no chat template"
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
