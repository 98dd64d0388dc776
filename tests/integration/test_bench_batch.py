"""bench/batch.py end to end on the micro zoo: every method at every batch size, our greedy
output equal to transformers' batched generate(), and the ratios the report names."""

from __future__ import annotations

import json
from pathlib import Path

from support.bench_scripts import load_bench_script, micro_pair_args

from training.zoo.cache import ZooManifest


def test_report_has_every_method_at_every_batch_size(micro_zoo: ZooManifest, tmp_path: Path):
    out = tmp_path / "batch.json"
    args = [*micro_pair_args(micro_zoo), "--samples", "3", "--max-new-tokens", "6"]
    args += ["--batch-sizes", "1", "2", "--threads", "1", "--repeats", "1", "--k", "3"]
    assert load_bench_script("batch").main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    cells = {(row["method"], row["batch_size"]) for row in report["rows"]}
    batched = ["transformers generate()", "ours AR", "ours static K=3"]
    assert cells == {(m, b) for m in batched for b in (1, 2)} | {
        ("batch-1 engine AR", 1),
        ("batch-1 engine static K=3", 1),
    }
    assert all(row["tokens"] == 18 and row["tokens_per_s"] > 0 for row in report["rows"])
    assert report["greedy_equal_to_generate"] == {"1": 3, "2": 3}
    for summary in (report["summary"], report["summary_cpu_time"]):
        assert set(summary["ours_ar_over_generate"]) == {"1", "2"}
        assert set(summary["speculative_speedup"]) == {"1", "2"}
        assert summary["ar_throughput_largest_b_over_b1"] > 0
