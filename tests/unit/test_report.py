"""The CLI's tables as pure data: summaries, status counts, plan tables, zoo cards, export rows."""

from __future__ import annotations

import io
import json
import textwrap
from typing import Any

import pytest
from rich.console import Console
from support.paths import REPO
from support.store_records import stored_trial

from orchestrator.analysis import report
from orchestrator.analysis.holdout import PromptSplit, SweepSamples
from orchestrator.analysis.pairing import SampleSpeed
from orchestrator.store.records import StoredTrial
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import load_sweep, parse_sweep

DEMO_BEFORE_PROTOCOL = REPO / "docs" / "lab" / "data" / "demo-before-protocol.yaml"


def _row(**values: Any) -> StoredTrial:
    """A stored trial: defaults for every column the report reads."""
    base = {
        "trial_id": "t",
        "pair": "p",
        "draft_kind": "lm",
        "dataset": "gsm8k",
        "temperature": 0.0,
        "policy": "svip",
        "threshold": None,
        "max_draft_len": 8,
        "status": "done",
        "attempts": 1,
        "error": None,
        "tokens_per_s": None,
        "speedup": None,
        "acceptance_rate": None,
    }
    return stored_trial(**{**base, **values})


def _text(table: Any) -> str:
    console = Console(file=io.StringIO(), width=200)
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_summary_rows_average_done_trials_per_group() -> None:
    rows = [
        _row(policy="ar", max_draft_len=0, tokens_per_s=10.0, speedup=1.0),
        _row(threshold=0.3, tokens_per_s=12.0, speedup=1.2, acceptance_rate=0.4),
        _row(threshold=0.5, tokens_per_s=18.0, speedup=1.8, acceptance_rate=0.7),
        _row(threshold=0.7, status="failed", error="boom"),
        _row(dataset="xsum", threshold=0.3, status="pending"),
    ]
    summary = report.summary_rows(rows)
    assert [(r["dataset"], r["policy"]) for r in summary] == [
        ("gsm8k", "ar"),
        ("gsm8k", "svip"),
        ("xsum", "svip"),
    ]
    baseline, svip, pending = summary
    assert baseline["acceptance_rate"] is None and baseline["e2e_speedup"] == 1.0
    assert (svip["trials"], svip["done"]) == (3, 2)
    assert svip["e2e_tokens_per_s"] == pytest.approx((12.0 + 18.0) / 2)
    assert svip["e2e_speedup"] == pytest.approx((1.2 + 1.8) / 2)
    # stored without decode seconds: no decode-only figure, the best one end to end
    assert svip["decode_tokens_per_s"] is None and svip["decode_speedup"] is None
    assert svip["best_speedup"] == 1.8
    assert svip["best_note"] == "best chosen and measured on the same prompts (end-to-end)"
    assert svip["best_on"] == "same"
    assert svip["acceptance_rate"] == pytest.approx((0.4 + 0.7) / 2)
    assert (pending["trials"], pending["done"], pending["e2e_tokens_per_s"]) == (1, 0, None)


def test_summary_rows_group_by_fewer_keys() -> None:
    rows = [
        _row(temperature=0.0, max_draft_len=4, speedup=1.0),
        _row(temperature=1.0, max_draft_len=16, speedup=3.0),
    ]
    (only,) = report.summary_rows(rows, group_by=("dataset", "policy"))
    assert only["trials"] == 2 and only["e2e_speedup"] == pytest.approx(2.0)
    shown = {"dataset", "policy", *report.SUMMARY_COLUMNS[len(report.SUMMARY_GROUP) :]}
    assert set(only) == shown | {"best_trial", "best_note"}


def _speeds(seconds: list[float], decode: list[float]) -> list[SampleSpeed]:
    pairs = enumerate(zip(seconds, decode, strict=True))
    return [SampleSpeed(f"p{i}", i, 10, s, d) for i, (s, d) in pairs]


def test_summary_leads_with_decode_only_and_picks_the_best_on_dev_measured_on_test() -> None:
    """svip at 0.3 is the faster on dev prompts 0-1 and at 0.5 on test prompts 2-3: the summary
    reports 0.3, measured on 2-3, and says how it chose."""
    common = {"dataset": "gsm8k", "split": None, "samples": 4, "max_new_tokens": 8}
    trial = {**common, "baseline_id": "ar", "is_baseline": False}
    rows = [
        _row(
            trial_id="ar",
            policy="ar",
            max_draft_len=0,
            is_baseline=True,
            **common,
            decode_tokens_per_s=12.5,
            decode_speedup=1.0,
            tokens_per_s=10.0,
            speedup=1.0,
        ),
        _row(
            trial_id="a",
            threshold=0.3,
            decode_tokens_per_s=16.0,
            decode_speedup=1.3,
            tokens_per_s=12.0,
            speedup=1.2,
            **trial,
        ),
        _row(
            trial_id="b",
            threshold=0.5,
            decode_tokens_per_s=18.0,
            decode_speedup=1.5,
            tokens_per_s=13.0,
            speedup=1.3,
            **trial,
        ),
    ]
    base = _speeds([1.0] * 4, [0.8] * 4)
    samples = {
        "ar": base,
        "a": _speeds([0.6, 0.6, 1.0, 1.0], [0.4, 0.4, 0.8, 0.8]),
        "b": _speeds([1.0, 1.0, 0.5, 0.5], [0.8, 0.8, 0.3, 0.3]),
    }
    split = PromptSplit(dev=(0, 1), test=(2, 3))
    measured = SweepSamples(samples, {("gsm8k", None, 4, 8): split})
    _, svip = report.summary_rows(rows, measured=measured)
    assert svip["decode_tokens_per_s"] == pytest.approx(17.0)
    assert svip["decode_speedup"] == pytest.approx(1.4)
    assert (svip["best_trial"], svip["best_speedup"]) == ("a", pytest.approx(1.0))
    assert svip["best_note"] == "chosen on 2 dev prompts, measured on 2 test prompts (decode-only)"
    assert svip["best_on"] == "dev 2, test 2"
    assert svip["best_speedup_ci"] != report.MISSING
    columns = list(report.SUMMARY_COLUMNS)
    assert columns.index("decode_speedup") < columns.index("e2e_speedup")
    _, same = report.summary_rows(rows, measured=SweepSamples(samples, {}))
    assert (same["best_trial"], same["best_speedup"]) == ("b", pytest.approx(0.8 / 0.55))
    assert same["best_note"] == "best chosen and measured on the same 4 prompts (decode-only)"
    assert same["best_on"] == "same 4"


def test_mean_or_none_skips_missing() -> None:
    assert report.mean_or_none([1.0, None, 2.0]) == pytest.approx(1.5)
    assert report.mean_or_none([None, None]) is None


def test_status_counts() -> None:
    statuses = ["done", "done", "failed", "pending", "running", "done"]
    counts = report.status_counts(_row(status=status) for status in statuses)
    assert counts == {"planned": 6, "done": 3, "failed": 1, "pending": 1, "running": 1}


def test_error_summary_keeps_the_last_line_shortened() -> None:
    traceback = "Traceback (most recent call last):\n  File 'x'\nValueError: bad\n\n"
    assert report.error_summary(traceback) == "ValueError: bad"
    assert report.error_summary(None) == "-"
    long = report.error_summary("x" * 500, limit=20)
    assert long == "x" * 17 + "..." and len(long) == 20


def test_failed_rows_list_only_failures() -> None:
    rows = [_row(trial_id="a"), _row(trial_id="b", status="failed", error="E: x", attempts=3)]
    (failed,) = report.failed_rows(rows)
    assert failed["trial_id"] == "b" and failed["attempts"] == 3 and failed["error"] == "E: x"
    assert list(failed) == list(report.FAILED_COLUMNS)


def test_plan_group_rows_of_the_demo_sweep_before_the_protocol() -> None:
    plan = plan_sweep(load_sweep(DEMO_BEFORE_PROTOCOL))
    groups = report.plan_group_rows(plan)
    by_key = {(g["dataset"], g["temperature"], g["policy"]): g for g in groups}
    # 2 datasets x 2 temperatures x (ar + 9 policies), minus the oracle and the SpecDec++
    # stand-in (greedy only) at temperature 0.7.
    assert len(groups) == 2 * 2 * 10 - 2 * 2
    assert ("humaneval", 0.7, "oracle") not in by_key
    assert ("humaneval", 0.7, "specdecpp") not in by_key
    adaedl = by_key[("builtin:math", 0.7, "adaedl")]
    assert (adaedl["trials"], adaedl["settings"], adaedl["max_draft_lens"]) == (3, 1, "3, 7, 16")
    greedy = by_key[("builtin:math", 0.0, "adaedl")]
    assert (greedy["trials"], greedy["settings"], greedy["max_draft_lens"]) == (9, 3, "3, 7, 16")
    assert by_key[("builtin:math", 0.7, "svip")]["max_draft_lens"] == "16"
    assert by_key[("humaneval", 0.0, "ar")]["max_draft_lens"] == "0"
    assert sum(g["trials"] for g in groups) == len(plan.trials)


JOBS_SWEEP = """\
name: jobs
pairs:
  - name: big
    target: {model: "zoo:micro/target", backend: deepspeed, tp_size: 2, gpus: 1.0}
    draft: {model: "zoo:micro/draft-s", gpus: 0.5}
datasets: ["builtin:code"]
temperatures: [0, 1]
policies:
  - {name: specdecpp, job: head}
  - {name: oracle}
max_draft_lens: [4]
training_jobs:
  - {name: head, kind: specdecpp_head, base: "zoo:micro/draft-s", teacher: "zoo:micro/target",
     dataset: "builtin:code", epochs: 2}
"""


def test_plan_tables_of_jobs_skips_and_resources() -> None:
    plan = plan_sweep(parse_sweep(textwrap.dedent(JOBS_SWEEP)))
    (job,) = report.job_rows(plan)
    assert (job["name"], job["kind"], job["epochs"]) == ("head", "specdecpp_head", 2)
    assert job["job_id"] == plan.jobs[0].job_id
    (skipped,) = report.skipped_rows(plan)
    assert (skipped["policy"], skipped["temperature"], skipped["trials"]) == ("oracle", 1.0, 1)
    (resources,) = report.resource_rows(plan)
    # 2 target ranks with 1 GPU each + a draft actor with 0.5 GPU; one CPU per actor.
    assert (resources["target_actors"], resources["cpus"], resources["gpus"]) == (2, 3, 2.5)
    trials = report.plan_trial_rows(plan)
    specdecpp = next(row for row in trials if row["policy"] == "specdecpp")
    assert specdecpp["requires_jobs"] == "head"
    assert "threshold=" in specdecpp["params"]
    assert next(row for row in trials if row["policy"] == "ar")["params"] == "-"


def test_format_params_sorts_names() -> None:
    assert report.format_params({"b": 0.5, "a": 3}) == "a=3, b=0.5"
    assert report.format_params({}) == "-"


def test_zoo_card_rows_and_columns() -> None:
    cards = {
        "target": {"role": "target", "parameters": 1000, "val_loss": {"math": 2.0, "code": 3.0}},
        "draft-s": {
            "role": "draft",
            "parameters": 100,
            "val_loss": {"code": 3.5, "math": 2.5},
            "realism": {
                "greedy_agreement": 0.6,
                "entropy_std_nats": 1.1,
                "cost_ratio": 0.08,
                "static_speedup_code": 1.7,
            },
        },
    }
    rows = report.zoo_card_rows(cards)
    assert report.zoo_columns(rows) == [
        "model",
        "role",
        "parameters",
        "val_loss_code",
        "val_loss_math",
        "greedy_agreement",
        "entropy_std_nats",
        "cost_ratio",
        "static_speedup_code",
    ]
    assert report.zoo_headers(["val_loss_code", "cost_ratio"])["val_loss_code"] == (
        "val loss (code)"
    )
    target, draft = rows
    assert target["val_loss_code"] == 3.0 and target["cost_ratio"] is None
    assert target["static_speedup_code"] is None
    figures = ("greedy_agreement", "cost_ratio", "val_loss_math", "static_speedup_code")
    assert tuple(draft[key] for key in figures) == (0.6, 0.08, 2.5, 1.7)


def test_export_records_encode_json_columns() -> None:
    params = {"threshold": 0.3, "length_cap": 40}
    (record,) = report.export_records([{"params": params, "tokens_per_s": 1.5, "metrics": None}])
    assert isinstance(record["params"], str) and json.loads(record["params"]) == params
    assert record["tokens_per_s"] == 1.5 and record["metrics"] is None


def test_unique_names() -> None:
    assert report.unique_names(["x", "y", "x", "x"]) == ["x", "y", "x_2", "x_3"]
    assert report.unique_names(["x", "x_2", "x"]) == ["x", "x_2", "x_3"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (2.0, "2"),
        (0.123456, "0.1235"),
        (1234.4, "1234"),
        (123456.7, "123457"),
        (7, "7"),
        (True, "True"),
        ("a", "a"),
    ],
)
def test_format_value(value: Any, text: str) -> None:
    assert report.format_value(value) == text


def test_render_table_headers_alignment_and_plain_text() -> None:
    rows = [{"policy": "[bold]svip[/bold]", "tokens_per_s": 12.5}]
    table = report.render_table(rows, ["policy", "tokens_per_s"], title="t")
    assert [column.justify for column in table.columns] == ["left", "right"]
    text = _text(table)
    assert "tokens/s" in text and "[bold]svip[/bold]" in text and "12.5" in text
    raw = _text(report.render_table(rows, ["tokens_per_s"], headers={}))
    assert "tokens_per_s" in raw and "tokens/s" not in raw


def test_the_committed_demo_database_summarises_without_decode_figures() -> None:
    """docs/lab/data/demo-before-protocol.db predates prefill/decode timing: its summary shows
    no decode-only figure, end-to-end ones, and best trials chosen and measured on the same 6
    prompts."""
    from orchestrator.analysis.holdout import holdout_splits
    from orchestrator.store import open_store

    spec = load_sweep(DEMO_BEFORE_PROTOCOL)
    db = REPO / "docs" / "lab" / "data" / "demo-before-protocol.db"
    with open_store(f"sqlite:///{db}", read_only=True) as store:
        rows = store.trials(spec.name)
        samples = store.trials_sample_speeds(row.trial_id for row in rows)
    summary = report.summary_rows(rows, measured=SweepSamples(samples, holdout_splits(spec)))
    assert summary and all(r["decode_speedup"] is None for r in summary)
    assert all(r["e2e_speedup"] is not None for r in summary)
    assert {r["best_on"] for r in summary} == {"same 6"}
    notes = {r["best_note"] for r in summary}
    assert notes == {"best chosen and measured on the same 6 prompts (end-to-end)"}


def test_the_summary_and_trial_labels_tell_a_pairs_draft_kinds_apart() -> None:
    rows = [
        _row(trial_id="a", speedup=1.2),
        _row(trial_id="b", draft_kind="ngram", speedup=2.0),
    ]
    summary = report.summary_rows(rows)
    assert [(r["pair"], r["draft_kind"], r["e2e_speedup"]) for r in summary] == [
        ("p", "lm", 1.2),
        ("p", "ngram", 2.0),
    ]
    assert ", p, ngram draft, gsm8k," in report.trial_label(rows[1])


DRAFTS_SWEEP = """\
name: drafts
pairs:
  - name: p
    target: zoo:micro/target
    drafts: [zoo:micro/draft-s, {kind: ngram, n_max: 2}]
datasets: [{name: "builtin:code", samples: 2, max_new_tokens: 8}]
temperatures: [0]
policies: [{name: static}, {name: ngram_match}]
max_draft_lens: [4]
"""


def test_plan_tables_show_each_trials_draft_kind_and_draft() -> None:
    plan = plan_sweep(parse_sweep(DRAFTS_SWEEP))
    groups = report.plan_group_rows(plan)
    assert [(g["draft_kind"], g["draft"], g["policy"]) for g in groups] == [
        ("lm", "zoo:micro/draft-s", "ar"),
        ("lm", "zoo:micro/draft-s", "static"),
        ("ngram", "ngram(n_max=2,n_min=1)", "static"),
        ("ngram", "ngram(n_max=2,n_min=1)", "ngram_match"),
    ]
    trials = report.plan_trial_rows(plan)
    assert [row["draft_kind"] for row in trials] == ["lm", "lm", "ngram", "ngram"]
    (skipped,) = report.skipped_rows(plan)
    assert (skipped["draft"], skipped["policy"]) == ("zoo:micro/draft-s", "ngram_match")


def test_a_paired_ratios_model_error_is_named_in_cells_and_compares_note() -> None:
    from orchestrator.analysis.metrics import ModelError
    from orchestrator.analysis.pairing import Comparison
    from orchestrator.analysis.stats import Interval

    assert report.model_error_cell(None) == "none (both live)"
    assert report.model_error_cell(ModelError(0.0291, "one fit")) == "±2.9% (one fit)"
    assert report.model_error_cell(ModelError(None, "one side replayed")) == (
        "not measured (one side replayed)"
    )
    assert report.model_error_note(None) == []
    (note,) = report.model_error_note(ModelError(0.0347, "one side replayed"))
    assert note.startswith("note: the interval and p include the cost model's error, ±3.5% (")
    assert "a replayed side against a live one" in note
    interval = Interval(0.979, 0.95, 1.007, 36, 1.0)
    error = ModelError(0.0291, "one fit")
    a, b = _row(trial_id="a", mode="replay"), _row(trial_id="b", mode="replay")
    lines = report.comparison_lines(
        a, b, Comparison(36, interval, "not distinguishable", 1, 1.0, error), 36, 36
    )
    assert any("±2.9% (two replayed sides of one cost fit" in line for line in lines)
    plain = report.comparison_lines(
        a, b, Comparison(36, interval, "not distinguishable", 1, 1.0), 36, 36
    )
    assert not any("cost model" in line for line in plain)
