"""Atomic training checkpoints in one directory, resumed from the newest complete one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


class Checkpoints:
    """Atomic training checkpoints in one directory: the newest complete one wins.

    A checkpoint is one ``torch.save`` of a dict (model and optimiser state dicts, the step,
    anything else the job needs) written to a temporary file and renamed, so a crash while
    writing leaves the previous checkpoint intact. Loading uses ``weights_only=True``.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, step: int) -> Path:
        return self.directory / f"step-{step:08d}.pt"

    def latest(self) -> tuple[int, dict[str, Any]] | None:
        """Return (step, state) of the newest checkpoint, or None when there is none."""
        if not self.directory.is_dir():
            return None
        paths = sorted(self.directory.glob("step-*.pt"))
        if not paths:
            return None
        state = torch.load(paths[-1], map_location="cpu", weights_only=True)
        return int(state["step"]), state

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Write ``state`` as the checkpoint of ``step`` and delete older ones."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self._path(step)
        temporary = final.with_suffix(".tmp")
        torch.save({**state, "step": step}, temporary)
        os.replace(temporary, final)
        for old in self.directory.glob("step-*.pt"):
            if old != final:
                old.unlink(missing_ok=True)
