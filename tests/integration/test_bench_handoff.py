"""bench/handoff.py on the micro zoo: its pieces roll back, and its JSON adds up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.bench_scripts import load_bench_script, micro_pair_args
from support.paths import REPO

from training.zoo.cache import ZooManifest
from workers.lm import CachedLM, load_causal_lm

BENCH = REPO / "bench" / "handoff.py"
HANDOFF = load_bench_script("handoff")
SETTLE_ROUNDS, WAYS = HANDOFF.SETTLE_ROUNDS, HANDOFF.WAYS


def test_a_piece_leaves_the_cache_as_it_found_it(micro_zoo: ZooManifest) -> None:
    lm = CachedLM(load_causal_lm(micro_zoo.model_path("draft-s")))
    prompt = torch.tensor([5, 6, 7, 8, 9])
    for one_by_one in (True, False):
        piece = HANDOFF.RoundPieces(lm, prompt, 3, one_by_one)
        assert piece.length == len(prompt)
        assert piece.run() > 0 and piece.run() > 0
        assert lm.cached_len == len(prompt)


def test_every_way_is_timed_in_turns_and_compared_by_cycle(
    micro_zoo: ZooManifest, tmp_path: Path
) -> None:
    out = tmp_path / "handoff.json"
    args = micro_pair_args(micro_zoo)
    args += ["--rounds", "6", "--cycles", "3", "--out", str(out)]
    run = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["ways"]) == set(WAYS)
    base = report["times"]["back_to_back"]
    base_seconds = sum(map(sum, base["draft"])) + sum(map(sum, base["verify"]))
    for way in WAYS:
        times, figures = report["times"][way], report["ways"][way]
        assert [len(burst) for burst in times["draft"]] == [6 - SETTLE_ROUNDS] * 3
        assert [len(burst) for burst in times["verify"]] == [6 - SETTLE_ROUNDS] * 3
        assert figures["draft_ms_median"] > 0 and figures["verify_ms_median"] > 0
        seconds = sum(map(sum, times["draft"])) + sum(map(sum, times["verify"]))
        assert figures["round_over_back_to_back"] == pytest.approx(seconds / base_seconds)
        low, high = figures["ratio_ci95"]
        assert low <= figures["round_over_back_to_back"] <= high
        assert f"{way:14} draft" in run.stdout


def test_too_few_rounds_are_refused_with_the_option_named() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH), "--rounds", str(SETTLE_ROUNDS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "--rounds must be above" in run.stderr
