"""Ray actors that host the models. They only move data: the decoding logic is the engine's.

``TargetWorker`` hosts the target (backend ``hf``: the whole model; backend ``deepspeed``: one
AutoTP rank of ``tp_size``). ``DraftWorker`` hosts the draft model, drives the rounds through
:func:`workers.trial.run_trial`, and calls the target group once per round through
:class:`RemoteTargetGroup`, which fans each call out to every rank and returns rank 0's answer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import ray
import torch

from workers.lm import CachedLM, load_causal_lm
from workers.records import GenerationResult, SamplingConfig
from workers.target import LocalTarget, VerifyRequest, VerifyResponse
from workers.trial import TrialRequest, run_trial


@dataclass(frozen=True)
class ModelSpec:
    """Where a model is and how to load it."""

    path: str
    dtype: str = "float32"
    trust_remote_code: bool = False


@dataclass(frozen=True)
class RankSpec:
    """This rank's place in a tensor-parallel target group.

    An empty ``master_addr`` means this node's address (all ranks of a group are packed on one
    node, so every rank resolves the same one).
    """

    rank: int
    world_size: int
    master_addr: str
    master_port: int


def _device() -> str:
    """Return "cuda" when Ray gave this actor a GPU, else "cpu"."""
    return "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


@ray.remote
class TargetWorker:
    """One target process: the whole model (hf) or one AutoTP rank (deepspeed)."""

    def __init__(self, model: ModelSpec, rank: RankSpec | None = None) -> None:
        if rank is None:
            lm = CachedLM(
                load_causal_lm(model.path, model.dtype, _device(), model.trust_remote_code)
            )
            self.target = LocalTarget(lm)
        else:
            from workers.tensor_parallel import TensorParallelTarget

            if not rank.master_addr:
                rank = replace(rank, master_addr=ray.util.get_node_ip_address())
            self.target = TensorParallelTarget(model, rank)

    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> float:
        """Start a request on this rank."""
        return self.target.prefill(prompt_ids, sampling, seed)

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        """Score one drafted block on this rank."""
        return self.target.verify(request)

    def node_id(self) -> str:
        """Return the Ray node this actor runs on (placement checks)."""
        return ray.get_runtime_context().get_node_id()


class RemoteTargetGroup:
    """The target group as the engine sees it: every call goes to all ranks, rank 0 answers."""

    def __init__(self, ranks: list) -> None:
        self.ranks = ranks

    def prefill(self, prompt_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> float:
        """Start a request on every rank; return rank 0's seconds."""
        return ray.get([rank.prefill.remote(prompt_ids, sampling, seed) for rank in self.ranks])[0]

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        """Verify on every rank (they compute in lockstep); return rank 0's response."""
        return ray.get([rank.verify.remote(request) for rank in self.ranks])[0]


@ray.remote
class DraftWorker:
    """The draft model plus the round driver; holds handles to the target group's ranks."""

    def __init__(self, model: ModelSpec | None, target_ranks: list) -> None:
        self.draft = None
        if model is not None:
            self.draft = CachedLM(
                load_causal_lm(model.path, model.dtype, _device(), model.trust_remote_code)
            )
        self.target = RemoteTargetGroup(target_ranks)

    def run_trial(self, request: TrialRequest) -> list[GenerationResult]:
        """Run one trial (all its prompts) and return one result per prompt."""
        return run_trial(self.draft, self.target, request)

    def node_id(self) -> str:
        """Return the Ray node this actor runs on (placement checks)."""
        return ray.get_runtime_context().get_node_id()
