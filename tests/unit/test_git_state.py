"""orchestrator/run/git_state.py against git itself: commit and dirtiness of real repositories."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.paths import REPO

from orchestrator.run.git_state import GitState, git_state


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@example.com")
    _git(root, "config", "user.name", "t")
    (root / "a.txt").write_text("one\n")
    (root / "sub").mkdir()
    (root / "sub" / "b.py").write_text("x = 1\n" * 50)
    (root / "link").symlink_to("a.txt")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "first")
    return root


def test_matches_git_on_this_checkout() -> None:
    state = git_state(REPO)
    assert state.commit == _git(REPO, "rev-parse", "HEAD")
    assert state.dirty == bool(_git(REPO, "status", "--porcelain", "--untracked-files=no"))


def test_clean_then_each_kind_of_change(repo: Path) -> None:
    assert git_state(repo) == git_state(repo)
    assert git_state(repo).commit == _git(repo, "rev-parse", "HEAD")
    assert git_state(repo).dirty is False
    (repo / "untracked.txt").write_text("new")  # untracked files do not count
    assert git_state(repo).dirty is False
    (repo / "a.txt").write_text("two\n")  # same size, other content
    assert git_state(repo).dirty is True
    _git(repo, "checkout", "--", "a.txt")
    assert git_state(repo).dirty is False
    (repo / "sub" / "b.py").unlink()
    assert git_state(repo).dirty is True


def test_packed_refs_detached_head_and_worktree(repo: Path, tmp_path: Path) -> None:
    first = _git(repo, "rev-parse", "HEAD")
    _git(repo, "pack-refs", "--all")
    assert git_state(repo).commit == first
    (repo / "a.txt").write_text("three\n")
    _git(repo, "commit", "-q", "-am", "second")
    _git(repo, "checkout", "-q", first)
    assert git_state(repo).commit == first
    linked = tmp_path / "linked"
    _git(repo, "worktree", "add", "-q", "-b", "side", str(linked), "HEAD")
    assert git_state(linked).commit == first and git_state(linked).dirty is False
    (linked / "a.txt").write_text("changed in the worktree\n")
    assert git_state(linked).dirty is True


def test_outside_a_repository(tmp_path: Path) -> None:
    state = git_state(tmp_path)
    assert (state.commit, state.dirty) == (None, None)


def test_staged_changes_are_not_a_clean_tree(repo: Path) -> None:
    (repo / "a.txt").write_text("two\n")
    _git(repo, "add", "a.txt")  # staged, not committed: the work tree matches the index
    assert git_state(repo).dirty is True
    _git(repo, "commit", "-q", "-m", "second")
    assert git_state(repo) == GitState(_git(repo, "rev-parse", "HEAD"), False)
    (repo / "new.txt").write_text("new\n")
    _git(repo, "add", "new.txt")  # a new file in the index only
    assert git_state(repo).dirty is True
    _git(repo, "reset", "-q")
    assert git_state(repo).dirty is False


def test_staged_change_with_an_invalid_cache_tree_compares_trees(repo: Path) -> None:
    (repo / "sub" / "b.py").write_text("x = 2\n" * 50)
    _git(repo, "add", "sub/b.py")
    _git(repo, "checkout", "-q", "HEAD", "--", "sub/b.py")  # index back to HEAD, cache-tree not
    assert _git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert git_state(repo).dirty is False
    _git(repo, "rm", "-q", "--cached", "a.txt")  # staged deletion
    assert git_state(repo).dirty is True


def test_fresh_clone_reads_packed_objects(repo: Path, tmp_path: Path) -> None:
    (repo / "a.txt").write_text("three\n")
    _git(repo, "commit", "-q", "-am", "second")
    _git(repo, "gc", "-q", "--aggressive")  # everything packed, trees and commits deltified
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(repo), str(clone))
    assert not any((clone / ".git" / "objects").glob("??/*"))  # no loose objects
    state = git_state(clone)
    assert (state.commit, state.dirty) == (_git(clone, "rev-parse", "HEAD"), False)
    (clone / "a.txt").write_text("four\n")
    _git(clone, "add", "a.txt")
    assert git_state(clone).dirty is True
    _git(clone, "checkout", "-q", "HEAD", "--", "a.txt")
    assert git_state(clone).dirty is False
