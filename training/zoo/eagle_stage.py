"""A pretrained profile's EAGLE head (``zoo:<profile>/eagle``): trained on the teacher data.

The head reads the imported target's features over the teacher samples (prompt + the target's
greedy response; one teacher-forced forward per batch of samples), its LM head cut to the
drafts' ``draft_vocab`` when the stage has one, and trains with EAGLE's loss
(``training.eagle_training``). Its card: the data, the steps, held-out agreement at draft steps
1–3, the step's cost against a target step (prepacked and not) and greedy static-K acceptance
on the stage's held-out prompts (HumanEval unless unavailable).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

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
from workers.eagle.artifact import save_eagle_head
from workers.eagle.head import EagleConfig, EagleHead, TargetParts


def sample_features(
    target: LlamaForCausalLM, samples: list[TeacherSample], batch_size: int, pad_id: int
) -> tuple[SequenceFeatures, list[int]]:
    """Return the target's teacher-forced features over ``samples`` (right-padded; the padding
    is invalid) and each sample's prompt length."""
    width = max(sample.ids.numel() for sample in samples)
    tokens = torch.full((len(samples), width), pad_id, dtype=torch.long)
    valid = torch.zeros_like(tokens, dtype=torch.bool)
    for row, sample in enumerate(samples):
        tokens[row, : sample.ids.numel()] = sample.ids
        valid[row, : sample.ids.numel()] = True
    prompt_lengths = [sample.start + sample.prompt_labels + 1 for sample in samples]
    return sequence_features(target, tokens, valid, batch_size), prompt_lengths


def eagle_into(
    recipe: PretrainedRecipe,
    stage: EagleStage,
    target: LlamaForCausalLM,
    data: tuple[list[TeacherSample], list[TeacherSample]],
    vocab: DraftVocab | None,
    evaluation: tuple[EvalRecipe, list[torch.Tensor], str, int | None],
    directory: Path,
    progress: bool,
) -> None:
    """Train the profile's EAGLE head on the (train, held-out) teacher samples, measure it on
    ``evaluation`` (its recipe, encoded prompts, dataset and EOS id), save it with its card."""
    train, heldout = data
    pad = int(target.config.pad_token_id or 0)
    started = time.perf_counter()
    log(progress, recipe, f"extracting the target's features over {len(train)} teacher samples")
    train_data, _ = sample_features(target, train, stage.feature_batch, pad)
    held_data, held_prompts = sample_features(target, heldout, stage.feature_batch, pad)
    extract_s = time.perf_counter() - started
    kept = None if vocab is None else tuple(vocab.kept.tolist())
    torch.manual_seed(stage.training.seed)
    head = EagleHead(EagleConfig.for_target(target, head_vocab=kept), TargetParts.of(target))
    log(progress, recipe, f"training {stage.name} ({stage.training.steps} steps)")
    before = agreement_at_steps(head, held_data, held_prompts, 3, stage.eval_starts)
    started = time.perf_counter()
    losses = _train_shown(head, train_data, stage, progress)
    train_s = time.perf_counter() - started
    after = agreement_at_steps(head, held_data, held_prompts, 3, stage.eval_starts)
    eval_recipe, prompts, dataset, eos = evaluation
    log(progress, recipe, f"measuring {stage.name} (cost, static-K acceptance)")
    costs = {
        layout: asdict(step_cost(target, head, eval_recipe.timing_context, 30, prepack))
        for layout, prepack in (("prepacked", True), ("unpacked", False))
    }
    static = static_acceptance(target, head, prompts, (2, 4), eval_recipe.new_tokens, eos)
    card = {
        **identity_card(recipe, stage.name, "eagle_head"),
        "parameters": sum(p.numel() for p in head.parameters()),
        "hidden_size": head.config.hidden_size,
        "head_vocab": None if kept is None else len(kept),
        "training": {
            **asdict(stage),
            "train_samples": len(train),
            "train_tokens": train_data.n_tokens,
            "heldout_samples": len(heldout),
            "final_loss": sum(losses[-10:]) / max(1, len(losses[-10:])),
            "extract_seconds": extract_s,
            "train_seconds": train_s,
        },
        "heldout_agreement_before": before,
        "heldout_agreement": after,
        "realism": {
            "dataset": dataset,
            "cost_ratio": costs["prepacked"]["cost_ratio"],
            "costs": costs,
            "static": {str(k): asdict(found) for k, found in static.items()},
        },
    }
    save_eagle_head(directory / stage.name, head, {"profile": recipe.profile})
    (directory / stage.name / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")


def _train_shown(
    head: EagleHead, data: SequenceFeatures, stage: EagleStage, progress: bool
) -> list[float]:
    """Train ``head`` for the stage's steps behind a progress bar (loss, ETA); return the
    losses."""
    with tqdm(total=stage.training.steps, desc=f"train {stage.name}", disable=not progress) as bar:

        def shown(_step: int, loss: float) -> None:
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            bar.update(1)

        return train_steps(head, data, stage.training, stage.loss, shown)
