"""A causal LM with its own KV cache: forward new tokens, crop back to an accepted prefix.

Works with Hugging Face decoder-only models that expose ``get_decoder()`` and
``get_output_embeddings()`` (Llama, Mistral, Qwen, GPT-NeoX/Pythia, ...). The decoder and the
LM head are called separately so that only the rows that are needed go through the head and the
last-layer hidden states come for free (trained acceptance heads read them). Plain Llama models
run their decoder through ``workers.llama_fast`` (same computation, without transformers'
per-call bookkeeping); every other model, and any model with ``fast=False``, through the
transformers forward with a ``DynamicCache``.

A forward's cost depends on its block size differently on each weight layout of the fast path
(oneDNN-packed or the model's own weights), and a one-token step (every step of target-only
decoding, every draft step) may cost more than a two-token block: on this repository's CPU MKL
runs a one-row product as a matrix-vector kernel on one core, and the 49152-row LM head of
SmolLM2 took 11.5 ms that way against 4.2 ms as a two-column product. ``CachedLM`` therefore
times every layout at several block sizes once when it is created (``calibrate_steps``) and
follows the resulting ``workers.step_plan.StepPlan``: each forward runs on the layout fastest
for its size, and where two tokens are cheaper a one-token step runs as a two-token block (the
token twice, the second position cropped off). The AR baseline's steps and speculation's
blocks each run on their fastest layout, so no speedup over AR comes from a slow baseline step;
what mixing layouts means for exactness is in ``workers.step_plan``.

A draft may restrict its LM head to the tokens it proposes (a frequency-ranked head, as in
FR-Spec): its ``config.json`` then carries ``draft_vocab``, the sorted ids it may propose, while
the checkpoint keeps the full embeddings and head. ``CachedLM`` then runs the head on a
contiguous copy of those rows only and scatters the result into full-width logits whose other
columns hold ``OUTSIDE_VOCAB_LOGIT``: every softmax gives them probability exactly 0, so
speculative sampling's residual max(0, p − q) stays exact.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from workers.compiled_step import CompiledSteps
from workers.hf_cache import cache_kwargs
from workers.llama_fast import LlamaFastDecoder, PackedLinear, unsupported_reason
from workers.model_spec import SingleStep
from workers.step_plan import CALIBRATION_SIZES, Layout, StepPlan, choose_step_plan

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

#: Timed repetitions of each (layout, block size) when calibrating (interleaved, fastest taken).
CALIBRATION_REPEATS = 5
#: Cached tokens the calibration's blocks run after (a short prompt plus some decoding).
CALIBRATION_CONTEXT = 64
#: The logit of a token outside a draft's ``draft_vocab``. Finite, not -inf: temperature divides
#: logits and policies take entropies as −Σ p·log p, where -inf would give NaN (-inf − -inf, or
#: 0·-inf); it is low enough that exp(it − any real logit) is exactly 0 in float32, so such a
#: token has probability exactly 0 under every softmax, warped or not.
OUTSIDE_VOCAB_LOGIT = -1e9


@dataclass(frozen=True)
class SingleStepCalibration:
    """What ``CachedLM.calibrate_steps`` measured and chose.

    ``seconds``: the fastest seconds of a block of each timed size on each layout timed;
    ``plan``: the choice (``workers.step_plan.choose_step_plan``). ``one_token_s`` and
    ``two_tokens_s`` are the chosen layouts' one-token step and two-token block, ``padded``
    whether one-token steps run as two-token blocks. ``compile_seconds``: what compiling the
    "compiled" layout's graphs took at load (None when it was not offered).
    """

    seconds: dict[Layout, dict[int, float]]
    plan: StepPlan
    one_token_s: float
    two_tokens_s: float
    padded: bool
    compile_seconds: float | None = None


@dataclass(frozen=True)
class StepOutput:
    """Logits [n, V] (and last-layer hidden states [n, d]) for the rows that were asked for;
    ``layers`` [n, k·d]: the states after the decoder layers a forward named, at every position
    (an EAGLE head fusing several layers reads them), else None."""

    logits: torch.Tensor
    hidden: torch.Tensor
    layers: torch.Tensor | None = None


@dataclass(frozen=True)
class RestrictedHead:
    """The LM head's rows for the ids in ``kept`` (sorted), as one contiguous matrix."""

    kept: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    vocab_size: int


def restricted_head(model: PreTrainedModel) -> RestrictedHead | None:
    """Return the head restricted to ``model.config.draft_vocab``, or None when it has none.

    Raises ValueError for ids that are unsorted, repeated or outside the head's rows.
    """
    draft_vocab = getattr(model.config, "draft_vocab", None)
    if draft_vocab is None:
        return None
    head = model.get_output_embeddings()
    vocab_size = head.weight.shape[0]
    ids = list(draft_vocab)
    if not ids or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= vocab_size:
        raise ValueError(
            f"draft_vocab must be sorted distinct token ids below the head's {vocab_size} rows"
        )
    kept = torch.tensor(ids, dtype=torch.long, device=head.weight.device)
    bias = getattr(head, "bias", None)
    return RestrictedHead(
        kept=kept,
        weight=head.weight.detach()[kept].contiguous(),
        bias=None if bias is None else bias.detach()[kept].contiguous(),
        vocab_size=vocab_size,
    )


def scatter_logits(head: RestrictedHead, kept_logits: torch.Tensor) -> torch.Tensor:
    """Return float logits [..., V]: ``kept_logits`` [..., len(kept)] in their columns, the rest
    ``OUTSIDE_VOCAB_LOGIT``."""
    full = kept_logits.new_full(
        (*kept_logits.shape[:-1], head.vocab_size), OUTSIDE_VOCAB_LOGIT, dtype=torch.float32
    )
    full[..., head.kept] = kept_logits.float()
    return full


def head_logits(
    head: torch.nn.Module,
    restricted: RestrictedHead | None,
    hidden: torch.Tensor,
    product: PackedLinear | None = None,
    packed: bool = True,
) -> torch.Tensor:
    """Return float logits [..., V] of last-layer hidden states [..., d] through the LM head.

    ``restricted`` (from ``restricted_head``) scores only its kept rows, scattered to full width.
    ``product`` (rows [n, d] only; from ``head_product``) computes the product with the head's
    prepared weight (its packed copy unless ``packed`` is False), otherwise it runs as the head
    module (or ``F.linear`` on the kept rows) does.
    """
    if restricted is None:
        logits = product(hidden, packed) if product is not None else head(hidden)
        return logits.float()
    if product is not None:
        return scatter_logits(restricted, product(hidden, packed))
    linear = torch.nn.functional.linear(hidden, restricted.weight, restricted.bias)
    return scatter_logits(restricted, linear)


def layer_states(hidden_states: Sequence[torch.Tensor], layers: tuple[int, ...]) -> torch.Tensor:
    """Return the states after decoder layers ``layers`` [..., k·d], concatenated in their
    order, from a transformers forward's ``hidden_states`` (the embeddings first, the last
    layer's after the final norm)."""
    return torch.cat([hidden_states[i + 1] for i in layers], dim=-1)


def head_product(
    head: torch.nn.Module, restricted: RestrictedHead | None, prepack: bool = True
) -> PackedLinear:
    """Return the fast path's prepared LM-head product: the kept rows when ``restricted``."""
    weight = head.weight if restricted is None else restricted.weight
    return PackedLinear(weight.detach(), prepack)


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on ``device`` (CUDA runs kernels asynchronously); a no-op on CPU.

    Call it before reading a clock that should include a forward's device time.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def avoid_cudnn_attention(device: torch.device | str) -> None:
    """On CUDA, take cuDNN out of ``scaled_dot_product_attention``'s backends, process-wide.

    cuDNN's attention builds an execution graph for each new key length, and decoding meets a
    new length at every step. On an H200 (bfloat16, SmolLM2) that made each first visit of a
    length cost several times a cached one (docs/lab/gpu-run-3-h200.md); flash and
    memory-efficient attention have no such per-length cost. A no-op on other devices.
    """
    if torch.device(device).type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def load_causal_lm(
    path: str | Path,
    dtype: str = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """Load a causal LM from a local directory or hub id, safetensors only, in eval mode.

    ``trust_remote_code`` stays off unless a sweep asks for it explicitly.
    """
    model = AutoModelForCausalLM.from_pretrained(
        str(path),
        dtype=DTYPES[dtype],
        use_safetensors=True,
        trust_remote_code=trust_remote_code,
    )
    return model.to(device).eval()


class CachedLM:
    """One model plus one KV cache for batch-1 decoding.

    ``fast`` (default) takes the plain-torch Llama path when the model qualifies; ``fast_path``
    says whether it did. ``prepack`` (default) lets the fast path keep oneDNN-packed copies of
    the weights on CPU in float32 beside the model's own (``workers.llama_fast.PackedLinear``:
    twice the projections' memory); ``layouts`` lists the layouts it can then run on ("packed"
    first, the default), else only "unpacked". ``compiled_steps`` (fast path only) adds the
    "compiled" layout (``workers.compiled_step``: the unpacked forward through
    ``torch.compile``, bit-equal to it), compiling its graphs now (inductor's on-disk cache
    makes a second load quick). ``single_step`` says how forwards run (``plan``): "auto"
    (default) times every layout at several block sizes now (``calibrate_steps``); "plain" and
    "padded" run every size on the default layout with one-token steps as themselves or as
    two-token blocks (a tensor-parallel rank must not decide alone: its ranks run the same
    kernels in lockstep); a ``workers.step_plan.StepPlan`` is taken as given (a choice made on
    the node before, ``orchestrator.run.step_choices``). A model on CUDA takes cuDNN out of
    attention for the whole process (``avoid_cudnn_attention``).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        fast: bool = True,
        single_step: SingleStep = "auto",
        prepack: bool = True,
        compiled_steps: bool = False,
    ) -> None:
        self.model = model
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.restricted = restricted_head(model)
        self.device = next(model.parameters()).device
        avoid_cudnn_attention(self.device)
        use_fast = fast and unsupported_reason(model) is None
        self.fast_decoder = LlamaFastDecoder(model, prepack) if use_fast else None
        self.head_product = None
        if use_fast:
            self.head_product = head_product(self.head, self.restricted, prepack)
        self.cache = None if use_fast else DynamicCache(config=model.config)
        packs = self.head_product is not None and self.head_product.packed is not None
        self.layouts: tuple[Layout, ...] = ("packed", "unpacked") if packs else ("unpacked",)
        self.compiled: CompiledSteps | None = None
        if compiled_steps:
            if self.fast_decoder is None:
                raise ValueError(
                    "compiled_steps needs the plain-torch Llama path: "
                    f"{unsupported_reason(model) or 'fast=False was given'}"
                )
            self.compiled = CompiledSteps(self.fast_decoder)
            self.compiled.warm()
            self.layouts += ("compiled",)
        self.plan = _given_plan(single_step, self.layouts[0])
        if self.compiled is None and "compiled" in {layout for _, layout in self.plan.layouts}:
            raise ValueError("the step plan runs compiled steps: load with compiled_steps=True")
        self.calibration: SingleStepCalibration | None = None
        if single_step == "auto":
            self.calibrate_steps()

    @property
    def pad_single_step(self) -> bool:
        """Whether one-token steps run as two-token blocks (``plan.padded``)."""
        return self.plan.padded

    @pad_single_step.setter
    def pad_single_step(self, padded: bool) -> None:
        self.plan = StepPlan(self.plan.layouts, padded)

    @torch.inference_mode()
    def calibrate_steps(
        self, repeats: int = CALIBRATION_REPEATS, layouts: Sequence[Layout] | None = None
    ) -> SingleStepCalibration:
        """Time blocks of each size on each layout, taking turns, and follow the plan chosen.

        ``layouts`` (default: all of ``layouts``) are timed at ``CALIBRATION_SIZES``, or at 1
        and 2 tokens when there is one (only the padding is then to choose), after a cached
        context of ``CALIBRATION_CONTEXT`` tokens; the cache is left empty. Each layout's turn
        starts with an untimed one-token step (its weights back in the caches) and the sizes'
        order rotates; the fastest of the repeats counts (a busy machine only adds time).
        Returns (and keeps in ``calibration``) the times and the choice
        (``workers.step_plan.choose_step_plan``).
        """
        layouts = tuple(layouts or self.layouts)
        sizes = CALIBRATION_SIZES if len(layouts) > 1 else (1, 2)
        context = torch.zeros(CALIBRATION_CONTEXT, dtype=torch.long, device=self.device)
        times: dict[tuple[Layout, int], list[float]] = {(a, n): [] for a in layouts for n in sizes}
        self.reset()
        self._forward(context, last_only=True)
        for repeat in range(repeats + 1):
            for layout in layouts if repeat % 2 == 0 else layouts[::-1]:
                self.plan = StepPlan.uniform(layout)
                self._timed_block(context[:1])
                for n in sizes[repeat % len(sizes) :] + sizes[: repeat % len(sizes)]:
                    seconds = self._timed_block(context[:n])
                    if repeat > 0:
                        times[layout, n].append(seconds)
        self.reset()
        seconds = {a: {n: min(times[a, n]) for n in sizes} for a in layouts}
        plan = choose_step_plan(seconds)
        one, two = seconds[plan.layout(1)][1], seconds[plan.layout(2)][2]
        compiled = None if self.compiled is None else self.compiled.compile_seconds
        self.calibration = SingleStepCalibration(seconds, plan, one, two, plan.padded, compiled)
        self.plan = plan
        return self.calibration

    def _timed_block(self, ids: torch.Tensor) -> float:
        """Return the seconds of one forward of ``ids`` (all rows through the head) after the
        cached context, which it is cropped back to."""
        length = self.cached_len
        synchronize(self.device)
        start = time.perf_counter()
        self._forward(ids, last_only=False)
        synchronize(self.device)
        seconds = time.perf_counter() - start
        self.crop(length)
        return seconds

    @property
    def fast_path(self) -> bool:
        """True when the decoder runs through ``workers.llama_fast``."""
        return self.fast_decoder is not None

    @property
    def vocab_kept(self) -> int | None:
        """Number of tokens the head scores (``draft_vocab``), or None for the full vocabulary."""
        return None if self.restricted is None else int(self.restricted.kept.numel())

    @property
    def cached_len(self) -> int:
        """Number of tokens whose keys and values are in the cache."""
        if self.fast_decoder is not None:
            return self.fast_decoder.length
        return self.cache.get_seq_length()

    def reset(self) -> None:
        """Drop the cache (start of a new request)."""
        if self.fast_decoder is not None:
            self.fast_decoder.reset()
        else:
            self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        last_only: bool = False,
        all_hidden: bool = False,
        layers: tuple[int, ...] = (),
    ) -> StepOutput:
        """Run ``ids`` [n] after the cached prefix, append them to the cache, return outputs.

        With ``last_only`` only the last position goes through the LM head; ``all_hidden``
        then still returns the hidden states of every position (an EAGLE head reads a prompt's
        features). ``layers`` (decoder-layer indices) asks for the states after those layers at
        every position too (``StepOutput.layers``). Raises ValueError for an empty ``ids``
        (e.g. a prompt that tokenised to nothing).
        """
        ids = ids.view(-1).to(self.device)
        if ids.numel() == 0:
            raise ValueError("the model was given no tokens to run (an empty prompt?)")
        if ids.numel() == 1 and self.plan.padded:
            length = self.cached_len
            out = self._forward(ids.repeat(2), last_only=False, layers=layers)
            self.crop(length + 1)
            chosen = None if out.layers is None else out.layers[:1]
            return StepOutput(logits=out.logits[:1], hidden=out.hidden[:1], layers=chosen)
        return self._forward(ids, last_only, all_hidden, layers)

    def _forward(
        self,
        ids: torch.Tensor,
        last_only: bool,
        all_hidden: bool = False,
        layers: tuple[int, ...] = (),
    ) -> StepOutput:
        """Run ``ids`` [n] (on the model's device) through decoder and head, as ``forward``, on
        the layout ``plan`` gives n (a compiled one's forwards with ``layers`` run eagerly on
        the unpacked weights: the same bits)."""
        layout = self.plan.layout(ids.numel())
        packed = layout == "packed"
        chosen = None
        if self.fast_decoder is not None and layers:
            hidden, chosen = self.fast_decoder.forward_layers(ids, packed, layers)
        elif self.compiled is not None and layout == "compiled":
            hidden = self.compiled.forward(ids)
        elif self.fast_decoder is not None:
            hidden = self.fast_decoder.forward(ids, packed)
        else:
            out = self.decoder(
                input_ids=ids[None],
                use_cache=True,
                output_hidden_states=bool(layers),
                **cache_kwargs(self.decoder, self.cache),
            )
            hidden = out.last_hidden_state[0]
            chosen = layer_states(out.hidden_states, layers)[0] if layers else None
        rows = hidden[-1:] if last_only else hidden
        logits = head_logits(self.head, self.restricted, rows, self.head_product, packed)
        return StepOutput(logits=logits, hidden=hidden if all_hidden else rows, layers=chosen)

    def crop(self, length: int) -> None:
        """Roll the cache back so that it holds only the first ``length`` tokens."""
        if self.fast_decoder is not None:
            self.fast_decoder.crop(length)
            return
        excess = self.cached_len - length
        if excess > 0:
            self.cache.crop(-excess)

    @torch.inference_mode()
    def full_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Return logits [n, V] of a from-scratch forward of ``ids`` (no cache involved)."""
        out = self.decoder(input_ids=ids.view(1, -1).to(self.device), use_cache=False)
        return head_logits(self.head, self.restricted, out.last_hidden_state[0])


def _given_plan(single_step: SingleStep, layout: Layout) -> StepPlan:
    """Return the plan ``single_step`` gives before any calibration (``layout``: the default)."""
    if isinstance(single_step, StepPlan):
        return single_step
    return StepPlan.uniform(layout, padded=single_step == "padded")
