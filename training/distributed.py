"""How a training loop steps its model: alone, under torch DDP, or under DeepSpeed ZeRO.

A job's loop asks ``stepper(model, optimizer, grad_clip)`` for a ``Stepper`` and then, for each
of ``StepLoop``'s seeded global batches: ``shard = stepper.shard(indices)`` (this rank's rows),
a forward through ``stepper.model`` on those rows, and ``stepper.step(loss, shard, lr)``, which
returns the loss of the whole batch. Every rank sees the same global batches, each trains on its
contiguous slice of them, and ranks' losses are weighted by their share of the rows, so the
gradient (and the resume point) is the single-process run's, up to float rounding.

Which stepper: ``PlainStep`` outside a process group of more than one rank (``python -m
training``, a one-worker Ray Train job); ``DDPStep`` (gloo on CPU, NCCL on GPU, the process group
Ray Train sets up) otherwise; ``ZeroStep`` (``deepspeed.initialize`` with ZeRO stage 1 or 2) when
the job's ``parallel`` setting asks for it, or is ``auto`` with CUDA and DeepSpeed present.

Rank 0 alone writes: ``is_writer`` guards checkpoints (``rank_checkpoints``), cached data
(``writer_first``), artifacts and the result; the other ranks read what it wrote.

The parallel settings (``workers``, ``parallel``, ``zero_stage``) sit in a job's ``config``
next to its kind's own settings; ``split_parallel`` separates them.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from training.checkpoints import Checkpoints
from training.job_settings import JobConfigError, typed_setting

PARALLEL_CHOICES: tuple[str, ...] = ("auto", "ddp", "zero")
ZERO_STAGES = (1, 2)


@dataclass(frozen=True)
class ParallelSettings:
    """How many Ray Train workers a job runs on and how they share a step.

    ``workers`` ranks, each one CPU (or one GPU when the cluster has GPUs). ``parallel``:
    ``ddp`` (torch DistributedDataParallel), ``zero`` (DeepSpeed ZeRO at ``zero_stage``: 1
    partitions the optimiser state, 2 also the gradients; parameters stay whole, so the
    artifact is saved as usual) or ``auto`` (ZeRO when CUDA and DeepSpeed are present, else DDP).
    """

    workers: int = 1
    parallel: str = "auto"
    zero_stage: int = 2

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise JobConfigError(f"setting 'workers' must be >= 1, got {self.workers}")
        if self.parallel not in PARALLEL_CHOICES:
            raise JobConfigError(
                f"setting 'parallel' must be one of {list(PARALLEL_CHOICES)}, got {self.parallel!r}"
            )
        if self.zero_stage not in ZERO_STAGES:
            raise JobConfigError(
                f"setting 'zero_stage' must be one of {list(ZERO_STAGES)} (stage 3 partitions "
                f"the parameters, which the jobs' checkpoints and artifacts do not gather), "
                f"got {self.zero_stage!r}"
            )

    def uses_zero(self) -> bool:
        """Return True when several ranks should step with DeepSpeed ZeRO rather than DDP."""
        if self.parallel == "auto":
            return torch.cuda.is_available() and deepspeed_installed()
        return self.parallel == "zero"


PARALLEL_KEYS: tuple[str, ...] = tuple(spec.name for spec in fields(ParallelSettings))


def deepspeed_installed() -> bool:
    """Return True when the optional ``deepspeed`` package can be imported."""
    return importlib.util.find_spec("deepspeed") is not None


def split_parallel(settings: Mapping[str, Any]) -> tuple[dict[str, Any], ParallelSettings]:
    """Return (the kind's own settings, the parallel settings) of a job's ``config``.

    Errors name the bad parallel setting; the kind's settings are checked by the kind.
    """
    defaults = ParallelSettings()
    values = {key: typed_setting(settings, key, getattr(defaults, key)) for key in PARALLEL_KEYS}
    own = {key: value for key, value in settings.items() if key not in PARALLEL_KEYS}
    return own, ParallelSettings(**values)


# ---------------------------------------------------------------------------------------------
# Ranks
# ---------------------------------------------------------------------------------------------


def world() -> tuple[int, int]:
    """Return (rank, world size) of this process: (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_writer() -> bool:
    """Return True on the rank that writes checkpoints, data, artifacts and results (rank 0)."""
    return world()[0] == 0


def barrier() -> None:
    """Wait for every rank (nothing to wait for outside a process group)."""
    if world()[1] > 1:
        dist.barrier()


def writer_first(path: Path, write: Callable[[], None]) -> None:
    """Run ``write`` on rank 0 unless ``path`` exists; return on every rank once it does.

    So data one rank builds (teacher generations) is built once and read by all.
    """
    if is_writer() and not path.exists():
        write()
    barrier()


class RankCheckpoints(Checkpoints):
    """``Checkpoints`` that every rank reads and only rank 0 writes."""

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Write the checkpoint of ``step`` on rank 0; do nothing on the other ranks."""
        if is_writer():
            super().save(step, state)


_active = ParallelSettings()


@contextmanager
def parallel_settings(settings: ParallelSettings) -> Iterator[None]:
    """Make ``settings`` the ones ``stepper`` follows in this process while the block runs."""
    global _active
    previous, _active = _active, settings
    try:
        yield
    finally:
        _active = previous


# ---------------------------------------------------------------------------------------------
# Steppers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """This rank's rows of a global batch and the weight of its loss.

    ``weight`` = world size × (its rows / the batch's rows), so that the ranks' averaged
    gradients are the gradient of the batch mean. A rank with no rows of a short last batch
    runs its first row at weight 0 (every rank must join the gradient all-reduce).
    """

    rows: torch.Tensor
    weight: float
    share: float


def shard_rows(indices: torch.Tensor, rank: int, world_size: int) -> Shard:
    """Return rank ``rank``'s contiguous slice of ``indices`` (``torch.tensor_split``)."""
    part = torch.tensor_split(indices, world_size)[rank]
    share = part.numel() / max(1, indices.numel())
    if part.numel() == 0:
        return Shard(indices[:1], 0.0, 0.0)
    return Shard(part, world_size * share, share)


class Stepper(Protocol):
    """How one training loop runs its model's forward and optimiser steps."""

    model: nn.Module

    def shard(self, indices: torch.Tensor) -> Shard: ...

    def step(self, loss: torch.Tensor, shard: Shard, lr: float) -> float: ...

    def optimizer_state(self) -> Any: ...

    def load_optimizer_state(self, state: Any) -> None: ...


def _set_lr(optimizer: Any, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _clip(module: nn.Module, grad_clip: float | None) -> None:
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(module.parameters(), grad_clip)


@dataclass
class PlainStep:
    """One process: the whole batch, one backward, a clipped step (as before Ray Train)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    grad_clip: float | None

    def shard(self, indices: torch.Tensor) -> Shard:
        """Return the whole batch at weight 1."""
        return Shard(indices, 1.0, 1.0)

    def step(self, loss: torch.Tensor, shard: Shard, lr: float) -> float:
        """Backpropagate ``loss``, clip, step at ``lr``; return the loss."""
        _set_lr(self.optimizer, lr)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        _clip(self.model, self.grad_clip)
        self.optimizer.step()
        return float(loss.detach())

    def optimizer_state(self) -> Any:
        """Return the optimiser's state dict."""
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: Any) -> None:
        """Restore the optimiser's state dict."""
        self.optimizer.load_state_dict(state)


def batch_loss(loss: torch.Tensor, shard: Shard) -> float:
    """Return the loss of the whole batch: the ranks' losses weighted by their share of rows."""
    total = (loss.detach().float() * shard.share).reshape(1)
    dist.all_reduce(total)
    return float(total)


@dataclass
class DDPStep:
    """Several ranks under torch DDP: each its slice, gradients averaged in the backward."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    grad_clip: float | None
    model: nn.Module = field(init=False)

    def __post_init__(self) -> None:
        device = next(self.module.parameters()).device
        device_ids = [device.index] if device.type == "cuda" else None
        self.model = nn.parallel.DistributedDataParallel(self.module, device_ids=device_ids)

    def shard(self, indices: torch.Tensor) -> Shard:
        """Return this rank's slice of the batch."""
        return shard_rows(indices, *world())

    def step(self, loss: torch.Tensor, shard: Shard, lr: float) -> float:
        """Backpropagate the weighted loss (DDP averages gradients), clip, step; return the
        batch loss."""
        _set_lr(self.optimizer, lr)
        self.optimizer.zero_grad(set_to_none=True)
        (loss * shard.weight).backward()
        _clip(self.module, self.grad_clip)
        self.optimizer.step()
        return batch_loss(loss, shard)

    def optimizer_state(self) -> Any:
        """Return the optimiser's state dict (the same on every rank)."""
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: Any) -> None:
        """Restore the optimiser's state dict."""
        self.optimizer.load_state_dict(state)


@dataclass
class ZeroStep:
    """Several ranks under DeepSpeed ZeRO (stage 1 or 2): optimiser state (and, at stage 2,
    gradients) partitioned over the ranks; DeepSpeed averages gradients and clips.

    Checkpoints hold every rank's partition of the optimiser state (gathered on each save),
    so a resumed run needs the same number of workers.
    """

    module: nn.Module
    optimizer: torch.optim.Optimizer
    grad_clip: float | None
    zero_stage: int
    batch_size: int
    model: nn.Module = field(init=False)

    def __post_init__(self) -> None:
        self.model = zero_engine(
            self.module, self.optimizer, self.zero_stage, self.batch_size, self.grad_clip
        )

    def shard(self, indices: torch.Tensor) -> Shard:
        """Return this rank's slice of the batch."""
        return shard_rows(indices, *world())

    def step(self, loss: torch.Tensor, shard: Shard, lr: float) -> float:
        """Backpropagate the weighted loss and step the engine at ``lr``; return the batch loss."""
        engine: Any = self.model
        _set_lr(engine.optimizer, lr)
        engine.backward(loss * shard.weight)
        engine.step()
        return batch_loss(loss, shard)

    def optimizer_state(self) -> Any:
        """Return every rank's partition of the optimiser state, in rank order."""
        engine: Any = self.model
        states: list[Any] = [None] * world()[1]
        dist.all_gather_object(states, engine.optimizer.optimizer.state_dict())
        return states

    def load_optimizer_state(self, state: Any) -> None:
        """Restore this rank's partition and refresh the fp32 master weights from the model."""
        rank, size = world()
        if len(state) != size:
            raise JobConfigError(
                f"the checkpoint holds ZeRO state of {len(state)} workers; setting 'workers' "
                f"must stay {len(state)} to resume it (got {size})"
            )
        engine: Any = self.model
        engine.optimizer.optimizer.load_state_dict(state[rank])
        engine.optimizer.refresh_fp32_params()


def zero_engine(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    zero_stage: int,
    batch_size: int,
    grad_clip: float | None,
) -> Any:
    """Return ``deepspeed.initialize``'s engine over ``module`` and ``optimizer`` (fp32, ZeRO at
    ``zero_stage``) in the current process group.

    On the CPU accelerator DeepSpeed's shared-memory all-reduce kernel crashes in ranks not
    started by its launcher, so the process group's all-reduce is used instead
    (``workers.tensor_parallel.use_process_group_allreduce_on_cpu``).
    """
    from workers.tensor_parallel import use_process_group_allreduce_on_cpu

    use_process_group_allreduce_on_cpu()
    import deepspeed

    size = world()[1]
    micro = max(1, math.ceil(batch_size / size))
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "train_batch_size": micro * size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": grad_clip or 0.0,
        "zero_optimization": {"stage": zero_stage},
        "steps_per_print": 2**31 - 1,
    }
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    return engine


def stepper(
    model: nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float | None, batch_size: int
) -> Stepper:
    """Return how to step ``model`` here: plain alone, else ZeRO or DDP (``parallel`` setting)."""
    if world()[1] == 1:
        return PlainStep(model, optimizer, grad_clip)
    if _active.uses_zero():
        return ZeroStep(model, optimizer, grad_clip, _active.zero_stage, batch_size)
    return DDPStep(model, optimizer, grad_clip)
