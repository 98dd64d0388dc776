"""What the draft KD jobs (DistillSpec, AdaSPEC, EESD early exit) share.

Settings: ``TrainSettings`` (optimisation and data shape) is the base of every job's settings
dataclass; ``parse_settings`` fills one from a sweep's ``config`` mapping, naming any unknown
key, wrong type (``Literal`` fields: value outside the choices) or out-of-range value.

Data: ``kd_texts`` splits the dataset into training and held-out documents (the built-ins'
``heldout`` split, else a tail slice of the training documents); ``training_blocks`` packs the
training documents and/or continues their prompts with the teacher's greedy or sampled output
(DistillSpec's on-policy data), mixed in a given fraction and cached in the job directory so a
resumed run trains on exactly the same blocks.

Training: ``train_student`` is the one distillation loop: teacher forward, the job's per-batch
loss, AdamW, in a resumable ``StepLoop`` whose checkpoints hold model, optimiser and loss
history, so a crashed run continues to the same final weights as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import torch
from transformers import PreTrainedModel

from training.distributed import RankCheckpoints, Stepper, is_writer, stepper, writer_first
from training.job_settings import JobConfigError, check_settings, typed_setting
from training.jobs.base import (
    CHECKPOINT_DIR,
    JobConfig,
    StepLoop,
    job_prompts,
    token_blocks,
    training_texts,
)
from training.lm_trainer import (
    LOSS_WINDOW,
    TrainConfig,
    adamw_optimizer,
    greedy_continuations,
    learning_rate,
)
from training.losses import TargetDistribution, forward_kl_per_token, target_distribution
from training.realism import greedy_matches

CARD_FILE = "model_card.json"
DATA_DIR = "data"
HELDOUT_FRACTION = 0.1
GRAD_CLIP = 1.0

#: (input ids [B, L], teacher distribution over them, student logits [B, L, V]) -> scalar loss.
LossFn = Callable[[torch.Tensor, TargetDistribution, torch.Tensor], torch.Tensor]
S = TypeVar("S")


def require(condition: bool, key: str, message: str) -> None:
    """Raise ``JobConfigError`` naming setting ``key`` unless ``condition`` holds."""
    if not condition:
        raise JobConfigError(f"setting {key!r} {message}")


@dataclass(frozen=True)
class TrainSettings:
    """Settings every draft KD job accepts.

    ``lr`` is AdamW's peak learning rate (3e-4 as published for DistillSpec/AdaSPEC), decayed
    linearly to 0 with no warm-up, as the Hugging Face Trainer those papers used does.
    ``batch_size`` blocks of ``block_len`` predicted tokens per step; ``max_steps`` caps the
    optimiser steps of each training phase (None: ``config.epochs`` full epochs).
    ``prompt_tokens`` is the most prompt tokens kept before the teacher continues a prompt.
    ``eval_blocks`` held-out blocks measure KL and agreement. ``device``: ``auto`` picks CUDA
    when available.
    """

    lr: float = 3e-4
    batch_size: int = 16
    block_len: int = 128
    max_steps: int | None = None
    prompt_tokens: int = 64
    checkpoint_every: int = 10
    eval_blocks: int = 64
    device: str = "auto"

    def __post_init__(self) -> None:
        require(self.lr > 0, "lr", f"must be positive, got {self.lr}")
        require(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        require(self.block_len >= 2, "block_len", f"must be >= 2, got {self.block_len}")
        require(
            self.max_steps is None or self.max_steps >= 1,
            "max_steps",
            f"must be >= 1 or null, got {self.max_steps}",
        )
        require(
            1 <= self.prompt_tokens <= self.block_len,
            "prompt_tokens",
            f"must be in [1, block_len={self.block_len}], got {self.prompt_tokens}",
        )
        require(self.checkpoint_every >= 1, "checkpoint_every", "must be >= 1")
        require(self.eval_blocks >= 1, "eval_blocks", "must be >= 1")
        require(
            self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda"),
            "device",
            f"must be 'auto', 'cpu' or 'cuda[:n]', got {self.device!r}",
        )

    def torch_device(self) -> torch.device:
        """Return the device to train on (``auto``: CUDA if available, else CPU)."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


def parse_settings(cls: type[S], settings: Mapping[str, Any], kind: str) -> S:
    """Return the settings dataclass ``cls`` filled from ``settings``; errors name the key.

    A field's default gives its type (``typed_setting``); ``Literal`` fields accept only their
    choices; fields defaulting to None accept None or an int. Range checks live in each
    dataclass's ``__post_init__``.
    """
    declared = {spec.name: spec for spec in fields(cls)}  # type: ignore[arg-type]
    check_settings(settings, declared, kind)
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for name in settings:
        value = settings[name]
        hint = hints[name]
        if get_origin(hint) is Literal:
            choices = get_args(hint)
            if value not in choices:
                raise JobConfigError(
                    f"{kind}: setting {name!r} must be one of {list(choices)}, got {value!r}"
                )
        elif declared[name].default is None:
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise JobConfigError(
                    f"{kind}: setting {name!r} must be an int or null, got {value!r}"
                )
        else:
            value = typed_setting(settings, name, declared[name].default)
        values[name] = value
    return cls(**values)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KDTexts:
    """A job's documents: ``train`` to distil on, ``heldout`` to measure on, ``prompts`` to
    continue with the teacher (the training documents' prompt parts, same order)."""

    train: list[str]
    heldout: list[str]
    prompts: list[str]


def is_builtin_dataset(name: str) -> bool:
    """Return True for SpecSweep's generated datasets, which have a ``heldout`` split."""
    from workers.datasets import BUILTIN_DATASETS, validate_dataset_name

    return validate_dataset_name(name) in BUILTIN_DATASETS


def _dataset_prompts(config: JobConfig) -> list[str]:
    """Return the prompt texts of the documents ``training_texts(config)`` returns, in order."""
    return [prompt.text for prompt in job_prompts(config)]


def kd_texts(config: JobConfig, with_prompts: bool) -> KDTexts:
    """Return the job's training and held-out documents (and prompts when asked for).

    Built-in datasets are evaluated on their ``heldout`` split. Other datasets have no split
    the job may assume unseen, so the last ``HELDOUT_FRACTION`` of the loaded documents (at
    least one) is held out and not trained on.
    """
    documents = training_texts(config)
    prompts = _dataset_prompts(config) if with_prompts else []
    if is_builtin_dataset(config.dataset):
        heldout = training_texts(replace(config, split="heldout"))
        return KDTexts(documents, heldout, prompts)
    if len(documents) < 2:
        raise JobConfigError(
            f"{config.dataset}: need at least 2 documents to hold one out, got {len(documents)}"
        )
    tail = max(1, round(HELDOUT_FRACTION * len(documents)))
    return KDTexts(documents[:-tail], documents[-tail:], prompts[:-tail])


def prompt_ids(tokenizer: Any, prompts: Sequence[str], prompt_tokens: int) -> list[list[int]]:
    """Return each prompt's token ids cut to its first ``prompt_tokens`` (empty ones dropped)."""
    ids = [
        tokenizer(text, add_special_tokens=False)["input_ids"][:prompt_tokens] for text in prompts
    ]
    return [row for row in ids if row]


def generated_blocks(
    teacher: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    block_len: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Return [len(prompts), block_len + 1] rows: each prompt continued by the teacher.

    Greedy tokens at ``temperature`` 0 (``greedy_continuations``), else tokens sampled at that
    temperature from ``generator`` (``head_data.continue_sequences``), so the same seed draws
    the same data. Prompts of equal length are continued in batches, so no padding.
    """
    from training.jobs.head_data import continue_sequences
    from workers.records import SamplingConfig

    device = next(teacher.parameters()).device
    by_length: dict[int, list[int]] = {}
    for index, row in enumerate(prompts):
        by_length.setdefault(len(row), []).append(index)
    rows: list[torch.Tensor] = [torch.empty(0)] * len(prompts)
    sampling = SamplingConfig(temperature=temperature)
    generator = generator or torch.Generator().manual_seed(0)
    for length, indices in sorted(by_length.items()):
        batch = torch.tensor([list(prompts[i]) for i in indices], device=device)
        new_tokens = block_len + 1 - length
        if temperature > 0.0:
            continued = continue_sequences(teacher, batch, new_tokens, sampling, generator, 64)
        else:
            continued = greedy_continuations(teacher, batch, new_tokens)
        for index, row in zip(indices, continued.cpu(), strict=True):
            rows[index] = row
    return torch.stack(rows)


def mix_counts(generated: int, corpus: int, fraction: float) -> tuple[int, int]:
    """Return (g, c): how many generated and corpus blocks to train on.

    The largest g + c with g/(g + c) ≈ ``fraction``, g ≤ ``generated`` and c ≤ ``corpus``.
    """
    if fraction <= 0.0:
        return 0, corpus
    if fraction >= 1.0:
        return generated, 0
    total = math.floor(min(corpus / (1.0 - fraction), generated / fraction))
    g = min(generated, round(fraction * total))
    return g, min(corpus, total - g)


def training_blocks(
    texts: KDTexts,
    tokenizer: Any,
    teacher: PreTrainedModel,
    settings: TrainSettings,
    generated_fraction: float,
    seed: int,
    temperature: float = 0.0,
) -> torch.Tensor:
    """Return the [n, block_len + 1] blocks to distil on.

    A fraction ``generated_fraction`` of them are dataset prompts continued by the teacher
    (one block per prompt; greedy, or sampled at ``temperature``), the rest packed training
    documents; both drawn in a seeded order, samples from the same seeded generator.
    """
    corpus = (
        token_blocks(tokenizer, texts.train, settings.block_len) if generated_fraction < 1 else None
    )
    prompts = prompt_ids(tokenizer, texts.prompts, settings.prompt_tokens)
    n_corpus = 0 if corpus is None else corpus.shape[0]
    g, c = mix_counts(len(prompts), n_corpus, generated_fraction)
    if g + c == 0:
        raise JobConfigError("no training blocks: the dataset gave no prompts or no full block")
    generator = torch.Generator().manual_seed(seed)
    parts = []
    if c:
        parts.append(corpus[torch.randperm(n_corpus, generator=generator)[:c]])  # type: ignore[index]
    if g:
        chosen = torch.randperm(len(prompts), generator=generator)[:g].tolist()
        chosen_prompts = [prompts[i] for i in chosen]
        parts.append(
            generated_blocks(teacher, chosen_prompts, settings.block_len, temperature, generator)
        )
    return torch.cat(parts)


def cached_tensor(path: Path, build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Return the tensor saved at ``path``, built and saved atomically first if it is absent.

    Target-generated data costs many teacher forwards; caching it also makes a resumed run
    train on exactly the blocks the crashed one did. Under several ranks, rank 0 builds it and
    every rank reads it.
    """

    def write() -> None:
        value = build()
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        torch.save(value, temporary)
        os.replace(temporary, path)

    writer_first(path, write)
    return torch.load(path, map_location="cpu", weights_only=True)


def heldout_blocks(texts: KDTexts, tokenizer: Any, settings: TrainSettings) -> torch.Tensor:
    """Return at most ``eval_blocks`` packed held-out blocks of ``block_len + 1`` tokens."""
    return token_blocks(tokenizer, texts.heldout, settings.block_len)[: settings.eval_blocks]


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


@torch.inference_mode()
def heldout_metrics(
    teacher: PreTrainedModel, student: PreTrainedModel, blocks: torch.Tensor, batch_size: int = 8
) -> dict[str, float]:
    """Return the student's mean forward KL(teacher‖student) and greedy agreement with the
    teacher, teacher-forced over every position of ``blocks`` (what acceptance depends on)."""
    was_training = student.training
    student.eval()
    device = next(student.parameters()).device
    kl_sum, matches, positions = 0.0, 0, 0
    for start in range(0, blocks.shape[0], batch_size):
        inputs = blocks[start : start + batch_size, :-1].to(device)
        target_logits = teacher(input_ids=inputs, use_cache=False).logits
        draft_logits = student(input_ids=inputs, use_cache=False).logits
        kl_sum += forward_kl_per_token(target_logits, draft_logits).sum().item()
        matches += int(greedy_matches(target_logits, draft_logits).sum().item())
        positions += inputs.numel()
    student.train(was_training)
    return {"heldout_kl": kl_sum / positions, "heldout_agreement": matches / positions}


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """One resumable training run of a student: its name (checkpoint folder, bar label),
    epochs and peak learning rate."""

    name: str
    epochs: int
    lr: float


@dataclass(frozen=True)
class PhaseResult:
    """What a phase reports. ``first_loss`` is the loss of step 0, ``final_loss`` the mean of
    the last ``LOSS_WINDOW`` steps; ``seconds`` counts training time over all runs, of which
    ``resumed_seconds`` came from before the resume at ``resumed_from_step``."""

    first_loss: float
    final_loss: float
    steps: int
    tokens_seen: int
    resumed_from_step: int
    resumed_seconds: float
    seconds: float


class _History:
    """The part of a phase's checkpoint that is not model or optimiser: losses, rows, time."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.first_loss = math.nan
        self.rows_seen = 0
        self.before = 0.0
        self.started = time.perf_counter()

    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.started

    def state(self) -> dict[str, Any]:
        return {
            "losses": list(self.losses),
            "first_loss": self.first_loss,
            "rows_seen": self.rows_seen,
            "seconds": self.seconds(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.losses = list(state["losses"])
        self.first_loss = float(state["first_loss"])
        self.rows_seen = int(state["rows_seen"])
        self.before = float(state["seconds"])
        self.started = time.perf_counter()

    def record(self, loss: float, rows: int) -> None:
        if math.isnan(self.first_loss):
            self.first_loss = loss
        self.losses = [*self.losses[-(LOSS_WINDOW - 1) :], loss]
        self.rows_seen += rows


def phase_steps(n_blocks: int, settings: TrainSettings, epochs: int) -> int:
    """Return the optimiser steps of a phase: full epochs, capped by ``max_steps``."""
    steps = max(1, math.ceil(n_blocks / settings.batch_size)) * epochs
    return steps if settings.max_steps is None else min(steps, settings.max_steps)


@dataclass
class _Trainee:
    """What a phase checkpoints: the student, its optimiser (inside ``steps``) and history."""

    student: PreTrainedModel
    steps: Stepper
    history: _History

    def state(self) -> dict[str, Any]:
        """Return the checkpoint: model and optimiser state, then the history's fields."""
        return {
            "model": self.student.state_dict(),
            "optimizer": self.steps.optimizer_state(),
            **self.history.state(),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Put back a checkpoint ``state`` returned."""
        self.student.load_state_dict(saved["model"])
        self.steps.load_optimizer_state(saved["optimizer"])
        self.history.restore(saved)


def _phase_schedule(phase: Phase, total: int, settings: TrainSettings, seed: int) -> TrainConfig:
    """Return a phase's optimisation: ``total`` AdamW steps at ``phase.lr`` decayed linearly to
    0, no weight decay, betas (0.9, 0.999), gradient norm clipped to ``GRAD_CLIP``."""
    return TrainConfig(
        steps=total,
        batch_size=settings.batch_size,
        lr=phase.lr,
        schedule="linear",
        min_lr_ratio=0.0,
        weight_decay=0.0,
        betas=(0.9, 0.999),
        grad_clip=GRAD_CLIP,
        seed=seed,
    )


def _phase_loop(
    trainee: _Trainee,
    phase: Phase,
    n_blocks: int,
    settings: TrainSettings,
    output_dir: Path,
    seed: int,
    progress: bool,
) -> StepLoop:
    """Return a phase's resumable loop over ``n_blocks``, checkpointing ``trainee`` to
    ``output_dir/checkpoints/<phase.name>``."""
    return StepLoop(
        n_items=n_blocks,
        batch_size=settings.batch_size,
        epochs=phase.epochs,
        seed=seed,
        checkpoints=RankCheckpoints(output_dir / CHECKPOINT_DIR / phase.name),
        state_fn=trainee.state,
        restore_fn=trainee.restore,
        desc=phase.name,
        progress=progress,
        checkpoint_every=settings.checkpoint_every,
    )


def _distil(
    trainee: _Trainee,
    teacher: PreTrainedModel,
    blocks: torch.Tensor,
    loss_fn: LossFn,
    loop: StepLoop,
    schedule: TrainConfig,
    device: torch.device,
) -> None:
    """Run ``loop``'s batches up to ``schedule.steps`` on ``device``: teacher forward without
    gradients, the student's ``loss_fn`` on it, one optimiser step, its loss recorded."""
    steps = trainee.steps
    teacher.eval()
    trainee.student.train()
    for step, epoch, index in loop.batches():
        if step >= schedule.steps:
            break
        shard = steps.shard(index)
        inputs = blocks[shard.rows, :-1].to(device)
        with torch.no_grad():
            teacher_dist = target_distribution(teacher(input_ids=inputs, use_cache=False).logits)
        loss = loss_fn(inputs, teacher_dist, steps.model(input_ids=inputs, use_cache=False).logits)
        lr = learning_rate(step, schedule)
        trainee.history.record(steps.step(loss, shard, lr), index.numel())
        loop.report(epoch, trainee.history.losses[-1])


def train_student(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    blocks: torch.Tensor,
    loss_fn: LossFn,
    phase: Phase,
    settings: TrainSettings,
    output_dir: Path,
    seed: int,
    progress: bool,
) -> PhaseResult:
    """Distil ``student`` in place towards ``teacher`` on ``blocks`` with ``loss_fn``.

    Only parameters with ``requires_grad`` train (AdamW, weight decay on matrices only, betas
    (0.9, 0.999), linear decay to 0, gradient norm clipped to 1). Checkpoints go to
    ``output_dir/checkpoints/<phase.name>``; a phase that crashed resumes from its newest
    checkpoint and one that finished only restores its final state.
    """
    device = next(student.parameters()).device
    total = phase_steps(blocks.shape[0], settings, phase.epochs)
    schedule = _phase_schedule(phase, total, settings, seed)
    optimizer = adamw_optimizer(student, schedule, phase.lr)
    steps = stepper(student, optimizer, GRAD_CLIP, settings.batch_size)
    trainee = _Trainee(student, steps, _History())
    loop = _phase_loop(trainee, phase, blocks.shape[0], settings, output_dir, seed, progress)
    start = loop.resume()
    resumed_seconds = trainee.history.before
    _distil(trainee, teacher, blocks, loss_fn, loop, schedule, device)
    if start < total < loop.total_steps:
        loop.checkpoints.save(total, trainee.state())
    student.eval()
    history = trainee.history
    return PhaseResult(
        first_loss=history.first_loss,
        final_loss=sum(history.losses) / max(1, len(history.losses)),
        steps=total,
        tokens_seen=history.rows_seen * settings.block_len,
        resumed_from_step=start,
        resumed_seconds=resumed_seconds,
        seconds=history.seconds(),
    )


# ---------------------------------------------------------------------------------------------
# Artifacts
# ---------------------------------------------------------------------------------------------


def check_same_vocabulary(student: PreTrainedModel, teacher: PreTrainedModel) -> None:
    """Raise ``JobConfigError`` unless both models predict over the same vocabulary size."""
    sizes = (
        student.get_output_embeddings().weight.shape[0],
        teacher.get_output_embeddings().weight.shape[0],
    )
    if sizes[0] != sizes[1]:
        raise JobConfigError(f"draft and teacher vocabularies differ: {sizes[0]} vs {sizes[1]}")


def phase_metrics(result: PhaseResult, prefix: str = "") -> dict[str, float]:
    """Return a phase's training figures as metrics (keys prefixed with ``prefix``)."""
    return {
        f"{prefix}train_loss": result.final_loss,
        f"{prefix}train_loss_first": result.first_loss,
        f"{prefix}steps": float(result.steps),
        f"{prefix}tokens_seen": float(result.tokens_seen),
        f"{prefix}train_seconds": result.seconds,
    }


def draft_card(
    config: JobConfig, settings: TrainSettings, metrics: Mapping[str, float], **extra: Any
) -> dict[str, Any]:
    """Return the ``model_card.json`` of a KD draft: what it is, from what, how, how good."""
    return {
        "kind": config.kind,
        "name": config.name,
        "base": config.base,
        "teacher": config.teacher,
        "dataset": config.dataset,
        "split": config.split,
        "samples": config.samples,
        "epochs": config.epochs,
        "seed": config.seed,
        "settings": asdict(settings),  # type: ignore[call-overload]
        "metrics": dict(metrics),
        **extra,
    }


def save_draft(
    model: PreTrainedModel, tokenizer: Any, directory: Path, card: Mapping[str, Any]
) -> None:
    """Save ``model`` (safetensors), its tokenizer and ``card`` so ``from_pretrained`` loads it.

    The card is written last: its presence marks a complete save. Only rank 0 writes.
    """
    if not is_writer():
        return
    directory.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    (directory / CARD_FILE).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")


def read_card(directory: Path) -> dict[str, Any] | None:
    """Return the parsed ``model_card.json`` in ``directory``, or None when there is none."""
    path = directory / CARD_FILE
    return json.loads(path.read_text()) if path.is_file() else None
