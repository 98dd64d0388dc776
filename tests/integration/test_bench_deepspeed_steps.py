"""bench/deepspeed_steps.py on the micro target: two gloo ranks of DeepSpeed AutoTP, its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.bench_scripts import load_bench_script

from training.zoo.cache import ZooManifest


def test_two_ranks_time_every_block_and_report_the_calibrated_step(
    micro_zoo: ZooManifest, tmp_path: Path
) -> None:
    out = tmp_path / "ds.json"
    args = ["--target", str(micro_zoo.model_path("target")), "--ranks", "2"]
    args += ["--repeats", "3", "--max-block", "4", "--context", "32", "--out", str(out)]
    assert load_bench_script("deepspeed_steps").main(args) == 0
    report = json.loads(out.read_text())
    assert (report["ranks"], report["backend"], report["device"]) == (2, "gloo", "cpu")
    assert report["cpu_process_group_allreduce"] is True
    costs = {int(n): t for n, t in report["t_target"].items()}
    assert sorted(costs) == [1, 2, 3, 4] and all(t > 0 for t in costs.values())
    assert set(report["t_one_token"]) == {"plain", "padded"}
    assert report["padded_single_step"] == report["calibration"]["padded"]
    assert report["one_token_not_dearer"] == (costs[1] <= costs[2])


def test_ranks_that_fail_make_it_fail_without_a_report(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # a model directory no rank can load
    out = tmp_path / "ds.json"
    args = ["--target", str(broken), "--ranks", "2", "--timeout", "120", "--out", str(out)]
    assert load_bench_script("deepspeed_steps").main(args) == 1
    assert not out.exists()


def test_a_target_that_is_no_model_is_named(tmp_path: Path, capsys) -> None:
    args = ["--target", str(tmp_path), "--out", str(tmp_path / "ds.json")]
    assert load_bench_script("deepspeed_steps").main(args) == 2
    assert f"{str(tmp_path)!r} is not a model directory" in capsys.readouterr().err


def test_a_block_of_one_is_refused() -> None:
    with pytest.raises(SystemExit):
        load_bench_script("deepspeed_steps").main(["--target", "x", "--max-block", "1"])
