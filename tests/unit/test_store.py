"""The results store on real databases: migrations, idempotent writes, read-only, concurrency.

Runs on a SQLite file per test; set ``SPECSWEEP_TEST_PG_URL`` (a database the tests may wipe)
to run every test on PostgreSQL too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3
import threading
from contextlib import closing
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, inspect, select
from sqlalchemy.exc import DBAPIError
from support import store_db
from support.store_db import SWEEP, spec_and_plan

from orchestrator.analysis.metrics import trial_metrics
from orchestrator.store import Store, StoreError, default_url, open_store, prompt_id, records
from orchestrator.store.db import alembic_config, current_revision, head_revision
from orchestrator.store.models import (
    ArtifactRow,
    Base,
    CostFitRow,
    RoundRow,
    RunRow,
    SampleResultRow,
    SweepTrialRow,
    TraceRow,
    TrainingJobRow,
    TrialRow,
)
from orchestrator.store.records import StoredTrial
from orchestrator.sweep.planner import Trial
from workers.records import GenerationResult, RoundRecord

db_url = store_db.db_url
store = store_db.store


def _results(tokens_per_sample: int, seconds: float) -> list[GenerationResult]:
    """Two samples of ``tokens_per_sample`` tokens each, in rounds of 2 drafted, 1 accepted."""
    results = []
    for sample in range(2):
        rounds = [
            RoundRecord(2, 1, False, 2, 0.01, 0.02, mean_entropy=0.5, min_max_prob=0.4)
            for _ in range(tokens_per_sample // 2)
        ]
        results.append(
            GenerationResult(
                prompt_ids=[10 + sample, 11, 12],
                output_ids=list(range(tokens_per_sample)),
                rounds=rounds,
                seconds=seconds,
            )
        )
    return results


def _count(store: Store, model: type[Base], *conditions: object) -> int:
    with store.engine.connect() as connection:
        query = select(func.count()).select_from(model).where(*conditions)  # type: ignore[arg-type]
        return int(connection.scalar(query) or 0)


def _row(store: Store, trial: Trial) -> StoredTrial:
    return next(row for row in store.trials() if row.trial_id == trial.trial_id)


def test_migration_from_empty_matches_models(db_url: str) -> None:
    with open_store(db_url) as store:
        assert current_revision(store.engine) == head_revision()
        tables = set(inspect(store.engine).get_table_names())
        assert tables == {*Base.metadata.tables, "alembic_version"}
        with store.engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert differences == []
    with open_store(db_url) as again:
        assert current_revision(again.engine) == head_revision()


@pytest.mark.parametrize(
    ("record_type", "model"),
    [
        (records.StoredTrial, TrialRow),
        (records.StoredSample, SampleResultRow),
        (records.StoredRound, RoundRow),
        (records.StoredRun, RunRow),
        (records.StoredJob, TrainingJobRow),
        (records.StoredArtifact, ArtifactRow),
        (records.StoredCostFit, CostFitRow),
        (records.StoredTraces, TraceRow),
    ],
)
def test_records_mirror_their_tables_in_column_order(record_type: type, model: type[Base]) -> None:
    names = [field.name for field in dataclasses.fields(record_type)]
    assert names == [column.key for column in model.__table__.columns]
    assert record_type.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_migration_downgrades_to_empty_and_back(db_url: str) -> None:
    with open_store(db_url) as store:
        config = alembic_config()
        with store.engine.connect() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "base")
            connection.commit()
        assert set(inspect(store.engine).get_table_names()) <= {"alembic_version"}
        assert current_revision(store.engine) is None
    with open_store(db_url) as store:
        assert set(inspect(store.engine).get_table_names()) == {
            *Base.metadata.tables,
            "alembic_version",
        }


def test_replay_migration_keeps_every_row_both_ways(db_url: str) -> None:
    """0004 must not recreate ``trials``: on SQLite that cascade-deletes samples and links."""
    spec, plan = spec_and_plan()
    counts = {}
    with open_store(db_url) as store:
        store.register_sweep(spec, plan)
        results = _results(tokens_per_sample=6, seconds=1.5)
        store.record_trial(plan.trials[1], results, trial_metrics(results))
        store.record_cost_fit(_fit_values())
        tables = (TrialRow, SweepTrialRow, SampleResultRow, RoundRow)
        counts = {model: _count(store, model) for model in tables}
        assert all(counts.values())
        config = alembic_config()
        for target in ("0003", "head"):
            with store.engine.connect() as connection:
                config.attributes["connection"] = connection
                if target == "head":
                    command.upgrade(config, target)
                else:
                    command.downgrade(config, target)
                connection.commit()
            assert {model: _count(store, model) for model in tables} == counts
        assert {row.mode for row in store.trials("store")} == {"live"}
        assert store.cost_fits() == []


def test_prefill_decode_migration_keeps_rows_and_leaves_old_ones_without_a_split(
    db_url: str,
) -> None:
    """0008 adds nullable columns: a trial stored at 0007 reads back after the upgrade with its
    end-to-end figures and no decode-only ones; a downgrade drops them and keeps every row."""
    spec, plan = spec_and_plan()
    config = alembic_config()
    with open_store(db_url) as store:
        store.register_sweep(spec, plan)
        with store.engine.connect() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0007")
            connection.commit()
        assert "decode_seconds" not in {
            c["name"] for c in inspect(store.engine).get_columns("trials")
        }
        with store.engine.begin() as connection:  # a shard stored by the 0007 code
            trial_id = plan.trials[1].trial_id
            connection.exec_driver_sql(
                "UPDATE trials SET status = 'done', tokens_per_s = 8.0, speedup = 1.5 "
                f"WHERE trial_id = '{trial_id}'"
            )
            connection.exec_driver_sql(
                "INSERT INTO sample_results (trial_id, sample_index, prompt_id, prompt_len, "
                "generated_tokens, seconds, output_ids, drafted, accepted, n_rounds, "
                f"stopped_on_eos) VALUES ('{trial_id}', 0, 'p0', 3, 8, 1.0, '[]', 4, 2, 2, "
                "false)"
            )
    with open_store(db_url) as store:  # a writer migrates to head
        assert current_revision(store.engine) == head_revision()
        (row,) = store.trial_rows([trial_id])
        assert (row.tokens_per_s, row.speedup) == (8.0, 1.5)
        assert row.decode_tokens_per_s is None and row.decode_speedup is None
        (sample,) = store.sample_outputs(trial_id)
        assert sample.seconds == 1.0 and sample.decode_seconds is None
        assert store.trials_sample_speeds([trial_id])[trial_id][0].decode_seconds is None


def test_draft_kind_migration_gives_stored_rows_lm_and_new_trials_their_kind(
    db_url: str,
) -> None:
    """0011 adds ``trials.draft_kind``: a trial stored at 0009 reads back as ``lm`` after the
    upgrade, a lookup draft's trial is stored as ``ngram``, and a downgrade keeps every row."""
    spec, plan = spec_and_plan(
        SWEEP.replace("draft: zoo:micro/draft-s", "drafts: [zoo:micro/draft-s, {kind: ngram}]")
    )
    old = plan.trials[1]
    lookup = next(t for t in plan.trials if t.served.draft_kind == "ngram")
    config = alembic_config()
    with open_store(db_url) as store:
        with store.engine.connect() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0009")
            connection.commit()
        assert "draft_kind" not in {c["name"] for c in inspect(store.engine).get_columns("trials")}
        with store.engine.begin() as connection:  # a trial registered by the 0009 code
            connection.exec_driver_sql(
                "INSERT INTO trials (trial_id, pair, target, backend, tp_size, dtype, dataset, "
                "samples, max_new_tokens, temperature, top_k, top_p, policy, max_draft_len, "
                "seed, is_baseline, mode, code_version, params, config, status, attempts, "
                f"created_at) VALUES ('{old.trial_id}', 'demo', 't', 'hf', 1, 'float32', 'd', "
                "2, 8, 0.0, 0, 1.0, 'static', 4, 0, false, 'live', '2', '{}', '{}', "
                "'pending', 0, '2026-01-01 00:00:00')"
            )
    with open_store(db_url) as store:  # a writer migrates to head
        assert current_revision(store.engine) == head_revision()
        assert [row.draft_kind for row in store.trial_rows([old.trial_id])] == ["lm"]
        store.register_sweep(spec, plan)
        kinds = {row.trial_id: row.draft_kind for row in store.trials("store")}
        assert kinds[lookup.trial_id] == "ngram" and kinds[old.trial_id] == "lm"
        assert set(kinds.values()) == {"lm", "ngram"}
        with store.engine.connect() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0009")
            connection.commit()
        assert _count(store, TrialRow) == len(plan.trials)


def _fit_values() -> dict[str, object]:
    """Return a cost_fits row of made-up numbers."""
    return {
        "sweep": "store",
        "group_key": "g",
        "pair": "demo",
        "dataset": "builtin:code",
        "split": None,
        "samples": 2,
        "max_new_tokens": 8,
        "temperature": 0.0,
        "t_draft": 0.001,
        "t_target": 0.01,
        "t_per_verified": 0.0005,
        "r2_draft": 0.9,
        "r2_verify": 0.8,
        "r2_round": 0.95,
        "n_rounds": 10,
        "n_trials": 2,
        "overhead_seconds": 0.002,
    }


def test_cost_fits_replace_per_group_and_traces_store_once(store: Store) -> None:
    store.record_cost_fit(_fit_values())
    store.record_cost_fit({**_fit_values(), "t_draft": 0.002})
    store.record_cost_fit({**_fit_values(), "group_key": "h"})
    fits = store.cost_fits("store")
    assert [(f.group_key, f.t_draft) for f in fits] == [("g", 0.002), ("h", 0.001)]
    assert store.cost_fits("other") == []
    assert store.traces("k") is None
    assert store.record_traces("k", 4, [{"a": 1}, {"b": 2}], 1.5)
    assert not store.record_traces("k", 8, [], 0.0)
    stored = store.traces("k")
    assert stored is not None
    assert (stored.trace_key, stored.cap, stored.n_samples, stored.traces, stored.seconds) == (
        "k",
        4,
        2,
        [{"a": 1}, {"b": 2}],
        1.5,
    )


def test_default_url_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sub" / "env.db"
    monkeypatch.setenv("SPECSWEEP_DB", f"sqlite:///{path}")
    assert default_url() == f"sqlite:///{path}"
    with open_store() as store:
        assert store.trials() == []
    assert path.is_file()
    monkeypatch.delenv("SPECSWEEP_DB")
    assert default_url() == "sqlite:///results.db"


def test_register_sweep_stores_pending_trials_in_plan_order(store: Store) -> None:
    spec, plan = spec_and_plan()
    store.register_sweep(spec, plan)
    store.register_sweep(spec, plan)
    rows = store.trials("store")
    assert [row.trial_id for row in rows] == [t.trial_id for t in plan.trials]
    assert {row.status for row in rows} == {"pending"}
    assert _count(store, TrialRow) == len(plan.trials) == 1 + 2 + 20
    assert _count(store, TrainingJobRow, TrainingJobRow.status == "pending") == 1
    first = rows[1]
    trial = plan.trials[1]
    assert (first.policy, first.max_draft_len, first.baseline_id) == (
        trial.setting.policy,
        trial.setting.max_draft_len,
        plan.trials[0].trial_id,
    )
    assert store.sweeps()[0].n_trials == len(plan.trials)


def test_trials_shared_by_two_sweeps_are_stored_once(store: Store) -> None:
    spec, plan = spec_and_plan()
    small_spec, small_plan = spec_and_plan(
        SWEEP.replace("name: store", "name: small").replace(
            "max_draft_lens: [4, 8]", "max_draft_lens: [4]"
        )
    )
    store.register_sweep(spec, plan)
    store.register_sweep(small_spec, small_plan)
    assert _count(store, TrialRow) == len(plan.trials)
    assert len(store.trials("small")) == len(small_plan.trials) == 1 + 1 + 10
    assert {s.name: s.n_trials for s in store.sweeps()} == {
        "store": len(plan.trials),
        "small": len(small_plan.trials),
    }
    store.register_sweep(spec, small_plan)  # re-registering replaces the membership
    assert len(store.trials("store")) == len(small_plan.trials)
    assert _count(store, SweepTrialRow) == 2 * len(small_plan.trials)


def test_record_trial_once_with_samples_and_rounds(store: Store) -> None:
    spec, plan = spec_and_plan()
    store.register_sweep(spec, plan)
    trial = plan.trials[1]
    results = _results(tokens_per_sample=6, seconds=1.5)
    assert store.mark_running(trial)
    assert store.record_trial(trial, results, trial_metrics(results))
    assert not store.record_trial(trial, results, trial_metrics(results))
    assert not store.mark_running(trial)
    row = _row(store, trial)
    assert row.status == "done" and row.attempts == 1
    assert row.generated_tokens == 12
    assert row.tokens_per_s == pytest.approx(12 / 3.0)
    assert row.acceptance_rate == pytest.approx(0.5)
    assert row.verification_rate == pytest.approx(6 / 12)
    assert row.metrics["draft_length_histogram"] == {"2": 6}
    assert _count(store, SampleResultRow) == 2
    assert _count(store, RoundRow) == 2 * 3
    assert _count(store, RoundRow, RoundRow.sample_index == 1, RoundRow.round_index == 2) == 1
    assert store.completed_trial_ids(t.trial_id for t in plan.trials) == {trial.trial_id}


def test_record_trial_without_rounds(store: Store) -> None:
    _, plan = spec_and_plan()
    trial = plan.trials[2]
    results = _results(tokens_per_sample=4, seconds=1.0)
    assert store.record_trial(trial, results, trial_metrics(results), record_rounds=False)
    assert _count(store, SampleResultRow) == 2
    assert _count(store, RoundRow) == 0
    assert _row(store, trial).status == "done"


def test_samples_keep_dataset_prompt_ids_and_texts(store: Store) -> None:
    _, plan = spec_and_plan()
    results = _results(tokens_per_sample=2, seconds=1.0)
    metrics = trial_metrics(results)
    with pytest.raises(ValueError, match="prompt_ids has 1 entries for 2 results"):
        store.record_trial(plan.trials[0], results, metrics, prompt_ids=["only-one"])
    ids, texts = ["builtin:code:a.f", "builtin:code:b.g"], ["def f():", "def g():"]
    store.record_trial(plan.trials[0], results, metrics, prompt_ids=ids, output_texts=texts)
    store.record_trial(plan.trials[1], results, metrics)
    with store.engine.connect() as connection:
        query = select(
            SampleResultRow.trial_id, SampleResultRow.prompt_id, SampleResultRow.output_text
        ).order_by(SampleResultRow.id)
        rows = [tuple(row) for row in connection.execute(query)]
    first, second = plan.trials[0].trial_id, plan.trials[1].trial_id
    assert rows == [
        (first, ids[0], texts[0]),
        (first, ids[1], texts[1]),
        (second, prompt_id([10, 11, 12]), None),
        (second, prompt_id([11, 11, 12]), None),
    ]


def test_sample_prompt_ids_identify_prompts() -> None:
    expected = hashlib.sha256(b"[10,11,12]").hexdigest()[:16]
    assert prompt_id([10, 11, 12]) == expected
    assert prompt_id((10, 11, 12)) == expected
    assert prompt_id([10, 11]) != expected


def test_speedup_against_the_baseline_in_either_order(store: Store) -> None:
    spec, plan = spec_and_plan()
    store.register_sweep(spec, plan)
    baseline, first, second = plan.trials[0], plan.trials[1], plan.trials[2]
    fast = _results(tokens_per_sample=6, seconds=1.0)  # 12 tokens / 2 s = 6 tokens/s
    slow = _results(tokens_per_sample=6, seconds=3.0)  # 12 tokens / 6 s = 2 tokens/s
    store.record_trial(first, fast, trial_metrics(fast))
    assert _row(store, first).speedup is None
    store.record_trial(baseline, slow, trial_metrics(slow))
    assert _row(store, first).speedup == pytest.approx(3.0)
    assert _row(store, baseline).speedup == pytest.approx(1.0)
    store.record_trial(second, slow, trial_metrics(slow))
    assert _row(store, second).speedup == pytest.approx(1.0)
    with store.engine.begin() as connection:
        connection.execute(TrialRow.__table__.update().values(speedup=None))
    assert store.refresh_speedups("store") == 3
    assert _row(store, first).speedup == pytest.approx(3.0)
    assert store.refresh_speedups("no-such-sweep") == 0


def test_failure_then_retry_then_success(store: Store) -> None:
    spec, plan = spec_and_plan()
    store.register_sweep(spec, plan)
    trial = plan.trials[3]
    assert store.mark_running(trial)
    assert store.record_failure(trial, "RuntimeError: out of memory")
    row = _row(store, trial)
    assert (row.status, row.attempts, row.error) == (
        "failed",
        1,
        "RuntimeError: out of memory",
    )
    assert store.mark_running(trial)
    assert _row(store, trial).attempts == 2
    results = _results(tokens_per_sample=2, seconds=1.0)
    assert store.record_trial(trial, results, trial_metrics(results))
    assert not store.record_failure(trial, "late failure", attempts=5)
    row = _row(store, trial)
    assert (row.status, row.attempts, row.error) == ("done", 2, None)
    assert store.completed_trial_ids([trial.trial_id, "unknown"]) == {trial.trial_id}


def test_training_jobs_and_artifacts(store: Store) -> None:
    spec, plan = spec_and_plan()
    store.register_sweep(spec, plan)
    (job,) = plan.jobs
    store.record_training_job(job, "running", attempts=1)
    assert store.completed_job_ids([job.job_id]) == set()
    store.record_training_job(job, "done", metrics={"loss": 0.5}, seconds=12.0)
    assert store.completed_job_ids([job.job_id, "other"]) == {job.job_id}
    store.record_artifact(job.job_id, "specdecpp_head", "/runs/head.pt")
    store.record_artifact(job.job_id, "specdecpp_head", "/runs/head.pt")
    assert [(a.kind, a.path) for a in store.artifacts(job.job_id)] == [
        ("specdecpp_head", "/runs/head.pt")
    ]
    assert _count(store, ArtifactRow) == 1
    with store.engine.connect() as connection:
        row = connection.execute(select(TrainingJobRow)).one()
    assert (row.status, row.attempts, row.metrics, row.seconds) == ("done", 1, {"loss": 0.5}, 12.0)
    assert row.config["base"] == "zoo:micro/draft-s"


def test_read_only_store_reads_and_rejects_writes(db_url: str) -> None:
    spec, plan = spec_and_plan()
    with open_store(db_url) as writer:
        writer.register_sweep(spec, plan)
    with open_store(db_url, read_only=True) as reader:
        assert len(reader.trials("store")) == len(plan.trials)
        with pytest.raises(DBAPIError):
            reader.mark_running(plan.trials[0])
        with pytest.raises(DBAPIError):
            reader.register_sweep(spec, plan)
        results = _results(tokens_per_sample=2, seconds=1.0)
        with pytest.raises(DBAPIError):
            reader.record_trial(plan.trials[0], results, trial_metrics(results))
        assert {row.status for row in reader.trials()} == {"pending"}
        assert _count(reader, SampleResultRow) == 0


def test_read_only_needs_an_existing_migrated_sqlite_store(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(StoreError, match="no store"):
        open_store(f"sqlite:///{missing}", read_only=True)
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).execute("CREATE TABLE unrelated (x INTEGER)").connection.close()
    with pytest.raises(StoreError, match="never opened by a writer"):
        open_store(f"sqlite:///{empty}", read_only=True)


def test_concurrent_writers_lose_no_rows(db_url: str) -> None:
    spec, plan = spec_and_plan()
    trials = list(plan.trials)
    results = _results(tokens_per_sample=4, seconds=1.0)
    metrics = trial_metrics(results)
    start = threading.Barrier(2)
    written: list[int] = []
    errors: list[BaseException] = []

    def writer(order: list[Trial]) -> None:
        try:
            start.wait()
            with open_store(db_url) as store:  # both migrate the fresh database at once
                store.register_sweep(spec, plan)
                count = 0
                for trial in order:
                    store.mark_running(trial)
                    count += store.record_trial(trial, results, metrics)
                written.append(count)
        except BaseException as error:  # reported below with the thread's traceback
            errors.append(error)

    threads = [
        threading.Thread(target=writer, args=(trials,)),
        threading.Thread(target=writer, args=(trials[::-1],)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert sum(written) == len(trials)
    with open_store(db_url) as store:
        assert _count(store, TrialRow, TrialRow.status == "done") == len(trials)
        assert _count(store, SampleResultRow) == 2 * len(trials)
        assert _count(store, RoundRow) == 2 * 2 * len(trials)
        assert _count(store, SweepTrialRow) == len(trials)
        rows = store.trials("store")
        assert all(row.attempts in (1, 2) for row in rows)


def test_a_writer_opens_a_fresh_sqlite_database_while_another_holds_its_write_lock(
    tmp_path: Path,
) -> None:
    # In rollback-journal mode SQLite refuses the switch to WAL at once ("database is
    # locked", no busy wait) while another connection holds a write lock: what two processes
    # opening a fresh database together run into.
    path = tmp_path / "fresh.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE held (x INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO held VALUES (1)")
    release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        with open_store(f"sqlite:///{path}") as store:
            assert store.engine.dialect.name == "sqlite"
    finally:
        release.join()
        holder.close()
    with closing(sqlite3.connect(path)) as reader:
        assert reader.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_the_shared_column_lists_name_trials_columns_and_metrics_fields() -> None:
    from dataclasses import fields

    from orchestrator.analysis.metrics import TrialMetrics
    from orchestrator.store.models import (
        HEADLINE_METRICS,
        INTERVAL_COLUMNS,
        TRIAL_METRIC_COLUMNS,
        TrialRow,
    )

    columns = {column.key for column in TrialRow.__table__.columns}
    assert set(TRIAL_METRIC_COLUMNS) | set(HEADLINE_METRICS) | set(INTERVAL_COLUMNS) <= columns
    metric_fields = {field.name for field in fields(TrialMetrics)}
    assert set(TRIAL_METRIC_COLUMNS) <= metric_fields
    # the speedups are the store's (they divide by the baseline), every other headline is measured
    assert set(HEADLINE_METRICS) - metric_fields == {"speedup", "decode_speedup"}


def test_display_url_hides_the_password_and_fills_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestrator.store import display_url

    shown = display_url("postgresql://alice:secret@db.example/specsweep")
    assert "secret" not in shown and "alice" in shown
    monkeypatch.setenv("SPECSWEEP_DB", "sqlite:///elsewhere.db")
    assert display_url(None) == "sqlite:///elsewhere.db"
    assert display_url("not a url") == "not a url"
