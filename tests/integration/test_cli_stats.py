"""``compare``, intervals in the summary and the fits table, provenance in exports (in-process
CLI on real SQLite stores filled with hand-made results)."""

from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path

import pytest
from support import cli_sweeps, runner_stub
from support.store_records import stored_trial

from orchestrator import cli
from orchestrator.analysis.metrics import trial_metrics
from orchestrator.run.provenance import collect_provenance
from orchestrator.store import open_store
from orchestrator.store.records import StoredTrial
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import load_sweep
from workers.records import GenerationResult, RoundRecord


def _results(seconds: list[float], drafted: int, prompt_base: int = 0) -> list[GenerationResult]:
    """One sample per entry (prompt ``prompt_base + i``): 8 rounds of ``drafted``, half taken."""
    accepted = drafted // 2
    return [
        GenerationResult(
            prompt_ids=[1, 2, prompt_base + i],
            output_ids=list(range(8 * (accepted + 1))),
            rounds=[RoundRecord(drafted, accepted, False, drafted, 0.0, 0.0)] * 8,
            seconds=s,
        )
        for i, s in enumerate(seconds)
    ]


#: The AR baseline's seconds per prompt (8 tokens each).
BASE = [0.5, 0.9, 0.4, 1.2, 0.7, 0.6]


@pytest.fixture
def stats_store(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """Sweep ``cli`` with 6 prompts: AR, static (about 2x), SVIP 0.3 (about static's speed),
    SVIP 0.5 on other prompts. Returns the URL and the trial ids by name."""
    sweep_file = cli_sweeps.write_sweep(tmp_path / "cli.yaml", cli_sweeps.SWEEP.replace("2,", "6,"))
    spec = load_sweep(sweep_file)
    plan = plan_sweep(spec)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    base = BASE
    trials = {
        "ar": (cli_sweeps.trial_of(plan, "ar"), _results(base, 0)),
        "static": (
            cli_sweeps.trial_of(plan, "static"),
            _results([s * f for s, f in zip(base, [1, 1.1, 0.9, 1, 1.05, 0.95], strict=True)], 2),
        ),
        "svip": (
            cli_sweeps.trial_of(plan, "svip", 0.3),
            _results([s * f for s, f in zip(base, [1.02, 1.07, 0.93, 1, 1, 0.97], strict=True)], 2),
        ),
        "other": (cli_sweeps.trial_of(plan, "svip", 0.5), _results(base, 2, prompt_base=50)),
    }
    with open_store(url) as store:
        store.register_sweep(spec, plan)
        store.record_run("cli", collect_provenance())
        for trial, results in trials.values():
            store.record_trial(trial, results, trial_metrics(results))
    return url, {name: trial.trial_id for name, (trial, _) in trials.items()}


def test_compare_says_faster_slower_and_not_distinguishable(stats_store, capsys) -> None:
    url, ids = stats_store
    assert cli.main(["--db", url, "compare", ids["static"], ids["ar"]]) == 0
    out = capsys.readouterr().out
    factors = [1, 1.1, 0.9, 1, 1.05, 0.95]
    expected = (16 * 6 / sum(s * f for s, f in zip(BASE, factors, strict=True))) / (
        8 * 6 / sum(BASE)
    )
    match = re.search(r"tokens/s A / B = (\S+), 95% CI \[(\S+), (\S+)\]", out)
    assert match is not None and "over 6 shared prompts" in out
    estimate, low, high = (float(value) for value in match.groups())
    assert estimate == pytest.approx(expected, rel=1e-3) and low < estimate < high
    assert "verdict: A is faster than B" in out
    assert "n = 6 (paired t interval over 6 shared prompts); p = " in out
    assert cli.main(["--db", url, "compare", ids["ar"], ids["static"]]) == 0
    assert "verdict: A is slower than B" in capsys.readouterr().out
    assert cli.main(["--db", url, "compare", ids["svip"], ids["static"]]) == 0
    assert "verdict: not distinguishable" in capsys.readouterr().out


def test_compare_refuses_trials_without_shared_prompts(stats_store, capsys) -> None:
    url, ids = stats_store
    assert cli.main(["--db", url, "compare", ids["other"], ids["ar"]]) == 2
    err = capsys.readouterr().err
    assert "share no prompts" in err and ids["other"] in err and "Traceback" not in err
    assert cli.main(["--db", url, "compare", "nope", ids["ar"]]) == 2
    assert "no trial 'nope'" in capsys.readouterr().err


def test_compare_of_several_pairs_is_holm_adjusted(stats_store, capsys) -> None:
    url, ids = stats_store
    pairs = [ids["static"], ids["ar"], ids["svip"], ids["ar"], ids["other"], ids["ar"]]
    assert cli.main(["--db", url, "compare", *pairs]) == 0
    out = capsys.readouterr().out
    assert "Holm-adjusted over 2 comparisons (family-wise error 5%)" in out
    assert "intervals at 97.5% hold together" in out
    assert out.count("97.5% CI [") == 2 and out.count("Holm-adjusted p = ") == 2
    assert "no interval: n = 0; an interval needs at least 2 prompts shared" in out
    assert cli.main(["--db", url, "compare", ids["static"], ids["ar"], ids["svip"]]) == 2
    assert "in pairs" in capsys.readouterr().err


def test_compare_says_how_many_prompts_an_interval_needs(tmp_path, capsys) -> None:
    from orchestrator.analysis import report
    from orchestrator.analysis.pairing import Comparison

    a, b = _summary_row(1.5), _summary_row(1.0)
    refusal = "\n".join(report.comparison_refusal(a, b, 1))
    assert "share only 1 prompt(s)" in refusal
    assert "n = 1; an interval needs at least 2 prompts" in refusal
    lines = report.comparison_lines(a, b, Comparison(1, None, None, 3), 4, 1)
    assert "no interval: n = 1; an interval needs at least 2 prompts shared" in lines


def test_export_carries_provenance_and_intervals(stats_store, tmp_path, capsys) -> None:
    url, ids = stats_store
    out = tmp_path / "cli.csv"
    assert cli.main(["--db", url, "export", "cli", "--out", str(out)]) == 0
    with out.open(encoding="utf-8", newline="") as handle:
        rows = {row["trial_id"]: row for row in csv.DictReader(handle)}
    static = rows[ids["static"]]
    assert static["run_cpu"] == collect_provenance().cpu
    assert static["run_torch_threads"] == str(collect_provenance().torch_threads)
    low, mid, high = (float(static[k]) for k in ("speedup_low", "speedup", "speedup_high"))
    assert 1.8 < low < mid < high < 2.2


def test_summary_table_shows_the_best_trial_interval() -> None:
    rows = [
        _summary_row(1.5, speedup_low=1.2, speedup_high=1.7),
        _summary_row(2.0, speedup_low=1.9, speedup_high=2.1),
    ]
    from orchestrator.analysis import report

    (summary,) = report.summary_rows(rows)
    assert summary["best_speedup"] == 2.0 and summary["best_speedup_ci"] == "[1.9, 2.1]"


def _summary_row(speedup: float, **intervals: float) -> StoredTrial:
    return stored_trial(
        pair="p",
        dataset="d",
        temperature=0.0,
        policy="static",
        max_draft_len=4,
        status="done",
        tokens_per_s=10.0,
        speedup=speedup,
        acceptance_rate=0.5,
        **intervals,
    )


fake_runner = runner_stub.fake_runner


def test_resubmit_says_when_done_trials_ran_under_another_provenance(
    fake_runner, tmp_path, capsys
) -> None:
    import dataclasses

    sweep_file = cli_sweeps.write_sweep(tmp_path / "done.yaml", cli_sweeps.DONE_SWEEP)
    plan = plan_sweep(load_sweep(sweep_file))
    url = f"sqlite:///{tmp_path / 'results.db'}"
    here = collect_provenance()
    with open_store(url) as store:
        store.record_run("done", dataclasses.replace(here, commit="f" * 40, torch_threads=64))
        baseline = cli_sweeps.trial_of(plan, "ar")
        store.record_trial(
            baseline, cli_sweeps.BASELINE_RESULTS, trial_metrics(cli_sweeps.BASELINE_RESULTS)
        )
        store.run_id = None  # the static trial: stored before provenance was recorded
        static = cli_sweeps.trial_of(plan, "static")
        store.record_trial(
            static, cli_sweeps.STATIC_RESULTS, trial_metrics(cli_sweeps.STATIC_RESULTS)
        )
    assert cli.main(["--db", url, "submit", str(sweep_file)]) == 0
    out = capsys.readouterr().out
    assert "1 done trial(s) kept from a run with no recorded provenance" in out
    line = next(line for line in out.splitlines() if "different provenance" in line)
    assert line.startswith("1 done trial(s) kept from run 1")
    assert f"torch_threads 64 → {here.torch_threads}" in out and "commit ffff" in out
    assert "nothing to run" in out


def test_refresh_fills_intervals_of_trials_stored_without_them(stats_store, capsys) -> None:
    url, ids = stats_store
    with open_store(url) as store:
        before = store.trial_rows([ids["static"]])[0]
        with store.engine.begin() as connection:
            connection.exec_driver_sql("UPDATE trials SET speedup_low = NULL, speedup_high = NULL")
    assert cli.main(["--db", url, "refresh", "cli"]) == 0
    assert "refreshed the statistics of 4 done trials of cli" in capsys.readouterr().out
    with open_store(url, read_only=True) as store:
        after = store.trial_rows([ids["static"]])[0]
    assert (after.speedup_low, after.speedup_high) == (
        before.speedup_low,
        before.speedup_high,
    )
    assert cli.main(["--db", url, "refresh", "nope"]) == 2


def test_recorded_torch_threads_are_what_a_worker_actor_runs_with(ray_local) -> None:
    import ray

    from orchestrator.run.provenance import worker_torch_threads
    from orchestrator.sweep.bundles import CPUS_PER_ACTOR

    @ray.remote(num_cpus=CPUS_PER_ACTOR)
    class Probe:
        def threads(self) -> int:
            import torch

            return torch.get_num_threads()

    probe = Probe.remote()
    assert ray.get(probe.threads.remote()) == worker_torch_threads()
    ray.kill(probe)


def test_compare_leads_with_decode_only_where_both_trials_stored_it(tmp_path, capsys) -> None:
    """A prefill of 0.3 s a prompt on both sides, static decoding in a third of AR's time:
    decode-only static is 3x AR, end to end less; the decode-only comparison comes first."""
    sweep_file = cli_sweeps.write_sweep(tmp_path / "cli.yaml", cli_sweeps.SWEEP.replace("2,", "6,"))
    spec = load_sweep(sweep_file)
    plan = plan_sweep(spec)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    decode = [0.6 + 0.05 * i for i in range(6)]

    def split(results, scale):
        return [
            dataclasses.replace(
                r, seconds=0.3 + d * scale, prefill_seconds=0.3, decode_seconds=d * scale
            )
            for r, d in zip(results, decode, strict=True)
        ]

    ar = split(_results(decode, 0), 1.0)
    static = split(_results(decode, 0), 1 / 3)
    with open_store(url) as store:
        store.register_sweep(spec, plan)
        for name, results in (("ar", ar), ("static", static)):
            store.record_trial(cli_sweeps.trial_of(plan, name), results, trial_metrics(results))
    ids = [cli_sweeps.trial_of(plan, "static").trial_id, cli_sweeps.trial_of(plan, "ar").trial_id]
    assert cli.main(["--db", url, "compare", *ids]) == 0
    out = capsys.readouterr().out
    first = re.search(r"decode-only tokens/s A / B = (\S+),", out)
    second = re.search(r"end-to-end tokens/s A / B = (\S+),", out)
    assert first is not None and second is not None and first.start() < second.start()
    assert float(first.group(1)) == pytest.approx(3.0, rel=1e-6)
    expected = sum(0.3 + d for d in decode) / sum(0.3 + d / 3 for d in decode)
    assert float(second.group(1)) == pytest.approx(expected, rel=1e-3)
    assert "verdict: A is faster than B (decode-only)" in out


#: The cli sweep over 6 prompts, replayed: static K=4 and SVIP projected by one cost fit whose
#: live checks (static and SVIP 0.3 at K=4) were off by -3% and +2% on the same prompts.
REPLAYED = cli_sweeps.SWEEP.replace("2,", "6,") + (
    "execution:\n  mode: replay\n  live_check:\n    - {policy: static, max_draft_len: 4}\n"
    "    - {policy: svip, max_draft_len: 4, params: {threshold: 0.3}}\n"
)
FIT_ERROR = 0.025


def _replayed_store(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """Store the replayed sweep: AR live; static and SVIP 0.3 replayed with identical rounds
    and seconds (about 2x AR); the checks live; the group's cost fit with the checks' errors."""
    spec = load_sweep(cli_sweeps.write_sweep(tmp_path / "cli.yaml", REPLAYED))
    plan = plan_sweep(spec)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    grid = [t for t in plan.trials if not t.is_check]
    checks = [t for t in plan.trials if t.is_check]
    ids = {"ar": cli_sweeps.trial_of(plan, "ar").trial_id}
    projected = _results(
        [s * f for s, f in zip(BASE, [1, 1.1, 0.9, 1, 1.05, 0.95], strict=True)], 2
    )
    with open_store(url) as store:
        store.register_sweep(spec, plan)
        for trial in [*grid, *checks]:
            replayed = trial.mode == "replay"
            results = projected if trial.setting.max_draft_len else _results(BASE, 0)
            error = FIT_ERROR if replayed else None
            store.record_trial(trial, results, trial_metrics(results, cost_model_error=error))
            if replayed:
                ids[f"{trial.setting.policy} {trial.setting.threshold}"] = trial.trial_id
        store.record_cost_fit(
            {
                "sweep": "cli",
                "group_key": "g",
                "pair": "demo",
                "dataset": "builtin:code",
                "split": None,
                "samples": 6,
                "max_new_tokens": 8,
                "temperature": 0.0,
                **dict.fromkeys(("t_draft", "t_target", "t_per_verified"), 0.001),
                **dict.fromkeys(("r2_draft", "r2_verify", "r2_round"), 0.9),
                "n_rounds": 48,
                "n_trials": 3,
                "overhead_seconds": 0.01,
                "checks": [
                    {"trial_id": t.trial_id, "error": e}
                    for t, e in zip(checks, (-0.03, 0.02), strict=True)
                ],
                "out_of_sample_error": FIT_ERROR,
            }
        )
    return url, ids


def test_compare_includes_the_cost_models_error_of_a_replayed_side(tmp_path, capsys) -> None:
    url, ids = _replayed_store(tmp_path)
    # two replayed sides of one fit with identical rounds: 1, widened by the ratio's error
    assert cli.main(["--db", url, "compare", ids["svip 0.3"], ids["static None"]]) == 0
    out = capsys.readouterr().out
    gap = 1.02 / 0.97 - 1
    match = re.search(r"tokens/s A / B = (\S+), 95% CI \[(\S+), (\S+)\]", out)
    assert match is not None
    assert [float(v) for v in match.groups()] == pytest.approx([1, 1 - gap, 1 + gap], rel=1e-3)
    assert "verdict: not distinguishable" in out
    assert f"±{gap:.1%} (two replayed sides of one cost fit" in out
    # a replayed side against the live AR: the fit's e
    assert cli.main(["--db", url, "compare", ids["static None"], ids["ar"]]) == 0
    out = capsys.readouterr().out
    assert "verdict: A is faster than B" in out
    assert "±2.5% (a replayed side against a live one" in out
    # both in one family: the same notes, Holm-adjusted
    pairs = [ids["svip 0.3"], ids["static None"], ids["static None"], ids["ar"]]
    assert cli.main(["--db", url, "compare", *pairs]) == 0
    out = capsys.readouterr().out
    assert out.count("note: the interval and p include the cost model's error") == 2
