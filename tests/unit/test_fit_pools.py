"""The runner's cost fit pools a pair's datasets at one sampling setting (issue #43).

A replay group keeps its own traces and its ``cost_fits`` key (one per prompt set, as before),
but its fit is made over the live trials of every dataset of the pair at its sampling setting,
and every check of that pool is held out in turn; after a live run each pool is fit once and
stored under each of its groups. The stores are real SQLite (and PostgreSQL when set).
"""

from __future__ import annotations

import textwrap

import pytest
from support import store_db

from orchestrator.analysis.metrics import trial_metrics
from orchestrator.run.group_fits import store_live_fits
from orchestrator.store import Store
from orchestrator.sweep.planner import plan_sweep, replay_groups
from orchestrator.sweep.spec import parse_sweep
from orchestrator.sweep.trial import OWN_FIT_MIN_CHECKS, fit_group_key, fit_pool_key
from workers.records import GenerationResult, RoundRecord

db_url = store_db.db_url
store = store_db.store

SWEEP = """\
name: pools
pairs:
  - name: micro
    target: {model: "zoo:micro/target"}
    draft: {model: "zoo:micro/draft-s"}
datasets:
  - {name: "builtin:code", samples: 3, max_new_tokens: 16}
  - {name: "builtin:math", samples: 3, max_new_tokens: 24}
temperatures: [0.0, 0.7]
policies:
  - name: static
  - {name: svip, grid: {threshold: [0.3, 0.5]}}
max_draft_lens: [2, 4]
execution:
  mode: %s
  live_check: [{policy: static, max_draft_len: 2}, {policy: static, max_draft_len: 4}]
"""


def _plan(mode: str, checks: str = ""):
    text = textwrap.dedent(SWEEP % mode)
    if checks:
        text = text.replace(
            "{policy: static, max_draft_len: 4}]",
            f"{{policy: static, max_draft_len: 4}}, {checks}]",
        )
    spec = parse_sweep(text)
    return spec, plan_sweep(spec)


def test_a_replay_group_fits_over_its_pairs_datasets_at_its_sampling_setting() -> None:
    _, plan = _plan("mixed")
    groups = replay_groups(plan)
    assert [g.trials[0].prompts.dataset for g in groups] == ["builtin:code", "builtin:math"]
    code, math = groups
    assert code.fit_key != math.fit_key and code.trace_key != math.trace_key
    assert code.fit_key == fit_group_key(code.trials[0])
    greedy_live = [t for t in plan.trials if t.mode == "live" and t.sampling.temperature == 0.0]
    assert {t.prompts.dataset for t in greedy_live} == {"builtin:code", "builtin:math"}
    checks = [t.trial_id for t in greedy_live if t.is_check]
    assert len(checks) == 4  # two checks per dataset, both datasets
    for group in groups:
        assert [t.trial_id for t in group.pool] == [t.trial_id for t in greedy_live]
        assert [t.trial_id for t in group.pool_checks] == checks
        assert {t.trial_id for t in group.live} < {t.trial_id for t in group.pool}


def test_groups_with_enough_checks_are_fit_each_on_its_own() -> None:
    extra = "{policy: svip, max_draft_len: 4}"
    _, plan = _plan("mixed", extra)
    groups = replay_groups(plan)
    assert OWN_FIT_MIN_CHECKS == 3 and len(groups) == 2
    for group in groups:
        assert len(group.pool_checks) == 3
        assert {t.prompts.dataset for t in group.pool} == {group.trials[0].prompts.dataset}
        assert {t.trial_id for t in group.pool} == {t.trial_id for t in group.live}
    _, two_checks = _plan("mixed")  # two checks per group: the pair's datasets pooled
    assert all(len(g.pool_checks) == 4 for g in replay_groups(two_checks))


def test_the_pool_key_leaves_out_dataset_and_output_length_but_not_sampling() -> None:
    _, plan = _plan("live")
    keys = {}
    for trial in plan.trials:
        keys.setdefault(trial.sampling.temperature, set()).add(fit_pool_key(trial))
    assert {t: len(k) for t, k in keys.items()} == {0.0: 1, 0.7: 1}
    assert keys[0.0] != keys[0.7]


def _results(trial, prompts: int) -> list[GenerationResult]:
    """Synthetic samples whose rounds cost 2 ms per draft forward and 10 + 1·size ms to
    verify, with a context that grows with the dataset's prompt length."""
    k = max(trial.setting.max_draft_len, 0)
    prompt = 30 if trial.prompts.dataset == "builtin:code" else 60
    results = []
    for index in range(prompts):
        rounds = [
            RoundRecord(k, k - (i % 2) if k else 0, False, k, 0.002 * k, 0.010 + 0.001 * k)
            for i in range(4 + index)
        ]
        decode = sum(r.draft_seconds + r.verify_seconds for r in rounds)
        results.append(
            GenerationResult(
                prompt_ids=list(range(prompt + index)),
                output_ids=list(range(8)),
                rounds=rounds,
                seconds=decode + 0.005,
                prefill_seconds=0.005,
                decode_seconds=decode,
            )
        )
    return results


def test_a_live_run_stores_one_pooled_fit_under_each_group_of_the_pool(store: Store) -> None:
    spec, plan = _plan("live")
    store.register_sweep(spec, plan)
    for trial in plan.trials:
        results = _results(trial, trial.prompts.samples)
        store.record_trial(trial, results, trial_metrics(results))
    notes = store_live_fits(spec, plan, store, skip=set())
    assert len(notes) == 2 and all(note.startswith("cost fit micro [") for note in notes)
    assert "builtin:code, builtin:math" in notes[0]
    fits = {fit.group_key: fit for fit in store.cost_fits("pools")}
    groups = {fit_group_key(t): t for t in plan.trials}
    assert set(fits) == set(groups)
    for temperature in (0.0, 0.7):
        pool = [t for t in plan.trials if t.sampling.temperature == temperature]
        stored = [fits[key] for key, t in groups.items() if t.sampling.temperature == temperature]
        assert len(stored) == 2 and stored[0].dataset != stored[1].dataset
        assert {f.n_trials for f in stored} == {len(pool)}
        shapes = [{k: v for k, v in f.step_model.items() if k != "level"} for f in stored]
        assert shapes[0] == shapes[1]  # one pooled shape, each group at its own level
        assert all(f.step_model["level"] > 0 for f in stored)
        assert stored[0].t_draft == pytest.approx(0.002)
