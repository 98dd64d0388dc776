"""orchestrator/run/git_objects.py against git itself: loose, packed and deltified objects."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.run.git_objects import ObjectStore, commit_tree, flat_tree


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=True)
    return done.stdout.decode("utf-8", "surrogateescape").strip()


def _git_bytes(cwd: Path, *args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=True).stdout


@pytest.fixture
def history(tmp_path: Path) -> Path:
    """A repository whose trees and files change a little per commit (so packs hold deltas)."""
    root = tmp_path / "repo"
    (root / "many").mkdir(parents=True)
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@example.com")
    _git(root, "config", "user.name", "t")
    for step in range(6):
        for number in range(120):
            (root / "many" / f"file_{number:03}.txt").write_text(f"{number}\n" * 40)
        (root / "many" / f"file_{step:03}.txt").write_text(f"step {step}\n" * 300)
        (root / "big.txt").write_text("".join(f"line {n} {n * step}\n" for n in range(3000)))
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"step {step}")
    return root


def _objects(root: Path) -> list[tuple[str, str]]:
    """Every stored object's (id, type), as git lists them."""
    check = "--batch-check=%(objectname) %(objecttype)"
    listed = _git(root, "cat-file", "--batch-all-objects", check).splitlines()
    return [(line.split(" ")[0], line.split(" ")[1]) for line in listed]


def _deltas(root: Path) -> int:
    """How many packed objects are stored as deltas (``git verify-pack``'s chain lines)."""
    packs = sorted((root / ".git" / "objects" / "pack").glob("*.idx"))
    lines = _git(root, "verify-pack", "-v", *map(str, packs)).splitlines()
    return sum(1 for line in lines if len(line.split()) == 7 and len(line.split()[0]) == 40)


@pytest.mark.parametrize("offset_deltas", [True, False], ids=["ofs-delta", "ref-delta"])
def test_every_object_matches_git(history: Path, offset_deltas: bool) -> None:
    objects = history / ".git" / "objects"
    loose = ObjectStore(objects)  # before packing, every object is a loose file
    expected = {sha: loose.read(sha) for sha, _ in _objects(history)}
    assert expected[_git(history, "rev-parse", "HEAD")].data == _git_bytes(
        history, "cat-file", "commit", "HEAD"
    )
    _git(history, "config", "repack.useDeltaBaseOffset", str(offset_deltas).lower())
    _git(history, "repack", "-q", "-a", "-d", "-f", "--window=50", "--depth=50")
    _git(history, "prune-packed")
    assert not any(objects.glob("??/*")) and _deltas(history) >= 5
    store = ObjectStore(objects)
    for sha, kind in _objects(history):
        found = store.read(sha)
        assert found is not None and found.kind == kind, sha
        assert found == expected[sha], sha
    blob = _git(history, "rev-parse", "HEAD:big.txt")
    assert store.read(blob).data == _git_bytes(history, "cat-file", "blob", blob)


def test_commit_tree_and_flat_tree(history: Path) -> None:
    _git(history, "gc", "-q", "--aggressive")
    store = ObjectStore(history / ".git" / "objects")
    head = _git(history, "rev-parse", "HEAD")
    tree = commit_tree(store, head)
    assert tree == _git(history, "rev-parse", "HEAD^{tree}")
    listed = _git(history, "ls-tree", "-r", "HEAD").splitlines()
    flat = flat_tree(store, tree)
    assert flat is not None and len(flat) == len(listed) == 121
    for line in listed:
        meta, path = line.split("\t")
        mode, _, sha = meta.split(" ")
        assert (flat[path].mode, flat[path].sha) == (int(mode, 8), sha)
    assert commit_tree(store, "0" * 40) is None and flat_tree(store, head) is None
