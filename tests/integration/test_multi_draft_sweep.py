"""A pair with several drafts runs on real Ray actors with the micro zoo: the lookup draft's
arms share the first draft's AR baseline and group shard (interleaved), a further draft model
runs on its own draft actor with its own baseline, and every greedy arm reproduces the
target's tokens."""

from __future__ import annotations

import pytest

from orchestrator.run.runner import RunOptions, arm_groups, execute_plan, preflight
from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep

SWEEP = """\
name: drafts
pairs:
  - name: micro
    target: "zoo:micro/target"
    drafts: ["zoo:micro/draft-s", {kind: ngram, n_max: 3}, "zoo:micro/draft-m"]
datasets: [{name: "builtin:code", samples: 3, max_new_tokens: 12}]
temperatures: [0]
policies: [{name: static}, {name: ngram_match}]
max_draft_lens: [3]
execution: {warmup_samples: 0, retries: 0, shard_prompts: 3}
"""


@pytest.fixture
def zoo_env(micro_zoo, monkeypatch):
    """Point zoo references at the session's micro zoo."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    return micro_zoo


def test_several_drafts_of_a_pair_run_on_ray_sharing_what_they_can(zoo_env, ray_local, tmp_path):
    spec = parse_sweep(SWEEP, "drafts.yaml")
    plan = plan_sweep(spec)
    kinds = [(t.pair, t.served.draft_kind, t.setting.policy) for t in plan.trials]
    assert kinds == [
        ("micro", "lm", "ar"),
        ("micro", "lm", "static"),
        ("micro", "ngram", "static"),
        ("micro", "ngram", "ngram_match"),
        ("micro~2", "lm", "ar"),
        ("micro~2", "lm", "static"),
    ]
    groups = arm_groups(plan.trials)
    assert [len(group) for group in groups] == [4, 2]
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    inputs = preflight(spec, plan)
    assert inputs.model_paths["micro~2"].draft is not None
    summary = execute_plan(spec, plan, store, RunOptions(progress=False), inputs)
    assert (summary.ran, summary.failed) == (6, 0), summary.failures
    assert summary.shards.left == 4 + 2  # one group shard of four arms, one of two
    expected = [s.output_ids for s in store.sample_outputs(plan.trials[0].trial_id)]
    for trial in plan.trials:
        samples = store.sample_outputs(trial.trial_id)
        assert [s.output_ids for s in samples] == expected, (trial.pair, trial.setting.policy)
    rows = {row.trial_id: row for row in store.trials("drafts")}
    assert {rows[t.trial_id].draft_kind for t in plan.trials} == {"lm", "ngram"}
    lookup = [t for t in plan.trials if t.served.draft_kind == "ngram"]
    assert {rows[t.trial_id].baseline_id for t in lookup} == {plan.trials[0].trial_id}
    assert all(rows[t.trial_id].speedup is not None for t in lookup)
    store.close()
