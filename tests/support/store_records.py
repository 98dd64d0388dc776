"""Hand-made store records for tests of pure functions over the store's reads."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from orchestrator.store.records import StoredTrial


def stored_trial(**values: Any) -> StoredTrial:
    """Return a StoredTrial with ``values`` and None in every other field."""
    empty = dict.fromkeys((field.name for field in fields(StoredTrial)), None)
    return StoredTrial(**{**empty, **values})
