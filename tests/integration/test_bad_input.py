"""Bad input is refused before anything runs: malformed sweep files and failing preflight checks.

A hypothesis corpus mutates one thing in a valid sweep (a wrong type, an unknown key, an empty
list, a negative or absurd number, a YAML syntax error). Each file must give exactly one problem,
``FILE:LINE: field.path: message``, naming the mutated field on the line where it is written;
``submit`` must exit 2 and leave the database as it was (not created, or byte-identical).
An alias bomb or a recursive alias is refused the same way, at its line, without expanding it.
Preflight problems (a missing model, a draft with another tokenizer, a dataset that cannot be
loaded or has fewer rows than ``samples``, an output that does not fit a model's context) must
also exit 2 before any trial runs, with no trial row written.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
import string
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.paths import TEST_DATA

from orchestrator import cli
from orchestrator.cli.common import EXIT_USER_ERROR
from orchestrator.run.preflight import PreflightError, preflight_inputs
from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import MAX_GRID_TRIALS, SweepError, load_sweep, parse_sweep

#: A valid sweep; validation is pure, so its zoo references are never resolved here.
VALID: dict[str, Any] = {
    "name": "bad-input",
    "pairs": [
        {
            "name": "micro",
            "target": {"model": "zoo:micro/target", "tp_size": 1, "gpus": 0.0},
            "draft": {"model": "zoo:micro/draft-s"},
        }
    ],
    "datasets": [{"name": "builtin:code", "samples": 2, "max_new_tokens": 12}],
    "temperatures": [0.0, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}],
    "policies": [
        {"name": "static"},
        {"name": "svip", "grid": {"threshold": [0.3, 0.5]}},
        {"name": "adaedl", "params": {"threshold": 0.5}},
    ],
    "max_draft_lens": [4],
    "seeds": [0],
    "execution": {"retries": 1, "warmup_samples": 1, "record_rounds": True},
}
KINDS = ("wrong_type", "unknown_key", "empty", "negative", "absurd", "yaml_syntax")
MALFORMED_EXAMPLES = 200
#: Member tags of a policy parameter's union type (see ``_strip_union_tag``).
UNION_TAGS = frozenset({"bool", "int", "float", "str", "none"})

Path_ = tuple[str | int, ...]

#: Fields and the kind of value each takes (shorthand forms excluded: a pair's target may be a
#: bare string, a temperature a bare number, a dataset a bare name).
TYPED_FIELDS: dict[Path_, str] = {
    ("name",): "string",
    ("pairs", 0, "name"): "string",
    ("pairs", 0, "target", "model"): "string",
    ("pairs", 0, "target", "tp_size"): "integer",
    ("pairs", 0, "target"): "mapping",
    ("datasets", 0, "samples"): "integer",
    ("datasets", 0, "max_new_tokens"): "integer",
    ("temperatures", 1, "top_k"): "integer",
    ("policies", 1, "grid", "threshold"): "list",
    ("policies", 2, "params", "threshold"): "number",
    ("max_draft_lens",): "list",
    ("max_draft_lens", 0): "integer",
    ("seeds", 0): "integer",
    ("execution",): "mapping",
    ("execution", "retries"): "integer",
    ("execution", "record_rounds"): "boolean",
}
#: Mappings an unknown key can be added to (in ``params``/``grid`` it is an unknown parameter).
MAPPINGS: tuple[Path_, ...] = (
    (),
    ("pairs", 0),
    ("pairs", 0, "target"),
    ("pairs", 0, "draft"),
    ("datasets", 0),
    ("temperatures", 1),
    ("policies", 1),
    ("policies", 2, "params"),
    ("policies", 1, "grid"),
    ("execution",),
)
LISTS: tuple[Path_, ...] = (
    ("pairs",),
    ("datasets",),
    ("temperatures",),
    ("policies",),
    ("max_draft_lens",),
    ("seeds",),
    ("policies", 1, "grid", "threshold"),
)
#: Numeric fields, whether they are integers, and their lower and upper limits.
BOUNDED: dict[Path_, tuple[bool, float, float | None]] = {
    ("pairs", 0, "target", "tp_size"): (True, 1, 64),
    ("pairs", 0, "target", "gpus"): (False, 0, 64),
    ("datasets", 0, "samples"): (True, 1, 1_000_000),
    ("datasets", 0, "max_new_tokens"): (True, 1, 100_000),
    ("temperatures", 1, "temperature"): (False, 0, None),
    ("temperatures", 1, "top_k"): (True, 0, None),
    ("policies", 2, "params", "threshold"): (False, 0, None),
    ("policies", 1, "grid", "threshold", 1): (False, 0, None),
    ("max_draft_lens", 0): (True, 1, 128),
    ("seeds", 0): (True, 0, 2**32 - 1),
    ("execution", "retries"): (True, 0, 100),
    ("execution", "warmup_samples"): (True, 0, 1000),
}
#: Lines YAML cannot parse; the reported line is the inserted one (or the next, for an
#: unclosed flow collection, or the end, for an unterminated quote).
BROKEN_LINES = {
    "tab": (None, 0),
    "mapping in a value": ("zz_key: a: b", 0),
    "unclosed list": ("zz_key: [1, 2", 1),
    "unclosed mapping": ("zz_key: {a: 1", 1),
    "unterminated quote": ('description: "no end', None),
    "duplicate key": ("name: again", 0),
}
WORD = st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=10)
#: Text no field parses as a number or boolean (YAML 1.1 and pydantic spellings excluded).
NON_NUMERIC = WORD.filter(
    lambda word: (
        word not in {"inf", "infinity", "nan", "true", "false", "yes", "no", "on", "off"}
        and word not in {"y", "n", "t", "f", "null"}
    )
)


@dataclass(frozen=True)
class Malformed:
    """One malformed sweep: its text, and where the single problem must point.

    ``path`` is the field path the message must start with; ``line`` the exact line, or
    ``line_text`` a text the reported line must contain (``min_line``: at or after that line).
    """

    kind: str
    text: str
    path: str
    line: int | None = None
    line_text: str | None = None
    min_line: int = 1


def format_path(path: Path_) -> str:
    """Return ``pairs[0].target`` for ``("pairs", 0, "target")``, ``(root)`` for ``()``."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
    return text.lstrip(".") or "(root)"


def _set(sweep: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    """Return a copy of ``sweep`` with ``value`` at ``path`` (created when missing)."""
    copied = copy.deepcopy(sweep)
    node: Any = copied
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return copied


def _dump(sweep: dict[str, Any]) -> str:
    return yaml.safe_dump(sweep, sort_keys=False, width=10_000)


def _scalar_text(value: Any) -> str:
    """Return how YAML writes a scalar (the text its line must contain)."""
    return yaml.safe_dump(value).splitlines()[0]


def _at(kind: str, path: Path_, value: Any, sweep: dict[str, Any] = VALID) -> Malformed:
    """A sweep with ``value`` at ``path``: the problem is on the line that writes that field."""
    last = path[-1]
    scalar = not isinstance(value, dict | list) or value == []
    line_text = _scalar_text(value) if isinstance(last, int) and scalar else f"{last}:"
    if isinstance(last, int) and not scalar:
        line_text = "- "
    return Malformed(kind, _dump(_set(sweep, path, value)), format_path(path), line_text=line_text)


@st.composite
def wrong_types(draw: st.DrawFn) -> Malformed:
    path, expected = draw(st.sampled_from(sorted(TYPED_FIELDS.items(), key=str)))
    integers = st.integers(-(10**6), 10**6)
    lists = st.lists(integers, min_size=1, max_size=3)
    mappings = st.dictionaries(WORD, integers, min_size=1, max_size=2)
    bad = {
        "string": st.one_of(integers, lists, mappings, st.booleans()),
        "integer": st.one_of(NON_NUMERIC, lists, mappings),
        "number": st.one_of(NON_NUMERIC, lists, mappings, st.booleans()),
        "boolean": st.one_of(lists, mappings),
        "list": st.one_of(integers, mappings),
        "mapping": st.one_of(integers, lists),
    }[expected]
    return _at("wrong_type", path, draw(bad))


@st.composite
def unknown_keys(draw: st.DrawFn) -> Malformed:
    where = draw(st.sampled_from(MAPPINGS))
    key = "zz_" + draw(WORD)
    if where[-1:] == ("grid",):
        # Reported at the value (``grid.KEY[0]``, once per value), so give it one value.
        case = _at("unknown_key", (*where, key), [0.5])
        return replace(case, line_text="- 0.5")
    value = draw(st.one_of(st.integers(0, 9), WORD, st.booleans()))
    return _at("unknown_key", (*where, key), value)


@st.composite
def empty_lists(draw: st.DrawFn) -> Malformed:
    return _at("empty", draw(st.sampled_from(LISTS)), [])


@st.composite
def negatives(draw: st.DrawFn) -> Malformed:
    path, (integer, low, _high) = draw(st.sampled_from(sorted(BOUNDED.items(), key=str)))
    if integer:
        value: float = draw(st.integers(-(10**12), int(low) - 1))
    else:
        value = draw(st.floats(-1e12, -1e-9, allow_nan=False, allow_infinity=False))
    return _at("negative", path, value)


@st.composite
def absurd_sizes(draw: st.DrawFn) -> Malformed:
    bounded = [(path, bounds) for path, bounds in BOUNDED.items() if bounds[2] is not None]
    choices = [*sorted(bounded, key=str), "grid"]
    choice = draw(st.sampled_from(choices))
    if choice == "grid":
        # 2 temperatures x 4 policy settings x 128 draft lengths x k seeds > the trial limit:
        # one problem, at the root (no single field is wrong, their product is).
        k = draw(st.integers(MAX_GRID_TRIALS // 1024 + 1, 3 * MAX_GRID_TRIALS // 1024))
        sweep = _set(VALID, ("max_draft_lens",), list(range(1, 129)))
        sweep = _set(sweep, ("seeds",), list(range(k)))
        return Malformed("absurd", _dump(sweep), "(root)", line=1)
    path, (integer, _low, high) = choice
    assert high is not None
    if integer:
        value: float = draw(st.integers(int(high) + 1, 10**30))
    else:
        value = draw(st.floats(high * 1.001, 1e300, allow_nan=False, allow_infinity=False))
    return _at("absurd", path, value)


@st.composite
def yaml_syntax_errors(draw: st.DrawFn) -> Malformed:
    lines = _dump(VALID).splitlines()
    what = draw(st.sampled_from(sorted(BROKEN_LINES)))
    inserted, offset = BROKEN_LINES[what]
    if inserted is None:  # a tab in the indentation of an indented line
        indented = [i for i, line in enumerate(lines) if line.startswith(" ")]
        index = draw(st.sampled_from(indented))
        lines[index] = "\t" + lines[index].lstrip(" ")
    else:  # a new top-level line, inserted before another top-level key
        tops = [i for i, line in enumerate(lines) if line[:1].isalpha()]
        index = draw(st.sampled_from(tops[1:] if what == "duplicate key" else tops))
        lines.insert(index, inserted)
    text = "\n".join(lines) + "\n"
    if offset is None:  # reported at the end of the stream
        return Malformed("yaml_syntax", text, "(yaml)", min_line=index + 1)
    return Malformed("yaml_syntax", text, "(yaml)", line=index + 1 + offset)


MALFORMED = st.one_of(
    wrong_types(), unknown_keys(), empty_lists(), negatives(), absurd_sizes(), yaml_syntax_errors()
)


def _locate(problem: str, sweep_file: Path) -> tuple[int, str]:
    """Return (line, field path) of a ``FILE:LINE: field.path: message`` problem."""
    match = re.fullmatch(rf"{re.escape(str(sweep_file))}:(\d+): (\S+): (.+)", problem)
    assert match is not None, problem
    return int(match[1]), match[2]


def _strip_union_tag(path: str) -> str:
    """Drop the member tag pydantic appends to a union-typed field's path (``.int``, ...).

    A policy parameter is a union (bool | int | float | str | None), so a list given for one
    fails every member and pydantic reports one message per member, all on the same field.
    """
    head, _, tag = path.rpartition(".")
    return head if head and tag in UNION_TAGS else path


def _files(directory: Path) -> dict[str, str]:
    """Return {file name: sha256} of everything in ``directory`` (a database and its WAL)."""
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


def test_valid_sweep_is_accepted() -> None:
    """The corpus's base is valid, so each problem below comes from its one mutation."""
    assert parse_sweep(_dump(VALID)).name == "bad-input"


def test_malformed_sweeps_give_one_located_error_exit_2_and_leave_the_db_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    url = f"sqlite:///{existing / 'results.db'}"
    spec = parse_sweep(_dump(VALID))
    with open_store(url) as store:
        store.register_sweep(spec, plan_sweep(spec))
    existing_files = _files(existing)
    absent = tmp_path / "absent"
    absent.mkdir()
    sweep_file = tmp_path / "sweep.yaml"
    tried: Counter[str] = Counter()
    several_messages: Counter[str] = Counter()

    @settings(
        max_examples=MALFORMED_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=MALFORMED)
    def check(case: Malformed) -> None:
        tried[case.kind] += 1
        sweep_file.write_text(case.text, encoding="utf-8")
        with pytest.raises(SweepError) as caught:
            load_sweep(sweep_file)
        problems = caught.value.problems
        located = [_locate(problem, sweep_file) for problem in problems]
        assert len({(line, _strip_union_tag(path)) for line, path in located}) == 1, problems
        several_messages[case.kind] += len(problems) > 1
        problem = problems[0]
        line, path = located[0]
        path = _strip_union_tag(path)
        assert path == case.path or path.startswith((case.path + ".", case.path + "[")), (
            case,
            problem,
        )
        assert case.min_line <= line <= len(case.text.splitlines()) + 1, (case, problem)
        if case.line is not None:
            assert line == case.line, (case, problem)
        if case.line_text is not None:
            assert case.line_text in case.text.splitlines()[line - 1], (case, problem)

        for db_dir in (absent, existing):
            args = ["--db", f"sqlite:///{db_dir / 'results.db'}", "submit", str(sweep_file)]
            assert cli.main(args) == EXIT_USER_ERROR
            err = capsys.readouterr().err
            assert all(p in err for p in problems) and "Traceback" not in err, err
        assert list(absent.iterdir()) == []
        assert _files(existing) == existing_files

    check()
    with capsys.disabled():
        print(
            f"\n[bad-input] {sum(tried.values())} malformed sweep files tried: {dict(tried)}; "
            f"files whose one bad field got several messages: {dict(several_messages)}"
        )
    assert set(tried) == set(KINDS)


#: Each level lists ten aliases of the level before: 10^9 values once expanded.
ALIAS_BOMB = "".join(
    f"l{level}: &l{level} [{', '.join([f'*l{level - 1}' if level else 'x'] * 10)}]\n"
    for level in range(9)
)


@pytest.mark.parametrize(
    ("case", "text", "expected"),
    [
        ("bomb", ALIAS_BOMB, ": aliases expand the file to more than"),
        ("recursive", "loop: &x [1, [2, *x]]\n", ": alias *x is inside the node &x it names"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "submit"])
def test_alias_bomb_and_recursive_alias_exit_2_at_their_line(
    command: str, case: str, text: str, expected: str, tmp_path: Path
) -> None:
    """In a subprocess with a deadline, so a regression fails instead of hanging the suite."""
    sweep_file = tmp_path / "sweep.yaml"
    head = _dump(VALID)
    sweep_file.write_text(head + text, encoding="utf-8")
    first_line = len(head.splitlines()) + 1
    db = tmp_path / "results.db"
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--db", f"sqlite:///{db}", command, str(sweep_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-2000:]
    match = re.search(rf"{re.escape(str(sweep_file))}:(\d+): \(yaml\)(.*)", result.stderr)
    assert match is not None and expected in match[2], result.stderr[-2000:]
    assert first_line <= int(match[1]) < first_line + text.count("\n")
    assert "Traceback" not in result.stderr
    assert not db.exists()


# ---------------------------------------------------------------------------------------------
# Preflight: the file is valid, but what it names cannot be used
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def zoo_env(micro_zoo: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point zoo references at the session's micro zoo."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    return micro_zoo


@pytest.fixture
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the Hugging Face Hub unreachable, also for modules that read the setting already."""
    import datasets.config
    import huggingface_hub.constants

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")
        monkeypatch.setattr(datasets.config, name, True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("SPECSWEEP_DATA_GSM8K", raising=False)


def _other_tokenizer_draft(zoo: Any, directory: Path) -> Path:
    """Save the micro draft with a tokenizer that has one extra token (a different vocabulary)."""
    from transformers import AutoTokenizer

    from workers.lm import load_causal_lm

    load_causal_lm(zoo.model_path("draft-xs")).save_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(zoo.model_path("draft-xs"))
    tokenizer.add_tokens(["<not-in-the-target>"])
    tokenizer.save_pretrained(directory)
    return directory


def _short_context_draft(zoo: Any, directory: Path, positions: int) -> Path:
    """Copy the micro draft with ``max_position_embeddings`` lowered to ``positions``."""
    shutil.copytree(zoo.model_path("draft-xs"), directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(
        json.dumps({**config, "max_position_embeddings": positions})
    )
    return directory


GSM8K_ROWS = TEST_DATA / "hub" / "gsm8k.jsonl"
PREFLIGHT_CASES = (
    "missing model",
    "tokenizer mismatch",
    "dataset unavailable",
    "output beyond the target's context",
    "output beyond the draft's context",
    "fewer rows than samples",
)


def _preflight_case(case: str, zoo: Any, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """Return a valid sweep whose ``case`` preflight must refuse, and a part of the message."""
    sweep = copy.deepcopy(VALID)
    if case == "missing model":
        missing = tmp_path / "no-such-model"
        sweep["pairs"][0]["draft"] = {"model": str(missing)}
        expected = f"pairs[0].draft.model: {str(missing)!r} is not a model directory"
    elif case == "tokenizer mismatch":
        draft = _other_tokenizer_draft(zoo, tmp_path / "other-tokenizer")
        sweep["pairs"][0]["draft"] = {"model": str(draft)}
        expected = "pairs[0]: the draft's tokenizer"
    elif case == "dataset unavailable":
        sweep["datasets"] = [{"name": "gsm8k", "samples": 2, "max_new_tokens": 12}]
        expected = "dataset gsm8k: dataset 'gsm8k' ('openai/gsm8k'"
    elif case == "output beyond the target's context":
        sweep["datasets"][0]["max_new_tokens"] = 100_000
        expected = (
            "datasets[0].max_new_tokens: 100000 does not fit the context of pair micro's target "
            "zoo:micro/target (max_position_embeddings = 2048)"
        )
    elif case == "output beyond the draft's context":
        draft = _short_context_draft(zoo, tmp_path / "short-draft", 20)
        sweep["pairs"][0]["draft"] = {"model": str(draft)}
        expected = (
            f"datasets[0].max_new_tokens: 12 does not fit the context of pair micro's draft "
            f"{draft} (max_position_embeddings = 20): 12 new tokens + 5 for the largest verify "
            "block (max_draft_len 4 + 1) + at least 8 prompt tokens need 25 positions; lower "
            "max_new_tokens to at most 7"
        )
    else:
        rows = len(GSM8K_ROWS.read_text().splitlines())
        sweep["datasets"] = [
            {
                "name": "gsm8k",
                "samples": rows + 1,
                "max_new_tokens": 12,
                "local_path": str(GSM8K_ROWS),
            }
        ]
        expected = (
            f"datasets[0].samples: {rows + 1} but the local file {GSM8K_ROWS} has only {rows} "
            f"rows; lower samples to {rows} or give a file with more rows"
        )
    return sweep, expected


@pytest.mark.parametrize("case", PREFLIGHT_CASES)
def test_preflight_inputs_names_each_problem(
    case: str, zoo_env: Any, hub_offline: None, tmp_path: Path
) -> None:
    """The check itself, without the CLI (a missed check fails here instead of running)."""
    sweep, expected = _preflight_case(case, zoo_env, tmp_path)
    spec = parse_sweep(_dump(sweep))
    with pytest.raises(PreflightError) as caught:
        preflight_inputs(spec, plan_sweep(spec))
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


@pytest.mark.parametrize("case", PREFLIGHT_CASES)
@pytest.mark.parametrize("db_exists", [False, True], ids=["no-db", "existing-db"])
def test_preflight_refuses_before_any_trial_runs(
    case: str,
    db_exists: bool,
    zoo_env: Any,
    hub_offline: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    import ray

    sweep, expected = _preflight_case(case, zoo_env, tmp_path)
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(_dump(sweep))
    db_dir = tmp_path / "db"
    db_dir.mkdir()
    url = f"sqlite:///{db_dir / 'results.db'}"
    if db_exists:
        other = parse_sweep(_dump({**VALID, "name": "already-there"}))
        with open_store(url) as store:
            store.register_sweep(other, plan_sweep(other))
    before = _files(db_dir)

    assert cli.main(["--db", url, "submit", str(sweep_file), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"error: preflight failed for {sweep_file}; nothing was run:" in err
    assert expected in err, err
    assert "Traceback" not in err
    assert not ray.is_initialized()  # refused before the runner connected to Ray
    assert _files(db_dir) == before  # no database created, or the existing one untouched
    if db_exists:
        with open_store(url, read_only=True) as store:
            assert {row.name for row in store.sweeps()} == {"already-there"}
            assert all(row.status == "pending" for row in store.trials())


def test_preflight_lists_every_problem_at_once(
    zoo_env: Any, hub_offline: None, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = copy.deepcopy(VALID)
    sweep["pairs"][0]["target"]["model"] = str(tmp_path / "no-target")
    sweep["datasets"].append({"name": "gsm8k", "samples": 2, "max_new_tokens": 12})
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(json.dumps(sweep))  # JSON is YAML too
    assert cli.main(["--db", f"sqlite:///{tmp_path / 'r.db'}", "submit", str(sweep_file)]) == 2
    problems = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  ")]
    assert [p.split(":")[0].strip() for p in problems] == ["pairs[0].target.model", "dataset gsm8k"]
    assert not (tmp_path / "r.db").exists()
