"""A sweep whose pair drafts by n-gram lookup runs on real Ray actors with the micro zoo: no
draft model is loaded, and every greedy trial reproduces the AR baseline's tokens."""

from __future__ import annotations

import pytest

from orchestrator.run.runner import RunOptions, execute_plan, preflight
from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep

SWEEP = """\
name: lookup
pairs: [{name: micro-lookup, target: "zoo:micro/target", draft: {kind: ngram, n_max: 3}}]
datasets: [{name: "builtin:code", samples: 3, max_new_tokens: 24}]
temperatures: [0]
policies: [{name: static}, {name: ngram_match}]
max_draft_lens: [4]
execution: {warmup_samples: 0, retries: 0}
"""


@pytest.fixture
def zoo_env(micro_zoo, monkeypatch):
    """Point zoo references at the session's micro zoo."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    return micro_zoo


def test_an_ngram_pair_runs_on_ray_and_reproduces_the_baseline(zoo_env, ray_local, tmp_path):
    spec = parse_sweep(SWEEP, "lookup.yaml")
    plan = plan_sweep(spec)
    assert {t.served.draft_kind for t in plan.trials} == {"ngram"}
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    inputs = preflight(spec, plan)
    assert inputs.model_paths["micro-lookup"].draft is None  # no draft model to load
    summary = execute_plan(spec, plan, store, RunOptions(progress=False), inputs)
    assert (summary.ran, summary.failed) == (3, 0), summary.failures
    baseline = next(t for t in plan.trials if t.is_baseline)
    expected = [s.output_ids for s in store.sample_outputs(baseline.trial_id)]
    drafted = 0
    for trial in plan.trials:
        samples = store.sample_outputs(trial.trial_id)
        assert [s.output_ids for s in samples] == expected, trial.setting.policy
        drafted += sum(s.drafted for s in samples)
    assert drafted > 0, "the lookup should propose on code prompts"
    store.close()


def test_an_ngram_pair_replays_in_a_replay_sweep_as_it_runs_live(zoo_env, ray_local, tmp_path):
    """A replay sweep's lookup pair records lookup traces and replays its trials: the live
    check replays to its own live rounds, every replayed trial reproduces the baseline's
    tokens, and the lookup's cost fit has no draft step."""
    text = SWEEP.replace(
        "execution: {warmup_samples: 0, retries: 0}",
        "execution: {warmup_samples: 0, retries: 0, mode: replay, "
        "live_check: {policy: static, max_draft_len: 4}}",
    ).replace("{name: ngram_match}", "{name: ngram_match}, {name: adaedl}")
    spec = parse_sweep(text, "lookup-replay.yaml")
    plan = plan_sweep(spec)
    replayed = [t for t in plan.trials if t.mode == "replay"]
    assert {t.setting.policy for t in replayed} == {"static", "ngram_match", "adaedl"}
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    summary = execute_plan(spec, plan, store, RunOptions(progress=False), preflight(spec, plan))
    assert summary.failed == 0, summary.failures
    assert summary.traces_recorded == 1
    assert len(summary.cross_checks) == 1, summary.fit_notes
    assert "replay reproduces 100.0% of the live rounds" in summary.cross_checks[0]
    baseline = next(t for t in plan.trials if t.is_baseline)
    expected = [s.output_ids for s in store.sample_outputs(baseline.trial_id)]
    for trial in replayed:
        samples = store.sample_outputs(trial.trial_id)
        assert [s.output_ids for s in samples] == expected, trial.setting.policy
        assert all(r.draft_forwards == 0 for r in store.rounds([trial.trial_id]))
    (fit,) = store.cost_fits()
    assert fit.step_model["t_draft"] == 0.0 and fit.step_model["t_lookup"] >= 0.0
    store.close()
