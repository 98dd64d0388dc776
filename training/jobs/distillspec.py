"""DistillSpec: distil a draft LM towards its target's next-token distributions.

The draft (``config.base``) minimises a divergence (``forward_kl`` by default, ``reverse_kl`` or
``tvd``) between the target's (``config.teacher``) and its own next-token distributions at every
position of its training blocks. The blocks are the dataset's documents (``data: dataset``) or
the dataset's prompts continued by the target's greedy or, at ``sample_temperature`` > 0, sampled
output (``data: target``, DistillSpec's on-policy data). ``prepare_drafting`` and
``train_draft`` are reused by AdaSPEC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import PreTrainedModel

from training.job_settings import JobConfigError
from training.jobs.base import (
    ARTIFACT_DIR,
    JobConfig,
    JobResult,
    Stopwatch,
    load_job_model,
    load_job_tokenizer,
)
from training.jobs.draft_common import (
    DATA_DIR,
    LossFn,
    Phase,
    PhaseResult,
    TrainSettings,
    cached_tensor,
    check_same_vocabulary,
    draft_card,
    heldout_blocks,
    heldout_metrics,
    kd_texts,
    parse_settings,
    phase_metrics,
    require,
    save_draft,
    train_student,
    training_blocks,
)
from training.losses import DivergenceKind, TargetDistribution, distillation_loss

DataSource = Literal["dataset", "target"]
DATA_NOTES: dict[str, str] = {
    "dataset": "packed dataset documents (prompt + reference), teacher-forced",
    "target": "dataset prompts (first prompt_tokens tokens) continued by the teacher's greedy "
    "(sample_temperature 0) or sampled output to block_len + 1 tokens (DistillSpec's on-policy "
    "data)",
}


@dataclass(frozen=True)
class DistillSpecSettings(TrainSettings):
    """DistillSpec's settings: the divergence to minimise and the text to distil on.

    ``sample_temperature`` (``data: target`` only): 0 continues the prompts with the teacher's
    greedy tokens; above 0 samples them at that temperature, seeded by the job's seed, as
    DistillSpec's on-policy data is drawn.
    """

    divergence: DivergenceKind = "forward_kl"
    data: DataSource = "dataset"
    sample_temperature: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            math.isfinite(self.sample_temperature) and self.sample_temperature >= 0.0,
            "sample_temperature",
            f"must be a finite number >= 0, got {self.sample_temperature}",
        )
        require(
            self.sample_temperature == 0.0 or self.data == "target",
            "sample_temperature",
            "applies only to data: target (the teacher's continuations)",
        )


@dataclass
class DraftingSetup:
    """Models and data of a draft KD job: teacher and student on the training device, the
    tokenizer, training and held-out blocks [n, block_len + 1]."""

    teacher: PreTrainedModel
    student: PreTrainedModel
    tokenizer: Any
    train: torch.Tensor
    heldout: torch.Tensor


def prepare_drafting(
    config: JobConfig, settings: DistillSpecSettings, output_dir: Path, progress: bool
) -> DraftingSetup:
    """Return the loaded models and the job's blocks (training blocks cached in the job dir)."""
    if config.teacher is None:
        raise JobConfigError(f"{config.kind}: a teacher (the target model) is required")
    if config.epochs < 1:
        raise JobConfigError(f"{config.kind}: epochs must be >= 1, got {config.epochs}")
    device = settings.torch_device()
    teacher = load_job_model(config.teacher, progress).to(device)
    student = load_job_model(config.base, progress).to(device)
    check_same_vocabulary(student, teacher)
    tokenizer = load_job_tokenizer(config.base, progress)
    texts = kd_texts(config, with_prompts=settings.data == "target")
    fraction = 1.0 if settings.data == "target" else 0.0
    train = cached_tensor(
        output_dir / DATA_DIR / "train_blocks.pt",
        lambda: training_blocks(
            texts, tokenizer, teacher, settings, fraction, config.seed, settings.sample_temperature
        ),
    )
    return DraftingSetup(
        teacher, student, tokenizer, train, heldout_blocks(texts, tokenizer, settings)
    )


def divergence_loss(kind: DivergenceKind) -> LossFn:
    """Return the per-batch loss: mean divergence ``kind`` over every position."""

    def loss(
        inputs: torch.Tensor, teacher: TargetDistribution, logits: torch.Tensor
    ) -> torch.Tensor:
        return distillation_loss(kind, teacher, logits)

    return loss


def train_draft(
    student: PreTrainedModel,
    setup: DraftingSetup,
    divergence: DivergenceKind,
    phase: Phase,
    settings: TrainSettings,
    output_dir: Path,
    seed: int,
    progress: bool,
) -> PhaseResult:
    """Distil ``student`` towards ``setup.teacher`` on ``setup.train`` with ``divergence``."""
    return train_student(
        student,
        setup.teacher,
        setup.train,
        divergence_loss(divergence),
        phase,
        settings,
        output_dir,
        seed,
        progress,
    )


def prefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """Return ``metrics`` with every key prefixed."""
    return {prefix + key: value for key, value in metrics.items()}


def settings_of(config: JobConfig) -> DistillSpecSettings:
    """Return the job's parsed settings; JobConfigError names the first bad one.

    ``training.jobs.check_job_config`` calls it when a sweep is validated, so a bad setting
    stops the sweep before anything runs.
    """
    return parse_settings(DistillSpecSettings, config.settings, config.kind)


def run(config: JobConfig, output_dir: Path, progress: bool) -> JobResult:
    """Distil ``config.base`` from ``config.teacher``; save it under ``output_dir/artifact``.

    Metrics: final and first-step train loss, held-out forward KL and greedy agreement against
    the teacher after training and before it (``initial_*``), tokens seen, steps.
    """
    watch = Stopwatch()
    settings = settings_of(config)
    setup = prepare_drafting(config, settings, output_dir, progress)
    initial = heldout_metrics(setup.teacher, setup.student, setup.heldout)
    phase = Phase("draft", config.epochs, settings.lr)
    result = train_draft(
        setup.student,
        setup,
        settings.divergence,
        phase,
        settings,
        output_dir,
        config.seed,
        progress,
    )
    metrics = {
        **phase_metrics(result),
        **heldout_metrics(setup.teacher, setup.student, setup.heldout),
        **prefixed(initial, "initial_"),
    }
    card = draft_card(config, settings, metrics, data=DATA_NOTES[settings.data])
    artifact = output_dir / ARTIFACT_DIR
    save_draft(setup.student, setup.tokenizer, artifact, card)
    return JobResult(
        artifact_path=str(artifact),
        artifact_kind="draft",
        metrics=metrics,
        seconds=watch.seconds() + result.resumed_seconds,
        resumed_from_step=result.resumed_from_step,
    )
