"""bench/actors.py end to end on the micro zoo, in its own process (it starts its own Ray)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.bench_scripts import micro_pair_args
from support.paths import REPO

from training.zoo.cache import ZooManifest

pytestmark = pytest.mark.ray

BENCH = REPO / "bench" / "actors.py"
#: The placements the bench compares, in order.
PLACES = ("in_process", "processes", "actors")


def _command(micro_zoo: ZooManifest, out: Path, samples: int, repeats: int) -> list[str]:
    """Return the command running bench/actors.py on the micro pair (8 new tokens a prompt)."""
    options = ["--samples", str(samples), "--max-new-tokens", "8", "--repeats", str(repeats)]
    return [sys.executable, str(BENCH), *micro_pair_args(micro_zoo), *options, "--out", str(out)]


def test_every_placement_decodes_alike_and_reports_its_calibrations(
    micro_zoo: ZooManifest, tmp_path: Path
) -> None:
    out = tmp_path / "actors.json"
    run = subprocess.run(
        _command(micro_zoo, out, 3, 2), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["complete"] is True and report["turns_done"] == 2 * 3
    assert report["placements"] == list(PLACES)
    assert set(report["methods"]) == {"ar", "static K=4"}
    for name, figures in report["methods"].items():
        assert figures["same_outputs"] and figures["same_accepted_counts"]
        speeds = figures["tokens_per_s"]
        assert set(speeds) == set(PLACES) and all(v > 0 for v in speeds.values())
        assert set(figures["ratios"]) == {
            "actors/in_process",
            "processes/in_process",
            "actors/processes",
        }
        for key, ratio in figures["ratios"].items():
            over, under = key.split("/")
            assert ratio["ratio"] == pytest.approx(speeds[over] / speeds[under])
            low, high = ratio["ci95"]
            assert low <= ratio["ratio"] <= high
        samples = figures["per_sample"]  # one per (repeat, prompt), each placement timed
        assert len(samples) == 2 * 3 and all(s["tokens"] == 8 for s in samples)
        for place in PLACES:
            seconds = sum(s[f"{place}_s"] for s in samples)
            assert speeds[place] == pytest.approx(48 / seconds)
            split = figures["per_round_ms"][place]
            assert split["verify_ms"] > 0 and split["rest_ms"] > -1e-6
            usage = figures["usage_per_round"][place]
            assert usage["cpu_ms"] > 0 and 0 <= usage["system_ms"] <= usage["cpu_ms"]
            assert usage["voluntary_switches"] >= 0 and usage["involuntary_switches"] >= 0
            assert usage["minor_faults"] >= 0
            assert usage["machine_busy_ms"] >= 0 and usage["machine_steal_ms"] >= 0
            # CPU seconds per wall second: one thread decodes at a time, plus what the
            # processes' other threads (Ray's, the channel's) and the call around it add; no
            # floor above 0, since the other test worker may hold the cores (a -n 2 run: 0.16)
            assert 0 < usage["cpu_over_wall"] < 3
            if name == "ar":  # no drafting, and one round per generated token (48 in all)
                total = split["draft_ms"] + split["verify_ms"] + split["rest_ms"]
                assert split["draft_ms"] == 0
                assert total * 48 == pytest.approx(1000 * seconds)
    for place in PLACES:
        for model in ("draft", "target"):
            calibration = report["single_step_calibration"][place][model]
            assert calibration["one_token_s"] > 0 and calibration["two_tokens_s"] > 0
    assert "one-token steps padded: in_process draft" in run.stdout
    assert "processes draft" in run.stdout
    assert "per round (CPU, voluntary + involuntary switches): in_process" in run.stdout
    assert "actors/processes" in run.stdout
    assert report["warmup_seconds"] == 0.0


def test_a_run_stopped_early_leaves_the_figures_of_its_finished_turns(
    micro_zoo: ZooManifest, tmp_path: Path
) -> None:
    out = tmp_path / "actors.json"
    command = _command(micro_zoo, out, 2, 1000)
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not out.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert out.exists(), "no report while the turns ran"
    finally:
        run.send_signal(signal.SIGINT)  # as a lease or a user stops it; Ray shuts down at exit
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
    report = json.loads(out.read_text())
    assert report["complete"] is False and 1 <= report["turns_done"] < 1000 * 2
    for figures in report["methods"].values():
        assert len(figures["per_sample"]) == report["turns_done"]
        assert all(figures["tokens_per_s"][place] > 0 for place in PLACES)
