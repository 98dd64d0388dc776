"""The source tree's git commit and whether tracked files differ from it, read from ``.git``.

Read from the repository's files (HEAD, refs, packed-refs, the index), not by running git:
package code starts no process (``tests/test_security.py``). Handles a plain checkout and a
linked worktree (``.git`` is a file naming its git dir). A tracked file counts as changed when
it is missing or its content's blob hash differs from the index (stat data first, as git does);
index version 4 (path compression) and unusual setups give None ("unknown").
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

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


def _index_entries(index: bytes) -> list[_IndexEntry] | None:
    """Parse a version 2 or 3 index; None for another version or a damaged file."""
    if index[:4] != b"DIRC":
        return None
    version, count = struct.unpack(">II", index[4:12])
    if version not in (2, 3):
        return None
    entries, offset = [], 12
    for _ in range(count):
        fields = _ENTRY_HEAD.unpack_from(index, offset)
        flags, start = fields[11], offset + _ENTRY_HEAD.size
        if version == 3 and flags & 0x4000:
            start += 2
        end = index.index(b"\0", start)
        if (flags >> 12) & 0x3 == 0:  # stage 0 only
            entries.append(
                _IndexEntry(
                    path=index[start:end].decode("utf-8", "surrogateescape"),
                    mode=fields[6],
                    size=fields[9],
                    mtime_ns=fields[2] * 1_000_000_000 + fields[3],
                    sha=fields[10].hex(),
                )
            )
        offset += (end - offset + 8) // 8 * 8  # entries are NUL-padded to a multiple of 8
    return entries


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
    """Return the commit checked out at ``root`` and whether tracked files were changed."""
    try:
        dirs = _git_dirs(root)
        if dirs is None:
            return GitState(None, None)
        commit = _head_commit(*dirs)
        index = dirs[0] / "index"
        entries = _index_entries(index.read_bytes()) if index.is_file() else None
    except (OSError, UnicodeDecodeError, struct.error, ValueError):
        return GitState(None, None)
    dirty = None if entries is None else any(_changed(root, entry) for entry in entries)
    return GitState(commit, dirty)
