"""A sweep with ``batch_sizes: [1, 2]`` runs on real Ray actors with the micro zoo: at batch 2
each arm decodes its shard as one batch queue through the target worker's channel, greedy
outputs equal batch 1's, the store holds the batch size, the total tokens/s and each sample's
share of the batch's wall time, ``schedule`` writes a schedule from what was measured, and
``plan --estimate`` on that store prices batch 2 from what it measured."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from orchestrator.run.runner import RunOptions, execute_plan, preflight
from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep

SWEEP = """\
name: batches
pairs: [{name: micro, target: "zoo:micro/target", draft: "zoo:micro/draft-s"}]
datasets: [{name: "builtin:code", samples: 4, max_new_tokens: 10}]
temperatures: [0]
policies: [{name: static}]
max_draft_lens: [3]
batch_sizes: [1, 2]
execution: {warmup_samples: 0, retries: 0, shard_prompts: 4}
"""


@pytest.fixture
def zoo_env(micro_zoo, monkeypatch):
    """Point zoo references at the session's micro zoo."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    return micro_zoo


def test_batch_two_equals_batch_one_and_stores_its_figures(zoo_env, ray_local, tmp_path, capsys):
    spec = parse_sweep(SWEEP, "batches.yaml")
    plan = plan_sweep(spec)
    assert sorted((t.batch_size, t.setting.policy) for t in plan.trials) == [
        (1, "ar"),
        (1, "static"),
        (2, "ar"),
        (2, "static"),
    ]
    url = f"sqlite:///{tmp_path / 'results.db'}"
    with open_store(url) as store:
        store.register_sweep(spec, plan)
        summary = execute_plan(spec, plan, store, RunOptions(progress=False), preflight(spec, plan))
        assert (summary.ran, summary.failed) == (4, 0), summary.failures
        rows = {row.trial_id: row for row in store.trials("batches")}
        outputs = {
            (t.batch_size, t.setting.policy): [
                s.output_ids for s in store.sample_outputs(t.trial_id)
            ]
            for t in plan.trials
        }
        samples = {t.trial_id: store.sample_outputs(t.trial_id) for t in plan.trials}
    assert outputs[(2, "static")] == outputs[(1, "static")] == outputs[(1, "ar")]
    assert outputs[(2, "ar")] == outputs[(1, "ar")]
    for trial in plan.trials:
        row = rows[trial.trial_id]
        assert row.batch_size == trial.batch_size
        assert row.total_tokens_per_s is not None and row.total_tokens_per_s > 0
        assert row.total_tokens_per_s_low < row.total_tokens_per_s < row.total_tokens_per_s_high
        shares = [s.batch_seconds for s in samples[trial.trial_id]]
        if trial.batch_size == 1:
            assert shares == [None] * 4
            assert row.total_tokens_per_s == pytest.approx(row.tokens_per_s)
        else:
            assert all(
                0 < share <= s.seconds
                for share, s in zip(shares, samples[trial.trial_id], strict=True)
            )
            assert row.config["batch_size"] == 2
        if not trial.is_baseline:
            assert row.decode_speedup is not None and row.decode_speedup_low is not None
            assert rows[trial.baseline_id].batch_size == trial.batch_size

    assert main(["schedule", "batches", "--db", url, "--format", "vllm"]) == 0
    out = capsys.readouterr().out
    assert "best static K per batch size" in " ".join(out.split())
    snippet = next((line for line in out.splitlines() if line.startswith("{")), None)
    if snippet is not None:  # speculation paid at some batch size on this machine
        ranges = json.loads(snippet)["num_speculative_tokens_per_batch_size"]
        assert [r[:2] for r in ranges] == [[1, 1], [2, 2]]
    else:
        assert "without speculative decoding" in " ".join(out.split())

    sweep_file = tmp_path / "batches.yaml"
    sweep_file.write_text(SWEEP)
    estimate_argv = ["plan", str(sweep_file), "--estimate", "--gpus", "1"]
    assert main([*estimate_argv, "--db", f"sqlite:///{tmp_path / 'none.db'}"]) == 0
    alone = " ".join(capsys.readouterr().out.split())
    assert "batch 2, micro: sized from batch 1: no measurement at B = 2" in alone
    assert main([*estimate_argv, "--db", url]) == 0
    measured = " ".join(capsys.readouterr().out.split())
    assert "batch 1: each pair's profile" in measured
    assert "batch 2, micro: measured at B = 2 (2 stored trial(s)" in measured
