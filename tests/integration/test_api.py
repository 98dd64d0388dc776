"""orchestrator.api: a micro-zoo sweep on real Ray actors and SQLite, the same rows as the CLI."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from orchestrator import api, cli
from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import load_sweep, parse_sweep

SWEEP = """
name: api-test
pairs:
  - name: micro
    target: {model: "zoo:micro/target"}
    draft: {model: "zoo:micro/draft-s"}
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 8}
temperatures: [0.0]
policies:
  - name: static
  - name: adaedl
    grid: {threshold: [0.5]}
max_draft_lens: [3]
seeds: [0]
execution: {retries: 0, warmup_samples: 1}
"""

#: Trial columns that do not depend on timing: equal for two runs of one greedy sweep.
SAME_COLUMNS = [
    "trial_id",
    "policy",
    "threshold",
    "is_baseline",
    "status",
    "n_samples",
    "generated_tokens",
    "n_rounds",
    "n_drafted",
    "n_accepted",
    "acceptance_rate",
    "mean_accepted",
]


def _outputs(url: str, trial_ids: list[str]) -> dict[str, list[list[int]]]:
    """Return each trial's stored output ids, per sample."""
    with open_store(url, read_only=True) as store:
        return {
            trial_id: [sample.output_ids for sample in store.sample_outputs(trial_id)]
            for trial_id in trial_ids
        }


def test_run_sweep_gives_the_rows_the_cli_gives_and_resumes(
    job_env: Path, ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep_file = tmp_path / "api.yaml"
    sweep_file.write_text(SWEEP, encoding="utf-8")
    plan = plan_sweep(load_sweep(sweep_file))
    api_url = f"sqlite:///{tmp_path / 'api.db'}"
    cli_url = f"sqlite:///{tmp_path / 'cli.db'}"

    result = api.run_sweep(sweep_file, db=api_url, progress=False)
    summary = result.summary
    planned = len(plan.trials)
    assert (summary.planned, summary.already_done, summary.ran, summary.failed) == (
        planned,
        0,
        planned,
        0,
    )
    frame = result.to_dataframe()
    assert list(frame["trial_id"]) == [trial.trial_id for trial in plan.trials]
    assert (frame["status"] == "done").all() and (frame["tokens_per_s"] > 0).all()
    assert frame["is_baseline"].sum() == 1 and result.failed_trials.empty
    pd.testing.assert_frame_equal(api.load_results(api_url, "api-test"), frame)

    assert cli.main(["--db", cli_url, "submit", str(sweep_file), "--no-progress"]) == 0
    assert f"{planned} trials planned, 0 already done, {planned} ran, 0 failed" in (
        capsys.readouterr().out
    )
    from_cli = api.load_results(cli_url, "api-test")
    pd.testing.assert_frame_equal(from_cli[SAME_COLUMNS], frame[SAME_COLUMNS])
    ids = list(frame["trial_id"])
    assert _outputs(api_url, ids) == _outputs(cli_url, ids)

    again = api.run_sweep(sweep_file, db=api_url, progress=False)
    assert (again.summary.already_done, again.summary.ran) == (planned, 0)
    pd.testing.assert_frame_equal(again.to_dataframe(), frame)


def test_failed_trials_and_unknown_sweeps(tmp_path: Path) -> None:
    spec = parse_sweep(SWEEP, "api.yaml")
    plan = plan_sweep(spec)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    with open_store(url) as store:
        store.register_sweep(spec, plan)
        store.record_failure(plan.trials[1], "ValueError: bad draft", attempts=1)
        result = api.SweepResult(summary=None, trials=store.trials_dataframe("api-test"))  # type: ignore[arg-type]
    assert list(result.failed_trials["trial_id"]) == [plan.trials[1].trial_id]
    assert list(result.failed_trials["error"]) == ["ValueError: bad draft"]
    assert sorted(result.to_dataframe()["status"]) == ["failed", "pending", "pending"]
    with pytest.raises(LookupError, match="api-test"):
        api.load_results(url, "other")
