"""One step plan per model and node, shared by replicas (pure: threads, no Ray)."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.run.step_choices import SingleStepChoices, StepKey
from workers.step_plan import StepPlan

KEY = StepKey("node-a", "/models/target", "float32")
#: Two plans a calibration may return.
MIXED = StepPlan(((1, "unpacked"), (4, "packed")), padded=True)
PACKED = StepPlan.uniform("packed")


def test_first_load_calibrates_and_later_loads_adopt_its_choice() -> None:
    choices = SingleStepChoices()
    modes: list[str] = []

    def start(mode) -> StepPlan | None:
        modes.append(mode)
        return MIXED if mode == "auto" else None

    for _ in range(3):
        choices.load(KEY, start)
    assert modes == ["auto", MIXED, MIXED]
    assert choices.known(KEY) == MIXED


def test_choices_are_per_node_model_dtype_and_shards() -> None:
    choices = SingleStepChoices()
    choices.load(KEY, lambda mode: PACKED)
    assert choices.known(KEY) == PACKED
    for other in (
        StepKey("node-b", "/models/target", "float32"),
        StepKey("node-a", "/models/draft", "float32"),
        StepKey("node-a", "/models/target", "bfloat16"),
        StepKey("node-a", "/models/target", "float32", tp_size=2),
    ):
        assert choices.known(other) == "auto"


def test_a_failed_load_records_nothing_so_the_next_one_calibrates() -> None:
    choices = SingleStepChoices()

    def broken(mode) -> StepPlan | None:
        raise RuntimeError("actor died while loading")

    with pytest.raises(RuntimeError):
        choices.load(KEY, broken)
    seen: list[str] = []
    choices.load(KEY, lambda mode: seen.append(mode) or PACKED)
    assert seen == ["auto"] and choices.known(KEY) == PACKED


def test_a_load_without_a_calibration_leaves_the_choice_open() -> None:
    choices = SingleStepChoices()
    choices.load(KEY, lambda mode: None)
    assert choices.known(KEY) == "auto"


def test_concurrent_loads_of_one_key_wait_for_the_first_choice() -> None:
    choices = SingleStepChoices()
    first_running = threading.Event()
    modes: list[str] = []

    def slow_calibration(mode) -> StepPlan | None:
        modes.append(mode)
        first_running.set()
        time.sleep(0.2)
        return MIXED

    def second() -> None:
        first_running.wait()
        choices.load(KEY, lambda mode: modes.append(mode) or None)

    other = threading.Thread(target=second)
    other.start()
    choices.load(KEY, slow_calibration)
    other.join()
    assert modes == ["auto", MIXED]


def test_loads_of_different_keys_do_not_wait_for_each_other() -> None:
    choices = SingleStepChoices()
    other_key = StepKey("node-a", "/models/draft", "float32")
    other_mode: list[str] = []

    def held(mode) -> StepPlan | None:
        other = threading.Thread(
            target=lambda: choices.load(other_key, lambda m: other_mode.append(m) or PACKED)
        )
        other.start()
        other.join(timeout=5)  # a load waiting on KEY's lock would still be blocked here
        return PACKED

    choices.load(KEY, held)
    assert other_mode == ["auto"]
