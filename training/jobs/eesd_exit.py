"""EESD early-exit draft: the target's first N layers plus one trainable layer, self-distilled.

The draft is a plain ``LlamaForCausalLM`` with N + 1 layers: the target's (``config.base``)
embeddings and first N layers, copied and frozen; one trainable decoder layer initialised from
the target's last layer; the target's final norm and LM head (untied from the embeddings, so
the head trains while the embeddings stay frozen). It is distilled with forward KL against the
full target (``config.teacher``, default the same target) on a mix of target-generated text
(dataset prompts continued greedily) and dataset text, ``generated_fraction`` of it generated.

The draft is cut by ``training.early_exit``. Zoo targets are enlarged with function-preserving
layers whose output projections are zero (``training.zoo.enlarge.enlarge_target``). Initialising
from such a layer would start the exit layer as a no-op, so when the target's model card (or,
without a card, its weights) shows the last layer is one of them, the exit layer starts from the
last trained layer and the draft's card says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import LlamaForCausalLM

from training.early_exit import early_exit_draft, exit_init_layer, is_zero_residual_layer
from training.job_settings import JobConfigError
from training.jobs.base import (
    ARTIFACT_DIR,
    JobConfig,
    JobResult,
    Stopwatch,
    load_job_model,
    load_job_tokenizer,
    resolve_ref,
)
from training.jobs.distillspec import divergence_loss, prefixed
from training.jobs.draft_common import (
    DATA_DIR,
    Phase,
    TrainSettings,
    cached_tensor,
    draft_card,
    heldout_blocks,
    heldout_metrics,
    kd_texts,
    parse_settings,
    phase_metrics,
    read_card,
    require,
    save_draft,
    train_student,
    training_blocks,
)

EXIT_FRACTION = 0.08


@dataclass(frozen=True)
class EesdSettings(TrainSettings):
    """Early-exit settings: N frozen target layers (None: max(1, round(0.08 · layers))) and the
    fraction of training blocks that are target-generated."""

    exit_layers: int | None = None
    generated_fraction: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.exit_layers is None or self.exit_layers >= 1,
            "exit_layers",
            f"must be >= 1 or null, got {self.exit_layers}",
        )
        require(
            0.0 <= self.generated_fraction <= 1.0,
            "generated_fraction",
            f"must be in [0, 1], got {self.generated_fraction}",
        )


def default_exit_layers(num_layers: int) -> int:
    """Return EESD's default N: about 8% of the target's layers, at least one."""
    return max(1, round(EXIT_FRACTION * num_layers))


def _target_enlargement(ref: str) -> dict[str, Any] | None:
    """Return the ``enlargement`` section of the target's model card, if it has one."""
    path = Path(resolve_ref(ref))
    card = read_card(path) if path.is_dir() else None
    return None if card is None else card.get("enlargement")


def settings_of(config: JobConfig) -> EesdSettings:
    """Return the job's parsed settings; JobConfigError names the first bad one.

    ``training.jobs.check_job_config`` calls it when a sweep is validated, so a bad setting
    stops the sweep before anything runs.
    """
    return parse_settings(EesdSettings, config.settings, config.kind)


def run(config: JobConfig, output_dir: Path, progress: bool) -> JobResult:
    """Cut, self-distil and save an early-exit draft of ``config.base``.

    Metrics: DistillSpec's (train loss, held-out KL and agreement after and before training,
    tokens, steps) plus ``exit_layers``, ``init_layer`` and ``trainable_parameters``.
    """
    watch = Stopwatch()
    settings = settings_of(config)
    if config.epochs < 1:
        raise JobConfigError(f"{config.kind}: epochs must be >= 1, got {config.epochs}")
    target = load_job_model(config.base, progress)
    if not isinstance(target, LlamaForCausalLM):
        raise JobConfigError(f"eesd_exit needs a Llama target, got {type(target).__name__}")
    shape = _exit_shape(config, settings, target)
    device = settings.torch_device()
    draft = early_exit_draft(target, shape.exit_layers, shape.init_layer).to(device)
    target = target.to(device)
    same = config.teacher is None or config.teacher == config.base
    teacher = target if same else load_job_model(config.teacher, progress).to(device)
    tokenizer = load_job_tokenizer(config.base, progress)
    texts = kd_texts(config, with_prompts=settings.generated_fraction > 0)
    train = cached_tensor(
        output_dir / DATA_DIR / "train_blocks.pt",
        lambda: training_blocks(
            texts, tokenizer, teacher, settings, settings.generated_fraction, config.seed
        ),
    )
    heldout = heldout_blocks(texts, tokenizer, settings)
    initial = heldout_metrics(teacher, draft, heldout)
    result = train_student(
        draft,
        teacher,
        train,
        divergence_loss("forward_kl"),
        Phase("exit", config.epochs, settings.lr),
        settings,
        output_dir,
        config.seed,
        progress,
    )
    metrics = {
        **phase_metrics(result),
        **heldout_metrics(teacher, draft, heldout),
        **prefixed(initial, "initial_"),
        "exit_layers": float(shape.exit_layers),
        "init_layer": float(shape.init_layer),
        "trainable_parameters": float(
            sum(p.numel() for p in draft.parameters() if p.requires_grad)
        ),
    }
    card = _exit_card(config, settings, metrics, shape)
    artifact = output_dir / ARTIFACT_DIR
    save_draft(draft, tokenizer, artifact, card)
    return JobResult(
        artifact_path=str(artifact),
        artifact_kind="draft",
        metrics=metrics,
        seconds=watch.seconds() + result.resumed_seconds,
        resumed_from_step=result.resumed_from_step,
    )


@dataclass(frozen=True)
class _ExitShape:
    """Where an early-exit draft leaves its target: its layer count, the target layer its trained
    layer starts from (and why), and the target's layer count."""

    exit_layers: int
    init_layer: int
    init_note: str
    target_layers: int


def _exit_shape(config: JobConfig, settings: EesdSettings, target: LlamaForCausalLM) -> _ExitShape:
    """Return the draft's shape; raises JobConfigError when the exit is not below the top."""
    num_layers = target.config.num_hidden_layers
    exit_layers = settings.exit_layers or default_exit_layers(num_layers)
    require(
        exit_layers < num_layers,
        "exit_layers",
        f"must be below the target's {num_layers} layers, got {exit_layers}",
    )
    zero_layers = [is_zero_residual_layer(layer) for layer in target.model.layers]
    init_layer, init_note = exit_init_layer(
        num_layers, _target_enlargement(config.base), zero_layers
    )
    return _ExitShape(exit_layers, init_layer, init_note, num_layers)


def _exit_card(
    config: JobConfig, settings: EesdSettings, metrics: dict[str, float], shape: _ExitShape
) -> dict[str, Any]:
    """Return the model card of an early-exit draft."""
    exit_layers, init_layer = shape.exit_layers, shape.init_layer
    return draft_card(
        config,
        settings,
        metrics,
        teacher_resolved=config.teacher or config.base,
        exit_layers=exit_layers,
        target_layers=shape.target_layers,
        init_layer=init_layer,
        init_note=shape.init_note,
        frozen=f"token embeddings and layers 0-{exit_layers - 1}, equal to the target's",
        trained=f"layer {exit_layers} (from target layer {init_layer}), final norm, LM head "
        "(untied copy of the target's)",
        data=f"{settings.generated_fraction:.0%} dataset prompts continued by the target's "
        "greedy output, the rest packed dataset documents; forward KL against the full target",
    )
