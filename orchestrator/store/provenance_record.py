"""A run's provenance as a record: what a run ran on, and how two provenances differ (pure).

The ``runs`` table stores a :class:`Provenance`; ``orchestrator.run.provenance`` collects one from
the driver's process (git, installed libraries, device). The resubmission note ("measured under
a different provenance") compares stored runs with a new provenance here, without a store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.store.records import StoredRun


@dataclass(frozen=True)
class Provenance:
    """One run's provenance; the field names are the ``runs`` table's columns."""

    commit: str | None
    dirty: bool | None
    specsweep_version: str | None
    torch_version: str | None
    transformers_version: str | None
    ray_version: str | None
    deepspeed_version: str | None
    python_version: str
    cpu: str
    gpu_name: str | None
    gpu_driver: str | None
    gpu_count: int
    torch_threads: int

    def columns(self) -> dict[str, Any]:
        """Return the fields as a dict of ``runs`` column values."""
        return asdict(self)

    def fingerprint(self) -> str:
        """Return a short hash of every field (equal provenances, equal fingerprints)."""
        data = json.dumps(self.columns(), sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:16]


def provenance_differences(old: StoredRun, new: Provenance) -> list[str]:
    """Return "field old → new" for every provenance field where a stored run differs."""
    changes = []
    for key, value in new.columns().items():
        stored = getattr(old, key)
        if stored != value:
            changes.append(f"{key} {_shown(key, stored)} → {_shown(key, value)}")
    return changes


def _shown(key: str, value: Any) -> Any:
    """Return a field's value as a note shows it: an unknown dirtiness (None) as "unknown"."""
    return "unknown" if key == "dirty" and value is None else value


def provenance_note(
    stored_runs: Mapping[int, StoredRun],
    counts: Mapping[int | None, int],
    new: Provenance,
) -> list[str]:
    """Return a line per stored run whose provenance differs from ``new``.

    ``counts`` maps a run id (None: measured before runs were recorded) to how many of the
    sweep's done trials it measured; the lines say that those results were kept although they
    were measured under another provenance.
    """
    lines = []
    if counts.get(None):
        lines.append(f"{counts[None]} done trial(s) kept from a run with no recorded provenance")
    for run_id, run in stored_runs.items():
        changes = provenance_differences(run, new)
        if changes:
            lines.append(
                f"{counts.get(run_id, 0)} done trial(s) kept from run {run_id} measured under a "
                f"different provenance: {'; '.join(changes)}"
            )
    return lines
