"""One one-token step choice per model and node, shared by every replica that loads it there.

A model calibrates its one-token step when it loads (``workers.lm.CachedLM``): it times a
one-token step against a two-token block and pads its steps when the block is cheaper. The
timing is only as good as the machine is quiet then, so replicas that each calibrate on their
own can choose differently on one node (several starting at once, or one starting while others
decode), and a disturbed choice costs that replica speed and, in low precision, can decide a
greedy tie otherwise. So the first replica to load a model on a node calibrates while the
others that want the same model there wait, and they, and any replica that replaces one later,
adopt its choice. Another node calibrates on its own: its hardware may differ.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from workers.model_spec import SingleStep


@dataclass(frozen=True)
class StepKey:
    """What a one-token step choice holds for: one model as loaded (its path, dtype, and the
    tensor-parallel size its ranks are sharded to), on one Ray node."""

    node: str
    path: str
    dtype: str
    tp_size: int = 1


class SingleStepChoices:
    """The one-token step choices made so far in a sweep, safe to use from replica threads."""

    def __init__(self) -> None:
        self._padded: dict[StepKey, bool] = {}
        self._locks: dict[StepKey, threading.Lock] = {}
        self._guard = threading.Lock()

    def known(self, key: StepKey) -> SingleStep:
        """Return the choice recorded for ``key`` ("plain" or "padded"), or "auto" if none."""
        padded = self._padded.get(key)
        return "auto" if padded is None else ("padded" if padded else "plain")

    def load(self, key: StepKey, start: Callable[[SingleStep], bool | None]) -> None:
        """Run ``start``, which loads the model under ``key`` with the given ``single_step`` and
        returns whether its one-token steps are padded (None when it was not asked to time them).

        Loads of one key run one at a time: the first calibrates ("auto") and its answer is
        recorded; later ones get it forced. When ``start`` raises, nothing is recorded, so the
        next load calibrates.
        """
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            mode = self.known(key)
            padded = start(mode)
            if mode == "auto" and padded is not None:
                self._padded[key] = padded
