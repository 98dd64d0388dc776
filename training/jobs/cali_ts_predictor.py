"""EESD Cali-TS predictor training: θ_M = sigmoid(W_p [W^i H_t, H_{t+i}]) for offsets i ≤ 10.

``config.base`` is the draft, ``config.teacher`` the target.

Which positions the engine shows the predictor (``workers.engine.speculative_generate`` and
``_draft_block``, ``workers.target.LocalTarget.verify``). Say a model's hidden state at index j
is its last-layer state after reading tokens 0..j (it produces token j + 1). At the start of a
round the sequence has L tokens s_0..s_{L-1}; s_{L-1} is the token the target emitted last
round, which it has not read yet. Then

- ``DraftStep.target_hidden`` is the previous round's ``VerifyResponse.hidden``: the target's
  state at index L − 2 (it read s_0..s_{L-2} and produced s_{L-1}). In a request's first round
  there is none (``None``: the target has only been prefilled).
- candidate i of the round (``DraftStep.index`` = i, 1-based) is the token at position
  L − 1 + i, and ``DraftStep.hidden`` is the draft's state at index L + i − 2: it has read
  s_0..s_{L-1} and the round's candidates 1..i−1, and produces q for candidate i.

So with t = L − 2 the target state is H_t, the draft state is H_{t+i} and the candidate is the
token at t + i + 1: the offset between the two states is exactly ``step.index``. Since the first
round leaves L ≥ P + 1 for a P-token prompt, t ≥ P − 1.

Training pairs on target-generated text x (P = ``prompt_tokens`` prompt tokens continued by the
target for ``response_tokens``, greedily at ``temperature`` 0, the default, as EESD decodes):
for every t ≥ P − 1 and i = 1..``max_offset`` with t + i + 1 inside the response (and before or
at its first EOS), the input is (target state at t, draft state at t + i, i), both models having
read x. The draft's candidates 1..i−1 are thus the target's tokens, which is what they are in
the only case where candidate i can be accepted (all earlier ones accepted, greedy). The label
of candidate t + i + 1 is whether the draft's greedy token there equals the target's (greedy
agreement) or, at ``temperature`` > 0, min(1, p(Y)/q(Y)) for Y ~ q from the draft.

W^i is a bias-free d_t → ``projection_dim`` map per offset (0, the default, means d_t: one
d_t × d_t matrix each, as published; set it lower for a wide target), W_p a linear map of
[W^i H_t, H_{t+i}] to one logit. Loss: BCE; Adam with cosine decay from ``lr``. A held-out tenth
of the sequences gives eval BCE and binary KL, with the constant predictor at the training base
rate for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from training.job_settings import JobConfigError, check_settings, typed_setting
from training.jobs.base import (
    ARTIFACT_DIR,
    JobConfig,
    JobResult,
    Stopwatch,
)
from training.jobs.head_data import (
    DATA_DEFAULTS,
    DataSettings,
    FitSettings,
    acceptance_labels,
    batched_logits,
    bce_per_item,
    binary_kl,
    binary_report,
    cached_tensors,
    fit,
    fit_settings,
    forward_states,
    heldout_split,
    job_device,
    provenance_meta,
    response_mask,
    sample_rows,
    seeded_module,
    target_text,
    write_module_artifact,
)
from workers.heads import PREDICTOR_FILE, PREDICTOR_KIND, CaliPredictor
from workers.records import SamplingConfig
from workers.sampling import warp_probs

DEFAULTS: dict[str, Any] = {
    **DATA_DEFAULTS,
    "temperature": 0.0,
    "max_offset": 10,
    "projection_dim": 0,
    "lr": 1e-3,
    "batch_size": 256,
}


@dataclass(frozen=True)
class PredictorSettings:
    """The job's settings: data, the largest offset, W^i's output size, optimisation."""

    data: DataSettings
    max_offset: int
    projection_dim: int
    fit: FitSettings

    @classmethod
    def from_config(cls, config: JobConfig) -> PredictorSettings:
        """Return the settings of ``config``, naming any unknown or invalid one."""
        settings = config.settings
        check_settings(settings, DEFAULTS, PREDICTOR_KIND)
        if config.teacher is None:
            raise JobConfigError(f"{PREDICTOR_KIND} needs teacher: the target it predicts")
        max_offset = typed_setting(settings, "max_offset", DEFAULTS["max_offset"])
        if max_offset < 1:
            raise JobConfigError(f"setting 'max_offset' must be >= 1, got {max_offset}")
        projection_dim = typed_setting(settings, "projection_dim", DEFAULTS["projection_dim"])
        if projection_dim < 0:
            raise JobConfigError(f"setting 'projection_dim' must be >= 0, got {projection_dim}")
        temperature = typed_setting(settings, "temperature", DEFAULTS["temperature"])
        return cls(
            data=DataSettings.from_settings(settings, temperature),
            max_offset=max_offset,
            projection_dim=projection_dim,
            fit=fit_settings(config, DEFAULTS["lr"], DEFAULTS["batch_size"]),
        )


def engine_positions(candidate_position: int, offset: int) -> tuple[int, int]:
    """Return (target index t, draft index t + i) whose states the engine shows for a candidate.

    ``candidate_position`` is the candidate token's absolute position in the sequence and
    ``offset`` its ``DraftStep.index`` i (see the module docstring).
    """
    draft_index = candidate_position - 1
    return draft_index - offset, draft_index


def position_labels(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator,
) -> torch.Tensor:
    """Return the acceptance label of the draft's next token for each row of logits [..., V].

    Greedy: 1.0 when the draft's argmax equals the target's, else 0.0. Sampling: min(1, p/q) of
    a token Y ~ q, with p and q warped by ``sampling``.
    """
    if sampling.greedy:
        return (draft_logits.argmax(-1) == target_logits.argmax(-1)).float()
    draft_probs = warp_probs(draft_logits, sampling)
    tokens = sample_rows(draft_probs, generator)
    return acceptance_labels(warp_probs(target_logits, sampling), draft_probs, tokens)


def cali_states(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    sequences: torch.Tensor,
    prompt_len: int,
    sampling: SamplingConfig,
    generator: torch.Generator,
    eos_token_id: int | None,
) -> dict[str, torch.Tensor]:
    """Return per-position states and labels of ``sequences`` [B, T] from index P − 1 on.

    Row j of every output stands for index P − 1 + j (j < R = T − P): ``target_states`` the
    target's state there, ``draft_states`` the draft's, ``labels`` the label of the draft's
    token at P + j and ``valid`` whether that position is inside the response (up to EOS).
    """
    rows = slice(prompt_len - 1, sequences.shape[1] - 1)
    target_hidden, target_logits = forward_states(target, sequences)
    draft_hidden, draft_logits = forward_states(draft, sequences)
    if target_logits.shape[-1] != draft_logits.shape[-1]:
        raise JobConfigError(
            f"draft and target vocabularies differ ({draft_logits.shape[-1]} vs "
            f"{target_logits.shape[-1]} logits); the predictor needs a pair sharing one tokenizer"
        )
    labels = position_labels(target_logits[:, rows], draft_logits[:, rows], sampling, generator)
    return {
        "target_states": target_hidden[:, rows].float().cpu(),
        "draft_states": draft_hidden[:, rows].float().cpu(),
        "labels": labels.float().cpu(),
        "valid": response_mask(sequences[:, prompt_len:], eos_token_id).cpu(),
    }


def offset_pairs(valid: torch.Tensor, sequences: torch.Tensor, max_offset: int) -> torch.Tensor:
    """Return every training pair (sequence, target row j, offset i), shape [M, 3].

    ``valid`` [N, R] is ``cali_states``'s mask; a pair needs its draft row j + i < R to be
    valid. ``sequences`` lists which of the N sequences to use.
    """
    chosen = valid[sequences]
    pairs = []
    for offset in range(1, max_offset + 1):
        index, row = chosen[:, offset:].nonzero(as_tuple=True)
        pairs.append(torch.stack([sequences[index], row, torch.full_like(row, offset)], dim=1))
    return torch.cat(pairs) if pairs else torch.empty(0, 3, dtype=torch.long)


def build_states(
    config: JobConfig, settings: PredictorSettings, progress: bool
) -> dict[str, torch.Tensor]:
    """Generate the target's text and return ``cali_states`` of all of it."""
    data = settings.data
    text = target_text(config, data, progress)
    parts: dict[str, list[torch.Tensor]] = {}
    chunks = text.chunks(data.generation_batch)
    for _, chunk in tqdm(chunks, desc="states", disable=not progress, leave=False):
        states = cali_states(
            text.target,
            text.draft,
            chunk,
            data.prompt_tokens,
            data.sampling,
            text.generator,
            text.tokenizer.eos_token_id,
        )
        for name, value in states.items():
            parts.setdefault(name, []).append(value)
    return {name: torch.cat(values) for name, values in parts.items()}


def settings_of(config: JobConfig) -> PredictorSettings:
    """Return the job's parsed settings; JobConfigError names the first bad one.

    ``training.jobs.check_job_config`` calls it when a sweep is validated, so a bad setting
    stops the sweep before anything runs.
    """
    return PredictorSettings.from_config(config)


@dataclass(frozen=True)
class _PairStates:
    """``cali_states``'s recorded states and labels on the training device, which (sequence,
    target row j, offset i) pairs index."""

    target_states: torch.Tensor
    draft_states: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def on(cls, data: dict[str, torch.Tensor], device: torch.device) -> _PairStates:
        """Return the states and labels of ``data`` moved to ``device``."""
        return cls(
            data["target_states"].to(device),
            data["draft_states"].to(device),
            data["labels"].to(device),
        )

    def pair_labels(self, pairs: torch.Tensor) -> torch.Tensor:
        """Return the labels of ``pairs``' candidates (draft row j + i)."""
        return self.labels[pairs[:, 0], pairs[:, 1] + pairs[:, 2]]

    def pair_logits(
        self, model: torch.nn.Module, pairs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``model``'s logits for ``pairs`` and their labels."""
        sequence, row, offset = pairs.to(self.labels.device).unbind(-1)
        logits = model(
            self.target_states[sequence, row], self.draft_states[sequence, row + offset], offset
        )
        return logits, self.labels[sequence, row + offset]


def run(config: JobConfig, output_dir: Path, progress: bool) -> JobResult:
    """Train the Cali-TS predictor of ``config``; return its artifact and eval metrics."""
    stopwatch = Stopwatch()
    settings = settings_of(config)
    data = cached_tensors(output_dir, lambda: build_states(config, settings, progress))
    train_pairs, eval_pairs = _split_pairs(data, settings, config.seed)
    device = job_device()
    states = _PairStates.on(data, device)
    target_size, draft_size = states.target_states.shape[-1], states.draft_states.shape[-1]
    projection_dim = settings.projection_dim or target_size
    predictor = seeded_module(
        config.seed,
        lambda: CaliPredictor(target_size, draft_size, projection_dim, settings.max_offset),
    ).to(device)

    def batch_loss(model: torch.nn.Module, indices: torch.Tensor) -> torch.Tensor:
        logits, batch_labels = states.pair_logits(model, train_pairs[indices])
        return bce_per_item(batch_labels, logits).mean()

    report = fit(
        predictor,
        train_pairs.shape[0],
        batch_loss,
        settings.fit,
        output_dir,
        stopwatch,
        progress,
        PREDICTOR_KIND,
    )
    eval_logits = batched_logits(
        lambda index: states.pair_logits(predictor, eval_pairs[index])[0], eval_pairs.shape[0]
    )
    base_rate = float(states.pair_labels(train_pairs).mean())
    metrics = {
        **_eval_metrics(states, eval_logits, eval_pairs, base_rate, settings.max_offset),
        "n_train": float(train_pairs.shape[0]),
        **report.summary(),
    }
    meta = {
        "kind": PREDICTOR_KIND,
        "target_hidden_size": target_size,
        "draft_hidden_size": draft_size,
        "projection_dim": projection_dim,
        "max_offset": settings.max_offset,
        "base_rate": base_rate,
        **provenance_meta(config, DEFAULTS, settings.fit),
        "metrics": metrics,
    }
    artifact = write_module_artifact(output_dir / ARTIFACT_DIR, PREDICTOR_FILE, predictor, meta)
    return JobResult(
        artifact_path=str(artifact),
        artifact_kind=PREDICTOR_KIND,
        metrics=metrics,
        seconds=stopwatch.seconds(),
        resumed_from_step=report.resumed_from_step,
    )


def _split_pairs(
    data: dict[str, torch.Tensor], settings: PredictorSettings, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the training and held-out (sequence, row, offset) pairs of the recorded states.

    Raises JobConfigError when either split has no pair.
    """
    train_rows, eval_rows = heldout_split(
        data["labels"].shape[0], settings.data.eval_fraction, seed
    )
    train_pairs = offset_pairs(data["valid"], train_rows, settings.max_offset)
    eval_pairs = offset_pairs(data["valid"], eval_rows, settings.max_offset)
    if train_pairs.shape[0] == 0 or eval_pairs.shape[0] == 0:
        raise JobConfigError(
            f"{PREDICTOR_KIND}: too few positions to pair ({train_pairs.shape[0]} train, "
            f"{eval_pairs.shape[0]} held-out); raise samples or response_tokens"
        )
    return train_pairs, eval_pairs


def _eval_metrics(
    states: _PairStates,
    eval_logits: torch.Tensor,
    eval_pairs: torch.Tensor,
    base_rate: float,
    max_offset: int,
) -> dict[str, float]:
    """Return the held-out pairs' binary report, per-offset KLs and count."""
    eval_labels = states.pair_labels(eval_pairs).cpu()
    return {
        **binary_report(eval_labels, eval_logits, base_rate),
        **_offset_kls(eval_labels, eval_logits, eval_pairs[:, 2], max_offset),
        "n_eval": float(eval_pairs.shape[0]),
    }


def _offset_kls(
    labels: torch.Tensor, logits: torch.Tensor, offsets: torch.Tensor, max_offset: int
) -> dict[str, float]:
    """Return the held-out binary KL at offset 1 and at the largest offset with pairs."""
    present = [i for i in (1, max_offset) if bool((offsets == i).any())]
    return {
        f"eval_kl_offset_{i}": float(binary_kl(labels[offsets == i], logits[offsets == i]))
        for i in present
    }
