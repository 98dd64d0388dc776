"""Build a ZooRecipe's zoo from scratch: tokenizer, target, distilled drafts, enlargement, cards."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from training.lm_trainer import (
    TrainResult,
    distill_drafts,
    greedy_continuations,
    pack_blocks,
    torch_threads,
    train_language_model,
)
from training.pretrained_drafts import projected_embeddings
from training.realism import agreement_stats, cost_stats, static_speedups
from training.tokenizer import encode_corpus, save_tokenizer, train_bpe_tokenizer
from training.zoo.cache import CARD_FILE, TOKENIZER_DIR, ZooManifest, write_manifest
from training.zoo.cards import (
    SPEEDUP_DATASET,
    SPEEDUP_PROMPT_TOKENS,
    architecture,
    base_card,
    distillation_card,
    realism_method,
    target_cost_card,
)
from training.zoo.enlarge import enlarge_target, enlargement_note, max_logit_difference
from training.zoo.progress import StageClock, log
from training.zoo.recipes import ModelShape, ZooRecipe
from workers.corpus import heldout_text, training_corpus
from workers.datasets import DatasetSpec, load_prompts

HELDOUT_KINDS = ("code", "math")


@dataclass
class _BuildState:
    """The data a build's stages share: recipe, tokenizer, training and held-out blocks."""

    recipe: ZooRecipe
    tokenizer: PreTrainedTokenizerFast
    train_blocks: torch.Tensor
    heldout_blocks: dict[str, torch.Tensor]


def _prepare_data(recipe: ZooRecipe, directory: Path, progress: bool) -> _BuildState:
    """Build the corpus, train and save the tokenizer, pack training and held-out blocks."""
    log(progress, recipe, "reading corpus (stdlib code + math problems)")
    corpus = training_corpus(recipe.code_chars, recipe.math_problems, seed=recipe.seed)
    log(progress, recipe, f"training a {recipe.vocab_size}-token BPE on {len(corpus):,} chars")
    tokenizer = train_bpe_tokenizer(corpus, recipe.vocab_size)
    save_tokenizer(tokenizer, directory / TOKENIZER_DIR)
    block_len = recipe.seq_len + 1
    train_blocks = pack_blocks(encode_corpus(tokenizer, corpus), block_len)
    heldout_blocks = {
        kind: pack_blocks(
            encode_corpus(tokenizer, heldout_text(kind, recipe.heldout_chars, seed=recipe.seed)),
            block_len,
        )
        for kind in HELDOUT_KINDS
    }
    return _BuildState(recipe, tokenizer, train_blocks, heldout_blocks)


def _new_model(shape: ModelShape, state: _BuildState, seed: int) -> LlamaForCausalLM:
    """Return a freshly initialised model of ``shape`` (seeded)."""
    torch.manual_seed(seed)
    config = shape.llama_config(state.recipe.vocab_size, state.tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


def _save_model(
    model: LlamaForCausalLM, state: _BuildState, directory: Path, card: dict[str, Any]
) -> None:
    """Save ``model`` (safetensors), the tokenizer and ``card`` into ``directory``."""
    model.generation_config.eos_token_id = state.tokenizer.eos_token_id
    model.generation_config.pad_token_id = state.tokenizer.pad_token_id
    model.save_pretrained(str(directory))
    if not (directory / "config.json").is_file():
        raise RuntimeError(
            f"save_pretrained wrote no model into {directory}: transformers saves nothing on a "
            "torch.distributed rank other than 0. Build the zoo outside distributed ranks "
            "(python -m orchestrator zoo build) and start them afterwards."
        )
    state.tokenizer.save_pretrained(str(directory))
    (directory / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")


def _train_target(state: _BuildState, progress: bool) -> tuple[LlamaForCausalLM, TrainResult]:
    """Train the (not yet enlarged) target on next-token prediction."""
    recipe = state.recipe
    log(progress, recipe, f"training target ({recipe.target_steps} steps)")
    target = _new_model(recipe.target, state, recipe.seed)
    result = train_language_model(
        target,
        state.train_blocks,
        recipe.target_training(),
        val_blocks=state.heldout_blocks,
        progress=progress,
        desc="train target",
    )
    return target, result


def _distillation_blocks(target: LlamaForCausalLM, state: _BuildState) -> torch.Tensor:
    """Return the blocks the drafts are distilled on: corpus blocks plus on-policy blocks.

    On-policy blocks are a corpus prompt followed by the target's greedy continuation, so the
    drafts also learn how the target behaves on its own outputs (what they see when decoding).
    """
    recipe = state.recipe
    total = recipe.distill_steps * recipe.batch_size
    generated = round(total * recipe.onpolicy_fraction)
    generator = torch.Generator().manual_seed(recipe.seed + 2)
    available = state.train_blocks.shape[0]
    order = torch.randperm(available, generator=generator).repeat(total // available + 1)
    natural = state.train_blocks[order[: total - generated]]
    if generated == 0:
        return natural
    prompts = state.train_blocks[order[total - generated : total], : recipe.onpolicy_prompt_tokens]
    new_tokens = state.train_blocks.shape[1] - recipe.onpolicy_prompt_tokens
    continued = greedy_continuations(target, prompts, new_tokens)
    return torch.cat([natural, continued])


def _distill(
    target: LlamaForCausalLM, state: _BuildState, progress: bool
) -> tuple[dict[str, LlamaForCausalLM], dict[str, TrainResult]]:
    """Create every draft and distil it from ``target`` with forward KL.

    A draft starts from random weights except its (tied) token embeddings, which are the
    target's projected onto their top principal axes: at this tiny compute budget that raises
    the drafts' agreement with the target by several points for free.
    """
    recipe = state.recipe
    log(progress, recipe, "generating on-policy distillation data with the target")
    blocks = _distillation_blocks(target, state)
    log(progress, recipe, f"distilling {len(recipe.drafts)} drafts ({recipe.distill_steps} steps)")
    drafts = {
        draft.name: _new_model(draft.shape, state, recipe.seed + 100 + index)
        for index, draft in enumerate(recipe.drafts)
    }
    target_embeddings = target.get_input_embeddings().weight.detach()
    with torch.no_grad():
        for draft in drafts.values():
            projected = projected_embeddings(target_embeddings, draft.config.hidden_size)
            draft.get_input_embeddings().weight.copy_(projected)
    results = distill_drafts(
        target,
        drafts,
        blocks,
        recipe.distillation(),
        learning_rates={draft.name: draft.lr for draft in recipe.drafts},
        val_blocks=state.heldout_blocks,
        progress=progress,
    )
    return drafts, results


def _realism_cards(
    trained_target: LlamaForCausalLM,
    timed_target: LlamaForCausalLM,
    drafts: dict[str, LlamaForCausalLM],
    state: _BuildState,
) -> dict[str, dict[str, Any]]:
    """Return each draft's realism figures against the target on held-out code and math.

    Agreement uses the trained target's logits, which the enlarged target reproduces (checked
    during the build); cost is timed against the enlarged target, the one that is saved.
    """
    recipe = state.recipe
    heldout = torch.cat([state.heldout_blocks[kind] for kind in HELDOUT_KINDS])[:, :-1]
    agreement = agreement_stats(trained_target, drafts, heldout)
    costs = cost_stats(
        timed_target,
        drafts,
        recipe.timing_context,
        recipe.timing_repeats,
        threads=recipe.timing_threads,
    )
    single = cost_stats(timed_target, drafts, recipe.timing_context, recipe.timing_repeats, 1)
    prompts = [
        torch.tensor(state.tokenizer(prompt.text)["input_ids"][-SPEEDUP_PROMPT_TOKENS:])
        for prompt in load_prompts(DatasetSpec(SPEEDUP_DATASET, samples=recipe.speedup_prompts))
    ]
    speedups = static_speedups(
        timed_target,
        drafts,
        prompts,
        recipe.speedup_ks,
        recipe.speedup_new_tokens,
        threads=recipe.timing_threads,
    )
    cards = {}
    for name in drafts:
        cost = costs[name]
        cards[name] = {
            "greedy_agreement": agreement[name].greedy_agreement,
            "entropy_mean_nats": agreement[name].entropy_mean,
            "entropy_std_nats": agreement[name].entropy_std,
            "positions": agreement[name].n_positions,
            "t_draft_s": cost.t_draft_s,
            "t_target_s": cost.t_target_s,
            "cost_ratio": cost.cost_ratio,
            "timing_threads": cost.threads,
            "t_draft_1_thread_s": single[name].t_draft_s,
            "t_target_1_thread_s": single[name].t_target_s,
            "cost_ratio_1_thread": single[name].cost_ratio,
            "timing_context_tokens": cost.context_len,
            "timing_repeats": cost.repeats,
            "load_average_1min": cost.load_average,
            "static_speedup_code": speedups[name].speedup,
            "static_speedup": {
                "dataset": SPEEDUP_DATASET,
                **asdict(speedups[name]),
            },
            "method": realism_method(SPEEDUP_DATASET),
        }
    return cards


def _enlarge(
    trained_target: LlamaForCausalLM, state: _BuildState, progress: bool
) -> tuple[LlamaForCausalLM, dict[str, Any] | None]:
    """Return the target to save (enlarged if the recipe says so) and its card section."""
    recipe = state.recipe
    plan = recipe.enlargement
    if plan is None:
        return trained_target, None
    log(
        progress,
        recipe,
        f"enlarging target: +{plan.extra_layers} layers, MLP width "
        f"{plan.intermediate_size}, all function-preserving",
    )
    target = enlarge_target(trained_target, plan, recipe.seed + 7)
    trained_layers = recipe.target.num_layers
    probe = state.heldout_blocks["code"][:2, :-1]
    section = {
        "trained_layers": list(range(trained_layers)),
        "added_layers": list(range(trained_layers, trained_layers + plan.extra_layers)),
        "trained_intermediate_size": recipe.target.intermediate_size,
        "intermediate_size": plan.intermediate_size,
        "max_abs_logit_change": max_logit_difference(trained_target, target, probe),
        "note": enlargement_note(trained_layers, plan, recipe.target.intermediate_size),
    }
    return target, section


def train_zoo(recipe: ZooRecipe, directory: Path, progress: bool) -> ZooManifest:
    """Build the whole zoo of ``recipe`` into ``directory`` and return its manifest."""
    clock = StageClock()
    directory.mkdir(parents=True)
    with torch_threads(recipe.train_threads):
        state = _prepare_data(recipe, directory, progress)
        clock.lap("data")
        trained_target, target_result = _train_target(state, progress)
        clock.lap("target")
        drafts, draft_results = _distill(trained_target, state, progress)
        clock.lap("distillation")
        target, enlargement = _enlarge(trained_target, state, progress)
        log(
            progress,
            recipe,
            "measuring realism (agreement, entropy, decoding cost, static-K speedup)",
        )
        realism = _realism_cards(trained_target, target, drafts, state)
        target_cost = target_cost_card(target, recipe)
    clock.lap("realism")

    target_card = base_card("target", "target", recipe, target_result)
    target_card.update(architecture(target))
    target_card["trained_architecture"] = architecture(trained_target)
    if enlargement is not None:
        target_card["enlargement"] = enlargement
    target_card["decoding_cost"] = target_cost
    _save_model(target, state, directory / "target", target_card)
    for draft_recipe in recipe.drafts:
        name = draft_recipe.name
        card = base_card(name, "draft", recipe, draft_results[name])
        card.update(architecture(drafts[name]))
        card["main_draft"] = name == recipe.main_draft
        card["distillation"] = distillation_card(recipe, draft_recipe)
        card["realism"] = realism[name]
        _save_model(drafts[name], state, directory / name, card)
    clock.lap("save")
    return write_manifest(recipe, directory, clock, progress)
