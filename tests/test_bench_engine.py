"""bench/engine.py end to end on the micro zoo: its JSON, and its model-dtype option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_bench_script, micro_pair_args

from training.zoo import ZooManifest


def _run(micro_zoo: ZooManifest, tmp_path: Path, dtype: str, *extra: str) -> dict:
    out = tmp_path / f"engine-{dtype}.json"
    args = micro_pair_args(micro_zoo)
    args += ["--samples", "2", "--max-new-tokens", "8", "--threads", "1", "--dtype", dtype]
    assert load_bench_script("engine").main([*args, *extra, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_float32_report_has_every_block_cost_and_speculation_matches_ar(
    micro_zoo: ZooManifest, tmp_path: Path
) -> None:
    report = _run(micro_zoo, tmp_path, "float32")
    assert (report["device"], report["dtype"]) == ("cpu", "float32")
    paths = {"plain_torch", "plain_torch_unpacked", "transformers_modules"}
    assert set(report["standalone_costs"]) == paths
    for costs in report["standalone_costs"].values():
        assert sorted(int(n) for n in costs["t_target"]) == list(range(1, 10))
        assert all(t > 0 for t in costs["t_target"].values())
    packed = report["standalone_costs"]["plain_torch"]["t_target"]
    unpacked = report["standalone_costs"]["plain_torch_unpacked"]["t_target"]
    assert report["packed_vs_unpacked_t_target"] == {n: packed[n] / unpacked[n] for n in packed}
    assert report["weights_packed"] is True
    ours = [m for m in report["methods"] if m["method"].startswith("ours static")]
    assert len(ours) == 9 and all(m["matches_ar"] for m in ours)
    assert sum(m["method"].endswith("(unpacked weights)") for m in ours) == 3
    assert 0 <= min(m["overhead_fraction"] for m in ours) < 1
    for m in ours:  # microseconds a round: more than one, and less than a whole round takes
        rounds = m["tokens"] / (m["mean_accepted"] + 1)
        assert 1 < m["overhead_us_per_round"] < 1e6 * m["seconds"] / rounds * 2
    for models in report["single_step_calibration"].values():
        assert set(models) == {"draft", "target"}
        assert all(c["one_token_s"] > 0 and c["two_tokens_s"] > 0 for c in models.values())
    assert report["warmup_seconds_per_token"] == {}  # on the CPU only when asked for
    assert report["complete"] is True


def test_the_report_is_saved_before_each_path_runs(
    micro_zoo: ZooManifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = load_bench_script("engine")
    writes = []
    monkeypatch.setattr(engine, "write_json", lambda path, data: writes.append(data))
    out = tmp_path / "engine.json"
    args = [*micro_pair_args(micro_zoo), "--samples", "1", "--max-new-tokens", "4"]
    assert engine.main([*args, "--threads", "1", "--out", str(out)]) == 0
    saved = [(w["complete"], len(w["methods"])) for w in writes]
    # block costs alone, then each path's AR + 3 static rows, then transformers' 5 rows too
    assert saved == [(False, 0), (False, 4), (False, 8), (False, 12), (True, 17)]
    assert all("standalone_costs" in w for w in writes)


def test_warmup_decodes_every_path_untimed_first(micro_zoo: ZooManifest, tmp_path: Path) -> None:
    report = _run(micro_zoo, tmp_path, "float32", "--warmup-seconds", "0.6")
    warmup = report["warmup_seconds_per_token"]
    assert set(warmup) == set(report["standalone_costs"])
    assert all(len(costs) >= 1 and all(c > 0 for c in costs) for costs in warmup.values())


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_dtype_option_loads_both_models_in_it(
    micro_zoo: ZooManifest, tmp_path: Path, dtype: str
) -> None:
    report = _run(micro_zoo, tmp_path, dtype)
    assert report["dtype"] == dtype
    assert all(m["tokens"] == 2 * 8 for m in report["methods"])
    assert report["weights_packed"] is False  # only float32 on CPU packs
