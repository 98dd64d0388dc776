"""A pretrained profile's EAGLE head (``zoo:<profile>/eagle``): trained on the teacher data.

The head reads the imported target's features over the teacher samples (prompt + the target's
greedy response: the last hidden states the generation computed, kept with each sample, or
where a sample has none one teacher-forced forward per batch) and, where the stage asks, over
the target's greedy answers to further code prompts (kept the same way) and windows of the
standard library's source (teacher-forced), its LM head cut to the drafts' ``draft_vocab``
when the stage has one, and trains with EAGLE's loss (``training.eagle_training``). Its card:
the data, the steps, agreement at draft steps 1–3 on the held-out teacher samples and on the
target's greedy answers to the evaluation dataset's prompts (HumanEval unless unavailable; none
of it is trained on), the step's cost against a target step (prepacked and not) and greedy
static-K acceptance on the evaluation prompts.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import LlamaForCausalLM

from training.eagle_training import (
    EagleStage,
    SequenceFeatures,
    agreement_at_steps,
    sequence_features,
    static_acceptance,
    step_cost,
    train_steps,
)
from training.pretrained_drafts import DraftVocab, EvalRecipe, TeacherSample
from training.zoo.cache import CARD_FILE
from training.zoo.cards import identity_card
from training.zoo.progress import log
from training.zoo.recipes import PretrainedRecipe
from workers.corpus import code_training_text
from workers.eagle.artifact import save_eagle_head
from workers.eagle.head import EagleConfig, EagleHead, TargetParts
from workers.lm import CachedLM
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget

#: Characters of source asked for per token wanted (SmolLM2's tokenizer: about 3.4 on the
#: standard library).
MAX_CHARS_PER_TOKEN = 6


@dataclass(frozen=True)
class EagleEvaluation:
    """What the head's card is measured on: the static-K recipe and its encoded ``prompts``,
    the prompts of the agreement check (``agreement_prompts``), their dataset and the EOS id."""

    recipe: EvalRecipe
    prompts: list[torch.Tensor]
    agreement_prompts: list[torch.Tensor]
    dataset: str
    eos_token_id: int | None


def padded_features(
    target: LlamaForCausalLM, rows: list[torch.Tensor], batch_size: int, pad_id: int
) -> SequenceFeatures:
    """Return the target's teacher-forced features over the token ``rows`` (right-padded; the
    padding is invalid)."""
    width = max(row.numel() for row in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    valid = torch.zeros_like(tokens, dtype=torch.bool)
    for index, row in enumerate(rows):
        tokens[index, : row.numel()] = row
        valid[index, : row.numel()] = True
    return sequence_features(target, tokens, valid, batch_size)


def sample_features(
    target: LlamaForCausalLM, samples: list[TeacherSample], batch_size: int, pad_id: int
) -> tuple[SequenceFeatures, list[int]]:
    """Return the target's features over ``samples`` (right-padded; the padding is invalid)
    and each sample's prompt length: the ones its generation kept when every sample has them
    (``captured_features``), else teacher-forced."""
    prompt_lengths = [sample.start + sample.prompt_labels + 1 for sample in samples]
    if samples and all(sample.features is not None for sample in samples):
        return captured_features(samples, pad_id), prompt_lengths
    rows = [sample.ids for sample in samples]
    return padded_features(target, rows, batch_size, pad_id), prompt_lengths


def captured_features(samples: list[TeacherSample], pad_id: int) -> SequenceFeatures:
    """Return the features the generation of ``samples`` kept, right-padded with ``pad_id``.

    A sample of n tokens has features at positions 0..n − 2 (valid there; the last token was
    never fed back). The target's greedy choice after each response position is the next token
    it generated; before the response it is unknown (−1: agreement is measured from the
    response on).
    """
    width = max(sample.ids.numel() for sample in samples)
    dim = samples[0].features.shape[-1]
    tokens = torch.full((len(samples), width), pad_id, dtype=torch.long)
    features = torch.zeros((len(samples), width, dim))
    valid = torch.zeros_like(tokens, dtype=torch.bool)
    choices = torch.full_like(tokens, -1)
    for index, sample in enumerate(samples):
        n, response = sample.ids.numel(), sample.start + sample.prompt_labels
        tokens[index, :n] = sample.ids
        features[index, : n - 1] = sample.features
        valid[index, : n - 1] = True
        choices[index, response : n - 1] = sample.ids[response + 1 :]
    return SequenceFeatures(tokens, features, valid, choices)


def code_windows(tokenizer: Any, count: int, window: int) -> list[torch.Tensor]:
    """Return ``count`` consecutive ``window``-token pieces of the standard library's training
    source (``workers.corpus.code_training_text``: held-out functions removed; HumanEval is
    not in it); ValueError when it is too short."""
    if count == 0:
        return []
    text = code_training_text(count * window * MAX_CHARS_PER_TOKEN)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < count * window:
        raise ValueError(
            f"code_windows: the standard library gives {len(ids)} tokens, fewer than "
            f"{count} windows of {window}; lower code_windows"
        )
    return list(torch.tensor(ids[: count * window], dtype=torch.long).view(count, window))


@torch.inference_mode()
def greedy_agreement_data(
    target: LlamaForCausalLM,
    evaluation: EagleEvaluation,
    new_tokens: int,
    batch_size: int,
    pad_id: int,
) -> tuple[SequenceFeatures, list[int]]:
    """Return the target's features over its greedy answers to the agreement prompts (prompt
    + answer, right-padded with ``pad_id``) and each prompt's length."""
    local = LocalTarget(CachedLM(target))
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=new_tokens)
    settings = RequestSettings(sampling=greedy, seed=0, eos_token_id=evaluation.eos_token_id)
    rows = [
        torch.cat([prompt, torch.tensor(local.generate(prompt, settings).output_ids)])
        for prompt in evaluation.agreement_prompts
    ]
    lengths = [prompt.numel() for prompt in evaluation.agreement_prompts]
    return padded_features(target, rows, batch_size, pad_id), lengths


@dataclass(frozen=True)
class EagleData:
    """The head's data: the (train, held-out) teacher samples, the code windows' tokens and
    the target's answers to the stage's further prompts (trained on beside ``train``)."""

    train: list[TeacherSample]
    heldout: list[TeacherSample]
    code: list[torch.Tensor]
    answers: list[TeacherSample] = field(default_factory=list)


def eagle_into(
    recipe: PretrainedRecipe,
    stage: EagleStage,
    target: LlamaForCausalLM,
    data: EagleData,
    vocab: DraftVocab | None,
    evaluation: EagleEvaluation,
    directory: Path,
    progress: bool,
) -> None:
    """Train the profile's EAGLE head on the teacher samples and code windows, measure it on
    ``evaluation``, save it with its card."""
    started = time.perf_counter()
    generated = data.train + data.answers
    carried = sum(sample.features is not None for sample in generated)
    what = f"{carried} of {len(generated)} samples kept from generation"
    log(progress, recipe, f"the target's features: {what}, {len(data.code)} code windows forced")
    train_data, checks = _extracted(target, stage, data, evaluation)
    extract_s = time.perf_counter() - started
    kept = None if vocab is None else tuple(vocab.kept.tolist())
    torch.manual_seed(stage.training.seed)
    head = EagleHead(EagleConfig.for_target(target, head_vocab=kept), TargetParts.of(target))
    log(progress, recipe, f"training {stage.name} ({stage.training.steps} steps)")
    before = [agreement_at_steps(head, *found, 3, stage.eval_starts) for found in checks]
    started = time.perf_counter()
    losses = _train_shown(head, train_data, stage, progress)
    train_s = time.perf_counter() - started
    after = [agreement_at_steps(head, *found, 3, stage.eval_starts) for found in checks]
    log(progress, recipe, f"measuring {stage.name} (cost, static-K acceptance)")
    card = {
        **identity_card(recipe, stage.name, "eagle_head"),
        "parameters": sum(p.numel() for p in head.parameters()),
        "hidden_size": head.config.hidden_size,
        "head_vocab": None if kept is None else len(kept),
        "head_vocab_coverage": None if vocab is None else vocab.coverage(data.heldout),
        "training": {
            **asdict(stage),
            "train_samples": len(data.train),
            "answer_samples": len(data.answers),
            "code_windows": len(data.code),
            "train_tokens": train_data.n_tokens,
            "heldout_samples": len(data.heldout),
            "final_loss": sum(losses[-10:]) / max(1, len(losses[-10:])),
            "extract_seconds": extract_s,
            "train_seconds": train_s,
        },
        "heldout_agreement_before": before[0],
        "heldout_agreement": after[0],
        "answer_agreement": {
            "dataset": evaluation.dataset,
            "prompts": len(evaluation.agreement_prompts),
            "new_tokens": stage.agreement_tokens,
            "before": before[1],
            "after": after[1],
        },
        "realism": _realism(target, head, evaluation),
    }
    save_eagle_head(directory / stage.name, head, {"profile": recipe.profile})
    (directory / stage.name / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")


def _extracted(
    target: LlamaForCausalLM, stage: EagleStage, data: EagleData, evaluation: EagleEvaluation
) -> tuple[SequenceFeatures, list[tuple[SequenceFeatures, list[int]]]]:
    """Return the training features (teacher samples and further answers, then code windows)
    and the agreement checks' features and prompt lengths: the held-out samples and the
    greedy HumanEval answers."""
    pad, batch = int(target.config.pad_token_id or 0), stage.feature_batch
    train_data, _ = sample_features(target, data.train + data.answers, batch, pad)
    if data.code:
        train_data = train_data.joined(padded_features(target, data.code, batch, pad))
    held = sample_features(target, data.heldout, batch, pad)
    answers = greedy_agreement_data(target, evaluation, stage.agreement_tokens, batch, pad)
    return train_data, [held, answers]


def _realism(
    target: LlamaForCausalLM, head: EagleHead, evaluation: EagleEvaluation
) -> dict[str, Any]:
    """Return the head's step cost against a target step (prepacked and not) and its greedy
    static-K acceptance at K = 2 and 4 on the evaluation prompts."""
    timing = evaluation.recipe.timing_context
    costs = {
        layout: asdict(step_cost(target, head, timing, 30, prepack))
        for layout, prepack in (("prepacked", True), ("unpacked", False))
    }
    new_tokens, eos = evaluation.recipe.new_tokens, evaluation.eos_token_id
    static = static_acceptance(target, head, evaluation.prompts, (2, 4), new_tokens, eos)
    return {
        "dataset": evaluation.dataset,
        "cost_ratio": costs["prepacked"]["cost_ratio"],
        "costs": costs,
        "static": {str(k): asdict(found) for k, found in static.items()},
    }


def _train_shown(
    head: EagleHead, data: SequenceFeatures, stage: EagleStage, progress: bool
) -> list[float]:
    """Train ``head`` for the stage's steps behind a progress bar (loss, ETA); return the
    losses."""
    with tqdm(total=stage.training.steps, desc=f"train {stage.name}", disable=not progress) as bar:

        def shown(_step: int, loss: float) -> None:
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            bar.update(1)

        return train_steps(
            head,
            data,
            stage.training,
            stage.loss,
            shown,
            stage.length_grouped,
            stage.bf16_autocast,
        )
