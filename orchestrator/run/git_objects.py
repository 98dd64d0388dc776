"""Read git objects (commits, trees) from a repository's files, without running git.

Loose objects are zlib files under ``objects/``; packed ones are found through a pack's version 2
``.idx`` and may be deltas (by offset or by id) against another object, which are applied here.
Used by ``git_state`` to compare the index with HEAD's tree. Anything unreadable (alternates,
a pack index other than version 2, a damaged file) gives None: the caller reports "unknown".
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

_IDX_MAGIC = b"\377tOc"
_TYPES = {1: "commit", 2: "tree", 3: "blob", 4: "tag"}
_OFS_DELTA, _REF_DELTA = 6, 7
_MAX_CHAIN = 64  # deeper delta chains than git's default (50) are not followed
_CHUNK = 1 << 16


@dataclass(frozen=True)
class GitObject:
    """An object's type (``commit``, ``tree``, ...) and its content."""

    kind: str
    data: bytes


@dataclass(frozen=True)
class TreeEntry:
    """One entry of a tree object: its file mode and object id."""

    mode: int
    sha: str


def _loose(objects: Path, sha: str) -> GitObject | None:
    """Return a loose object, or None when it is not stored loose."""
    path = objects / sha[:2] / sha[2:]
    if not path.is_file():
        return None
    raw = zlib.decompress(path.read_bytes())
    header, _, data = raw.partition(b"\0")
    return GitObject(header.split(b" ")[0].decode("ascii"), data)


def _idx_offset(idx: bytes, sha: str) -> int | None:
    """Return the pack offset of ``sha`` from a version 2 ``.idx``, or None when absent."""
    if idx[:4] != _IDX_MAGIC or struct.unpack(">I", idx[4:8])[0] != 2:
        return None
    key = bytes.fromhex(sha)
    fanout = struct.unpack_from(">256I", idx, 8)
    count = fanout[255]
    low, high = fanout[key[0] - 1] if key[0] else 0, fanout[key[0]]
    names = 8 + 256 * 4
    while low < high:
        mid = (low + high) // 2
        name = idx[names + mid * 20 : names + mid * 20 + 20]
        if name == key:
            offsets = names + count * 24
            offset = struct.unpack_from(">I", idx, offsets + mid * 4)[0]
            if offset & 0x80000000:
                large = offsets + count * 4 + (offset & 0x7FFFFFFF) * 8
                offset = struct.unpack_from(">Q", idx, large)[0]
            return offset
        low, high = (mid + 1, high) if name < key else (low, mid)
    return None


def _inflate(pack: bytes, start: int) -> bytes:
    """Return the zlib stream that begins at ``start`` (read in chunks, not to the pack's end)."""
    stream, out = zlib.decompressobj(), bytearray()
    while not stream.eof and start < len(pack):
        out += stream.decompress(pack[start : start + _CHUNK])
        start += _CHUNK
    if not stream.eof:
        raise ValueError("a packed object's data is cut short")
    return bytes(out)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """Return a delta header's little-endian base-128 number and the position after it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def apply_delta(base: bytes, delta: bytes) -> bytes:
    """Return the object a git delta builds from ``base`` (copy and insert instructions)."""
    _, pos = _varint(delta, 0)
    size, pos = _varint(delta, pos)
    out = bytearray()
    while pos < len(delta):
        op = delta[pos]
        pos += 1
        if not op & 0x80:
            out += delta[pos : pos + op]
            pos += op
            continue
        fields = [0, 0]
        for bit in range(7):  # 4 offset bytes then 3 size bytes, each present when its bit is set
            if op & (1 << bit):
                fields[bit >= 4] |= delta[pos] << (8 * (bit if bit < 4 else bit - 4))
                pos += 1
        offset, length = fields[0], fields[1] or 0x10000
        out += base[offset : offset + length]
    if len(out) != size:
        raise ValueError("a delta built an object of the wrong size")
    return bytes(out)


class ObjectStore:
    """The objects of one ``objects`` directory; pack files are read once per store."""

    def __init__(self, objects: Path) -> None:
        self.objects = objects
        self._files: dict[Path, bytes] = {}

    def _bytes(self, path: Path) -> bytes:
        """Return a pack or index file's content, read on first use."""
        if path not in self._files:
            self._files[path] = path.read_bytes()
        return self._files[path]

    def read(self, sha: str, depth: int = 0) -> GitObject | None:
        """Return object ``sha`` (loose or packed), or None when it is not stored here."""
        loose = _loose(self.objects, sha)
        if loose is not None:
            return loose
        for idx_path in sorted((self.objects / "pack").glob("pack-*.idx")):
            offset = _idx_offset(self._bytes(idx_path), sha)
            if offset is not None:
                return self._packed_at(self._bytes(idx_path.with_suffix(".pack")), offset, depth)
        return None

    def _packed_at(self, pack: bytes, offset: int, depth: int) -> GitObject:
        """Return the object stored at ``offset`` of ``pack``, resolving deltas."""
        byte = pack[offset]
        kind, pos = (byte >> 4) & 0x7, offset + 1
        while byte & 0x80:
            byte = pack[pos]
            pos += 1
        if kind in _TYPES:
            return GitObject(_TYPES[kind], _inflate(pack, pos))
        if depth >= _MAX_CHAIN:
            raise ValueError("a delta chain too long to follow")
        if kind == _OFS_DELTA:
            byte = pack[pos]
            back, pos = byte & 0x7F, pos + 1
            while byte & 0x80:
                byte = pack[pos]
                back, pos = ((back + 1) << 7) | (byte & 0x7F), pos + 1
            base = self._packed_at(pack, offset - back, depth + 1)
        elif kind == _REF_DELTA:
            found = self.read(pack[pos : pos + 20].hex(), depth + 1)
            if found is None:
                raise ValueError("a delta's base object is missing")
            base, pos = found, pos + 20
        else:
            raise ValueError(f"unknown pack object type {kind}")
        return GitObject(base.kind, apply_delta(base.data, _inflate(pack, pos)))


def commit_tree(store: ObjectStore, commit: str) -> str | None:
    """Return the root tree id of ``commit``, or None when the commit cannot be read."""
    found = store.read(commit)
    if found is None or found.kind != "commit" or not found.data.startswith(b"tree "):
        return None
    return found.data[5:45].decode("ascii")


def flat_tree(store: ObjectStore, tree: str, prefix: str = "") -> dict[str, TreeEntry] | None:
    """Return every non-tree entry under ``tree`` by its slash-separated path, or None."""
    found = store.read(tree)
    if found is None or found.kind != "tree":
        return None
    entries: dict[str, TreeEntry] = {}
    data, pos = found.data, 0
    while pos < len(data):
        space = data.index(b" ", pos)
        nul = data.index(b"\0", space)
        mode = int(data[pos:space], 8)
        path = prefix + data[space + 1 : nul].decode("utf-8", "surrogateescape")
        sha = data[nul + 1 : nul + 21].hex()
        pos = nul + 21
        if mode == 0o40000:
            sub = flat_tree(store, sha, path + "/")
            if sub is None:
                return None
            entries.update(sub)
        else:
            entries[path] = TreeEntry(mode, sha)
    return entries
