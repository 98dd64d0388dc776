"""The command line, run in-process (``cli.main([...])``) on stores filled with hand-made results.

The real ``submit`` run (Ray, models) is tested with the runner; here ``submit`` runs against a
stand-in ``orchestrator.run.runner`` module, so what is checked is the CLI's own logic: validation,
dry run, preflight, the "nothing to run" case, failed trials and exit codes.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import runner_stub
from support.cli_sweeps import (
    BASELINE_RESULTS,
    DONE_SWEEP,
    STATIC_RESULTS,
    SWEEP,
    trial_of,
    write_sweep,
)
from support.paths import REPO
from support.runner_stub import FakeRunner, FakeRunOptions, FakeSweepSummary

from orchestrator import cli
from orchestrator.analysis.metrics import trial_metrics
from orchestrator.cli.common import DEFAULT_CLUSTER_FILE
from orchestrator.cli.zoo import ZOO_PROFILES
from orchestrator.store import Store, open_store
from orchestrator.sweep.planner import Plan, plan_sweep
from orchestrator.sweep.spec import SweepSpec, load_sweep

DEMO = REPO / "sweeps" / "demo.yaml"
COMMANDS = (
    (),
    ("submit",),
    ("plan",),
    ("status",),
    ("query",),
    ("compare",),
    ("refresh",),
    ("export",),
    ("schedule",),
    ("zoo",),
    ("zoo", "build"),
)

OOM_TRACEBACK = 'Traceback (most recent call last):\n  File "x.py"\nRuntimeError: CUDA OOM\n'


@dataclass
class FilledStore:
    """Sweep ``cli`` in a store: baseline and static done, SVIP 0.3 failed, SVIP 0.5 pending."""

    url: str
    path: Path
    sweep_file: Path
    spec: SweepSpec
    plan: Plan


@pytest.fixture
def filled(tmp_path: Path) -> FilledStore:
    sweep_file = write_sweep(tmp_path / "cli.yaml", SWEEP)
    spec = load_sweep(sweep_file)
    plan = plan_sweep(spec)
    path = tmp_path / "results.db"
    url = f"sqlite:///{path}"
    with open_store(url) as store:
        store.register_sweep(spec, plan)
        baseline, static = trial_of(plan, "ar"), trial_of(plan, "static")
        store.record_trial(baseline, BASELINE_RESULTS, trial_metrics(BASELINE_RESULTS))
        store.record_trial(static, STATIC_RESULTS, trial_metrics(STATIC_RESULTS))
        store.record_failure(trial_of(plan, "svip", 0.3), OOM_TRACEBACK, attempts=3)
    return FilledStore(url, path, sweep_file, spec, plan)


def _table_row(output: str, first_cell: str) -> list[str]:
    """Return the cells of the table line whose first cell is ``first_cell``."""
    for line in output.splitlines():
        cells = [cell.strip() for cell in re.split("[│┃]", line)[1:-1]]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starting with {first_cell!r} in:\n{output}")


def _statuses(url: str) -> dict[str, str]:
    with open_store(url, read_only=True) as store:
        return {row.trial_id: row.status for row in store.trials()}


# ---------------------------------------------------------------------------------------------
# Help
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "main")
def test_help_of_every_command(command: tuple[str, ...], capsys: pytest.CaptureFixture) -> None:
    assert cli.main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(" ".join(("usage: python -m orchestrator", *command)))
    assert "examples:" in out


def test_module_help_in_a_subprocess() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for command in ("submit", "plan", "status", "query", "export", "zoo"):
        assert f"    {command} " in done.stdout


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture) -> None:
    assert cli.main([]) == 2
    assert "usage: python -m orchestrator" in capsys.readouterr().err


def test_zoo_profile_choices_are_the_zoo_profiles() -> None:
    from training.zoo.recipes import PROFILES

    assert tuple(sorted(PROFILES)) == ZOO_PROFILES


def test_bad_retries_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["submit", str(DEMO), "--retries", "-1"]) == 2
    assert "must be ≥ 0" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# plan and invalid sweeps
# ---------------------------------------------------------------------------------------------


def test_plan_demo_prints_the_planned_count(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # By hand, per dataset and draft kind (draft-s, the EAGLE head, n-gram lookup): greedy 16
    # policy settings (static, hf_heuristic, beta_ts, cali_ts, specdecpp, oracle 1 each;
    # max_confidence and adaedl 3; svip 4) x 4 caps and two live checks, ngram_match x 4 on the
    # lookup only; at 0.7 static K 1 and AdaEDL at 4 on draft-s only. Skipped: ngram_match on
    # draft-s and the head, the greedy-only oracle at 0.7 on all three (20 per dataset).
    # Baselines: draft-s's worker pair (the lookup shares it) at 2 temperatures, the head's at
    # greedy only (nothing of it runs at 0.7), per dataset -> 6; total 414.
    expected_policy_trials = 2 * (2 * (16 * 4 + 2) + (17 * 4 + 2) + 2)
    expected_trials = expected_policy_trials + 6
    counts = plan_sweep(load_sweep(DEMO)).counts()
    assert counts["trials"] == expected_trials
    db = tmp_path / "never.db"
    assert cli.main(["--db", f"sqlite:///{db}", "plan", str(DEMO)]) == 0
    out = capsys.readouterr().out
    assert (
        f"sweep demo: {expected_trials} trials (6 AR baselines + {expected_policy_trials} "
        "policy trials), 0 training jobs, 40 trials skipped"
    ) in out
    # pair, draft kind, draft, dataset, temperature, policy
    row = _table_row(out, "smollm2")
    assert row[:2] == ["smollm2", "lm"] and row[3:6] == ["humaneval", "0", "ar"]
    assert "greedy-only policy at temperature 0.7" in out
    assert not db.exists()


def test_plan_all_lists_every_trial(capsys: pytest.CaptureFixture) -> None:
    plan = plan_sweep(load_sweep(DEMO))
    assert cli.main(["plan", str(DEMO), "--all"]) == 0
    out = capsys.readouterr().out
    listed = [line for line in out.splitlines() if any(t.trial_id in line for t in plan.trials)]
    assert len(listed) == len(plan.trials) == 414
    svip = _table_row(out, trial_of(plan, "svip", 0.3).trial_id)
    assert svip[2] == "lm" and svip[6] == "svip" and "threshold=0.3" in svip[7].split(", ")


MALFORMED = {
    "unknown key": (
        SWEEP + "colour: blue\n",
        "bad.yaml:13: colour: Extra inputs are not permitted",
    ),
    "wrong type": (
        SWEEP.replace("samples: 2,", "samples: many,"),
        "bad.yaml:6: datasets[0].samples: Input should be a valid integer",
    ),
    "yaml syntax": (
        SWEEP.replace("temperatures: [0]", "temperatures: [0"),
        "bad.yaml:8: (yaml):",
    ),
}


@pytest.mark.parametrize("command", ["submit", "plan"])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_sweep_exits_2_naming_line_and_field(
    case: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    text, expected = MALFORMED[case]
    sweep_file = write_sweep(tmp_path / "bad.yaml", text)
    db = tmp_path / "results.db"
    assert cli.main(["--db", f"sqlite:///{db}", command, str(sweep_file)]) == 2
    captured = capsys.readouterr()
    assert expected in captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""
    assert not db.exists()


def test_missing_sweep_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["plan", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: cannot read" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# query
# ---------------------------------------------------------------------------------------------


def test_query_csv_reads_the_stored_values(
    filled: FilledStore, capsys: pytest.CaptureFixture
) -> None:
    sql = (
        "SELECT policy, tokens_per_s, speedup, acceptance_rate FROM trials "
        "WHERE status = 'done' ORDER BY tokens_per_s"
    )
    assert cli.main(["--db", filled.url, "query", sql, "--format", "csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["policy", "tokens_per_s", "speedup", "acceptance_rate"]
    assert [row[0] for row in rows[1:]] == ["ar", "static"]
    assert float(rows[1][1]) == pytest.approx(16.0) and float(rows[1][2]) == pytest.approx(1.0)
    assert rows[1][3] == ""
    assert [float(v) for v in rows[2][1:]] == pytest.approx([32.0, 2.0, 0.5])


def test_query_table_with_repeated_column_names(
    filled: FilledStore, capsys: pytest.CaptureFixture
) -> None:
    sql = "SELECT status, COUNT(*) AS n, 7 AS n FROM trials GROUP BY status ORDER BY status"
    assert cli.main(["query", sql, "--db", filled.url]) == 0
    out = capsys.readouterr().out
    header = _table_row(out, "status")
    assert header == ["status", "n", "n_2"]
    assert _table_row(out, "done") == ["done", "2", "7"]
    assert _table_row(out, "failed") == ["failed", "1", "7"]
    assert _table_row(out, "pending") == ["pending", "1", "7"]
    assert "3 rows" in out


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM trials",
        "UPDATE trials SET status = 'done'",
        "INSERT INTO sweeps (name, description, spec, code_version) VALUES ('x', '', '{}', '1')",
        "CREATE TABLE notes (text TEXT)",
        "DROP TABLE rounds",
        "ATTACH DATABASE 'attached.db' AS other",
    ],
)
def test_query_refuses_writes(
    sql: str, filled: FilledStore, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _statuses(filled.url)
    files = sorted(filled.path.parent.iterdir())
    monkeypatch.chdir(filled.path.parent)
    assert cli.main(["--db", filled.url, "query", sql]) == 2
    err = capsys.readouterr().err
    assert "query refused" in err and "Traceback" not in err
    assert _statuses(filled.url) == before
    assert sorted(filled.path.parent.iterdir()) == files
    with open_store(filled.url, read_only=True) as store:
        assert [sweep.name for sweep in store.sweeps()] == ["cli"]
        with store.engine.connect() as connection:
            tables = connection.exec_driver_sql("SELECT name FROM sqlite_master").scalars().all()
    assert "notes" not in tables and "rounds" in tables


def test_query_syntax_error_exits_2(filled: FilledStore, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--db", filled.url, "query", "SELEC policy FROM trials"]) == 2
    err = capsys.readouterr().err
    assert "query failed" in err and "syntax error" in err


def test_query_without_a_store_exits_2_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    db = tmp_path / "missing.db"
    assert cli.main(["--db", f"sqlite:///{db}", "query", "SELECT 1"]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not db.exists()


@pytest.mark.parametrize("url", ["foo://x", "not a url"])
def test_unusable_db_url_exits_2(url: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--db", url, "status"]) == 2
    err = capsys.readouterr().err
    assert "is not a usable database URL" in err and "Traceback" not in err


def test_db_defaults_to_the_environment(
    filled: FilledStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("SPECSWEEP_DB", filled.url)
    assert cli.main(["query", "SELECT COUNT(*) AS n FROM trials", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "4"]


# ---------------------------------------------------------------------------------------------
# status and export
# ---------------------------------------------------------------------------------------------


def test_status_counts_and_errors(filled: FilledStore, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--db", filled.url, "status"]) == 0
    out = capsys.readouterr().out
    # sweep, planned, done, failed, pending, running
    assert _table_row(out, "cli") == ["cli", "4", "2", "1", "1", "0"]
    failed = _table_row(out, trial_of(filled.plan, "svip", 0.3).trial_id)
    assert failed[-2:] == ["3", "RuntimeError: CUDA OOM"]
    assert "most recent call last" not in out


def test_status_lists_training_jobs_with_their_state(tmp_path: Path, capsys) -> None:
    sweep_file = write_sweep(
        tmp_path / "jobs.yaml",
        DONE_SWEEP.replace("name: done", "name: jobs")
        + "training_jobs:\n"
        + "  - {name: kd1, kind: distillspec, base: zoo:micro/draft-s, teacher: zoo:micro/target,"
        + ' dataset: "builtin:code"}\n'
        + "  - {name: kd2, kind: adaspec, base: zoo:micro/draft-s, teacher: zoo:micro/target,"
        + ' dataset: "builtin:code"}\n',
    )
    spec = load_sweep(sweep_file)
    plan = plan_sweep(spec)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    with open_store(url) as store:
        store.register_sweep(spec, plan)
        kd1, kd2 = sorted(plan.jobs, key=lambda job: job.name)
        store.record_training_job(kd1, "pending", attempts=1)
        store.record_training_job(kd2, "failed", error=OOM_TRACEBACK)
    assert cli.main(["--db", url, "status"]) == 0
    out = capsys.readouterr().out
    assert "training jobs" in out
    assert _table_row(out, "kd1")[1:4] == ["distillspec", "pending", "1"]
    failed = _table_row(out, "kd2")
    assert failed[2] == "failed" and "RuntimeError: CUDA OOM" in failed
    assert "most recent call last" not in out


def test_status_of_an_unknown_sweep_exits_2(
    filled: FilledStore, capsys: pytest.CaptureFixture
) -> None:
    assert cli.main(["--db", filled.url, "status", "nope"]) == 2
    assert "no sweep named 'nope'" in capsys.readouterr().err


def test_schedule_writes_the_static_k_for_each_engine(
    filled: FilledStore, capsys: pytest.CaptureFixture
) -> None:
    k = trial_of(filled.plan, "static").setting.max_draft_len
    assert cli.main(["--db", filled.url, "schedule", filled.spec.name, "--format", "trtllm"]) == 0
    out = capsys.readouterr().out
    assert "best static K per batch size" in " ".join(out.split())
    assert f"  max_draft_len: {k}\n  draft_len_schedule:\n    1: {k}\n" in out
    assert cli.main(["schedule", str(filled.path), "--format", "vllm"]) == 0  # a whole store
    (snippet,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert json.loads(snippet)["num_speculative_tokens_per_batch_size"] == [[1, 1, k]]


def test_schedule_errors_exit_2(filled: FilledStore, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--db", filled.url, "schedule", "nope", "--format", "vllm"]) == 2
    assert "no sweep named 'nope'" in capsys.readouterr().err
    assert cli.main(["--db", filled.url, "schedule", filled.spec.name, "--format", "x"]) == 2


def _check_exported(rows: list[dict[str, Any]], filled: FilledStore) -> None:
    """Compare exported rows with the plan and the hand-computed metrics."""
    assert [row["trial_id"] for row in rows] == [t.trial_id for t in filled.plan.trials]
    by_policy = {(row["policy"], _none_if_nan(row["threshold"])): row for row in rows}
    assert float(by_policy[("ar", None)]["tokens_per_s"]) == pytest.approx(16.0)
    static = by_policy[("static", None)]
    assert float(static["tokens_per_s"]) == pytest.approx(32.0)
    assert float(static["speedup"]) == pytest.approx(2.0)
    assert float(static["acceptance_rate"]) == pytest.approx(0.5)
    assert json.loads(static["params"]) == trial_of(filled.plan, "static").setting.params_dict
    failed = by_policy[("svip", 0.3)]
    assert failed["status"] == "failed" and failed["error"] == OOM_TRACEBACK
    assert by_policy[("svip", 0.5)]["status"] == "pending"


def _none_if_nan(value: Any) -> float | None:
    """CSV gives '' and Parquet NaN/None for a NULL threshold."""
    if value is None or value == "" or value != value:
        return None
    return float(value)


def test_export_csv_round_trip(
    filled: FilledStore, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "cli.csv"
    args = ["--db", filled.url, "export", "cli", "--format", "csv", "--out", str(out)]
    assert cli.main(args) == 0
    assert f"wrote 4 trials of sweep cli to {out}" in capsys.readouterr().out
    with out.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    _check_exported(rows, filled)


def test_export_parquet_round_trip(filled: FilledStore, tmp_path: Path) -> None:
    import pandas

    out = tmp_path / "cli.parquet"
    assert cli.main(["--db", filled.url, "export", "cli", "--out", str(out)]) == 0
    frame = pandas.read_parquet(out)
    assert frame["tokens_per_s"].dtype.kind == "f"
    _check_exported(frame.to_dict("records"), filled)


def test_export_errors_exit_2(
    filled: FilledStore, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert cli.main(["--db", filled.url, "export", "nope", "--out", str(tmp_path / "x.csv")]) == 2
    assert "stored sweeps: cli" in capsys.readouterr().err
    assert cli.main(["--db", filled.url, "export", "cli", "--out", str(tmp_path / "x.txt")]) == 2
    assert "--format csv or parquet" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "x.txt").exists()


# ---------------------------------------------------------------------------------------------
# submit against a stand-in runner
# ---------------------------------------------------------------------------------------------

fake_runner = runner_stub.fake_runner


def test_submit_dry_run_runs_nothing(
    fake_runner: FakeRunner, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    db = tmp_path / "results.db"
    assert cli.main(["--db", f"sqlite:///{db}", "submit", str(DEMO), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sweep demo: 414 trials" in out and "dry run: nothing was run" in out
    assert fake_runner.calls == []
    assert not db.exists()


def test_submit_preflight_failure_touches_no_store(
    fake_runner: FakeRunner, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    problem = "pairs[0].target.model: zoo:micro/target and zoo:micro/draft-s tokenizers differ"
    fake_runner.preflight_problems = [problem]
    db = tmp_path / "results.db"
    sweep_file = write_sweep(tmp_path / "cli.yaml", SWEEP)
    assert cli.main(["--db", f"sqlite:///{db}", "submit", str(sweep_file)]) == 2
    err = capsys.readouterr().err
    assert "preflight failed" in err and problem in err and "Traceback" not in err
    assert fake_runner.calls == ["preflight"]
    assert not db.exists()


def test_submit_when_everything_is_done_says_so(
    fake_runner: FakeRunner, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep_file = write_sweep(tmp_path / "done.yaml", DONE_SWEEP)
    spec = load_sweep(sweep_file)
    plan = plan_sweep(spec)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    with open_store(url) as store:
        store.record_trial(trial_of(plan, "ar"), BASELINE_RESULTS, trial_metrics(BASELINE_RESULTS))
        store.record_trial(trial_of(plan, "static"), STATIC_RESULTS, trial_metrics(STATIC_RESULTS))
    assert cli.main(["--db", url, "submit", str(sweep_file)]) == 0
    out = capsys.readouterr().out
    assert "nothing to run: all 2 trials of sweep done are already in DB" in out
    assert fake_runner.calls == ["preflight"]
    summary = [line for line in out.splitlines() if "│ static" in line]
    cells = [cell.strip() for cell in summary[0].split("│")[1:-1]]
    # pair, draft kind, dataset, temp, policy, max DL, trials, done, decode tokens/s, decode
    # speedup, e2e tokens/s, e2e speedup, best, CI, best's prompts, acceptance (results without
    # decode seconds: no decode-only figures; the interval of two identical samples is a point)
    assert cells == [
        "demo",
        "lm",
        "builtin:code",
        "0",
        "static",
        "4",
        "1",
        "1",
        "-",
        "-",
        "32",
        "2",
        "2",
        "[2, 2]",
        "same 2",
        "0.5",
    ]
    assert "best speedup: best chosen and measured on the same 2 prompts (end-to-end)" in out
    with open_store(url, read_only=True) as store:
        assert [sweep.name for sweep in store.sweeps()] == ["done"]


def test_submit_with_failed_trials_exits_1_and_says_how_to_retry(
    fake_runner: FakeRunner, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep_file = write_sweep(tmp_path / "cli.yaml", SWEEP)
    failing = None

    def run(spec: SweepSpec, plan: Plan, store: Store) -> FakeSweepSummary:
        nonlocal failing
        store.record_trial(trial_of(plan, "ar"), BASELINE_RESULTS, trial_metrics(BASELINE_RESULTS))
        store.record_trial(trial_of(plan, "static"), STATIC_RESULTS, trial_metrics(STATIC_RESULTS))
        store.record_trial(
            trial_of(plan, "svip", 0.5), STATIC_RESULTS, trial_metrics(STATIC_RESULTS)
        )
        failing = trial_of(plan, "svip", 0.3)
        store.record_failure(failing, "ValueError: bad draft", attempts=1)
        return FakeSweepSummary(spec.name, len(plan.trials), 0, 4, 1, 12.0)

    fake_runner.run = run
    url = f"sqlite:///{tmp_path / 'results.db'}"
    args = ["--db", url, "submit", str(sweep_file), "--retries", "0", "--no-progress"]
    assert cli.main([*args, "--address", "auto"]) == 1
    out = capsys.readouterr().out
    # no Ray cluster to count GPUs on: the estimate is skipped with its reason, the sweep runs
    assert "no estimate (" in out and "Ray cluster at auto" in out
    assert fake_runner.options == [FakeRunOptions(address="auto", retries=0, progress=False)]
    assert failing is not None
    assert _table_row(out, failing.trial_id)[-1] == "ValueError: bad draft"
    assert "4 trials planned, 0 already done, 4 ran, 1 failed" in out
    assert f"resubmit (done trials are skipped): python -m orchestrator submit {sweep_file}" in out
    svip = [line for line in out.splitlines() if "│ svip" in line]
    cells = [cell.strip() for cell in svip[0].split("│")[1:-1]]
    # both SVIP settings in one group: one done (32 tokens/s, speedup 2), one failed
    assert cells[1] == "lm"  # the draft kind
    assert cells[4:] == ["svip", "4", "2", "1", "-", "-", "32", "2", "2", "[2, 2]", "same 2", "0.5"]


@pytest.mark.slow
def test_zoo_build_prints_the_cards_of_a_cached_zoo(
    micro_zoo: Any, capsys: pytest.CaptureFixture
) -> None:
    cache_dir = micro_zoo.root.parent.parent
    args = ["zoo", "build", "--profile", "micro", "--cache-dir", str(cache_dir), "--no-progress"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert f"zoo micro found in the cache at {micro_zoo.root}" in out
    for name in micro_zoo.models:
        card = micro_zoo.card(name)
        cells = _table_row(out, name)
        assert cells[1:3] == [card["role"], str(card["parameters"])]
    draft = micro_zoo.card("draft-s")["realism"]
    assert _table_row(out, "draft-s")[-2:] == [
        f"{draft['cost_ratio']:.4g}",
        f"{draft['static_speedup_code']:.4g}",
    ]


def test_plan_estimate_prints_pairs_and_total(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["plan", str(DEMO), "--estimate", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "estimate on profile specdecpp-70b-7b-2xa100, 8 GPUs (--gpus)" in out
    assert "total: wall" in out and "GPU-h" in out


def test_submit_above_the_threshold_without_yes_exits_2_naming_yes(
    fake_runner: FakeRunner, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep_file = write_sweep(tmp_path / "cli.yaml", SWEEP)
    db = tmp_path / "results.db"
    argv = ["--db", f"sqlite:///{db}", "submit", str(sweep_file), "--confirm-above", "0"]
    argv += ["--cluster", str(DEFAULT_CLUSTER_FILE)]  # estimate the cluster, not this host
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert "--yes" in captured.err and "estimate on profile" in captured.out
    # the estimate follows the preflight (it reads the store's fits); nothing ran or was stored
    assert fake_runner.calls == ["preflight"] and not db.exists()

    def interrupted(*_args: Any) -> None:
        raise KeyboardInterrupt

    fake_runner.run = interrupted  # the run starts: that is all this test needs
    assert cli.main([*argv, "--yes"]) == 130
    assert fake_runner.calls == ["preflight", "preflight", "execute_plan"]


def test_submit_on_a_local_ray_without_gpus_runs_without_an_estimate(
    fake_runner: FakeRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sweep_file = write_sweep(tmp_path / "cli.yaml", SWEEP)

    def interrupted(*_args: Any) -> None:
        raise KeyboardInterrupt

    fake_runner.run = interrupted  # the run starts: that is all this test needs
    argv = ["--db", f"sqlite:///{tmp_path / 'r.db'}", "submit", str(sweep_file)]
    assert cli.main([*argv, "--confirm-above", "0"]) == 130
    out = capsys.readouterr().out
    assert "no estimate (this machine has no GPU" in out and "estimate on profile" not in out
    assert fake_runner.calls == ["preflight", "execute_plan"]


def test_submit_above_the_threshold_on_a_terminal_asks_and_no_runs_nothing(
    fake_runner: FakeRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    sweep_file = write_sweep(tmp_path / "cli.yaml", SWEEP)
    db = tmp_path / "results.db"
    asked: list[str] = []
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "n")
    argv = ["--db", f"sqlite:///{db}", "submit", str(sweep_file), "--confirm-above", "0"]
    argv += ["--cluster", str(DEFAULT_CLUSTER_FILE)]  # estimate the cluster, not this host
    assert cli.main(argv) == 0
    assert asked and "run it?" in asked[0]
    assert "not run" in capsys.readouterr().out
    assert fake_runner.calls == ["preflight"] and not db.exists()
