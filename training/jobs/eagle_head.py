"""EAGLE head training (docs/methods.md, "EAGLE head"): a feature-space draft for ``config.base``.

``config.base`` is the target whose features the head reads (``teacher``, when given, must be
the same model). Data: the job's documents cut to ``prompt_tokens`` tokens, continued by the
target for ``response_tokens`` tokens (greedy at ``temperature`` 0, the default), the target's
features teacher-forced over prompt and response (``training.eagle_training``). The head
(``workers.eagle.EagleHead``): the target's layer shape, its frozen final norm and LM head, cut
to the ``head_vocab`` most frequent tokens of the target's training text (0: the full vocabulary).
``feature_layers`` (a list of decoder-layer indices, or ``"eagle3"``; default: none) makes it a
fused head reading those layers' states (EAGLE-3 style, ``workers.eagle.layers``), trained on
the cross-entropy alone. Loss: ``w_feature`` · SmoothL1 + ``w_token`` · soft cross-entropy,
input noise ±``noise``, over ``unroll_steps`` draft steps per start (1: teacher forcing only;
k > 1: EAGLE-3's training-time test, the head drafting steps 2..k from its own features).
Adam, cosine decay from ``lr``, ``batch_size`` sequences,
``config.epochs`` epochs, resumable (the data is cached in the job's folder, the fit
checkpoints). A held-out tenth of the sequences gives greedy agreement at draft steps
1..``eval_steps`` (at most ``eval_starts`` starts per sequence) and the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from training.distributed import is_writer
from training.eagle_training import (
    EagleLossWeights,
    SequenceFeatures,
    agreement_at_steps,
    batch_generator,
    eagle_loss,
    frequent_ids,
    sequence_features,
)
from training.job_settings import JobConfigError, check_settings, typed_setting
from training.jobs.base import (
    ARTIFACT_DIR,
    JobConfig,
    JobResult,
    Stopwatch,
    load_job_model,
    load_job_tokenizer,
    training_texts,
)
from training.jobs.head_data import (
    DATA_DEFAULTS,
    DataSettings,
    FitSettings,
    cached_tensors,
    continue_sequences,
    fit,
    fit_settings,
    heldout_split,
    job_device,
    prompt_batch,
    provenance_meta,
    response_mask,
    seeded_module,
)
from workers.eagle.artifact import EAGLE_KIND, save_eagle_head
from workers.eagle.head import EagleConfig, EagleHead, TargetParts
from workers.eagle.layers import feature_choice, resolve_feature_layers

DEFAULTS: dict[str, Any] = {
    **DATA_DEFAULTS,
    "temperature": 0.0,
    "head_vocab": 0,
    "noise": 0.1,
    "w_feature": 1.0,
    "w_token": 0.1,
    "lr": 1e-3,
    "batch_size": 8,
    "eval_steps": 3,
    "eval_starts": 64,
    "feature_layers": [],
    "unroll_steps": 1,
}
#: How errors name the fused layers' setting.
LAYERS_FIELD = "setting 'feature_layers'"


@dataclass(frozen=True)
class EagleSettings:
    """The job's settings: data, head vocabulary size, loss, optimisation, evaluation, and
    the target layers a fused head reads (sorted indices or ``"eagle3"``; empty: EAGLE-1)."""

    data: DataSettings
    head_vocab: int
    loss: EagleLossWeights
    fit: FitSettings
    eval_steps: int
    eval_starts: int
    feature_layers: tuple[int, ...] | str = ()

    @classmethod
    def from_config(cls, config: JobConfig) -> EagleSettings:
        """Return the settings of ``config``, naming any unknown or invalid one."""
        settings = config.settings
        check_settings(settings, DEFAULTS, EAGLE_KIND)
        if config.teacher is not None and config.teacher != config.base:
            raise JobConfigError(
                f"{EAGLE_KIND} reads the features of base ({config.base!r}); teacher, when "
                f"given, must be the same model, got {config.teacher!r}"
            )
        typed = set(DEFAULTS) - {"feature_layers"}
        values = {key: typed_setting(settings, key, DEFAULTS[key]) for key in typed}
        if values["unroll_steps"] < 1:
            raise JobConfigError(
                f"setting 'unroll_steps' must be >= 1, got {values['unroll_steps']}"
            )
        for key in ("head_vocab", "eval_starts"):
            if values[key] < 0:
                raise JobConfigError(f"setting {key!r} must be >= 0, got {values[key]}")
        for key in ("noise", "w_feature", "w_token"):
            if values[key] < 0.0:
                raise JobConfigError(f"setting {key!r} must be >= 0, got {values[key]}")
        if values["w_feature"] == 0.0 and values["w_token"] == 0.0:
            raise JobConfigError("settings 'w_feature' and 'w_token' cannot both be 0")
        if values["eval_steps"] < 1:
            raise JobConfigError(f"setting 'eval_steps' must be >= 1, got {values['eval_steps']}")
        return cls(
            data=DataSettings.from_settings(settings, values["temperature"]),
            head_vocab=values["head_vocab"],
            loss=EagleLossWeights(
                values["w_feature"], values["w_token"], values["noise"], values["unroll_steps"]
            ),
            fit=fit_settings(config, DEFAULTS["lr"], DEFAULTS["batch_size"]),
            eval_steps=values["eval_steps"],
            eval_starts=values["eval_starts"],
            feature_layers=_feature_layers(settings, values),
        )


def _feature_layers(settings: dict[str, Any], values: dict[str, Any]) -> tuple[int, ...] | str:
    """Return the checked ``feature_layers`` setting (sorted indices, ``"eagle3"`` or empty),
    refusing a fused head's loss without a token term or with a regression weight."""
    value = settings.get("feature_layers", [])
    if isinstance(value, list | tuple) and not value:
        return ()
    if not isinstance(value, list | tuple | str):
        raise JobConfigError(f"{LAYERS_FIELD} must be a list of layer indices or 'eagle3'")
    try:
        choice = feature_choice(value, LAYERS_FIELD)
    except ValueError as exc:
        raise JobConfigError(str(exc)) from exc
    if values["w_token"] == 0.0:
        raise JobConfigError(f"{LAYERS_FIELD}: a fused head learns from 'w_token' alone, got 0")
    if settings.get("w_feature", 0.0) != 0.0:
        raise JobConfigError(
            f"{LAYERS_FIELD}: a fused head has no feature regression target (EAGLE-3); "
            "leave 'w_feature' out or set it to 0"
        )
    return choice


def target_layers(settings: EagleSettings, target: torch.nn.Module) -> tuple[int, ...]:
    """Return the layers the job's head fuses on ``target`` (empty: EAGLE-1), checked against
    its depth; JobConfigError names the setting."""
    if not settings.feature_layers:
        return ()
    try:
        depth = target.config.num_hidden_layers
        return resolve_feature_layers(settings.feature_layers, depth, LAYERS_FIELD)
    except ValueError as exc:
        raise JobConfigError(str(exc)) from exc


def settings_of(config: JobConfig) -> EagleSettings:
    """Return the job's parsed settings (``training.jobs.check_job_config`` calls it)."""
    return EagleSettings.from_config(config)


def build_data(
    config: JobConfig, settings: EagleSettings, target: torch.nn.Module, layers: tuple[int, ...]
) -> dict[str, torch.Tensor]:
    """Continue the job's prompts with the target; return tokens, features, mask, choices
    (and the states after ``layers``, a fused head's input, when it names any)."""
    data = settings.data
    tokenizer = load_job_tokenizer(config.base)
    prompts = prompt_batch(tokenizer, training_texts(config), data.prompt_tokens)
    generator = torch.Generator(device=job_device()).manual_seed(config.seed)
    sequences = continue_sequences(
        target, prompts, data.response_tokens, data.sampling, generator, data.generation_batch
    )
    response = sequences[:, data.prompt_tokens :]
    valid = torch.cat(
        [
            torch.ones_like(sequences[:, : data.prompt_tokens], dtype=torch.bool),
            response_mask(response, tokenizer.eos_token_id),
        ],
        dim=1,
    )
    found = sequence_features(target, sequences, valid, data.generation_batch, layers)
    specials = sorted({*tokenizer.all_special_ids} | {tokenizer.eos_token_id} - {None})
    saved = {
        "tokens": found.tokens,
        "features": found.features,
        "valid": found.valid,
        "choices": found.choices,
        "specials": torch.tensor(specials, dtype=torch.long),
    }
    if found.layers is not None:
        saved["layers"] = found.layers
    return saved


def make_head(
    target: torch.nn.Module, data: SequenceFeatures, settings: EagleSettings, specials: list[int]
) -> EagleHead:
    """Return a fresh head for ``target``: its vocabulary the ``head_vocab`` most frequent
    tokens of the training text (and the specials), or the full one; fusing the layers of
    ``feature_layers``, if any."""
    vocab = None
    if settings.head_vocab > 0:
        ids = torch.cat([data.tokens[data.valid], data.choices[data.valid]])
        vocab = tuple(frequent_ids(ids, settings.head_vocab, target.config.vocab_size, specials))
    layers = target_layers(settings, target)
    config = EagleConfig.for_target(target, head_vocab=vocab, feature_layers=layers)
    return EagleHead(config, TargetParts.of(target))


def run(config: JobConfig, output_dir: Path, progress: bool) -> JobResult:
    """Train the EAGLE head of ``config``; return its artifact and held-out metrics."""
    stopwatch = Stopwatch()
    settings = settings_of(config)
    device = job_device()
    target = load_job_model(config.base, progress).to(device).requires_grad_(False)
    layers = target_layers(settings, target)  # a bad layer is refused before any data is made
    saved = cached_tensors(output_dir, lambda: build_data(config, settings, target, layers))
    data = SequenceFeatures(
        saved["tokens"], saved["features"], saved["valid"], saved["choices"], saved.get("layers")
    )
    train_rows, eval_rows = heldout_split(
        data.tokens.shape[0], settings.data.eval_fraction, config.seed
    )
    train, held_out = data.rows(train_rows), data.rows(eval_rows)
    specials = saved["specials"].tolist()
    head = seeded_module(config.seed, lambda: make_head(target, train, settings, specials))
    head = head.to(device)

    def batch_loss(model: torch.nn.Module, indices: torch.Tensor) -> torch.Tensor:
        generator = batch_generator(config.seed, indices)
        return eagle_loss(head, train.rows(indices.cpu()), settings.loss, generator, model)

    report = fit(
        head, train_rows.numel(), batch_loss, settings.fit, output_dir, stopwatch, progress, "eagle"
    )
    metrics = _metrics(head.cpu(), held_out, settings)
    metrics.update({**report.summary(), "n_train_tokens": float(train.n_tokens)})
    meta = {
        **provenance_meta(config, DEFAULTS, settings.fit),
        "data": {"sequences": int(data.tokens.shape[0]), "tokens": data.n_tokens},
        "metrics": metrics,
    }
    artifact = output_dir / ARTIFACT_DIR
    if is_writer():
        save_eagle_head(artifact, head, meta)
    return JobResult(
        artifact_path=str(artifact),
        artifact_kind=EAGLE_KIND,
        metrics=metrics,
        seconds=stopwatch.seconds(),
        resumed_from_step=report.resumed_from_step,
    )


@torch.no_grad()
def _metrics(head: EagleHead, held_out: SequenceFeatures, settings: EagleSettings) -> dict:
    """Return held-out agreement at each draft step and the noise-free loss."""
    agreement = agreement_at_steps(
        head, held_out, settings.data.prompt_tokens, settings.eval_steps, settings.eval_starts
    )
    quiet = replace(settings.loss, noise=0.0)
    metrics = {f"agreement_step{k + 1}": value for k, value in enumerate(agreement)}
    metrics["eval_loss"] = float(eagle_loss(head, held_out, quiet, None))
    metrics["n_eval_tokens"] = float(held_out.n_tokens)
    return metrics
