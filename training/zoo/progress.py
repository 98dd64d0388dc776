"""A build's progress: the seconds each stage took and the log lines above the progress bars."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from training.zoo.recipes import Recipe


def log(progress: bool, recipe: Recipe, message: str) -> None:
    """Print a build-stage message above the progress bars when progress is shown."""
    if progress:
        tqdm.write(f"[zoo:{recipe.profile}] {message}")


@dataclass
class StageClock:
    """The seconds each finished stage of one build took, in order, from the build's start."""

    started: float = field(default_factory=time.perf_counter)
    stages: dict[str, float] = field(default_factory=dict)

    def lap(self, stage: str) -> None:
        """Close ``stage``: it took the time since the start less the stages before it."""
        self.stages[stage] = time.perf_counter() - self.started - sum(self.stages.values())

    def seconds(self) -> float:
        """Return the seconds since the build started."""
        return time.perf_counter() - self.started

    def summary(self) -> str:
        """Return 'stage 12 s, ...' for the build log."""
        return ", ".join(f"{stage} {seconds:.0f} s" for stage, seconds in self.stages.items())
