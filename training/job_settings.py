"""How a training job's settings are checked: the error that names a bad one, and typed lookups."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class JobConfigError(ValueError):
    """A job's configuration names an unknown setting or an impossible value."""


def typed_setting(settings: Mapping[str, Any], key: str, default: Any) -> Any:
    """Return ``settings[key]`` checked against ``default``'s type (ints pass as floats)."""
    if key not in settings:
        return default
    value = settings[key]
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise JobConfigError(f"setting {key!r} must be a {type(default).__name__}, got {value!r}")
    return value


def check_settings(settings: Mapping[str, Any], allowed: Mapping[str, Any], kind: str) -> None:
    """Raise ``JobConfigError`` naming any setting ``kind`` does not know."""
    unknown = sorted(set(settings) - set(allowed))
    if unknown:
        raise JobConfigError(f"{kind}: unknown settings {unknown}; known: {sorted(allowed)}")
