"""Greedy replay at batch size 2 end to end on real Ray with the micro zoo: a mixed sweep runs
the AR baseline and two live checks at B = 2, fits the batch cost table on them (each check
held out), and replays the other trials through the continuous-batching queue; the replayed
static K = 3 decodes the tokens the live check static K = 3 decoded, round for round, and its
projected per-sequence speed is within the stated out-of-sample error of the live one."""

from __future__ import annotations

import pytest

from orchestrator.run.runner import RunOptions, execute_plan, preflight
from orchestrator.store import open_store
from orchestrator.sweep.planner import REPLAY_MODE, plan_sweep
from orchestrator.sweep.spec import parse_sweep

SWEEP = """\
name: batch-replay
pairs: [{name: micro, target: "zoo:micro/target", draft: "zoo:micro/draft-s"}]
datasets: [{name: "builtin:code", samples: 4, max_new_tokens: 12}]
temperatures: [0]
policies:
  - name: static
  - name: max_confidence
    grid: {threshold: [0.1]}
max_draft_lens: [2, 3]
batch_sizes: [2]
execution:
  mode: mixed
  warmup_samples: 0
  retries: 0
  live_check: [{policy: static, max_draft_len: 1}, {policy: static, max_draft_len: 3}]
"""


@pytest.fixture
def zoo_env(micro_zoo, monkeypatch):
    """Point zoo references at the session's micro zoo."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    return micro_zoo


def _rounds(store, trial_id: str) -> list[tuple[int, int, int, int, int]]:
    return [
        (r.sample_index, r.round_index, r.drafted, r.accepted, r.draft_forwards)
        for r in store.rounds([trial_id])
    ]


@pytest.mark.slow
def test_replay_at_batch_two_equals_the_live_check(zoo_env, ray_local, tmp_path):
    spec = parse_sweep(SWEEP, "batch-replay.yaml")
    plan = plan_sweep(spec)
    replayed = [t for t in plan.trials if t.mode == REPLAY_MODE]
    assert len(replayed) == 4 and {t.batch_size for t in plan.trials} == {2}
    url = f"sqlite:///{tmp_path / 'results.db'}"
    with open_store(url) as store:
        store.register_sweep(spec, plan)
        summary = execute_plan(spec, plan, store, RunOptions(progress=False), preflight(spec, plan))
        assert (summary.ran, summary.failed) == (len(plan.trials), 0), summary.failures
        rows = {row.trial_id: row for row in store.trials("batch-replay")}
        (fit,) = store.cost_fits("batch-replay")
        check = next(t for t in plan.trials if t.is_check and t.setting.max_draft_len == 3)
        twin = next(
            t for t in replayed if t.setting.policy == "static" and t.setting.max_draft_len == 3
        )
        assert _rounds(store, twin.trial_id) == _rounds(store, check.trial_id)
        outputs = [s.output_ids for s in store.sample_outputs(twin.trial_id)]
        assert outputs == [s.output_ids for s in store.sample_outputs(check.trial_id)]
        shares = [s.batch_seconds for s in store.sample_outputs(twin.trial_id)]
    assert all(share is not None and share > 0 for share in shares)
    for trial in replayed:
        row = rows[trial.trial_id]
        assert (row.mode, row.batch_size, row.status) == ("replay", 2, "done")
        assert row.tokens_per_s > 0 and row.total_tokens_per_s > 0
    assert fit.step_model["kind"] == "batch" and fit.step_model["batch_size"] == 2
    checks = [t.trial_id for t in plan.trials if t.is_check]
    assert [c["trial_id"] for c in fit.checks] == checks
    error = fit.out_of_sample_error
    assert error is not None, fit.checks
    projected, measured = rows[twin.trial_id].tokens_per_s, rows[check.trial_id].tokens_per_s
    assert abs(projected / measured - 1) <= error, (projected, measured, error, fit.checks)
    assert any("at batch size 2" in note for note in summary.cross_checks)
