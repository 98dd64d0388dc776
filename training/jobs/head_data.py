"""What the SpecDec++ head and Cali-TS predictor jobs share: data, binary metrics, the fit loop.

Both jobs train a small module with BCE on features the draft and target compute over
target-generated text: prompts are the first ``prompt_tokens`` tokens of the job's training
documents, continued by the target for ``response_tokens`` tokens (``continue_sequences``). The
examples are built once and cached in ``output_dir / DATA_FILE`` (safetensors), so a resumed
run trains on exactly the same data. Sequences, not examples, are split into train and held-out
parts, so no held-out example shares a context with a training one.

Positions: a model's last-layer hidden state at index j has read tokens 0..j and produces the
distribution of token j + 1 (``forward_states`` returns both for every index).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from training.distributed import RankCheckpoints, Stepper, is_writer, stepper, writer_first
from training.job_settings import JobConfigError, typed_setting
from training.jobs.base import (
    CHECKPOINT_DIR,
    JobConfig,
    StepLoop,
    Stopwatch,
    load_job_model,
    load_job_tokenizer,
    training_texts,
)
from training.lm_trainer import TrainConfig, learning_rate
from workers.heads import CONFIG_FILE
from workers.hf_cache import cache_kwargs
from workers.lm import head_logits, restricted_head
from workers.records import SamplingConfig
from workers.sampling import warp_probs

DATA_FILE = "data.safetensors"

#: Data settings both jobs take, with their defaults.
DATA_DEFAULTS: dict[str, Any] = {
    "prompt_tokens": 64,
    "response_tokens": 128,
    "top_k": 0,
    "eval_fraction": 0.1,
    "generation_batch": 8,
}


@dataclass(frozen=True)
class DataSettings:
    """How the text is made: prompt and response lengths, decoding, the held-out share."""

    prompt_tokens: int
    response_tokens: int
    sampling: SamplingConfig
    eval_fraction: float
    generation_batch: int

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], temperature: float) -> DataSettings:
        """Return the data settings in ``settings`` (defaults from ``DATA_DEFAULTS``), checked."""
        values = {key: typed_setting(settings, key, d) for key, d in DATA_DEFAULTS.items()}
        for key in ("prompt_tokens", "response_tokens", "generation_batch"):
            if values[key] < 1:
                raise JobConfigError(f"setting {key!r} must be >= 1, got {values[key]}")
        if values["top_k"] < 0:
            raise JobConfigError(f"setting 'top_k' must be >= 0, got {values['top_k']}")
        if not 0.0 < values["eval_fraction"] < 1.0:
            raise JobConfigError(
                f"setting 'eval_fraction' must be in (0, 1), got {values['eval_fraction']}"
            )
        if temperature < 0.0:
            raise JobConfigError(f"setting 'temperature' must be >= 0, got {temperature}")
        sampling = SamplingConfig(
            temperature=temperature,
            top_k=values["top_k"],
            max_new_tokens=values["response_tokens"],
        )
        return cls(
            prompt_tokens=values["prompt_tokens"],
            response_tokens=values["response_tokens"],
            sampling=sampling,
            eval_fraction=values["eval_fraction"],
            generation_batch=values["generation_batch"],
        )


def job_device() -> torch.device:
    """Return the device jobs train on: the first GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def prompt_batch(tokenizer: Any, texts: list[str], prompt_tokens: int) -> torch.Tensor:
    """Return the first ``prompt_tokens`` token ids of each text long enough, [N, prompt_tokens].

    Equal lengths let prompts be continued in batches without padding; shorter texts are left
    out, and a job whose texts are all shorter fails naming the setting.
    """
    rows = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= prompt_tokens:
            rows.append(ids[:prompt_tokens])
    if len(rows) < 2:
        raise JobConfigError(
            f"only {len(rows)} training texts have at least prompt_tokens={prompt_tokens} tokens; "
            "at least 2 are needed (lower prompt_tokens or raise samples)"
        )
    return torch.tensor(rows, dtype=torch.long)


@torch.no_grad()
def continue_sequences(
    model: PreTrainedModel,
    prompts: torch.Tensor,
    new_tokens: int,
    sampling: SamplingConfig,
    generator: torch.Generator,
    batch_size: int,
) -> torch.Tensor:
    """Return ``prompts`` [N, P] each followed by ``new_tokens`` tokens of ``model``, [N, P+R].

    Tokens are the argmax at temperature 0 and samples of the warped distribution otherwise
    (``warp_probs``, as the engine warps). Generation goes on past EOS; callers mask with
    ``response_mask``.
    """
    device = next(model.parameters()).device
    rows = []
    for start in range(0, prompts.shape[0], batch_size):
        ids = prompts[start : start + batch_size].to(device)
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=ids, use_cache=True, **cache_kwargs(model, cache)).logits[:, -1]
        for _ in range(new_tokens):
            next_ids = sample_rows(warp_probs(logits.float(), sampling), generator)
            ids = torch.cat([ids, next_ids[:, None]], dim=1)
            logits = model(
                input_ids=next_ids[:, None], use_cache=True, **cache_kwargs(model, cache)
            )
            logits = logits.logits[:, -1]
        rows.append(ids.cpu())
    return torch.cat(rows)


@dataclass(frozen=True)
class TargetText:
    """The models of a head-training job and the text its target generated from the prompts.

    ``generator`` is the job's seeded generator after generation, so that the labelling that
    follows draws from the same stream in every run.
    """

    tokenizer: Any
    target: PreTrainedModel
    draft: PreTrainedModel
    sequences: torch.Tensor
    generator: torch.Generator

    def chunks(self, batch_size: int) -> list[tuple[int, torch.Tensor]]:
        """Return (first row, rows) of ``sequences`` in batches of ``batch_size``."""
        return [
            (start, self.sequences[start : start + batch_size])
            for start in range(0, self.sequences.shape[0], batch_size)
        ]


def target_text(config: JobConfig, data: DataSettings, progress: bool) -> TargetText:
    """Load the job's draft (``base``) and target (``teacher``) and continue its prompts.

    The one data preparation both head jobs share: prompts from the job's dataset, cut to
    ``data.prompt_tokens``, continued by the target for ``data.response_tokens``.
    """
    device = job_device()
    tokenizer = load_job_tokenizer(config.base, progress)
    target = load_job_model(config.teacher or "", progress).to(device)
    draft = load_job_model(config.base, progress).to(device)
    prompts = prompt_batch(tokenizer, training_texts(config), data.prompt_tokens)
    generator = torch.Generator(device=device).manual_seed(config.seed)
    sequences = continue_sequences(
        target, prompts, data.response_tokens, data.sampling, generator, data.generation_batch
    )
    return TargetText(tokenizer, target, draft, sequences, generator)


def sample_rows(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Return one token per distribution in ``probs`` [..., V], shape [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    drawn = torch.multinomial(flat.to(generator.device), 1, generator=generator)
    return drawn.view(probs.shape[:-1]).to(probs.device)


@torch.no_grad()
def forward_states(model: PreTrainedModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (last-layer hidden states [B, L, d], float logits [B, L, V]) of ``ids`` [B, L].

    The decoder and the LM head compute what ``workers.lm.CachedLM`` computes, so the hidden
    states are those the engine hands to policies (up to float rounding: the engine's fast path
    runs other kernels), and a draft with a ``draft_vocab`` gets the engine's restricted logits
    (0 probability outside it).
    """
    device = next(model.parameters()).device
    hidden = model.get_decoder()(input_ids=ids.to(device), use_cache=False).last_hidden_state
    return hidden, head_logits(model.get_output_embeddings(), restricted_head(model), hidden)


def response_mask(response: torch.Tensor, eos_token_id: int | None) -> torch.Tensor:
    """Return a bool mask of ``response`` [N, R]: True up to and including the first EOS."""
    if eos_token_id is None:
        return torch.ones_like(response, dtype=torch.bool)
    is_eos = (response == eos_token_id).long()
    eos_before = torch.cumsum(is_eos, dim=-1) - is_eos
    return eos_before == 0


def acceptance_labels(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """Return min(1, p(y)/q(y)) for each drafted token y: its chance of acceptance.

    ``target_probs`` p and ``draft_probs`` q are [..., V] at the same positions, ``tokens``
    [...] were drawn from q (so q(y) > 0). This is the rejection sampler's acceptance test.
    """
    p = target_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    q = draft_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.clamp(p / q, max=1.0)


def heldout_split(
    n_items: int, eval_fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (train, held-out) indices of ``n_items`` sequences, both non-empty, sorted."""
    n_eval = min(n_items - 1, max(1, round(n_items * eval_fraction)))
    order = torch.randperm(n_items, generator=torch.Generator().manual_seed(seed + 7919))
    return order[n_eval:].sort().values, order[:n_eval].sort().values


# ---------------------------------------------------------------------------------------------
# Binary losses and metrics (labels are probabilities in [0, 1], predictions logits)
# ---------------------------------------------------------------------------------------------


def weighted_bce(
    labels: torch.Tensor, logits: torch.Tensor, weight_accept: float, weight_reject: float
) -> torch.Tensor:
    """Return mean −(w_acc·y·log σ(f) + w_rej·(1−y)·log(1−σ(f))) (SpecDec++'s weighted BCE)."""
    per_item = weight_accept * labels * F.logsigmoid(logits) + weight_reject * (
        1.0 - labels
    ) * F.logsigmoid(-logits)
    return -per_item.mean()


def binary_kl(labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Return mean KL(Bern(y) ‖ Bern(σ(f))) in nats (0·log 0 = 0)."""
    entropy = -(torch.xlogy(labels, labels) + torch.xlogy(1.0 - labels, 1.0 - labels))
    return (bce_per_item(labels, logits) - entropy).mean()


def bce_per_item(labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Return −(y·log σ(f) + (1−y)·log(1−σ(f))) per item."""
    return -(labels * F.logsigmoid(logits) + (1.0 - labels) * F.logsigmoid(-logits))


def rate_logit(rate: float) -> float:
    """Return log(r / (1 − r)), with r kept inside [1e-6, 1 − 1e-6]."""
    r = min(max(rate, 1e-6), 1.0 - 1e-6)
    return math.log(r / (1.0 - r))


def weighted_optimal_rate(base_rate: float, weight_accept: float, weight_reject: float) -> float:
    """Return the constant prediction minimising the weighted BCE at acceptance rate ``base_rate``.

    w_acc·r / (w_acc·r + w_rej·(1−r)): what a head that learned nothing converges to.
    """
    accepted = weight_accept * base_rate
    return accepted / (accepted + weight_reject * (1.0 - base_rate))


def binary_report(labels: torch.Tensor, logits: torch.Tensor, base_rate: float) -> dict[str, float]:
    """Return held-out BCE and binary KL of ``logits``, and of the constant ``base_rate``.

    The constant predictor (the training set's mean label) is the baseline a useful head must
    beat; ``eval_mean_prediction`` shows how calibrated the head is on average.
    """
    constant = torch.full_like(labels, rate_logit(base_rate))
    return {
        "eval_bce": float(bce_per_item(labels, logits).mean()),
        "eval_kl": float(binary_kl(labels, logits)),
        "const_bce": float(bce_per_item(labels, constant).mean()),
        "const_kl": float(binary_kl(labels, constant)),
        "base_rate": base_rate,
        "eval_rate": float(labels.mean()),
        "eval_mean_prediction": float(torch.sigmoid(logits).mean()),
    }


# ---------------------------------------------------------------------------------------------
# Cached data, the fit loop, the artifact
# ---------------------------------------------------------------------------------------------


def cached_tensors(
    output_dir: Path, build: Callable[[], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """Return the job's data from ``output_dir / DATA_FILE``, built and written first if absent.

    Written to a temporary file and renamed, so a crash while writing leaves no partial data.
    Under several ranks, rank 0 builds it and every rank reads it.
    """
    path = output_dir / DATA_FILE

    def write() -> None:
        tensors = {name: value.contiguous().cpu() for name, value in build().items()}
        temporary = path.with_suffix(".tmp")
        save_file(tensors, str(temporary))
        os.replace(temporary, path)

    writer_first(path, write)
    return load_file(str(path))


def seeded_module(seed: int, make: Callable[[], nn.Module]) -> nn.Module:
    """Return ``make()`` initialised from ``seed`` without touching the global random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


@dataclass(frozen=True)
class FitSettings:
    """Optimisation of a head: Adam, cosine decay from ``lr`` to 0, ``batch_size`` examples."""

    lr: float
    batch_size: int
    epochs: int
    seed: int


@dataclass(frozen=True)
class FitReport:
    """The loss of every optimiser step (resumed runs included) and where this run started."""

    losses: list[float]
    resumed_from_step: int

    def summary(self) -> dict[str, float]:
        """Return the mean training loss of the first and of the last tenth of the steps."""
        window = max(1, len(self.losses) // 10)
        return {
            "train_loss_start": sum(self.losses[:window]) / window,
            "train_loss_end": sum(self.losses[-window:]) / window,
            "train_steps": float(len(self.losses)),
        }


def fit_settings(config: JobConfig, default_lr: float, default_batch: int) -> FitSettings:
    """Return the optimisation settings of ``config`` (settings ``lr``, ``batch_size``), checked."""
    lr = typed_setting(config.settings, "lr", default_lr)
    batch_size = typed_setting(config.settings, "batch_size", default_batch)
    if lr <= 0.0:
        raise JobConfigError(f"setting 'lr' must be > 0, got {lr}")
    if batch_size < 1:
        raise JobConfigError(f"setting 'batch_size' must be >= 1, got {batch_size}")
    if config.epochs < 1:
        raise JobConfigError(f"epochs must be >= 1, got {config.epochs}")
    return FitSettings(lr=lr, batch_size=batch_size, epochs=config.epochs, seed=config.seed)


@dataclass
class _FitState:
    """What a fit checkpoints: the module, its optimiser (inside ``steps``), the losses so far
    and the seconds spent."""

    module: nn.Module
    steps: Stepper
    stopwatch: Stopwatch
    losses: list[float] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """Return the checkpoint: module, optimiser, losses (float64 tensor) and seconds."""
        return {
            "module": self.module.state_dict(),
            "optimizer": self.steps.optimizer_state(),
            "losses": torch.tensor(self.losses, dtype=torch.float64),
            "seconds": self.stopwatch.seconds(),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Put back a checkpoint ``state`` returned."""
        self.module.load_state_dict(saved["module"])
        self.steps.load_optimizer_state(saved["optimizer"])
        self.losses[:] = saved["losses"].tolist()
        self.stopwatch.already = float(saved["seconds"])


def fit(
    module: nn.Module,
    n_items: int,
    batch_loss: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    settings: FitSettings,
    output_dir: Path,
    stopwatch: Stopwatch,
    progress: bool,
    desc: str,
) -> FitReport:
    """Train ``module`` on ``batch_loss(model, item indices)`` with Adam and cosine decay,
    resumably; ``model`` is what to run the forward through (``module``, or its DDP/ZeRO
    wrapper when several ranks share each batch).

    Checkpoints (module, optimiser, losses so far, seconds) go to ``output_dir /
    CHECKPOINT_DIR``; a rerun after a crash continues from the newest one with the same batches.
    """
    optimizer = torch.optim.Adam(module.parameters(), lr=settings.lr)
    fitted = _FitState(module, stepper(module, optimizer, None, settings.batch_size), stopwatch)
    loop = StepLoop(
        n_items=n_items,
        batch_size=settings.batch_size,
        epochs=settings.epochs,
        seed=settings.seed,
        checkpoints=RankCheckpoints(output_dir / CHECKPOINT_DIR),
        state_fn=fitted.state,
        restore_fn=fitted.restore,
        desc=desc,
        progress=progress,
    )
    start = loop.resume()
    schedule = TrainConfig(
        steps=loop.total_steps,
        batch_size=settings.batch_size,
        lr=settings.lr,
        schedule="cosine",
        min_lr_ratio=0.0,
    )
    steps = fitted.steps
    module.train()
    for step, epoch, indices in loop.batches():
        shard = steps.shard(indices)
        loss = batch_loss(steps.model, shard.rows)
        fitted.losses.append(steps.step(loss, shard, learning_rate(step, schedule)))
        loop.report(epoch, fitted.losses[-1])
    module.eval()
    return FitReport(losses=list(fitted.losses), resumed_from_step=start)


@torch.no_grad()
def batched_logits(
    predict: Callable[[torch.Tensor], torch.Tensor], n_items: int, batch_size: int = 4096
) -> torch.Tensor:
    """Return ``predict(indices)`` over all ``n_items`` items, concatenated, in batches."""
    parts = [
        predict(torch.arange(start, min(start + batch_size, n_items)))
        for start in range(0, n_items, batch_size)
    ]
    return torch.cat(parts).float().cpu()


def provenance_meta(
    config: JobConfig, defaults: Mapping[str, Any], fit_settings: FitSettings
) -> dict[str, Any]:
    """Return the artifact metadata on what a module was trained from and how: draft, target,
    the job's settings over their ``defaults``, and the optimisation."""
    return {
        "draft": config.base,
        "target": config.teacher,
        "settings": {**defaults, **dict(config.settings)},
        "fit": asdict(fit_settings),
    }


def write_module_artifact(
    directory: Path, filename: str, module: nn.Module, config: dict[str, Any]
) -> Path:
    """Write ``module``'s weights (safetensors) and ``config.json`` to ``directory``; return it.

    Only rank 0 writes.
    """
    if not is_writer():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    weights = {
        name: value.detach().contiguous().cpu() for name, value in module.state_dict().items()
    }
    save_file(weights, str(directory / filename))
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    return directory
