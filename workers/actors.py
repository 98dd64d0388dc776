"""Ray actors that host the models. They only move data: the decoding logic is the engine's.

``TargetWorker`` hosts the target (backend ``hf``: the whole model; backend ``deepspeed``: one
AutoTP rank of ``tp_size``). ``DraftWorker`` hosts the draft model (or an EAGLE head over the
target's frozen embeddings, norm and LM head, fed the target's features each round), drives
the rounds through :func:`workers.trial.run_trial` (a group shard's arms interleaved:
:func:`workers.trial.run_arms`), and calls the target group once per round through
:class:`RemoteTargetGroup`, which fans each call out to every rank and returns rank 0's
answer. The per-request calls (``prefill``, ``verify``, ``generate``) travel over each rank's
direct channel (:mod:`workers.channel`); the rest, and the actors' lifecycle, go through Ray.
The classes run outside Ray too (``TargetWorker.__ray_actor_class__``), as ``bench/actors.py``'s
Ray-free placement runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from threading import Lock

import ray
import torch

from workers.batch_engine import BatchRequest
from workers.batch_target import BATCH_METHODS, BatchTarget, ChannelBatchedLM
from workers.batch_trial import run_group
from workers.channel import ChannelAddress, ChannelClient, serve_channel
from workers.eagle.artifact import load_head_for_target
from workers.eagle.trace import record_eagle_trace
from workers.lm import CachedLM, SingleStepCalibration, StepOutput, load_causal_lm
from workers.model_spec import EagleHeadSpec, ModelSpec, RankSpec
from workers.proposers import EagleProposer
from workers.proposers.ngram import NgramSettings
from workers.records import GenerationResult, RequestSettings, SamplingConfig
from workers.target import LocalTarget, VerifyRequest, VerifyResponse
from workers.trace import GreedyTrace, record_lookup_trace, record_trace
from workers.trial import (
    GroupRequest,
    GroupResults,
    TrialRequest,
    WarmUp,
    run_trial,
    warm_up,
)

__all__ = [
    "ChannelTargetGroup",
    "DraftWorker",
    "ModelSpec",
    "RankSpec",
    "RemoteLM",
    "RemoteTargetGroup",
    "TargetWorker",
]


def _device() -> str:
    """Return "cuda" when Ray gave this actor a GPU (outside Ray: when one is visible), else
    "cpu"."""
    given = ray.get_gpu_ids() if ray.is_initialized() else True
    return "cuda" if given and torch.cuda.is_available() else "cpu"


def load_model(model: ModelSpec, device: str) -> CachedLM:
    """Load ``model`` on ``device`` as a worker hosts it."""
    lm = load_causal_lm(model.path, model.dtype, device, model.trust_remote_code)
    return CachedLM(lm, single_step=model.single_step)


def on_cpu(answer: object) -> object:
    """Return a target call's answer with its tensors on the CPU: prompt features, and a
    verification's hidden state and features (an EAGLE head's or Cali-TS's), so that a draft
    actor without the target's GPU can unpickle them; CPU tensors pass as they are."""
    if isinstance(answer, torch.Tensor):
        return answer.cpu()
    if not isinstance(answer, VerifyResponse):
        return answer
    hidden, features = answer.hidden, answer.features
    if all(t is None or t.device.type == "cpu" for t in (hidden, features)):
        return answer  # every round on a CPU target: no copy of the response
    return replace(
        answer,
        hidden=None if hidden is None else hidden.cpu(),
        features=None if features is None else features.cpu(),
    )


@ray.remote
class TargetWorker:
    """One target process: the whole model (hf) or one AutoTP rank (deepspeed)."""

    def __init__(self, model: ModelSpec, rank: RankSpec | None = None) -> None:
        self.batch: BatchTarget | None = None
        if rank is None:
            self.target = LocalTarget(load_model(model, _device()))
            self.batch = BatchTarget(self.target.lm)
        else:
            from workers.tensor_parallel import TensorParallelTarget

            if not rank.master_addr:
                rank = replace(rank, master_addr=ray.util.get_node_ip_address())
            self.target = TensorParallelTarget(model, rank)
        self.lock = Lock()
        self.channel: ChannelAddress | None = None

    def _call(self, method: str, args: tuple):
        """Run one of the target's methods in inference mode (the batched ones on its batched
        caches); Ray's calls and the channel's take turns. Tensors in the answer come back on
        the CPU (``on_cpu``)."""
        owner = self.batch if method in BATCH_METHODS else self.target
        if owner is None:
            raise ValueError(f"{method}: batched decoding runs on a target of backend hf only")
        with self.lock, torch.inference_mode():
            return on_cpu(getattr(owner, method)(*args))

    def open_channel(self) -> ChannelAddress:
        """Return this rank's direct channel (started on first use) for the per-request
        calls."""
        if self.channel is None:
            self.channel = serve_channel(ray.util.get_node_ip_address(), self._call)
        return self.channel

    def single_step_calibration(self) -> SingleStepCalibration | None:
        """Return how this rank's one-token steps were calibrated (None when ``ModelSpec``
        forced a choice)."""
        return self.target.lm.calibration

    def lm_forward(self, ids: torch.Tensor, last_only: bool) -> tuple[torch.Tensor, int]:
        """Forward ``ids`` through the target's cached LM; return CPU logits and cached length."""
        with self.lock:
            out = self.target.lm.forward(ids, last_only=last_only)
            return out.logits.cpu(), self.target.lm.cached_len

    def lm_crop(self, length: int) -> int:
        """Crop the target's cache to ``length`` tokens; return the cached length."""
        with self.lock:
            self.target.lm.crop(length)
            return self.target.lm.cached_len

    def lm_reset(self) -> None:
        """Drop the target's cache."""
        with self.lock:
            self.target.lm.reset()

    def node_id(self) -> str:
        """Return the Ray node this actor runs on (placement checks)."""
        return ray.get_runtime_context().get_node_id()


class ChannelTargetGroup:
    """The target group as the engine sees it, over its ranks' direct channels
    (:mod:`workers.channel`): every per-request call (``prefill``, ``verify``, ``generate``)
    goes to all ranks, and rank 0 answers.

    Channels open on first use, at the addresses :meth:`_open_addresses` returns. (The prefill
    is not left running while the draft prefills: its wait would land in the first round's
    verify seconds, which the cost fits read.) A broken channel is dropped, :meth:`_check_ranks`
    runs, and a ``ConnectionError`` follows. ``answered`` counts the calls answered: the draft
    actor's progress, which the driver watches.
    """

    def __init__(self, addresses: list[ChannelAddress]) -> None:
        self.addresses = addresses
        self.channels: list[ChannelClient] = []
        self.answered = 0

    def _open_addresses(self) -> list[ChannelAddress]:
        """Return the ranks' channel addresses, in rank order."""
        return self.addresses

    def _check_ranks(self) -> None:
        """Raise the ranks' own error when a channel broke because a rank died (no check
        here)."""

    def _on_channels(self, method: str, *args) -> object:
        """Call ``method`` on every rank over its channel; return rank 0's answer."""
        try:
            if not self.channels:
                self.channels = [ChannelClient.connect(a) for a in self._open_addresses()]
            for channel in self.channels:
                channel.send(method, *args)
            answers = [channel.receive() for channel in self.channels]  # drain every rank
            self.answered += 1
            return answers[0]
        except (EOFError, OSError) as exc:
            self.channels = []
            self._check_ranks()
            raise ConnectionError(f"target channel broke during {method}: {exc!r}") from exc

    def prefill(
        self,
        prompt_ids: torch.Tensor,
        sampling: SamplingConfig,
        seed: int,
        want_features: bool = False,
        feature_layers: tuple[int, ...] = (),
    ) -> torch.Tensor | None:
        """Start a request on every rank; rank 0's prompt features when ``want_features``
        (those of ``feature_layers`` when it names any)."""
        if not want_features:
            return self._on_channels("prefill", prompt_ids, sampling, seed)
        args = (prompt_ids, sampling, seed, want_features, feature_layers)
        return self._on_channels("prefill", *args)

    def verify(self, request: VerifyRequest) -> VerifyResponse:
        """Verify on every rank (they compute in lockstep); return rank 0's response."""
        return self._on_channels("verify", request)

    def generate(self, prompt_ids: torch.Tensor, settings: RequestSettings) -> GenerationResult:
        """Decode with the target alone: one call per rank for the whole request."""
        return self._on_channels("generate", prompt_ids, settings)

    def batched(self, slots: int) -> ChannelBatchedLM:
        """Return the target's batched cache of ``slots`` rows, one call per forward."""
        return ChannelBatchedLM(self._on_channels, slots)

    def batch_generate(self, requests: list[BatchRequest], slots: int) -> list[GenerationResult]:
        """Decode ``requests`` with the target alone, ``slots`` at a time: one call."""
        return self._on_channels("batch_generate", requests, slots)


class RemoteTargetGroup(ChannelTargetGroup):
    """The channels of a target group of Ray actors (``TargetWorker`` ranks).

    Each rank's address comes from the rank through Ray. When a channel breaks, the ranks are
    asked through Ray whether they are alive, so a dead rank raises Ray's actor error (the
    runner then replaces the worker group) and a live one a ``ConnectionError``.
    """

    def __init__(self, ranks: list) -> None:
        super().__init__([])
        self.ranks = ranks

    def _open_addresses(self) -> list[ChannelAddress]:
        """Ask every rank for its channel (started on first use)."""
        return ray.get([rank.open_channel.remote() for rank in self.ranks])

    def _check_ranks(self) -> None:
        """Raise Ray's actor error if a rank has died."""
        ray.get([rank.node_id.remote() for rank in self.ranks])


class RemoteLM:
    """The target group's cached LM as ``workers.trace.record_trace`` sees it (forward, crop,
    reset, cached_len): every call goes to all ranks, rank 0 answers; logits only, no hidden
    states. Returns full logit rows, so it serves trace recording, not the round protocol.
    """

    device = torch.device("cpu")

    def __init__(self, ranks: list) -> None:
        self.ranks = ranks
        self._cached_len = 0

    @property
    def cached_len(self) -> int:
        """Number of tokens in the target's cache."""
        return self._cached_len

    def reset(self) -> None:
        """Drop the cache on every rank."""
        ray.get([rank.lm_reset.remote() for rank in self.ranks])
        self._cached_len = 0

    def forward(self, ids: torch.Tensor, last_only: bool = False) -> StepOutput:
        """Forward ``ids`` on every rank; return rank 0's logits (hidden states left empty)."""
        answers = ray.get([rank.lm_forward.remote(ids.cpu(), last_only) for rank in self.ranks])
        logits, self._cached_len = answers[0]
        return StepOutput(logits=logits, hidden=torch.empty(0))

    def crop(self, length: int) -> None:
        """Roll every rank's cache back to ``length`` tokens."""
        self._cached_len = ray.get([rank.lm_crop.remote(length) for rank in self.ranks])[0]


#: Records one prompt's greedy trace: (prompt ids, max new tokens, cap, EOS id) -> the trace.
TraceRecorder = Callable[[torch.Tensor, int, int, int | None], GreedyTrace]


def load_draft(model: ModelSpec | EagleHeadSpec, device: str) -> CachedLM | EagleProposer:
    """Load what a draft worker drafts with on ``device``: a draft model, or an EAGLE head over
    its target's frozen parts as one proposer (its weights prepared once; every request
    begins it afresh)."""
    if isinstance(model, EagleHeadSpec):
        return EagleProposer(load_head_for_target(model.path, model.target, device))
    return load_model(model, device)


@ray.remote
class DraftWorker:
    """The draft (a draft model or an EAGLE head's proposer; None for a target-only or n-gram
    pair) plus the round driver; holds handles to the target group's ranks."""

    def __init__(self, model: ModelSpec | EagleHeadSpec | None, target_ranks: list) -> None:
        self.draft = None
        if model is not None:
            self.draft = load_draft(model, _device())
        self.target = RemoteTargetGroup(target_ranks)

    def run_trial(self, request: TrialRequest) -> list[GenerationResult]:
        """Run one trial (all its prompts) and return one result per prompt."""
        return run_trial(self.draft, self.target, request)

    def run_arms(self, group: GroupRequest) -> GroupResults:
        """Run a group shard's arms: interleaved prompt by prompt at batch size 1
        (``workers.trial.run_arms``), as batch queues above (``workers.batch_trial``)."""
        return run_group(self.draft, self.target, group)

    def warm_up(self, request: TrialRequest, min_seconds: float) -> WarmUp:
        """Decode ``request`` untimed for at least ``min_seconds`` (``workers.trial.warm_up``)."""
        return warm_up(self.draft, self.target, request, min_seconds)

    def progress(self) -> int:
        """Return how many target calls this actor's decoding has had answered so far (the
        driver's stall watch asks while a call runs; the actor must allow two at once)."""
        return self.target.answered

    def single_step_calibration(self) -> SingleStepCalibration | None:
        """Return how the draft model's one-token steps were calibrated (None without a draft
        model or when ``ModelSpec`` forced a choice)."""
        return self.draft.calibration if isinstance(self.draft, CachedLM) else None

    def record_traces(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        cap: int,
        eos_token_id: int | None,
        lookup: NgramSettings | None = None,
    ) -> list[GreedyTrace]:
        """Record the greedy trace of each prompt at ``cap``: the draft model's
        (``workers.trace.record_trace``), the EAGLE head's (``workers.eagle.trace``), or with
        ``lookup`` set an n-gram lookup's with those settings
        (``workers.trace.record_lookup_trace``: no draft model needed)."""
        record = self._trace_recorder(lookup)
        return [
            record(torch.tensor(prompt, dtype=torch.long), max_new_tokens, cap, eos_token_id)
            for prompt in prompts
        ]

    def _trace_recorder(self, lookup: NgramSettings | None) -> TraceRecorder:
        """Return the recorder of one prompt's trace for this actor's draft (or ``lookup``)."""
        if lookup is not None:
            return partial(record_lookup_trace, self.target, settings=lookup)
        if isinstance(self.draft, EagleProposer):
            return partial(record_eagle_trace, self.draft.drafter, self.target)
        if not isinstance(self.draft, CachedLM):
            raise ValueError("recording a trace needs a draft model, an EAGLE head or a lookup")
        return partial(record_trace, self.draft, RemoteLM(self.target.ranks))

    def node_id(self) -> str:
        """Return the Ray node this actor runs on (placement checks)."""
        return ray.get_runtime_context().get_node_id()
