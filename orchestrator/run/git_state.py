"""The source tree's git commit and whether tracked files differ from it, read from ``.git``.

Read from the repository's files (HEAD, refs, packed-refs, the index, the object store), not by
running git: package code starts no process (``tests/unit/test_security.py``). Handles a plain
checkout and a linked worktree (``.git`` is a file naming its git dir). The tree is dirty when a
tracked file differs from the index (missing, or its blob hash differs; stat data first, as git
does) or the index differs from HEAD's tree (staged changes): the index's cache-tree names its
root tree when valid, otherwise the index entries are compared with HEAD's tree read from the
objects (``git_objects``). Index version 4 (path compression), a split or sparse index, objects
elsewhere (alternates) and other unusual setups give None ("unknown"), never a wrong False.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from orchestrator.run.git_objects import ObjectStore, TreeEntry, commit_tree, flat_tree

_ENTRY_HEAD = struct.Struct(">10I20sH")  # ctime s/ns, mtime s/ns, dev, ino, mode, uid, gid, size
_GITLINK = 0o160000
_SYMLINK = 0o120000


@dataclass(frozen=True)
class GitState:
    """The checked-out commit (None outside a repository) and whether the tree is dirty."""

    commit: str | None
    dirty: bool | None


@dataclass(frozen=True)
class _IndexEntry:
    path: str
    mode: int
    size: int
    mtime_ns: int
    sha: str


@dataclass(frozen=True)
class _Index:
    """The stage-0 entries, whether any path is unmerged, and the cache-tree's root (if valid)."""

    entries: list[_IndexEntry]
    unmerged: bool
    root_tree: str | None


def _git_dirs(root: Path) -> tuple[Path, Path] | None:
    """Return (git dir, common dir) of the checkout at ``root``, or None."""
    dot = root / ".git"
    if dot.is_dir():
        return dot, dot
    if not dot.is_file():
        return None
    text = dot.read_text(encoding="utf-8").strip()
    if not text.startswith("gitdir:"):
        return None
    git_dir = (root / text.removeprefix("gitdir:").strip()).resolve()
    common = git_dir / "commondir"
    if common.is_file():
        return git_dir, (git_dir / common.read_text(encoding="utf-8").strip()).resolve()
    return git_dir, git_dir


def _resolve_ref(ref: str, git_dir: Path, common: Path) -> str | None:
    """Return the commit a ref names (loose in either dir, else packed-refs), or None."""
    for base in (git_dir, common):
        loose = base / ref
        if loose.is_file():
            return loose.read_text(encoding="utf-8").strip()
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(encoding="utf-8").splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    return None


def _head_commit(git_dir: Path, common: Path) -> str | None:
    """Return HEAD's commit id (detached or through one symbolic ref)."""
    head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    if head.startswith("ref:"):
        return _resolve_ref(head.removeprefix("ref:").strip(), git_dir, common)
    return head or None


def _parse_index(index: bytes) -> _Index | None:
    """Parse a version 2 or 3 index; None for another version, a split index or a damaged file."""
    if index[:4] != b"DIRC":
        return None
    version, count = struct.unpack(">II", index[4:12])
    if version not in (2, 3):
        return None
    entries, unmerged, offset = [], False, 12
    for _ in range(count):
        fields = _ENTRY_HEAD.unpack_from(index, offset)
        flags, start = fields[11], offset + _ENTRY_HEAD.size
        if version == 3 and flags & 0x4000:
            start += 2
        end = index.index(b"\0", start)
        if (flags >> 12) & 0x3 == 0:  # stage 0; a higher stage is an unmerged path
            entries.append(
                _IndexEntry(
                    path=index[start:end].decode("utf-8", "surrogateescape"),
                    mode=fields[6],
                    size=fields[9],
                    mtime_ns=fields[2] * 1_000_000_000 + fields[3],
                    sha=fields[10].hex(),
                )
            )
        else:
            unmerged = True
        offset += (end - offset + 8) // 8 * 8  # entries are NUL-padded to a multiple of 8
    extensions = _extensions(index, offset)
    if b"link" in extensions or b"sdir" in extensions:  # split or sparse: entries elsewhere
        return None
    return _Index(entries, unmerged, _cache_tree_root(extensions.get(b"TREE")))


def _extensions(index: bytes, offset: int) -> dict[bytes, bytes]:
    """Return the index extensions after the entries (before the 20-byte checksum) by name."""
    found: dict[bytes, bytes] = {}
    while offset + 8 <= len(index) - 20:
        name, size = index[offset : offset + 4], struct.unpack_from(">I", index, offset + 4)[0]
        found[name] = index[offset + 8 : offset + 8 + size]
        offset += 8 + size
    return found


def _cache_tree_root(tree: bytes | None) -> str | None:
    """Return the root tree id the cache-tree extension holds, or None when missing or invalid."""
    if not tree or tree[0] != 0:  # the root's path is empty
        return None
    newline = tree.index(b"\n")
    count = int(tree[1:newline].split(b" ")[0])
    if count < 0:  # invalidated by a change to the index since the tree was written
        return None
    return tree[newline + 1 : newline + 21].hex()


def _index_matches_head(index: _Index, objects: Path, commit: str) -> bool | None:
    """True when the index holds HEAD's tree exactly, None when that cannot be told."""
    if index.unmerged:
        return False
    store = ObjectStore(objects)
    head_tree = commit_tree(store, commit)
    if head_tree is None:
        return None
    if index.root_tree is not None:
        return index.root_tree == head_tree
    tree = flat_tree(store, head_tree)
    if tree is None:
        return None
    return tree == {entry.path: TreeEntry(entry.mode, entry.sha) for entry in index.entries}


def _blob_sha(data: bytes) -> str:
    """Return git's blob id of ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _changed(root: Path, entry: _IndexEntry) -> bool:
    """True when the tracked file differs from its index entry (missing, or other content)."""
    path = root / entry.path
    if entry.mode == _GITLINK:
        return False
    try:
        stat = path.lstat()
        if entry.mode == _SYMLINK:
            return _blob_sha(os.fsencode(os.readlink(path))) != entry.sha
        if stat.st_size != entry.size:
            return True
        if stat.st_mtime_ns == entry.mtime_ns:
            return False
        return _blob_sha(path.read_bytes()) != entry.sha
    except OSError:
        return True


def git_state(root: Path) -> GitState:
    """Return the commit checked out at ``root`` and whether tracked files differ from it
    (in the work tree or staged in the index); ``dirty`` is None when that cannot be told."""
    try:
        dirs = _git_dirs(root)
        if dirs is None:
            return GitState(None, None)
        commit = _head_commit(*dirs)
        index_file = dirs[0] / "index"
        index = _parse_index(index_file.read_bytes()) if index_file.is_file() else None
    except (OSError, UnicodeDecodeError, struct.error, ValueError):
        return GitState(None, None)
    if index is None or commit is None:
        return GitState(commit, None)
    if any(_changed(root, entry) for entry in index.entries):
        return GitState(commit, True)
    try:
        matches = _index_matches_head(index, dirs[1] / "objects", commit)
    except (OSError, UnicodeDecodeError, ValueError, IndexError, zlib.error):
        return GitState(commit, None)
    return GitState(commit, None if matches is None else not matches)
