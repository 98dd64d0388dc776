"""The embedded model zoo: builds, caching, loading, cards, enlargement, and its training pieces."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from training.lm_trainer import (
    TrainConfig,
    batch_indices,
    distill_drafts,
    greedy_continuations,
    learning_rate,
    next_token_loss,
    pack_blocks,
    torch_threads,
    train_language_model,
)
from training.losses import forward_kl
from training.pretrained_drafts import projected_embeddings
from training.realism import entropy_nats, greedy_matches, summarize_agreement
from training.tokenizer import END_OF_TEXT, encode_corpus, train_bpe_tokenizer
from training.zoo.build import build_zoo
from training.zoo.cache import ZooManifest, default_cache_dir
from training.zoo.enlarge import enlarge_target
from training.zoo.recipes import MICRO_RECIPE, PROFILES, ZOO_MODEL_NAMES, Enlargement, ZooRecipe
from training.zoo.refs import parse_model_ref, resolve_model_ref

pytestmark = pytest.mark.zoo

CODE_SAMPLE = 'def add(a, b):\n    """Return a + b."""\n    return a + b  # ünïcode ✓\n'

#: A recipe even smaller than micro, for the tests that build more than once.
TINY_RECIPE = replace(
    MICRO_RECIPE,
    code_chars=40_000,
    math_problems=60,
    heldout_chars=2_000,
    target_steps=4,
    distill_steps=3,
    enlargement=Enlargement(extra_layers=1, intermediate_size=160),
    timing_repeats=3,
)


def tiny_llama(layers: int = 2, seed: int = 0, vocab: int = 50) -> LlamaForCausalLM:
    """A random small Llama, seeded."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


# ---------------------------------------------------------------------------------------------
# The built micro zoo
# ---------------------------------------------------------------------------------------------


def test_every_model_and_tokenizer_loads_with_plain_auto_classes(micro_zoo: ZooManifest) -> None:
    assert set(micro_zoo.models) == set(ZOO_MODEL_NAMES)
    sizes = {}
    for name in ZOO_MODEL_NAMES:
        path = micro_zoo.model_path(name)
        assert (path / "model.safetensors").is_file()
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        assert isinstance(model, LlamaForCausalLM)
        assert len(tokenizer) == model.config.vocab_size == MICRO_RECIPE.vocab_size
        assert tokenizer.eos_token == tokenizer.bos_token == tokenizer.pad_token == END_OF_TEXT
        assert model.config.eos_token_id == tokenizer.eos_token_id
        ids = tokenizer(CODE_SAMPLE, return_tensors="pt").input_ids
        assert tokenizer.decode(ids[0]) == CODE_SAMPLE
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert logits.shape == (1, ids.shape[1], MICRO_RECIPE.vocab_size)
        assert torch.isfinite(logits).all()
        sizes[name] = sum(p.numel() for p in model.parameters())
    assert sizes["draft-xs"] < sizes["draft-s"] < sizes["draft-m"] < sizes["target"]
    shared = AutoTokenizer.from_pretrained(micro_zoo.tokenizer)
    assert (
        shared.get_vocab() == AutoTokenizer.from_pretrained(micro_zoo.models["target"]).get_vocab()
    )


def test_model_cards_hold_the_documented_fields(micro_zoo: ZooManifest) -> None:
    recipe = MICRO_RECIPE
    for name in ZOO_MODEL_NAMES:
        card = micro_zoo.card(name)
        model = AutoModelForCausalLM.from_pretrained(micro_zoo.model_path(name))
        assert card["parameters"] == sum(p.numel() for p in model.parameters())
        assert card["num_layers"] == model.config.num_hidden_layers
        assert card["hidden_size"] == model.config.hidden_size
        assert card["build_seconds"] > 0
        assert set(card["val_loss"]) == {"code", "math"}
        for loss in card["val_loss"].values():
            # Trained models beat the uniform distribution's ln V nats.
            assert 0 < loss < math.log(recipe.vocab_size)
    target = micro_zoo.card("target")
    assert target["tokens_seen"] == recipe.target_steps * recipe.batch_size * recipe.seq_len
    mains = [name for name in ZOO_MODEL_NAMES[1:] if micro_zoo.card(name)["main_draft"]]
    assert mains == [micro_zoo.main_draft] == [recipe.main_draft]
    for name in ZOO_MODEL_NAMES[1:]:
        card = micro_zoo.card(name)
        assert card["tokens_seen"] == recipe.distill_steps * recipe.batch_size * recipe.seq_len
        assert card["distillation"]["divergence"] == "forward_kl"
        realism = card["realism"]
        assert 0.0 <= realism["greedy_agreement"] <= 1.0
        assert realism["entropy_std_nats"] > 0
        assert realism["positions"] > 0
        assert realism["cost_ratio"] == pytest.approx(realism["t_draft_s"] / realism["t_target_s"])
        speedup = realism["static_speedup"]
        assert speedup["dataset"] == "builtin:code" and speedup["matches_ar"] is True
        assert (speedup["prompts"], speedup["new_tokens"]) == (
            recipe.speedup_prompts,
            recipe.speedup_new_tokens,
        )
        per_k = {int(k): tokens_per_s for k, tokens_per_s in speedup["tokens_per_s"].items()}
        assert sorted(per_k) == sorted(recipe.speedup_ks)
        assert per_k[speedup["best_k"]] == max(per_k.values())
        assert realism["static_speedup_code"] == speedup["speedup"]
        best = per_k[speedup["best_k"]]
        assert speedup["speedup"] == pytest.approx(best / speedup["ar_tokens_per_s"])
        assert all(0.0 <= a <= 1.0 for a in speedup["acceptance"].values())


def test_enlarged_target_card_and_weights(micro_zoo: ZooManifest) -> None:
    card = micro_zoo.card("target")
    plan = MICRO_RECIPE.enlargement
    trained = MICRO_RECIPE.target.num_layers
    section = card["enlargement"]
    assert section["added_layers"] == list(range(trained, trained + plan.extra_layers))
    assert "function-preserving" in section["note"] and "still runs" in section["note"]
    assert section["max_abs_logit_change"] < 1e-4
    assert card["num_layers"] == trained + plan.extra_layers
    assert card["trained_architecture"]["num_layers"] == trained
    model = AutoModelForCausalLM.from_pretrained(micro_zoo.model_path("target"))
    width = MICRO_RECIPE.target.intermediate_size
    for index, layer in enumerate(model.model.layers):
        down = layer.mlp.down_proj.weight
        assert torch.count_nonzero(down[:, width:]) == 0
        assert torch.count_nonzero(layer.mlp.gate_proj.weight) > 0
        assert torch.count_nonzero(layer.self_attn.q_proj.weight) > 0
        if index >= trained:
            assert torch.count_nonzero(layer.self_attn.o_proj.weight) == 0
            assert torch.count_nonzero(down) == 0
        else:
            assert torch.count_nonzero(down[:, :width]) > 0


def test_second_build_is_a_cache_hit(micro_zoo: ZooManifest) -> None:
    weights = micro_zoo.model_path("target") / "model.safetensors"
    modified = weights.stat().st_mtime_ns
    started = time.perf_counter()
    again = build_zoo("micro", cache_dir=micro_zoo.root.parent.parent, progress=False)
    assert time.perf_counter() - started < 2.0
    assert again.from_cache and not micro_zoo.from_cache
    assert again.root == micro_zoo.root and again.models == micro_zoo.models
    assert again.recipe_hash == micro_zoo.recipe_hash == MICRO_RECIPE.recipe_hash()
    assert weights.stat().st_mtime_ns == modified


def test_model_refs_resolve_to_the_cached_zoo(
    micro_zoo: ZooManifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    for name in ZOO_MODEL_NAMES:
        assert resolve_model_ref(f"zoo:micro/{name}", progress=False) == micro_zoo.models[name]
    assert parse_model_ref("zoo:smol-exit/draft-exit") == ("smol-exit", "draft-exit")
    with pytest.raises(ValueError, match=r"toy 'demo' profile was removed.*zoo:smol/target"):
        parse_model_ref("zoo:demo/target")
    for bad in ("zoo:nano/target", "zoo:micro/draft-xl", "hf:gpt2", "zoo:micro", "zoo:a/b/c"):
        with pytest.raises(ValueError):
            parse_model_ref(bad)


# ---------------------------------------------------------------------------------------------
# Rebuilds, determinism and concurrency (a tiny recipe built a few times)
# ---------------------------------------------------------------------------------------------


def test_a_build_whose_models_are_not_written_fails_and_caches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What transformers does on a torch.distributed rank other than 0: save_pretrained skips.
    monkeypatch.setattr(LlamaForCausalLM, "should_save_on_this_rank", lambda self, main: False)
    with pytest.raises(RuntimeError, match="wrote no model"):
        build_zoo(TINY_RECIPE, cache_dir=tmp_path, progress=False)
    assert not list((tmp_path / "zoo").glob("micro-*"))


def test_changed_recipe_rebuilds_concurrent_builds_share_one(micro_zoo: ZooManifest) -> None:
    cache = micro_zoo.root.parent.parent
    assert TINY_RECIPE.recipe_hash() != MICRO_RECIPE.recipe_hash()
    final = cache / "zoo" / f"micro-{TINY_RECIPE.recipe_hash()}"
    stale = final.parent / f".{final.name}.tmp-999-deadbeef"
    stale.mkdir(parents=True)
    (stale / "half-written").write_text("interrupted build")
    results: list[ZooManifest] = []

    def build() -> None:
        results.append(build_zoo(TINY_RECIPE, cache_dir=cache, progress=False))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.from_cache for r in results) == [False, True]
    assert {r.root for r in results} == {final}
    assert final != micro_zoo.root and micro_zoo.root.is_dir()
    assert not stale.exists()
    assert not list(final.parent.glob(".*.tmp-*"))


def test_same_recipe_and_seed_give_identical_files(tmp_path: Path) -> None:
    first = build_zoo(TINY_RECIPE, cache_dir=tmp_path / "a", progress=False)
    second = build_zoo(TINY_RECIPE, cache_dir=tmp_path / "b", progress=False)
    assert (first.tokenizer / "tokenizer.json").read_bytes() == (
        second.tokenizer / "tokenizer.json"
    ).read_bytes()
    for name in ("target", "draft-s"):
        a = (first.model_path(name) / "model.safetensors").read_bytes()
        b = (second.model_path(name) / "model.safetensors").read_bytes()
        assert a == b, f"{name} weights differ between two builds of the same recipe"


# ---------------------------------------------------------------------------------------------
# Recipes, cache location
# ---------------------------------------------------------------------------------------------


def test_recipe_hash_tracks_every_field() -> None:
    assert MICRO_RECIPE.recipe_hash() == replace(MICRO_RECIPE).recipe_hash()
    variants = [
        replace(MICRO_RECIPE, seed=1),
        replace(MICRO_RECIPE, target_lr=MICRO_RECIPE.target_lr * 2),
        replace(MICRO_RECIPE, enlargement=None),
        replace(
            MICRO_RECIPE,
            main_draft=next(
                d.name for d in MICRO_RECIPE.drafts if d.name != MICRO_RECIPE.main_draft
            ),
        ),
    ]
    hashes = {recipe.recipe_hash() for recipe in variants}
    assert len(hashes) == len(variants) and MICRO_RECIPE.recipe_hash() not in hashes
    assert PROFILES["smol"].recipe_hash() != PROFILES["micro"].recipe_hash()


def test_recipes_are_validated() -> None:
    with pytest.raises(ValueError):
        replace(MICRO_RECIPE, main_draft="draft-xl")
    with pytest.raises(ValueError):
        replace(MICRO_RECIPE, drafts=MICRO_RECIPE.drafts[:2])
    with pytest.raises(ValueError):
        replace(MICRO_RECIPE, onpolicy_fraction=1.5)
    with pytest.raises(ValueError):
        replace(MICRO_RECIPE, onpolicy_prompt_tokens=MICRO_RECIPE.seq_len + 1)
    for recipe in (r for r in PROFILES.values() if isinstance(r, ZooRecipe)):
        sizes = [d.shape.hidden_size * d.shape.num_layers for d in recipe.drafts]
        assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECSWEEP_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("SPECSWEEP_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "specsweep"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "specsweep"


# ---------------------------------------------------------------------------------------------
# Enlargement
# ---------------------------------------------------------------------------------------------


def test_enlargement_preserves_logits_and_every_layer_runs() -> None:
    small = tiny_llama(layers=2)
    big = enlarge_target(small, Enlargement(extra_layers=3, intermediate_size=96), seed=1)
    assert big.config.num_hidden_layers == 5 and big.config.intermediate_size == 96
    ids = torch.randint(0, 50, (3, 20), generator=torch.Generator().manual_seed(0))
    calls: list[int] = []
    for index, layer in enumerate(big.model.layers):
        layer.mlp.register_forward_hook(lambda *_, i=index: calls.append(i))
        layer.self_attn.register_forward_hook(lambda *_, i=index: calls.append(i))
    with torch.no_grad():
        expected = small(input_ids=ids).logits
        actual = big(input_ids=ids).logits
    assert sorted(set(calls)) == list(range(5)) and len(calls) == 10
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)
    # The check is sharp: one nonzero output weight in an added layer changes the logits.
    with torch.no_grad():
        big.model.layers[3].mlp.down_proj.weight[0, 0] = 0.5
        assert (big(input_ids=ids).logits - expected).abs().max() > 1e-3


def test_projected_embeddings_keep_the_main_axes() -> None:
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(40, 6, generator=generator) * torch.tensor([9, 5, 1, 1, 1, 1.0])
    full = projected_embeddings(embeddings, 6)
    # All axes kept: a rotation, so inner products between tokens are unchanged.
    torch.testing.assert_close(full @ full.T, embeddings @ embeddings.T, atol=1e-3, rtol=1e-4)
    two = projected_embeddings(embeddings, 2)
    assert two.shape == (40, 2)
    mean_norm = embeddings.norm(dim=1).mean()
    assert two.norm(dim=1).mean().item() == pytest.approx(mean_norm.item(), rel=1e-5)
    # The two kept axes are the high-variance ones: token geometry is mostly preserved.
    cosine = torch.nn.functional.cosine_similarity(
        (two @ two.T).flatten(), (embeddings @ embeddings.T).flatten(), dim=0
    )
    assert cosine > 0.95
    with pytest.raises(ValueError):
        projected_embeddings(embeddings, 7)


def test_enlargement_cannot_shrink() -> None:
    with pytest.raises(ValueError):
        enlarge_target(tiny_llama(), Enlargement(extra_layers=1, intermediate_size=16), seed=0)


# ---------------------------------------------------------------------------------------------
# Tokenizer, trainer and realism pieces
# ---------------------------------------------------------------------------------------------


def test_tokenizer_is_deterministic_and_round_trips() -> None:
    text = "\n\n".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n" for i in range(300))
    first = train_bpe_tokenizer(text, vocab_size=400)
    second = train_bpe_tokenizer(text, vocab_size=400)
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    assert len(first) == 400
    assert first.convert_tokens_to_ids(END_OF_TEXT) == first.eos_token_id
    for sample in (CODE_SAMPLE, "日本語 😀 \t\r\n  x", text[:500]):
        assert first.decode(encode_corpus(first, sample)) == sample
    assert len(encode_corpus(first, text)) < len(text.encode("utf-8")) / 2


def test_learning_rate_schedule() -> None:
    cosine = TrainConfig(steps=11, batch_size=1, lr=1.0, warmup_steps=2, min_lr_ratio=0.1)
    assert learning_rate(0, cosine) == pytest.approx(0.5)
    assert learning_rate(1, cosine) == pytest.approx(1.0)
    assert learning_rate(2, cosine) == pytest.approx(1.0)
    # Halfway through the 8 decay steps cos(π/2) = 0: 0.1 + 0.9 · 0.5.
    assert learning_rate(6, cosine) == pytest.approx(0.55)
    assert learning_rate(10, cosine) == pytest.approx(0.1)
    linear = replace(cosine, schedule="linear")
    assert learning_rate(4, linear) == pytest.approx(0.1 + 0.9 * 0.75)
    assert learning_rate(10, linear) == pytest.approx(0.1)


def test_pack_blocks_and_batches() -> None:
    blocks = pack_blocks(list(range(23)), 5)
    assert blocks.shape == (4, 5) and blocks[1].tolist() == [5, 6, 7, 8, 9]
    with pytest.raises(ValueError):
        pack_blocks([1, 2], 5)
    config = TrainConfig(steps=6, batch_size=3, lr=1.0, seed=4)
    batches = list(batch_indices(7, config))
    assert len(batches) == 6 and all(len(b) == 3 for b in batches)
    # Each epoch of two batches draws distinct blocks.
    for epoch in range(3):
        drawn = torch.cat(batches[2 * epoch : 2 * epoch + 2]).tolist()
        assert len(set(drawn)) == 6
    assert [b.tolist() for b in batches] == [b.tolist() for b in batch_indices(7, config)]


def test_next_token_loss_of_uniform_logits_is_log_vocab() -> None:
    logits = torch.zeros(2, 3, 7)
    targets = torch.tensor([[0, 1, 2], [3, 4, 6]])
    assert next_token_loss(logits, targets).item() == pytest.approx(math.log(7))


def test_training_and_distillation_reduce_their_losses() -> None:
    pattern = torch.arange(12).repeat(60)  # a sequence a model can learn exactly
    blocks = pack_blocks(pattern, 13)
    model = tiny_llama(layers=1, vocab=20)
    draft = tiny_llama(layers=1, seed=3, vocab=20)
    inputs = blocks[:, :-1]
    config = TrainConfig(steps=40, batch_size=8, lr=1e-2, warmup_steps=2)
    with torch_threads(1):
        result = train_language_model(model, blocks, config, {"v": blocks}, progress=False)
        with torch.no_grad():
            before = forward_kl(model(input_ids=inputs).logits, draft(input_ids=inputs).logits)
        results = distill_drafts(model, {"d": draft}, blocks, config, progress=False)
        with torch.no_grad():
            after = forward_kl(model(input_ids=inputs).logits, draft(input_ids=inputs).logits)
    assert result.tokens_seen == 40 * 8 * 12
    assert result.val_losses["v"] < 0.5 < math.log(20)
    assert after.item() < before.item() / 4
    assert results["d"].final_loss < before.item()


def test_greedy_continuations_match_transformers_generate() -> None:
    model = tiny_llama(layers=2, seed=5, vocab=30)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20)  # peaked logits: no near-ties in the argmax
    prompts = torch.randint(0, 30, (5, 4), generator=torch.Generator().manual_seed(1))
    ours = greedy_continuations(model, prompts, new_tokens=6, batch_size=2)
    assert ours.shape == (5, 10) and torch.equal(ours[:, :4], prompts)
    for row, prompt in zip(ours, prompts, strict=True):
        reference = model.generate(
            prompt[None], max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0
        )
        assert row.tolist() == reference[0].tolist()


def test_realism_measures() -> None:
    vocab = 8
    assert entropy_nats(torch.zeros(vocab)).item() == pytest.approx(math.log(vocab))
    peaked = torch.tensor([50.0, 0.0, 0.0])
    assert entropy_nats(peaked).item() == pytest.approx(0.0, abs=1e-6)
    two_way = torch.tensor([0.0, 0.0, -math.inf])
    assert entropy_nats(two_way).item() == pytest.approx(math.log(2))
    target = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [0.0, 3.0]])
    draft = torch.tensor([[0.0, 1.0], [0.0, 1.0], [5.0, 1.0], [0.0, 0.5]])
    matches = greedy_matches(target, draft)
    assert matches.tolist() == [False, True, True, True]
    stats = summarize_agreement(matches, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert stats.greedy_agreement == pytest.approx(0.75)
    assert stats.entropy_mean == pytest.approx(2.5)
    assert stats.entropy_std == pytest.approx(math.sqrt(5 / 3))  # sample std of 1..4
    assert stats.n_positions == 4
