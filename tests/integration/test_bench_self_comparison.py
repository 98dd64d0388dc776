"""bench/self_comparison.py on the micro zoo: its sweep enters one setting twice per seed, and
its JSON counts the verdicts it found."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

from training.zoo.cache import ZooManifest

pytestmark = pytest.mark.ray

BENCH = REPO / "bench" / "self_comparison.py"


def test_self_comparisons_are_counted(micro_zoo: ZooManifest, tmp_path: Path) -> None:
    out = tmp_path / "self.json"
    args = ["--repetitions", "2", "--samples", "2", "--max-new-tokens", "8", "--out", str(out)]
    args += ["--target", str(micro_zoo.model_path("target"))]
    args += ["--draft", str(micro_zoo.model_path("draft-s"))]
    run = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["repetitions"] == 2 and report["failed_trials"] == 0
    assert report["all_same_outputs"] is True
    found = report["comparisons"]
    assert [c["seed"] for c in found] == [0, 1]
    assert all(c["n_prompts"] == 2 and c["low"] <= c["ratio"] <= c["high"] for c in found)
    verdicts = sum(c["verdict"] != "not distinguishable" for c in found)
    assert report["verdicts"] == verdicts
    assert f"{verdicts} verdict(s) in 2 self-comparisons" in run.stdout
