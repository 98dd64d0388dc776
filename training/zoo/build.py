"""Build a profile's zoo once: the cached result, or a locked build renamed into place."""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import replace
from pathlib import Path

from training.zoo.cache import (
    MANIFEST_FILE,
    TOKENIZER_DIR,
    ZooManifest,
    exclusive_lock,
    remove_stale_builds,
    zoo_dir,
)
from training.zoo.pretrained import import_zoo
from training.zoo.recipes import PROFILES, PretrainedRecipe, Recipe
from training.zoo.scratch import train_zoo
from workers.accelerator_probe import name_cpu_accelerator_when_no_cuda


def build_zoo(
    profile: str | Recipe = "smol",
    cache_dir: Path | None = None,
    progress: bool = True,
    force: bool = False,
) -> ZooManifest:
    """Return the manifest of a profile's zoo, building it first unless it is cached.

    ``profile`` is a name in ``PROFILES`` or a recipe. The zoo is rebuilt only when the
    recipe hash changes or ``force`` is set. Two processes building the same zoo wait for each
    other on a lock file and the second finds the first's result.
    """
    recipe = PROFILES[profile] if isinstance(profile, str) else profile
    name_cpu_accelerator_when_no_cuda()
    final = zoo_dir(recipe, cache_dir)
    if (final / MANIFEST_FILE).exists() and not force:
        return ZooManifest.load(final)
    with exclusive_lock(final.parent / f".{final.name}.lock"):
        if (final / MANIFEST_FILE).exists() and not force:
            return ZooManifest.load(final)
        remove_stale_builds(final)
        staging = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            if isinstance(recipe, PretrainedRecipe):
                manifest = import_zoo(recipe, staging, progress)
            else:
                manifest = train_zoo(recipe, staging, progress)
            if final.exists():
                retired = final.parent / f".{final.name}.tmp-old-{uuid.uuid4().hex[:8]}"
                final.rename(retired)
                shutil.rmtree(retired, ignore_errors=True)
            staging.rename(final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return replace(
        manifest,
        root=final,
        tokenizer=final / TOKENIZER_DIR,
        models={name: final / name for name in manifest.models},
    )
