"""A stored trial finds its own cost fit: by its group key, draft kind and batch size included.

``fits`` and the dashboard's cost-model page projected every trial with the first stored fit of
its (pair, dataset, temperature, output length): a lookup draft's trials got the draft model's
draft-step cost, and a trial at batch size 4 the batch-1 formula. The key is now the one the
runner stores the fit under, recomputed from the trial's stored record.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.analysis import report
from orchestrator.analysis.costs.model import HARDWARE_PROFILES
from orchestrator.sweep.planner import fit_group_key, plan_sweep
from orchestrator.sweep.spec import load_sweep, parse_sweep

REPO = Path(__file__).resolve().parents[2]

BATCHED = """\
name: batched
pairs:
  - name: micro
    target: {model: "zoo:micro/target"}
    draft: {model: "zoo:micro/draft-s"}
datasets: [{name: "builtin:code", samples: 4, max_new_tokens: 16}]
temperatures: [0.0]
batch_sizes: [1, 2]
policies: [{name: static}]
max_draft_lens: [2]
"""


def _plans() -> list:
    """Return the plans whose trials the key is checked over (kinds, batch sizes, holdout)."""
    return [plan_sweep(load_sweep(REPO / "sweeps" / "demo.yaml")), plan_sweep(parse_sweep(BATCHED))]


def test_a_stored_record_gives_its_planned_trials_fit_group_key() -> None:
    trials = [trial for plan in _plans() for trial in plan.trials]
    assert {t.served.draft_kind for t in trials} == {"lm", "eagle", "ngram"}
    assert len({report.record_fit_group_key(t.columns()) for t in trials}) > 4
    assert {t.batch_size for t in trials} == {1, 2}
    for trial in trials:
        assert report.record_fit_group_key(trial.columns()) == fit_group_key(trial)


def _fit(trial, t_draft: float, step_model: dict | None = None) -> SimpleNamespace:
    """Return a stored fit of ``trial``'s group with draft step ``t_draft`` (round fit only)."""
    return SimpleNamespace(
        group_key=fit_group_key(trial),
        t_draft=t_draft,
        t_target=0.1,
        t_per_verified=0.0,
        r2_draft=1.0,
        r2_verify=1.0,
        r2_round=1.0,
        n_rounds=10,
        overhead_seconds=0.0,
        projection_fit="round",
        step_model=step_model,
    )


def _row(trial) -> SimpleNamespace:
    """Return a done stored trial of ``trial``: 20 draft forwards, 10 rounds, 40 tokens."""
    counts = {"n_draft_forwards": 20, "n_rounds": 10, "n_drafted": 20, "n_samples": 4}
    return SimpleNamespace(
        config=trial.columns(),
        status="done",
        generated_tokens=40,
        seconds=2.0,
        batch_size=trial.batch_size,
        **counts,
        **{key: None for key in report.PROJECTION_LEADING_COLUMNS if key != "fit_tokens_per_s"},
    )


def test_each_kind_and_batch_size_is_projected_by_its_own_fit() -> None:
    demo, batched_plan = _plans()
    checks = [t for t in demo.trials if t.is_check and t.prompts.dataset == "humaneval"]
    (lm,) = [t for t in checks if t.served.draft_kind == "lm" and t.setting.policy == "static"]
    (ngram,) = [
        t for t in checks if t.served.draft_kind == "ngram" and t.setting.policy == "static"
    ]
    (batched,) = [t for t in batched_plan.trials if t.batch_size == 2 and not t.is_baseline]
    table = {"kind": "batch", "batch_size": 2, "draft_step": [[2, 0.02]], "verify": [[2, 1, 0.3]]}
    fits = [_fit(lm, 0.01), _fit(ngram, 0.0), _fit(batched, 0.05, table)]
    # lm: 20 x 10 ms + 10 x 100 ms = 1.2 s; the lookup: no draft cost, 1.0 s; 40 tokens each.
    assert report.fit_tokens_per_s(fits, _row(lm)) == pytest.approx(40 / 1.2)
    assert report.fit_tokens_per_s(fits, _row(ngram)) == pytest.approx(40 / 1.0)
    assert report.fit_tokens_per_s(fits, _row(batched)) is None
    assert report.fit_tokens_per_s(fits[:1], _row(ngram)) is None
    profiles = list(HARDWARE_PROFILES.values())[:1]
    rows = report.profile_projection_rows([_row(lm), _row(batched)], profiles, fits)
    column = report.profile_column(profiles[0], "tokens_per_s")
    assert rows[0][column] is not None and rows[1][column] is None


def test_the_batch_tables_measured_cells_are_listed_and_batch_1_fits_are_not() -> None:
    table = {"kind": "batch", "batch_size": 2, "draft_step": [[1, 0.01], [2, 0.015]]}
    table["verify"] = [[2, 3, 0.25]]
    fits = [
        SimpleNamespace(pair="micro", dataset="d", temperature=0.0, step_model=None),
        SimpleNamespace(pair="micro", dataset="d", temperature=0.0, step_model=table),
    ]
    assert report.fit_batch_size(fits[0]) == 1 and report.fit_batch_size(fits[1]) == 2
    cells = report.batch_table_rows(fits)
    assert [(c["step"], c["rows"], c["block"]) for c in cells] == [
        ("draft", 1, None),
        ("draft", 2, None),
        ("verify", 2, 3),
    ]
    assert [c["ms"] for c in cells] == pytest.approx([10.0, 15.0, 250.0])
    assert all(c["batch_size"] == 2 and set(c) == set(report.BATCH_TABLE_COLUMNS) for c in cells)
