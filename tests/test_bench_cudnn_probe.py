"""bench/cudnn_probe.py on the micro zoo's target on the CPU: its passes and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from bench_scripts import load_bench_script

from training.zoo.cache import ZooManifest


def test_probe_times_two_passes_of_each_block_size(micro_zoo: ZooManifest, tmp_path: Path) -> None:
    probe = load_bench_script("cudnn_probe")
    out = tmp_path / "probe.json"
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        args = ["--model", str(micro_zoo.model_path("target")), "--device", "cpu"]
        assert probe.main([*args, "--dtype", "float32", "--cudnn", "on", "--out", str(out)]) == 0
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
    report = json.loads(out.read_text())
    assert (report["device"], report["cudnn"]) == ("cpu", "on")
    passes = report["passes"]
    assert [(p["block"], p["pass"]) for p in passes] == [(1, 0), (1, 1), (5, 0), (5, 1)]
    for row in passes:
        assert row["lengths"][1] - row["lengths"][0] == probe.LENGTHS
        assert 0 < row["median_ms"] <= row["p90_ms"] <= row["max_ms"]
