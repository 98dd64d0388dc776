"""What each model card says: identity, size, training, teacher data and measured cost."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from transformers import LlamaForCausalLM

from training.gguf_import import ImportedModel
from training.lm_trainer import TrainResult
from training.pretrained_drafts import DraftTraining, DraftVocab, PretrainedDrafts, TeacherSample
from training.realism import (
    DEFAULT_TIMING_THREADS,
    cached_step_seconds,
    decode_step_seconds,
    machine_load,
)
from training.zoo.recipes import (
    MODEL_REF_PREFIX,
    ZOO_VERSION,
    DraftRecipe,
    PretrainedRecipe,
    Recipe,
    ZooRecipe,
)
from workers.lm import CachedLM

_REALISM_METHOD = (
    "agreement: fraction of held-out code+math positions (teacher-forced) where the draft's "
    "argmax equals the target's; entropy: of softmax(raw draft logits), nats, over the same "
    "positions; cost: median wall time of one batch-1 fp32 single-token forward with a KV cache "
    "as the engine runs it (CachedLM: fast path, a draft's restricted head, the calibrated "
    "one-token step; after warm-up), draft and target timed alternately; static speedup: "
    "wall-clock tokens/s of the fastest static K over target-only AR on held-out {dataset} "
    "prompts, greedy, exactly the same tokens, the methods taking turns prompt by prompt"
)


def realism_method(dataset: str) -> str:
    """Return the cards' description of their measurements, the speedup's ``dataset`` named."""
    return _REALISM_METHOD.format(dataset=dataset)


#: Dataset and prompt length (last tokens kept) of the cards' static-K speedup.
SPEEDUP_DATASET = "builtin:code"
SPEEDUP_PROMPT_TOKENS = 256


def architecture(model: LlamaForCausalLM) -> dict[str, Any]:
    """Return the card's size fields of ``model``."""
    config = model.config
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "vocab_size": config.vocab_size,
    }


def identity_card(recipe: Recipe, name: str, role: str) -> dict[str, Any]:
    """Return the card fields that say which model this is: name, ref, role, profile, recipe."""
    return {
        "name": name,
        "ref": f"{MODEL_REF_PREFIX}{recipe.profile}/{name}",
        "role": role,
        "profile": recipe.profile,
        "recipe_hash": recipe.recipe_hash(),
        "zoo_version": ZOO_VERSION,
    }


def base_card(name: str, role: str, recipe: ZooRecipe, result: TrainResult) -> dict[str, Any]:
    """Return the card fields every trained model has: identity, training, held-out losses."""
    return {
        **identity_card(recipe, name, role),
        "tokens_seen": result.tokens_seen,
        "final_train_loss": result.final_loss,
        "val_loss": result.val_losses,
        "val_loss_unit": "next-token cross-entropy, nats/token, held-out text",
        "build_seconds": result.seconds,
    }


def distillation_card(recipe: ZooRecipe, draft: DraftRecipe) -> dict[str, Any]:
    """Return the card section on how a scratch zoo's draft was distilled from its target."""
    return {
        "teacher": "target (trained layers; the enlarged target computes the same logits)",
        "initialisation": "random, except token embeddings = the target's projected onto "
        "their top principal axes",
        "data": f"one epoch of {recipe.distill_steps * recipe.batch_size} blocks; a "
        f"fraction {recipe.onpolicy_fraction} are {recipe.onpolicy_prompt_tokens} corpus "
        "tokens + the target's greedy continuation, the rest corpus blocks",
        "divergence": "forward_kl",
        "lr": draft.lr,
        "steps": recipe.distill_steps,
    }


def target_cost_card(target: LlamaForCausalLM, recipe: Recipe) -> dict[str, float]:
    """Return the target's cached-forward cost for 1, 5 and 9 new tokens (verification sizes).

    A verification forward of K+1 tokens that costs little more than one decoding step is what
    lets speculative decoding pay off; these figures show how close the target comes. Timed on
    one thread: with two OpenMP threads, multi-token forwards on a shared machine are erratic
    (often 10x slower while another process holds a core), and cost minutes to time.
    """
    repeats = max(5, recipe.timing_repeats // 2)
    sizes = (1, 5, 9)
    timed = decode_step_seconds(
        [target] * len(sizes),
        recipe.timing_context,
        new_tokens=sizes,
        repeats=repeats,
        threads=1,
    )
    seconds = dict(zip(sizes, timed, strict=True))
    return {
        "t_forward_1_token_s": seconds[1],
        "t_forward_5_tokens_s": seconds[5],
        "t_forward_9_tokens_s": seconds[9],
        "forward_5_over_1": seconds[5] / seconds[1],
        "forward_9_over_1": seconds[9] / seconds[1],
        "timing_threads": 1,
        "timing_repeats": repeats,
        "timing_context_tokens": recipe.timing_context,
        "load_average_1min": machine_load(),
    }


def draft_vocab_card(vocab: DraftVocab | None, heldout: list[TeacherSample]) -> dict[str, Any]:
    """Return the card section on the draft head's vocabulary."""
    if vocab is None:
        return {"size": None, "what": "the full vocabulary"}
    return {
        "size": int(vocab.kept.numel()),
        "heldout_coverage": vocab.coverage(heldout),
        "what": "config.draft_vocab: the tokens with the most target top-k probability mass "
        "over the training teacher data, plus the specials; the head computes those rows only "
        "and the others get probability 0; heldout_coverage: share of the held-out teacher "
        "argmax tokens among them",
    }


def teacher_data_card(
    stage: PretrainedDrafts,
    train: list[TeacherSample],
    heldout: list[TeacherSample],
    seconds: float,
) -> dict[str, Any]:
    """Return the card section describing the teacher data both drafts were distilled on."""
    tokens = sum(sample.response_tokens for sample in train + heldout)
    return {
        **asdict(stage.data),
        "train_samples": len(train),
        "heldout_samples": len(heldout),
        "response_tokens": tokens,
        "train_response_tokens": sum(sample.response_tokens for sample in train),
        "train_prompt_labels": sum(sample.prompt_labels for sample in train),
        "generation_seconds": seconds,
        "generation_tokens_per_s": tokens / seconds,
        "what": "the target's greedy responses (chat template) to train-split stdlib functions, "
        "train-split builtin math problems and templated general instructions; labels are "
        "its top-k log-probabilities per response token and, with prompt_labels, per prompt "
        "token after the prefix all prompts share (teacher-forced in the generation's "
        "prefill); held-out agreement counts response tokens only; loss: KL(top-k "
        "renormalised p || q)",
    }


def cached_lm_cost_card(target: LlamaForCausalLM, recipe: PretrainedRecipe) -> dict[str, Any]:
    """Return the imported target's measured ``workers.lm.CachedLM`` forward times."""
    context, repeats = recipe.timing_context, recipe.timing_repeats
    blocks = cached_step_seconds(target, context, (1, 5, 9), repeats, threads=1)
    single = cached_step_seconds(target, context, (1,), repeats, threads=DEFAULT_TIMING_THREADS)
    return {
        "fast_path": CachedLM(target).fast_path,
        **{f"t_forward_{n}_token{'s' * (n > 1)}_1_thread_s": t for n, t in blocks.items()},
        f"t_forward_1_token_{DEFAULT_TIMING_THREADS}_threads_s": single[1],
        "timing_repeats": repeats,
        "timing_context_tokens": context,
        "load_average_1min": machine_load(),
        "method": "median wall time of one workers.lm.CachedLM forward after a prefill "
        "(blocks timed on one thread: on a shared machine two-thread block forwards are "
        "erratic)",
    }


def imported_target_card(
    recipe: PretrainedRecipe,
    imported: ImportedModel,
    cost: dict[str, float],
    cached_cost: dict[str, Any],
) -> dict[str, Any]:
    """Return the card of a target imported from a GGUF: its source, conversion and cost."""
    return {
        **identity_card(recipe, "target", "target"),
        **imported.card(),
        "conversion": "GGUF dequantised by transformers' loader, weights copied into a fresh "
        "float32 LlamaForCausalLM (no quantisation marker), saved as safetensors",
        "decoding_cost": cost,
        "cached_lm_cost": cached_cost,
    }


def pretrained_draft_card(
    recipe: PretrainedRecipe,
    name: str,
    draft: LlamaForCausalLM,
    training: DraftTraining,
    sections: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Return the card of a draft distilled from an imported target; ``sections`` holds its
    ``teacher_data``, ``draft_vocab`` and ``realism`` sections."""
    return {
        **identity_card(recipe, name, "draft"),
        "main_draft": name == recipe.main_draft,
        **architecture(draft),
        "trainable_parameters": sum(p.numel() for p in draft.parameters() if p.requires_grad),
        "distillation": {**asdict(training), "teacher_data": sections["teacher_data"]},
        "draft_vocab": sections["draft_vocab"],
        "realism": sections["realism"],
    }
