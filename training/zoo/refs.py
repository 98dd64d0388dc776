"""Model refs ``zoo:<profile>/<model>``: parsed, checked and resolved to a built model's folder."""

from __future__ import annotations

from pathlib import Path

from training.zoo.build import build_zoo
from training.zoo.recipes import MODEL_REF_PREFIX, PROFILES, REMOVED_MODELS, REMOVED_PROFILES


def parse_model_ref(ref: str) -> tuple[str, str]:
    """Return (profile, model name) of a ``zoo:<profile>/<model>`` ref, validating both."""
    if not ref.startswith(MODEL_REF_PREFIX) or ref.count("/") != 1:
        raise ValueError(f"not a zoo model ref (zoo:<profile>/<model>): {ref!r}")
    profile, name = ref[len(MODEL_REF_PREFIX) :].split("/")
    if profile not in PROFILES:
        message = f"unknown zoo profile {profile!r} in {ref!r}; have {sorted(PROFILES)}"
        if profile in REMOVED_PROFILES:
            message += f": {REMOVED_PROFILES[profile]}"
        raise ValueError(message)
    names = PROFILES[profile].model_names
    if name not in names:
        message = f"unknown zoo model {name!r} in {ref!r}; have {names}"
        if (profile, name) in REMOVED_MODELS:
            message += f": {REMOVED_MODELS[profile, name]}"
        raise ValueError(message)
    return profile, name


def is_model_ref(ref: str) -> bool:
    """Return True when ``ref`` names a zoo model (starts with ``zoo:``)."""
    return ref.startswith(MODEL_REF_PREFIX)


def resolve_model_ref(ref: str, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Return the local directory of ``zoo:<profile>/<model>``, building the profile if needed."""
    profile, name = parse_model_ref(ref)
    return build_zoo(profile, cache_dir=cache_dir, progress=progress).model_path(name)
