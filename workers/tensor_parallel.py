"""The DeepSpeed AutoTP target backend: one rank of a tensor-parallel target.

Every rank of a group loads the same checkpoint, lets DeepSpeed AutoTP keep its slice of each
linear layer, and wraps the sharded model in the ordinary :class:`workers.target.LocalTarget`.
AutoTP shards the LM head along its input (hidden) dimension and all-reduces the partial logits,
so every rank sees the full, identical logits; with identically seeded generators and the same
calls in the same order (the caller fans each call out to all ranks), all ranks return the same
response and the caller keeps rank 0's.

DeepSpeed is an optional dependency: it is imported only when a group is built.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import PreTrainedModel

from workers.lm import DTYPES, CachedLM, load_causal_lm
from workers.model_spec import ModelSpec, RankSpec, SingleStep
from workers.records import GenerationResult, RequestSettings, SamplingConfig
from workers.step_plan import StepPlan
from workers.target import LocalTarget, VerifyRequest, VerifyResponse

SHM_COMM_OP = "deepspeed_shm_comm"
DEEPSPEED_TP_GRAIN_SIZE = 64
#: Variables a parent's DeepSpeed launch may leave that would mislead rank processes started
#: from it (a benchmark's, a test's): drop them from their environment.
DEEPSPEED_LAUNCH_ENV = ("DS_ACCELERATOR", "LOCAL_SIZE")


def init_tp_group(
    rank: int, world_size: int, master_addr: str, master_port: int, backend: str | None = None
) -> str:
    """Join the default torch.distributed process group as ``rank`` of ``world_size``.

    Uses NCCL when CUDA is available and gloo otherwise, unless ``backend`` says which. Calling
    it again in a process that already joined a group of the same shape does nothing. Also sets
    ``LOCAL_RANK`` (the CUDA device index DeepSpeed selects) and returns the backend in use.
    """
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise RuntimeError(
                f"this process is already rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"cannot join as rank {rank} of {world_size}"
            )
        return dist.get_backend()
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    local_rank = rank % torch.cuda.device_count() if torch.cuda.is_available() else 0
    os.environ["LOCAL_RANK"] = str(local_rank)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{_url_host(master_addr)}:{master_port}",
        rank=rank,
        world_size=world_size,
    )
    return backend


def leave_tp_group() -> None:
    """Wait for every rank, then leave the default process group: call before a rank exits.

    A rank that exits with gloo's threads still running can abort in its C++ teardown
    ("terminate called without an active exception", SIGABRT): 1 in 40 runs of the
    tensor-parallel test on a loaded 2-core machine, and once in CI.
    """
    dist.barrier()
    dist.destroy_process_group()


def use_process_group_allreduce_on_cpu() -> bool:
    """Make DeepSpeed's inference all-reduce go through the process group (gloo) on CPU.

    Why: with the CPU accelerator, ``deepspeed.comm.torch.TorchBackend.__init__`` calls
    ``build_shm_op()``, which JIT-compiles the ``deepspeed_shm_comm`` extension (minutes) and
    registers ``torch.ops.deepspeed.inference_all_reduce_``; ``TorchBackend.inference_all_reduce``
    (every AutoTP row-parallel layer and the LM head) then uses that shared-memory kernel for
    fp32 on any AVX2 CPU. The kernel sets up its shared memory only when ``LOCAL_SIZE`` equals
    the world size, which only the DeepSpeed launcher sets; ranks started any other way (Ray
    actors, plain processes) crash with SIGSEGV on the first fp32 all-reduce.

    How: ``build_shm_op()`` builds the op only if ``deepspeed.ops.__compatible_ops__`` marks it
    compatible, so we mark ``deepspeed_shm_comm`` incompatible; the kernel is then never built or
    loaded and ``inference_all_reduce`` calls ``torch.distributed.all_reduce``. A backend created
    earlier is switched over through ``shm_vector_kernel_level = 0``, the attribute its
    ``inference_all_reduce`` checks. Call before ``deepspeed.init_inference``.

    Returns True when DeepSpeed runs on the CPU accelerator and the fallback is in place, False
    otherwise (CUDA: the NCCL path is left alone).
    """
    _select_cpu_accelerator_without_cuda()
    import deepspeed.comm.comm as ds_comm
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return False
    deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
    if ds_comm.cdb is not None:
        ds_comm.cdb.shm_vector_kernel_level = 0
    return True


def shard_with_autotp(
    model: PreTrainedModel,
    tp_size: int,
    dtype: torch.dtype,
    tp_grain_size: int = DEEPSPEED_TP_GRAIN_SIZE,
) -> nn.Module:
    """Shard ``model`` over the ``tp_size`` ranks of the current group with DeepSpeed AutoTP.

    Returns the sharded Hugging Face module (``engine.module``), so that ``CachedLM`` uses it as
    it would the whole model. Requires :func:`init_tp_group` first; on CPU it applies
    :func:`use_process_group_allreduce_on_cpu` itself.

    Attention projections are split by key/value heads; the MLP and the LM head in blocks of
    ``tp_grain_size`` features (DeepSpeed's default 64), so a dimension smaller than
    ``tp_size`` blocks stays whole on the first ranks. The LM head is row-parallel (its hidden
    input is split) and its partial logits are all-reduced, so every rank gets the full logits.
    Its forward only accepts [batch, seq, hidden], so it is wrapped to take the [n, hidden] rows
    ``CachedLM`` passes.
    """
    use_process_group_allreduce_on_cpu()
    import deepspeed

    engine = deepspeed.init_inference(
        model,
        tensor_parallel={"tp_size": tp_size, "tp_grain_size": tp_grain_size},
        dtype=dtype,
        replace_with_kernel_inject=False,
    )
    sharded = engine.module
    sharded.set_output_embeddings(RowsToSequenceHead(sharded.get_output_embeddings()))
    return sharded


class RowsToSequenceHead(nn.Module):
    """An LM head that accepts [n, hidden] rows by running the wrapped head on [1, n, hidden]."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return the wrapped head's logits with the same leading shape as ``hidden``."""
        if hidden.dim() != 2:
            return self.head(hidden)
        return self.head(hidden.unsqueeze(0)).squeeze(0)


def agreed_single_step(lm: CachedLM, single_step: SingleStep = "auto") -> CachedLM:
    """Calibrate ``lm``'s one-token step on every rank in lockstep and adopt rank 0's choice;
    a forced ``single_step`` ("plain", "padded" or a ``StepPlan``, the same on every rank) is
    taken as is.

    Each rank times its own shard; the ranks must still run the same kernels shapes (their
    collectives pair up), so rank 0's choice is broadcast to all.
    """
    if isinstance(single_step, StepPlan):
        lm.plan = single_step
        return lm
    if single_step != "auto":
        lm.pad_single_step = single_step == "padded"
        return lm
    padded = torch.tensor([int(lm.calibrate_steps().padded)], dtype=torch.int64)
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        padded = padded.cuda()
    dist.broadcast(padded, src=0)
    lm.pad_single_step = bool(padded.item())
    return lm


class TensorParallelTarget:
    """One rank of a tensor-parallel target: AutoTP-sharded model inside a ``LocalTarget``.

    ``model`` and ``rank`` are :class:`workers.model_spec.ModelSpec` and ``RankSpec`` (or anything
    with their fields); ``tp_grain_size`` is passed to :func:`shard_with_autotp`.
    """

    def __init__(
        self, model: ModelSpec, rank: RankSpec, tp_grain_size: int = DEEPSPEED_TP_GRAIN_SIZE
    ) -> None:
        init_tp_group(rank.rank, rank.world_size, rank.master_addr, rank.master_port)
        whole = load_causal_lm(
            model.path, model.dtype, device="cpu", trust_remote_code=model.trust_remote_code
        )
        sharded = shard_with_autotp(whole, rank.world_size, DTYPES[model.dtype], tp_grain_size)
        self.rank = rank.rank
        self.target = LocalTarget(
            agreed_single_step(CachedLM(sharded, single_step="plain"), model.single_step)
        )

    @property
    def lm(self) -> CachedLM:
        """The sharded model with its KV cache (full logits on every rank)."""
        return self.target.lm

    def prefill(
        self,
        prompt_ids: torch.Tensor,
        sampling: SamplingConfig,
        seed: int,
        want_features: bool = False,
        feature_layers: tuple[int, ...] = (),
    ) -> torch.Tensor | None:
        """Start a request on this rank (its prompt features when ``want_features``: those of
        ``feature_layers`` when it names any)."""
        return self.target.prefill(prompt_ids, sampling, seed, want_features, feature_layers)

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        """Score one drafted block on this rank (all ranks must get the same call)."""
        return self.target.verify(request)

    def generate(self, prompt_ids: torch.Tensor, settings: RequestSettings) -> GenerationResult:
        """Decode with the target alone on this rank (every rank runs the same loop)."""
        return self.target.generate(prompt_ids, settings)


def _select_cpu_accelerator_without_cuda() -> None:
    """Tell DeepSpeed to use its CPU accelerator when CUDA is absent (instead of guessing).

    Its auto-detection picks the same one but logs a warning in every process; an explicit
    ``DS_ACCELERATOR`` set by the user is kept.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _url_host(address: str) -> str:
    """Return ``address`` ready for a tcp:// URL (IPv6 addresses in brackets)."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def wait_for_ranks(procs: Sequence[Any], deadline_s: float) -> list[int | None]:
    """Return the exit codes of rank processes (anything with ``poll()``) once all ended, one
    failed (its peers would wait for it forever) or ``deadline_s`` passed (None: running)."""
    deadline = time.monotonic() + deadline_s
    codes = [proc.poll() for proc in procs]
    while None in codes and not any(codes) and time.monotonic() < deadline:
        time.sleep(0.2)
        codes = [proc.poll() for proc in procs]
    return codes
