"""One step plan per model and node, shared by every replica that loads it there.

A model calibrates its steps when it loads (``workers.lm.CachedLM``): it times its weight layouts at
several block sizes and a one-token step against a two-token block, and chooses a
``workers.step_plan.StepPlan`` (a layout per block size, padded steps or not). The timing is only as
good as the machine is quiet then, so replicas that each calibrate on their own can choose
differently on one node (several starting at once, or one starting while others decode), and a
disturbed choice costs that replica speed and, in low precision, can decide a greedy tie otherwise.
So the first replica to load a model on a node calibrates while the others that want the same model
there wait, and they, and any replica that replaces one later, adopt its choice. Another node
calibrates on its own: its hardware may differ.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from workers.model_spec import SingleStep
from workers.step_plan import StepPlan


@dataclass(frozen=True)
class StepKey:
    """What a step plan holds for: one model as loaded (its path, dtype, and the
    tensor-parallel size its ranks are sharded to), on one Ray node."""

    node: str
    path: str
    dtype: str
    tp_size: int = 1


class SingleStepChoices:
    """The step plans chosen so far in a sweep, safe to use from replica threads."""

    def __init__(self) -> None:
        self._plans: dict[StepKey, StepPlan] = {}
        self._locks: dict[StepKey, threading.Lock] = {}
        self._guard = threading.Lock()

    def known(self, key: StepKey) -> SingleStep:
        """Return the plan recorded for ``key``, or "auto" if none."""
        return self._plans.get(key, "auto")

    def load(self, key: StepKey, start: Callable[[SingleStep], StepPlan | None]) -> None:
        """Run ``start``, which loads the model under ``key`` with the given ``single_step`` and
        returns the plan it chose (None when it was not asked to time its steps).

        Loads of one key run one at a time: the first calibrates ("auto") and its answer is
        recorded; later ones get it forced. When ``start`` raises, nothing is recorded, so the
        next load calibrates.
        """
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            mode = self.known(key)
            plan = start(mode)
            if mode == "auto" and plan is not None:
                self._plans[key] = plan
