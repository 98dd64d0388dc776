"""AdaSPEC: selective distillation of a draft on the tokens it can learn.

1. A reference model R, a copy of the draft, is distilled from the target with forward KL on
   the same blocks (DistillSpec's ``train_draft``) for ``reference_epochs`` (default: the job's
   epochs). It is saved under ``output_dir/reference``.
2. The draft, starting again from ``config.base``, gets the same training budget as a
   DistillSpec draft (``config.epochs``, ``max_steps``). At every batch the current draft's
   per-token divergence D(P‖Q) and the reference's D(P‖R) give Δ = D(P‖Q) − D(P‖R); the
   ``keep_fraction`` k of the batch's tokens with the largest Δ (the ones the draft lags on but
   a model of its size can learn) are kept, and the loss is Σ_kept D(P‖Q) / (k·|y|).

Reading of "learning rate scaled linearly with the kept fraction": the draft's peak learning
rate is ``lr · k / 1.0`` (linear scaling against full-token distillation, k = 1, since each step
trains on k·|y| tokens); the reference, which trains on every token, uses ``lr``. D is forward
KL as published; the ``divergence`` setting swaps it for reverse KL or TVD in Δ and the draft's
loss (the reference is always distilled with forward KL).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from training.jobs.base import ARTIFACT_DIR, JobConfig, JobResult, Stopwatch, load_job_model
from training.jobs.distillspec import (
    DATA_NOTES,
    DistillSpecSettings,
    DraftingSetup,
    prefixed,
    prepare_drafting,
    train_draft,
)
from training.jobs.draft_common import (
    LossFn,
    Phase,
    PhaseResult,
    draft_card,
    heldout_metrics,
    parse_settings,
    phase_metrics,
    read_card,
    require,
    save_draft,
    train_student,
)
from training.losses import PER_TOKEN_DIVERGENCES, DivergenceKind, TargetDistribution

REFERENCE_DIR = "reference"


@dataclass(frozen=True)
class AdaSpecSettings(DistillSpecSettings):
    """DistillSpec's settings plus the kept token fraction k and the reference's epochs."""

    keep_fraction: float = 0.4
    reference_epochs: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            0.0 < self.keep_fraction <= 1.0,
            "keep_fraction",
            f"must be in (0, 1], got {self.keep_fraction}",
        )
        require(
            self.reference_epochs is None or self.reference_epochs >= 1,
            "reference_epochs",
            f"must be >= 1 or null, got {self.reference_epochs}",
        )


def kept_count(n_tokens: int, keep_fraction: float) -> int:
    """Return how many of ``n_tokens`` tokens AdaSPEC keeps: k·n rounded half up, at least 1
    (when there is a token), at most n."""
    if n_tokens == 0:
        return 0
    return min(n_tokens, max(1, math.floor(keep_fraction * n_tokens + 0.5)))


def adaspec_token_mask(
    delta: torch.Tensor, keep_fraction: float, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Return a bool mask (shape of ``delta``) of the ``kept_count`` valid tokens with the
    largest Δ; tokens where ``valid`` is False are never kept and do not count in n."""
    flat = delta.detach().flatten().float()
    if valid is None:
        candidates = flat
        n_valid = flat.numel()
    else:
        keep_valid = valid.flatten().bool()
        candidates = torch.where(keep_valid, flat, torch.full_like(flat, -math.inf))
        n_valid = int(keep_valid.sum().item())
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[torch.topk(candidates, kept_count(n_valid, keep_fraction)).indices] = True
    return mask.view(delta.shape)


def adaspec_loss(
    draft_per_token: torch.Tensor,
    delta: torch.Tensor,
    keep_fraction: float,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Return Σ over kept tokens of ``draft_per_token`` divided by k·|y| (|y|: valid tokens)."""
    mask = adaspec_token_mask(delta, keep_fraction, valid)
    n_tokens = draft_per_token.numel() if valid is None else int(valid.sum().item())
    return (draft_per_token * mask).sum() / (keep_fraction * max(1, n_tokens))


def draft_learning_rate(lr: float, keep_fraction: float) -> float:
    """Return the draft's peak learning rate: ``lr`` scaled linearly with k (k = 1: ``lr``)."""
    return lr * keep_fraction / 1.0


def selective_loss(
    reference: PreTrainedModel, divergence: DivergenceKind, keep_fraction: float
) -> LossFn:
    """Return AdaSPEC's per-batch loss: Δ from the current draft and ``reference``, then the
    draft's divergence on the top-k tokens by Δ."""
    per_token = PER_TOKEN_DIVERGENCES[divergence]
    reference.eval()

    def loss(
        inputs: torch.Tensor, teacher: TargetDistribution, logits: torch.Tensor
    ) -> torch.Tensor:
        draft = per_token(teacher, logits)
        with torch.no_grad():
            ref = per_token(teacher, reference(input_ids=inputs, use_cache=False).logits)
        return adaspec_loss(draft, draft.detach() - ref, keep_fraction)

    return loss


@dataclass(frozen=True)
class Reference:
    """The distilled reference, its metrics, and the training seconds and resume step of the
    run that produced it (0 and the saved run's seconds when it was loaded from disk)."""

    model: PreTrainedModel
    metrics: dict[str, float]
    earlier_seconds: float
    resumed_from_step: int


def reference_model(
    config: JobConfig,
    settings: AdaSpecSettings,
    setup: DraftingSetup,
    output_dir: Path,
    progress: bool,
) -> Reference:
    """Return the reference R: loaded from ``output_dir/reference`` when an earlier run saved
    it, else a copy of the untrained draft distilled with forward KL (then saved there)."""
    directory = output_dir / REFERENCE_DIR
    card = read_card(directory)
    if card is not None:
        model = load_job_model(str(directory)).to(settings.torch_device())
        return Reference(model, card["metrics"], card["metrics"]["train_seconds"], 0)
    model = copy.deepcopy(setup.student)
    epochs = settings.reference_epochs or config.epochs
    phase = Phase(REFERENCE_DIR, epochs, settings.lr)
    result: PhaseResult = train_draft(
        model, setup, "forward_kl", phase, settings, output_dir, config.seed, progress
    )
    metrics = {**phase_metrics(result), **heldout_metrics(setup.teacher, model, setup.heldout)}
    card = draft_card(
        config,
        settings,
        metrics,
        role="AdaSPEC reference: the draft distilled with forward KL on every token",
        reference_epochs=epochs,
    )
    save_draft(model, setup.tokenizer, directory, card)
    return Reference(model, metrics, result.resumed_seconds, result.resumed_from_step)


def settings_of(config: JobConfig) -> AdaSpecSettings:
    """Return the job's parsed settings; JobConfigError names the first bad one.

    ``training.jobs.check_job_config`` calls it when a sweep is validated, so a bad setting
    stops the sweep before anything runs.
    """
    return parse_settings(AdaSpecSettings, config.settings, config.kind)


def run(config: JobConfig, output_dir: Path, progress: bool) -> JobResult:
    """Train the reference, then the draft on its top-k tokens; save both.

    Metrics: DistillSpec's (for the draft) plus the reference's, prefixed ``reference_``.
    """
    watch = Stopwatch()
    settings = settings_of(config)
    setup = prepare_drafting(config, settings, output_dir, progress)
    initial = heldout_metrics(setup.teacher, setup.student, setup.heldout)
    reference = reference_model(config, settings, setup, output_dir, progress)
    lr = draft_learning_rate(settings.lr, settings.keep_fraction)
    result = train_student(
        setup.student,
        setup.teacher,
        setup.train,
        selective_loss(reference.model, settings.divergence, settings.keep_fraction),
        Phase("draft", config.epochs, lr),
        settings,
        output_dir,
        config.seed,
        progress,
    )
    metrics = {
        **phase_metrics(result),
        **heldout_metrics(setup.teacher, setup.student, setup.heldout),
        **prefixed(initial, "initial_"),
        **prefixed(reference.metrics, "reference_"),
    }
    card = draft_card(
        config,
        settings,
        metrics,
        data=DATA_NOTES[settings.data],
        lr_draft=lr,
        lr_reference=settings.lr,
        reference_path=str(output_dir / REFERENCE_DIR),
        method="AdaSPEC: forward-KL reference, then the draft trained on the top keep_fraction "
        "of each batch's tokens by D(P||Q) - D(P||R), loss normalised by k*|y|, lr * k",
    )
    artifact = output_dir / ARTIFACT_DIR
    save_draft(setup.student, setup.tokenizer, artifact, card)
    return JobResult(
        artifact_path=str(artifact),
        artifact_kind="draft",
        metrics=metrics,
        seconds=watch.seconds() + result.resumed_seconds + reference.earlier_seconds,
        resumed_from_step=max(result.resumed_from_step, reference.resumed_from_step),
    )
