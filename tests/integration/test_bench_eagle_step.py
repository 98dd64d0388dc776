"""bench/eagle_step.py on the micro zoo's target: both layouts timed, the JSON consistent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

from training.zoo.cache import ZooManifest

BENCH = REPO / "bench" / "eagle_step.py"


def test_both_layouts_are_timed_against_the_target(micro_zoo: ZooManifest, tmp_path: Path) -> None:
    out = tmp_path / "eagle-step.json"
    args = ["--target", str(micro_zoo.model_path("target")), "--head-vocab", "64"]
    args += ["--repeats", "3", "--threads", "1", "--out", str(out)]
    run = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["head_vocab"] == 64 and report["hidden_size"] == 64
    assert set(report["layouts"]) == {"prepacked", "unpacked"}
    for cost in report["layouts"].values():
        assert cost["t_head_s"] > 0 and cost["t_target_s"] > 0
        assert abs(cost["cost_ratio"] - cost["t_head_s"] / cost["t_target_s"]) < 1e-9
