"""Drafts distilled from an imported pretrained target (the ``smol`` zoo profile's draft stage).

Two drafts share one pass of teacher data: the target's own greedy responses, through its chat
template, to prompts that are neither HumanEval nor the held-out ``builtin:math`` set (training
split stdlib functions to complete, training split math problems, templated general
instructions). Generation is batched (left-padded ``generate``) and keeps, for every response
token, the target's top-k log-probabilities at that step, so distillation needs no further
teacher forward:

- a small Llama draft (embeddings: the target's projected onto their top principal axes),
- an EESD-style early exit: the target's first N layers and embeddings frozen, one trained layer
  (initialised from the target's last layer) with the final norm, and the target's LM head
  (frozen, untied copy).

Both minimise forward KL(p_topk || q) on response positions, where p_topk is the target's
distribution renormalised over its top k tokens. With ``draft_vocab`` set, both drafts' heads
cover only that many tokens (FR-Spec's frequency-ranked draft vocabulary): the ones that carry
the most of the target's probability mass over the teacher data, plus the specials. Over a 49k
vocabulary the head is most of a small draft's cost, in training and in decoding; the saved
config lists the kept ids (``draft_vocab``) and ``workers.lm.CachedLM`` computes only those rows
(the others get probability 0, so speculative sampling stays exact). Everything is seeded and
runs on a fixed number of threads, so a build is deterministic.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from training.eagle_training import EagleStage
from training.early_exit import early_exit_draft
from training.lm_trainer import (
    LOSS_WINDOW,
    TrainConfig,
    adamw_optimizer,
    batch_indices,
    learning_rate,
    optimizer_step,
)
from workers.corpus import code_functions, math_problems
from workers.hf_cache import cache_kwargs
from workers.prompt_format import encode_prompts

_TOPICS = (
    "recursion", "hash tables", "photosynthesis", "the water cycle", "unit tests", "gravity",
    "compound interest", "binary search", "version control", "healthy sleep", "prime numbers",
    "the French revolution", "volcanoes", "sorting algorithms", "climate", "public speaking",
)  # fmt: skip
_INSTRUCTIONS = (
    "Explain {} in two sentences.",
    "Give three short tips about {}.",
    "Write a haiku about {}.",
    "What is a common misconception about {}?",
    "Summarise {} for a ten-year-old.",
    "Write one quiz question about {} and answer it.",
)


@dataclass(frozen=True)
class TeacherDataRecipe:
    """Which prompts the target answers and how much of each answer is kept.

    ``heldout`` of the generated samples (the last ones) are kept out of training and measure
    teacher-forced greedy agreement. With ``prompt_labels`` the prompts' own tokens after the
    prefix every prompt shares (the chat template's system turn and user header) are labelled
    too, with the target's top-k from the generation's prefill (teacher-forced, off-policy).
    """

    code_prompts: int
    math_prompts: int
    instruction_prompts: int
    max_prompt_tokens: int
    max_new_tokens: int
    batch_size: int
    top_k: int
    heldout: int
    seed: int = 0
    prompt_labels: bool = False


@dataclass(frozen=True)
class SmallDraftShape:
    """Size of the small Llama draft (vocabulary, tokenizer and specials are the target's)."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int


@dataclass(frozen=True)
class EvalRecipe:
    """The cards' static-K measurement: held-out prompts decoded greedily by AR and static K."""

    dataset: str = "humaneval"
    prompts: int = 4
    prompt_tokens: int = 256
    new_tokens: int = 48
    ks: tuple[int, ...] = (2, 3, 4)
    timing_context: int = 128
    timing_repeats: int = 20


@dataclass(frozen=True)
class PretrainedDrafts:
    """The draft stage of a pretrained profile: teacher data, its drafts, their training.

    The small draft is always built; the EESD early exit only where ``exit_layers`` and
    ``exit_training`` are set (both or neither).
    """

    data: TeacherDataRecipe
    small: SmallDraftShape
    small_training: TrainConfig
    exit_layers: int | None = None
    exit_training: TrainConfig | None = None
    evaluation: EvalRecipe = field(default_factory=EvalRecipe)
    small_name: str = "draft-s"
    exit_name: str = "draft-exit"
    train_threads: int = 1
    draft_vocab: int | None = None
    eagle: EagleStage | None = None

    def __post_init__(self) -> None:
        if (self.exit_layers is None) != (self.exit_training is None):
            raise ValueError("set both exit_layers and exit_training for an early exit, or neither")

    @property
    def names(self) -> tuple[str, ...]:
        """Return the zoo names of the drafts, the small draft (the main one) first."""
        return (self.small_name,) if self.exit_layers is None else (self.small_name, self.exit_name)

    @property
    def model_names(self) -> tuple[str, ...]:
        """Return the names of everything the stage writes: the drafts, then the EAGLE head."""
        return self.names if self.eagle is None else (*self.names, self.eagle.name)


@dataclass(frozen=True)
class TeacherSample:
    """One target response: ``ids`` = prompt + response (EOS included when reached).

    Positions ``start .. start + T - 1`` of ``ids[:-1]`` are labelled: ``top_ids``/``top_logp``
    [T, k] are the target's top-k tokens and log-probabilities there. The first
    ``prompt_labels`` of them predict prompt tokens, the others the response's tokens.
    ``features`` [len(ids) − 1, d], when the generation kept them: the target's last hidden
    state (after its final norm) at every position but the last, as it computed them while
    answering (an EAGLE head's training data, with no second forward).
    """

    ids: torch.Tensor
    start: int
    top_ids: torch.Tensor
    top_logp: torch.Tensor
    prompt_labels: int = 0
    features: torch.Tensor | None = None

    @property
    def labelled(self) -> int:
        """Return the number of teacher-labelled positions (prompt and response)."""
        return self.top_ids.shape[0]

    @property
    def response_tokens(self) -> int:
        """Return the number of response tokens."""
        return self.labelled - self.prompt_labels

    def with_prompt_labels(self, top_ids: torch.Tensor, top_logp: torch.Tensor) -> TeacherSample:
        """Return this sample with the [P, k] labels of the P prompt positions before it."""
        return replace(
            self,
            start=self.start - top_ids.shape[0],
            top_ids=torch.cat([top_ids, self.top_ids]),
            top_logp=torch.cat([top_logp, self.top_logp]),
            prompt_labels=self.prompt_labels + top_ids.shape[0],
        )

    def responses_only(self) -> TeacherSample:
        """Return this sample with its response labels alone."""
        first = self.prompt_labels
        return replace(
            self,
            start=self.start + first,
            top_ids=self.top_ids[first:],
            top_logp=self.top_logp[first:],
            prompt_labels=0,
        )


def distillation_prompts(recipe: TeacherDataRecipe) -> list[str]:
    """Return the prompt texts: train-split stdlib functions, train-split math, instructions.

    Disjoint from HumanEval (not stdlib) and from ``builtin:math``'s held-out split; the order is
    interleaved by a seeded shuffle so that every generation batch mixes domains.
    """
    rng = random.Random(recipe.seed)
    code = _teacher_code_prompts(recipe, rng)
    math = [p.prompt for p in math_problems("train", recipe.math_prompts, seed=recipe.seed)]
    pairs = [(t, i) for t in _TOPICS for i in _INSTRUCTIONS]
    chosen = rng.sample(pairs, min(recipe.instruction_prompts, len(pairs)))
    general = [instruction.format(topic) for topic, instruction in chosen]
    prompts = code + math + general
    rng.shuffle(prompts)
    return prompts


def _teacher_code_prompts(recipe: TeacherDataRecipe, rng: random.Random) -> list[str]:
    """Return the teacher data's code prompts: ``recipe.code_prompts`` train-split stdlib
    functions drawn with ``rng`` (seeded with ``recipe.seed``; the draw moves it)."""
    functions = code_functions("train")
    return [f.prompt for f in rng.sample(functions, min(recipe.code_prompts, len(functions)))]


def answer_prompts(recipe: TeacherDataRecipe, count: int) -> list[str]:
    """Return ``count`` more train-split stdlib function prompts, none of them among
    ``distillation_prompts(recipe)``'s, in a seeded order (for data the target answers beyond
    the teacher data, e.g. an EAGLE head's); ValueError when fewer are left."""
    taken = set(_teacher_code_prompts(recipe, random.Random(recipe.seed)))
    rest = sorted({f.prompt for f in code_functions("train")} - taken)
    if count > len(rest):
        raise ValueError(f"answer_prompts: {count} asked, {len(rest)} stdlib functions left")
    return random.Random(recipe.seed + 1).sample(rest, count)


def _left_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (ids, attention mask) of ``rows`` left-padded to one length."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = torch.tensor(row)
        mask[index, width - len(row) :] = 1
    return ids, mask


def _position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Return the position ids of left-padded rows (0 at each row's first real token)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _top_logp(logits: torch.Tensor, k: int) -> torch.return_types.topk:
    """Return the top-k log-probabilities (values, token ids) of each row of ``logits``."""
    return torch.log_softmax(logits.float(), dim=-1).topk(k)


@contextmanager
def _final_norm_outputs(target: LlamaForCausalLM) -> Iterator[list[torch.Tensor]]:
    """Yield a list that receives the output of the target's final norm at each forward
    (its last hidden states [B, n, d]) while the context is open."""
    outputs: list[torch.Tensor] = []
    hook = target.model.norm.register_forward_hook(lambda _m, _i, out: outputs.append(out))
    try:
        yield outputs
    finally:
        hook.remove()


def _prefilled(
    target: LlamaForCausalLM, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache
) -> torch.Tensor:
    """Prefill ``cache`` with the left-padded prompts ``ids`` but their last tokens; return the
    target's last hidden states there."""
    return target.model(
        input_ids=ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=_position_ids(mask)[:, :-1],
        use_cache=True,
        **cache_kwargs(target.model, cache),
    ).last_hidden_state


@torch.inference_mode()
def _generate_batch(
    target: LlamaForCausalLM,
    rows: list[list[int]],
    recipe: TeacherDataRecipe,
    eos: int,
    first_label: int,
    keep_features: bool = False,
) -> list[TeacherSample]:
    """Greedily answer one batch of prompt ids; return a sample per row with top-k labels.

    The prompts but their last tokens are prefilled here and ``generate`` goes on from that
    cache; with ``recipe.prompt_labels`` the prefill's positions from ``first_label`` on are
    labelled as well. ``keep_features``: each sample keeps the target's last hidden states
    from the prefill and the generation's steps (``TeacherSample.features``).
    """
    pad = target.generation_config.pad_token_id
    pad = eos if pad is None else pad
    ids, mask = _left_padded(rows, pad)
    cache = DynamicCache()
    hidden = _prefilled(target, ids, mask, cache)
    with _final_norm_outputs(target) if keep_features else nullcontext([]) as steps:
        out = target.generate(
            input_ids=ids,
            attention_mask=mask,
            **cache_kwargs(target, cache),
            max_new_tokens=recipe.max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tops = [_top_logp(step, recipe.top_k) for step in out.logits]
    top_logp = torch.stack([values for values, _ in tops], dim=1)
    top_ids = torch.stack([token_ids for _, token_ids in tops], dim=1)
    responses = out.sequences[:, ids.shape[1] :]
    if keep_features and sum(step.shape[1] for step in steps) != responses.shape[1]:
        raise RuntimeError("generate ran another number of forwards than tokens it generated")
    states = torch.cat([hidden, *steps], dim=1) if keep_features else None
    samples = []
    for index, row in enumerate(rows):
        response = responses[index].tolist()
        length = response.index(eos) + 1 if eos in response else len(response)
        offset = ids.shape[1] - len(row)
        features = None
        if states is not None:  # a copy: a view would save the whole batch's storage
            features = states[index, offset : offset + len(row) - 1 + length].clone()
        full = torch.tensor(row + response[:length])
        sample = TeacherSample(
            full, len(row) - 1, top_ids[index, :length], top_logp[index, :length], 0, features
        )
        if recipe.prompt_labels and first_label < sample.start:
            span = hidden[index, offset + first_label : offset + sample.start]
            labels = _top_logp(target.lm_head(span), recipe.top_k)
            sample = sample.with_prompt_labels(labels.indices, labels.values)
        samples.append(sample)
    return samples


def shared_prefix_length(rows: list[list[int]]) -> int:
    """Return the number of leading token ids all ``rows`` have in common."""
    length = 0
    for column in zip(*rows, strict=False):
        if any(token != column[0] for token in column):
            break
        length += 1
    return length


def teacher_samples(
    target: LlamaForCausalLM,
    tokenizer: Any,
    recipe: TeacherDataRecipe,
    progress: bool,
    prompts: list[str] | None = None,
    keep_features: bool = False,
) -> tuple[list[TeacherSample], float]:
    """Return the target's responses to ``prompts`` (default ``distillation_prompts(recipe)``)
    and the seconds it took.

    Prompts go through the tokenizer's chat template when it has one. Batches hold prompts of
    similar length (sorted), so little compute goes into padding; the output keeps the
    prompts' shuffled order. Prompt labels (``recipe.prompt_labels``) predict every prompt
    token after the prefix all prompts share. ``keep_features``: every sample keeps the
    target's last hidden states (``TeacherSample.features``).
    """
    texts = distillation_prompts(recipe) if prompts is None else prompts
    encoded = encode_prompts(tokenizer, texts, recipe.max_prompt_tokens)
    first_label = max(0, shared_prefix_length(encoded) - 1)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    results: dict[int, TeacherSample] = {}
    started = time.perf_counter()
    bar = tqdm(total=len(encoded), desc="teacher responses", unit="prompt", disable=not progress)
    for first in range(0, len(order), recipe.batch_size):
        chunk = order[first : first + recipe.batch_size]
        rows = [encoded[i] for i in chunk]
        batch = _generate_batch(
            target, rows, recipe, tokenizer.eos_token_id, first_label, keep_features
        )
        results.update(zip(chunk, batch, strict=True))
        tokens = sum(sample.response_tokens for sample in results.values())
        bar.update(len(chunk))
        bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - started):.0f}")
    bar.close()
    return [results[i] for i in range(len(encoded))], time.perf_counter() - started


def projected_embeddings(embeddings: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """Return ``embeddings`` [V, d] projected onto their top ``hidden_size`` principal axes.

    The result [V, hidden_size] keeps the mean row norm of the input. A draft initialised with
    it starts with the target's notion of which tokens are alike.
    """
    if hidden_size > embeddings.shape[1]:
        raise ValueError(f"cannot project {embeddings.shape[1]} dims up to {hidden_size}")
    centered = embeddings - embeddings.mean(dim=0)
    _, _, axes = torch.linalg.svd(centered, full_matrices=False)
    projected = embeddings @ axes[:hidden_size].T
    scale = embeddings.norm(dim=1).mean() / projected.norm(dim=1).mean()
    return projected * scale


def small_draft(target: LlamaForCausalLM, shape: SmallDraftShape, seed: int) -> LlamaForCausalLM:
    """Return a fresh small Llama with the target's vocabulary, specials, rope and tied
    embeddings initialised from a PCA of the target's."""
    base = target.config
    config = LlamaConfig.from_dict(
        {
            **base.to_dict(),
            "hidden_size": shape.hidden_size,
            "num_hidden_layers": shape.num_layers,
            "intermediate_size": shape.intermediate_size,
            "num_attention_heads": shape.num_heads,
            "num_key_value_heads": shape.num_kv_heads,
            "head_dim": shape.hidden_size // shape.num_heads,
            "tie_word_embeddings": True,
        }
    )
    torch.manual_seed(seed)
    draft = LlamaForCausalLM(config)
    with torch.no_grad():
        weights = target.get_input_embeddings().weight.detach().float()
        draft.get_input_embeddings().weight.copy_(projected_embeddings(weights, shape.hidden_size))
    return draft


def exit_draft(target: LlamaForCausalLM, exit_layers: int) -> LlamaForCausalLM:
    """Return the EESD early exit: frozen first ``exit_layers`` layers, one trained layer from
    the target's last, the target's final norm (trained) and LM head (frozen)."""
    draft = early_exit_draft(target, exit_layers, target.config.num_hidden_layers - 1)
    draft.lm_head.requires_grad_(False)
    return draft


@dataclass(frozen=True)
class DraftVocab:
    """The token ids a draft's head covers (sorted) and, per full-vocabulary id, its row there
    (-1 for ids outside it)."""

    kept: torch.Tensor
    row_of: torch.Tensor

    @classmethod
    def of(cls, kept: torch.Tensor, vocab_size: int) -> DraftVocab:
        """Return the map of the sorted ids ``kept`` within a vocabulary of ``vocab_size``."""
        row_of = torch.full((vocab_size,), -1, dtype=torch.long)
        row_of[kept] = torch.arange(kept.numel())
        return cls(kept, row_of)

    def coverage(self, samples: list[TeacherSample]) -> float:
        """Return the fraction of the samples' response argmax tokens that the head covers."""
        top = torch.cat([sample.responses_only().top_ids[:, 0] for sample in samples])
        return float((self.row_of[top] >= 0).float().mean())


def frequent_tokens(
    samples: list[TeacherSample], size: int, vocab_size: int, always: list[int]
) -> DraftVocab:
    """Return the ``size`` tokens with the most teacher probability mass over the samples'
    labelled positions (top-k mass, summed), ``always`` (EOS, specials) among them."""
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for sample in samples:
        mass.index_add_(0, sample.top_ids.flatten(), sample.top_logp.double().exp().flatten())
    mass[torch.tensor(always, dtype=torch.long)] = float("inf")
    kept = mass.topk(min(size, vocab_size)).indices.sort().values
    return DraftVocab.of(kept, vocab_size)


def _batch(samples: list[TeacherSample]) -> dict[str, torch.Tensor]:
    """Right-pad samples into inputs, mask and the flat (row, position) of labelled positions."""
    width = max(sample.ids.numel() - 1 for sample in samples)
    ids = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    rows, positions = [], []
    for index, sample in enumerate(samples):
        inputs = sample.ids[:-1]
        ids[index, : inputs.numel()] = inputs
        mask[index, : inputs.numel()] = 1
        span = torch.arange(sample.start, sample.start + sample.labelled)
        rows.append(torch.full_like(span, index))
        positions.append(span)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "rows": torch.cat(rows),
        "positions": torch.cat(positions),
        "top_ids": torch.cat([sample.top_ids for sample in samples]),
        "top_logp": torch.cat([sample.top_logp for sample in samples]),
    }


def response_logits(
    draft: LlamaForCausalLM, batch: dict[str, torch.Tensor], vocab: DraftVocab | None = None
) -> torch.Tensor:
    """Return the draft's logits [N, V] at the batch's labelled positions only (the LM head runs
    on those rows alone: over a 49k vocabulary it is most of a small draft's cost); with
    ``vocab``, over its kept tokens only ([N, len(kept)])."""
    hidden = draft.model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
    ).last_hidden_state
    labelled = hidden[batch["rows"], batch["positions"]]
    if vocab is None:
        return draft.lm_head(labelled)
    return torch.nn.functional.linear(labelled, draft.lm_head.weight[vocab.kept])


def topk_forward_kl(
    draft_logits: torch.Tensor,
    top_ids: torch.Tensor,
    top_logp: torch.Tensor,
    vocab: DraftVocab | None = None,
) -> torch.Tensor:
    """Return mean KL(p_k || q) where p_k is the teacher renormalised over its top-k tokens.

    ``draft_logits`` [N, V] (or [N, len(kept)] with ``vocab``); ``top_ids``/``top_logp`` [N, k]
    the teacher's tokens and log-probabilities. q is the draft's softmax, read at the teacher's
    tokens; with ``vocab``, p_k is renormalised over those of its tokens the head covers.
    """
    rows = top_ids if vocab is None else vocab.row_of[top_ids]
    covered = rows >= 0
    teacher = torch.log_softmax(top_logp.masked_fill(~covered, float("-inf")), dim=-1)
    teacher = torch.where(covered, teacher, 0.0)
    student = torch.log_softmax(draft_logits.float(), dim=-1).gather(-1, rows.clamp(min=0))
    terms = torch.where(covered, teacher.exp() * (teacher - student), 0.0)
    return terms.sum(-1).mean()


@torch.inference_mode()
def teacher_agreement(
    draft: LlamaForCausalLM, samples: list[TeacherSample], vocab: DraftVocab | None = None
) -> float:
    """Return the fraction of response positions where the draft's argmax is the target's."""
    was_training = draft.training
    draft.eval()
    hits, total = 0, 0
    responses = [sample.responses_only() for sample in samples]
    for first in range(0, len(responses), 8):
        batch = _batch(responses[first : first + 8])
        predicted = response_logits(draft, batch, vocab).argmax(-1)
        if vocab is not None:
            predicted = vocab.kept[predicted]
        hits += int((predicted == batch["top_ids"][:, 0]).sum())
        total += predicted.numel()
    draft.train(was_training)
    return hits / max(1, total)


@dataclass(frozen=True)
class DraftTraining:
    """What distilling one draft reports (for its model card)."""

    steps: int
    tokens_seen: int
    final_loss: float
    seconds: float
    heldout_agreement_before: float
    heldout_agreement: float
    agreement_curve: list[tuple[int, float]]


def distill_on_teacher(
    draft: LlamaForCausalLM,
    train: list[TeacherSample],
    heldout: list[TeacherSample],
    config: TrainConfig,
    desc: str,
    progress: bool,
    vocab: DraftVocab | None = None,
) -> DraftTraining:
    """Distil ``draft`` in place on ``train`` by top-k forward KL (its head restricted to
    ``vocab`` when given); measure held-out agreement before, at each quarter and after."""
    torch.manual_seed(config.seed)
    before = teacher_agreement(draft, heldout, vocab)
    optimizer = adamw_optimizer(draft, config, config.lr)
    draft.train()
    recent: list[float] = []
    curve: list[tuple[int, float]] = [(0, before)]
    tokens, started = 0, time.perf_counter()
    checkpoints = {max(1, config.steps * q // 4) for q in (1, 2, 3)}
    batches = batch_indices(len(train), config)
    bar = tqdm(batches, total=config.steps, desc=desc, disable=not progress)
    for step, index in enumerate(bar):
        batch = _batch([train[i] for i in index.tolist()])
        logits = response_logits(draft, batch, vocab)
        loss = topk_forward_kl(logits, batch["top_ids"], batch["top_logp"], vocab)
        optimizer_step(draft, optimizer, loss, learning_rate(step, config), config.grad_clip)
        tokens += batch["rows"].numel()
        recent = [*recent[-(LOSS_WINDOW - 1) :], loss.item()]
        if step + 1 in checkpoints:
            curve.append((step + 1, teacher_agreement(draft, heldout, vocab)))
        bar.set_postfix(kl=f"{recent[-1]:.3f}", agree=f"{curve[-1][1]:.3f}")
    seconds = time.perf_counter() - started
    draft.eval()
    after = teacher_agreement(draft, heldout, vocab)
    curve.append((config.steps, after))
    return DraftTraining(
        config.steps, tokens, sum(recent) / len(recent), seconds, before, after, curve
    )


DraftFactory = Callable[[LlamaForCausalLM], LlamaForCausalLM]


def draft_factories(stage: PretrainedDrafts) -> dict[str, tuple[DraftFactory, TrainConfig]]:
    """Return, per draft name, how to make it from the target and how to train it."""
    factories: dict[str, tuple[DraftFactory, TrainConfig]] = {
        stage.small_name: (
            lambda target: small_draft(target, stage.small, stage.small_training.seed + 100),
            stage.small_training,
        )
    }
    if stage.exit_layers is not None and stage.exit_training is not None:
        layers = stage.exit_layers
        factories[stage.exit_name] = (
            lambda target: exit_draft(target, layers),
            stage.exit_training,
        )
    return factories
