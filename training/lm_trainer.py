"""A small, plain training loop: next-token LM training and forward-KL distillation of drafts.

Data are packed fixed-length blocks of token ids (``pack_blocks``); a block of L+1 tokens gives
L next-token predictions. Batches are drawn from a seeded permutation, the optimiser is AdamW
with linear warm-up then cosine or linear decay, and a tqdm bar shows loss and ETA.

Drafts are distilled from the target, not trained on the text: ``distill_drafts`` runs the
target once per batch and updates every draft against its distribution, so several drafts cost
one teacher forward per step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from training.losses import DivergenceKind, distillation_loss, target_distribution
from workers.hf_cache import cache_kwargs, returned_cache

LOSS_WINDOW = 20


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings of one training run (the batch is ``batch_size`` packed blocks)."""

    steps: int
    batch_size: int
    lr: float
    warmup_steps: int = 0
    schedule: Literal["cosine", "linear"] = "cosine"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class TrainResult:
    """What a run reports: predicted tokens seen, mean loss of the last steps, held-out losses.

    ``final_loss`` is next-token cross-entropy for LM training and the divergence for
    distillation; ``val_losses`` is always next-token cross-entropy (nats/token) per held-out set.
    """

    tokens_seen: int
    final_loss: float
    val_losses: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def pack_blocks(token_ids: list[int] | torch.Tensor, block_len: int) -> torch.Tensor:
    """Return ``token_ids`` cut into consecutive blocks, shape [n_blocks, block_len] (int64).

    The tail that does not fill a block is dropped. Exists so every model sees the same
    fixed-length rows with no padding.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    n_blocks = ids.numel() // block_len
    if n_blocks == 0:
        raise ValueError(f"{ids.numel()} tokens do not fill one block of {block_len}")
    return ids[: n_blocks * block_len].view(n_blocks, block_len)


def learning_rate(step: int, config: TrainConfig) -> float:
    """Return the learning rate at 0-based ``step``: linear warm-up, then cosine/linear decay.

    Decays from ``config.lr`` to ``config.lr * min_lr_ratio`` at the last step.
    """
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    decay_steps = max(1, config.steps - config.warmup_steps - 1)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    if config.schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - progress
    return config.lr * (config.min_lr_ratio + (1.0 - config.min_lr_ratio) * shape)


def batch_indices(n_blocks: int, config: TrainConfig) -> Iterator[torch.Tensor]:
    """Yield ``config.steps`` batches of block indices from seeded per-epoch permutations."""
    generator = torch.Generator().manual_seed(config.seed)
    order = torch.randperm(n_blocks, generator=generator)
    cursor = 0
    for _ in range(config.steps):
        if cursor + config.batch_size > n_blocks:
            order = torch.randperm(n_blocks, generator=generator)
            cursor = 0
        yield order[cursor : cursor + config.batch_size]
        cursor += config.batch_size


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(count)`` and restore the old setting after.

    Training on a shared machine is much faster with one thread than with OpenMP threads that
    spin while another process holds their core, and one thread makes results independent of
    the machine's core count.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Return mean cross-entropy (nats/token) of ``logits`` [B, L, V] against ``targets`` [B, L]."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@torch.inference_mode()
def greedy_continuations(
    model: PreTrainedModel, prompts: torch.Tensor, new_tokens: int, batch_size: int = 64
) -> torch.Tensor:
    """Return ``prompts`` [N, P] each followed by ``new_tokens`` greedy tokens of ``model``.

    Batched decoding with a KV cache (equal-length prompts, so no padding). Distilling on the
    target's own outputs (DistillSpec's on-policy data) teaches a draft the target's habits in
    generation, loops included, which teacher forcing on human text never shows it.
    """
    was_training = model.training
    model.eval()
    rows = []
    for start in range(0, prompts.shape[0], batch_size):
        ids = prompts[start : start + batch_size]
        out = model(input_ids=ids, use_cache=True)
        cache = returned_cache(model, out)
        for _ in range(new_tokens):
            next_ids = out.logits[:, -1].argmax(dim=-1, keepdim=True)
            ids = torch.cat([ids, next_ids], dim=1)
            out = model(input_ids=next_ids, use_cache=True, **cache_kwargs(model, cache))
        rows.append(ids)
    model.train(was_training)
    return torch.cat(rows)


@torch.inference_mode()
def evaluate_lm_loss(model: PreTrainedModel, blocks: torch.Tensor, batch_size: int = 8) -> float:
    """Return the mean next-token cross-entropy of ``model`` over ``blocks`` (nats/token)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for start in range(0, blocks.shape[0], batch_size):
        batch = blocks[start : start + batch_size]
        logits = model(input_ids=batch[:, :-1]).logits
        total += next_token_loss(logits, batch[:, 1:]).item() * batch[:, 1:].numel()
        count += batch[:, 1:].numel()
    model.train(was_training)
    return total / count


def adamw_optimizer(model: torch.nn.Module, config: TrainConfig, lr: float) -> torch.optim.AdamW:
    """Return AdamW over ``model`` with weight decay on matrices only (not norms or biases)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=config.betas)


def optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    lr: float,
    grad_clip: float,
) -> None:
    """Backpropagate ``loss`` and apply one clipped optimiser step at learning rate ``lr``."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()


def _validation_losses(
    model: PreTrainedModel, val_blocks: Mapping[str, torch.Tensor] | None
) -> dict[str, float]:
    """Return next-token cross-entropy of ``model`` on each named held-out block set."""
    return {name: evaluate_lm_loss(model, blocks) for name, blocks in (val_blocks or {}).items()}


def train_language_model(
    model: PreTrainedModel,
    blocks: torch.Tensor,
    config: TrainConfig,
    val_blocks: Mapping[str, torch.Tensor] | None = None,
    progress: bool = True,
    desc: str = "train",
) -> TrainResult:
    """Train ``model`` in place on next-token prediction over ``blocks``; return the summary."""
    torch.manual_seed(config.seed)
    model.train()
    optimizer = adamw_optimizer(model, config, config.lr)
    started = time.perf_counter()
    recent: list[float] = []
    bar = tqdm(
        batch_indices(blocks.shape[0], config),
        total=config.steps,
        desc=desc,
        disable=not progress,
        leave=False,
    )
    for step, index in enumerate(bar):
        batch = blocks[index]
        loss = next_token_loss(model(input_ids=batch[:, :-1]).logits, batch[:, 1:])
        optimizer_step(model, optimizer, loss, learning_rate(step, config), config.grad_clip)
        recent = [*recent[-(LOSS_WINDOW - 1) :], loss.item()]
        bar.set_postfix(loss=f"{recent[-1]:.3f}")
    seconds = time.perf_counter() - started
    model.eval()
    return TrainResult(
        tokens_seen=config.steps * config.batch_size * (blocks.shape[1] - 1),
        final_loss=sum(recent) / len(recent),
        val_losses=_validation_losses(model, val_blocks),
        seconds=seconds,
    )


def distill_drafts(
    target: PreTrainedModel,
    drafts: Mapping[str, PreTrainedModel],
    blocks: torch.Tensor,
    config: TrainConfig,
    learning_rates: Mapping[str, float] | None = None,
    divergence: DivergenceKind = "forward_kl",
    val_blocks: Mapping[str, torch.Tensor] | None = None,
    progress: bool = True,
) -> dict[str, TrainResult]:
    """Distil every draft in place towards ``target``'s next-token distributions on ``blocks``.

    One target forward and softmax per batch serve all drafts; each draft has its own AdamW (lr
    from ``learning_rates`` or ``config.lr``) and minimises ``divergence`` (forward KL by
    default) over every position. Returns one summary per draft, whose ``seconds`` count that
    draft's own forward/backward time (the shared target forwards are not included).
    """
    torch.manual_seed(config.seed)
    target.eval()
    schedules = {
        name: replace(config, lr=(learning_rates or {}).get(name, config.lr)) for name in drafts
    }
    optimizers = {
        name: adamw_optimizer(draft, config, schedules[name].lr) for name, draft in drafts.items()
    }
    recent: dict[str, list[float]] = {name: [] for name in drafts}
    seconds = dict.fromkeys(drafts, 0.0)
    for draft in drafts.values():
        draft.train()
    bar = tqdm(
        batch_indices(blocks.shape[0], config),
        total=config.steps,
        desc="distil drafts",
        disable=not progress,
        leave=False,
    )
    for step, index in enumerate(bar):
        inputs = blocks[index][:, :-1]
        with torch.no_grad():
            teacher = target_distribution(target(input_ids=inputs).logits)
        for name, draft in drafts.items():
            started = time.perf_counter()
            loss = distillation_loss(divergence, teacher, draft(input_ids=inputs).logits)
            lr = learning_rate(step, schedules[name])
            optimizer_step(draft, optimizers[name], loss, lr, config.grad_clip)
            seconds[name] += time.perf_counter() - started
            recent[name] = [*recent[name][-(LOSS_WINDOW - 1) :], loss.item()]
        bar.set_postfix({name: f"{values[-1]:.3f}" for name, values in recent.items()})
    tokens_seen = config.steps * config.batch_size * (blocks.shape[1] - 1)
    results = {}
    for name, draft in drafts.items():
        draft.eval()
        results[name] = TrainResult(
            tokens_seen=tokens_seen,
            final_loss=sum(recent[name]) / len(recent[name]),
            val_losses=_validation_losses(draft, val_blocks),
            seconds=seconds[name],
        )
    return results
