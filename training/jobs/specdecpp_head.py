"""SpecDec++ acceptance-head training (docs/methods.md, "SpecDec++ head training").

``config.base`` is the draft, ``config.teacher`` the target. Data, per target-generated text x
(prompt of ``prompt_tokens`` tokens + ``response_tokens`` tokens of the target, greedy at
temperature 0, else sampled at ``temperature``, default 1.0):

1. at every response position k the draft samples Y_k ~ q(· | x_<k) and its label is
   P_k = min(1, p(Y_k | x_<k) / q(Y_k | x_<k)), p and q warped at the same temperature (top-k);
2. the sequence fed to the draft mixes the two: z_k = x_k with probability ``mix_ratio`` r
   (15 %), else Y_k; the loss is taken only where z_k = Y_k (a draft token) and the response has
   not ended (positions after the first EOS are dropped);
3. the head's input for the candidate at k is e_k, the draft's last-layer hidden state at
   index k of z (it has read z_≤k, the judged token Y_k included): SpecDec++ Eq. (3.1), where
   the draft reads (x_prefix, Y_1, ..., Y_k) and the final embedding of Y_k predicts whether
   Y_k is accepted given the earlier candidates were (the authors' training code pairs the
   hidden state at each input token with that token's label, unshifted). In a round the engine
   shows candidate i the state that produced q_i, which for i >= 2 is e_{i−1}: the policy
   (``policies.specdecpp``, Algorithm 2) multiplies that factor in at step i, none at i = 1. As
   published, the label conditions on the target's tokens x_<k while the features read the
   mixed z_≤k, whose draft tokens stand for the earlier candidates of a round.

Loss: weighted BCE, −(w_acc·P·log σ(f) + w_rej·(1−P)·log(1−σ(f))), w_acc = 1, ``w_rej`` = 6.
Head: ``workers.heads.AcceptanceHead`` ((D+1) linear layers, ``depth`` D = 3). Adam, cosine
decay from ``lr`` (5e-5 as published) to 0, ``batch_size`` 32, ``config.epochs`` epochs. A held-out
tenth of the sequences gives eval BCE and binary KL against the labels, next to the constant
predictor at the training base rate and at the rate the weighted loss itself favours.
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
    binary_kl,
    binary_report,
    cached_tensors,
    fit,
    fit_settings,
    forward_states,
    heldout_split,
    job_device,
    provenance_meta,
    rate_logit,
    response_mask,
    sample_rows,
    seeded_module,
    target_text,
    weighted_bce,
    weighted_optimal_rate,
    write_module_artifact,
)
from workers.heads import HEAD_FILE, HEAD_KIND, AcceptanceHead
from workers.records import SamplingConfig
from workers.sampling import warp_probs

DEFAULTS: dict[str, Any] = {
    **DATA_DEFAULTS,
    "temperature": 1.0,
    "mix_ratio": 0.15,
    "w_acc": 1.0,
    "w_rej": 6.0,
    "depth": 3,
    "lr": 5e-5,
    "batch_size": 32,
}


@dataclass(frozen=True)
class HeadSettings:
    """The job's settings: data, target-token share r, BCE weights, depth D, optimisation."""

    data: DataSettings
    mix_ratio: float
    w_acc: float
    w_rej: float
    depth: int
    fit: FitSettings

    @classmethod
    def from_config(cls, config: JobConfig) -> HeadSettings:
        """Return the settings of ``config``, naming any unknown or invalid one."""
        settings = config.settings
        check_settings(settings, DEFAULTS, HEAD_KIND)
        if config.teacher is None:
            raise JobConfigError(
                f"{HEAD_KIND} needs teacher: the target whose acceptance it learns"
            )
        mix_ratio = typed_setting(settings, "mix_ratio", DEFAULTS["mix_ratio"])
        if not 0.0 <= mix_ratio < 1.0:
            raise JobConfigError(f"setting 'mix_ratio' must be in [0, 1), got {mix_ratio}")
        weights = {key: typed_setting(settings, key, DEFAULTS[key]) for key in ("w_acc", "w_rej")}
        for key, weight in weights.items():
            if weight <= 0.0:
                raise JobConfigError(f"setting {key!r} must be > 0, got {weight}")
        depth = typed_setting(settings, "depth", DEFAULTS["depth"])
        if depth < 0:
            raise JobConfigError(f"setting 'depth' must be >= 0, got {depth}")
        temperature = typed_setting(settings, "temperature", DEFAULTS["temperature"])
        return cls(
            data=DataSettings.from_settings(settings, temperature),
            mix_ratio=mix_ratio,
            w_acc=weights["w_acc"],
            w_rej=weights["w_rej"],
            depth=depth,
            fit=fit_settings(config, DEFAULTS["lr"], DEFAULTS["batch_size"]),
        )


def mix_mask(shape: tuple[int, ...], mix_ratio: float, generator: torch.Generator) -> torch.Tensor:
    """Return a bool mask, True (a draft token) with probability 1 − ``mix_ratio`` per position."""
    return torch.rand(shape, generator=generator, device=generator.device) >= mix_ratio


def label_block(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    response: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (the mixed response z, the labels P) of response positions [..., R].

    ``target_probs`` p and ``draft_probs`` q [..., R, V] are both conditioned on the target's
    tokens before each position, ``draft_tokens`` Y were drawn from q, ``draft_mask`` says where
    z takes Y instead of the target's token. P = min(1, p(Y)/q(Y)) at every position; the job
    keeps it where the mask is True.
    """
    mixed = torch.where(draft_mask, draft_tokens, response)
    return mixed, acceptance_labels(target_probs, draft_probs, draft_tokens)


def judged_token_states(hidden: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Return e_k [B, R, d] for each response position k: the state at sequence index
    ``prompt_len`` + k of ``hidden`` [B, prompt_len + R, d], the one that has read token k
    itself (SpecDec++ Eq. (3.1): the final embedding of the judged token)."""
    return hidden[:, prompt_len:]


def specdecpp_examples(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    sequences: torch.Tensor,
    prompt_len: int,
    sampling: SamplingConfig,
    mix_ratio: float,
    generator: torch.Generator,
    eos_token_id: int | None,
) -> dict[str, torch.Tensor]:
    """Return the examples of target-generated ``sequences`` [B, T]: features, labels, row.

    ``features`` [n, d] are e_k, the draft's hidden states at index k of the mixed sequence
    (``judged_token_states``) for the candidates Y_k at draft-token positions k, ``labels`` [n]
    their P_k, ``row`` [n] which of the ``sequences`` each came from.
    """
    rows = slice(prompt_len - 1, sequences.shape[1] - 1)
    response = sequences[:, prompt_len:].to(generator.device)
    _, target_logits = forward_states(target, sequences)
    _, draft_logits = forward_states(draft, sequences)
    if target_logits.shape[-1] != draft_logits.shape[-1]:
        raise JobConfigError(
            f"draft and target vocabularies differ ({draft_logits.shape[-1]} vs "
            f"{target_logits.shape[-1]} logits); the head needs a pair sharing one tokenizer"
        )
    target_probs = warp_probs(target_logits[:, rows], sampling)
    draft_probs = warp_probs(draft_logits[:, rows], sampling)
    draft_tokens = sample_rows(draft_probs, generator)
    draft_mask = mix_mask(tuple(response.shape), mix_ratio, generator).to(response.device)
    mixed, labels = label_block(target_probs, draft_probs, response, draft_tokens, draft_mask)
    mixed_sequences = torch.cat([sequences[:, :prompt_len].to(mixed.device), mixed], dim=1)
    hidden, _ = forward_states(draft, mixed_sequences)
    keep = draft_mask & response_mask(response, eos_token_id)
    row = torch.arange(sequences.shape[0], device=keep.device)[:, None].expand_as(keep)
    return {
        "features": judged_token_states(hidden, prompt_len)[keep].float().cpu(),
        "labels": labels[keep].float().cpu(),
        "row": row[keep].cpu(),
    }


def build_examples(
    config: JobConfig, settings: HeadSettings, progress: bool
) -> dict[str, torch.Tensor]:
    """Generate the target's text and return every example with its sequence number."""
    data = settings.data
    text = target_text(config, data, progress)
    parts: dict[str, list[torch.Tensor]] = {"features": [], "labels": [], "sequence": []}
    chunks = text.chunks(data.generation_batch)
    for start, chunk in tqdm(chunks, desc="label", disable=not progress, leave=False):
        examples = specdecpp_examples(
            text.target,
            text.draft,
            chunk,
            data.prompt_tokens,
            data.sampling,
            settings.mix_ratio,
            text.generator,
            text.tokenizer.eos_token_id,
        )
        parts["features"].append(examples["features"])
        parts["labels"].append(examples["labels"])
        parts["sequence"].append(examples["row"] + start)
    tensors = {name: torch.cat(values) for name, values in parts.items()}
    tensors["n_sequences"] = torch.tensor([text.sequences.shape[0]])
    return tensors


def settings_of(config: JobConfig) -> HeadSettings:
    """Return the job's parsed settings; JobConfigError names the first bad one.

    ``training.jobs.check_job_config`` calls it when a sweep is validated, so a bad setting
    stops the sweep before anything runs.
    """
    return HeadSettings.from_config(config)


@dataclass(frozen=True)
class _Split:
    """The labelled examples on the training device: features ``x`` [n, d] and labels ``y``
    [n] of the training sequences and of the held-out ones."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    eval_x: torch.Tensor
    eval_y: torch.Tensor


def _split_examples(
    data: dict[str, torch.Tensor], settings: HeadSettings, seed: int, device: torch.device
) -> _Split:
    """Return the examples split by sequence into training and held-out parts, on ``device``.

    Raises JobConfigError when either part has no example.
    """
    train_rows, eval_rows = heldout_split(
        int(data["n_sequences"][0]), settings.data.eval_fraction, seed
    )
    in_train = torch.isin(data["sequence"], train_rows)
    in_eval = torch.isin(data["sequence"], eval_rows)
    if not bool(in_train.any()) or not bool(in_eval.any()):
        raise JobConfigError(
            f"{HEAD_KIND}: too few labelled positions to split ({int(in_train.sum())} train, "
            f"{int(in_eval.sum())} held-out); raise samples or response_tokens"
        )
    features, labels = data["features"].to(device), data["labels"].to(device)
    return _Split(features[in_train], labels[in_train], features[in_eval], labels[in_eval])


def _eval_metrics(head: torch.nn.Module, split: _Split, settings: HeadSettings) -> dict[str, float]:
    """Return the held-out report of ``head``: BCE and KL next to the constant predictors at
    the training base rate and at the weighted loss's optimal rate, its weighted BCE, counts."""
    eval_x = split.eval_x
    eval_logits = batched_logits(lambda index: head(eval_x[index.to(eval_x.device)]), len(eval_x))
    base_rate = float(split.train_y.mean())
    weighted_rate = weighted_optimal_rate(base_rate, settings.w_acc, settings.w_rej)
    eval_labels = split.eval_y.cpu()
    return {
        **binary_report(eval_labels, eval_logits, base_rate),
        "const_weighted_kl": float(
            binary_kl(eval_labels, torch.full_like(eval_labels, rate_logit(weighted_rate)))
        ),
        "eval_weighted_bce": float(
            weighted_bce(eval_labels, eval_logits, settings.w_acc, settings.w_rej)
        ),
        "n_train": float(split.train_x.shape[0]),
        "n_eval": float(eval_x.shape[0]),
    }


def run(config: JobConfig, output_dir: Path, progress: bool) -> JobResult:
    """Train the SpecDec++ acceptance head of ``config``; return its artifact and eval metrics."""
    stopwatch = Stopwatch()
    settings = settings_of(config)
    data = cached_tensors(output_dir, lambda: build_examples(config, settings, progress))
    device = job_device()
    split = _split_examples(data, settings, config.seed, device)
    train_x, train_y = split.train_x, split.train_y
    hidden_size = train_x.shape[1]
    head = seeded_module(config.seed, lambda: AcceptanceHead(hidden_size, settings.depth)).to(
        device
    )

    def batch_loss(model: torch.nn.Module, indices: torch.Tensor) -> torch.Tensor:
        index = indices.to(device)
        return weighted_bce(train_y[index], model(train_x[index]), settings.w_acc, settings.w_rej)

    report = fit(
        head, train_x.shape[0], batch_loss, settings.fit, output_dir, stopwatch, progress, HEAD_KIND
    )
    metrics = {**_eval_metrics(head, split, settings), **report.summary()}
    artifact = write_module_artifact(
        output_dir / ARTIFACT_DIR,
        HEAD_FILE,
        head,
        {
            "kind": HEAD_KIND,
            "hidden_size": hidden_size,
            "depth": settings.depth,
            **provenance_meta(config, DEFAULTS, settings.fit),
            "metrics": metrics,
        },
    )
    return JobResult(
        artifact_path=str(artifact),
        artifact_kind=HEAD_KIND,
        metrics=metrics,
        seconds=stopwatch.seconds(),
        resumed_from_step=report.resumed_from_step,
    )
