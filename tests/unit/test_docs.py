"""The documentation against the code: commands, sweep snippets, the sweep-file reference, links.

README.md, docs/guide/*.md and docs/lab/README.md show commands and YAML: each orchestrator
command must parse and its `--help` name every flag the example uses (the training and bench
commands' `--help`, a subprocess importing the heavy frameworks, is checked in
tests/integration/test_doc_script_commands.py), and each YAML block must pass the real loader.
The sweep-file reference (docs/guide/sweep-files.md) has one table per spec model, field names in
backticks in the first column; the tables must list exactly the spec's fields, so a field added
to the spec fails here until it is documented. Nothing in the repository may point outside it.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import tomllib
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from support.doc_examples import (
    GUIDE,
    README,
    CodeBlock,
    code_blocks,
    documented_commands,
    guide_files,
    markdown_files,
)
from support.paths import REPO

from orchestrator.cli import build_parser
from orchestrator.sweep.spec import SweepSpec, parse_sweep
from policies import POLICIES, policy_parameters
from training.__main__ import load_job_config

SWEEP_REFERENCE = GUIDE / "sweep-files.md"
TEST_COMMAND = "bash scripts/setup.sh && .venv/bin/python -m pytest -n 2 --dist loadfile"
README_MAX_LINES = 250
#: Paths outside the repository that documents once pointed to (split so this file is clean).
OUTSIDE_PATHS = ("../" + "shared", "shared/" + "design.md", "shared/" + "methods.md")
#: Sweep every YAML fragment (top-level keys of a sweep) is merged into before validation.
MINIMAL_SWEEP = {
    "name": "docs-fragment",
    "pairs": [{"name": "micro", "target": "zoo:micro/target", "draft": "zoo:micro/draft-m"}],
    "datasets": ["builtin:code"],
    "temperatures": [0.0],
    "policies": [{"name": "static"}],
    "max_draft_lens": [4],
}
#: First line of a YAML block that is a `python -m training KIND` config, not a sweep.
JOB_CONFIG_MARK = re.compile(r"^# python -m training (\w+) config$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def orchestrator_help(args: list[str]) -> str:
    """Return the help text ``python -m orchestrator ARGS --help`` prints (exit 0 asserted)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*args, "--help"])
    assert exited.value.code == 0, f"--help of {args} exited {exited.value.code}"
    return out.getvalue()


def test_docs_show_the_commands_checked_here() -> None:
    programs = {command.program for command in documented_commands()}
    assert {"orchestrator", "training", "bench/engine.py", "bench/actors.py"} <= programs


def test_orchestrator_commands_in_the_docs_parse_and_their_flags_exist() -> None:
    commands = [c for c in documented_commands() if c.program == "orchestrator"]
    assert len(commands) >= 10
    for command in commands:
        args = list(command.args)
        try:
            build_parser().parse_args(args)
        except SystemExit as exited:
            pytest.fail(
                f"{command.source.relative_to(REPO)}: `python -m orchestrator {shlex.join(args)}` "
                f"does not parse (exit {exited.code})"
            )
        help_text = orchestrator_help(args)
        for flag in command.flags():
            assert flag in help_text, (
                f"{command.source.relative_to(REPO)}: {flag} not in {args[0]}'s help"
            )
        for arg in args:
            if arg.startswith("sweeps/") and arg.endswith(".yaml"):
                assert (REPO / arg).is_file(), (
                    f"{command.source.relative_to(REPO)}: no such sweep {arg}"
                )


def yaml_blocks() -> list[CodeBlock]:
    """Return the YAML blocks of the README and the guide."""
    return [block for path in guide_files() for block in code_blocks(path) if block.lang == "yaml"]


def test_every_yaml_block_in_the_docs_passes_the_real_loader(tmp_path: Path) -> None:
    blocks = yaml_blocks()
    assert len(blocks) >= 3
    for index, block in enumerate(blocks):
        first_line = block.text.splitlines()[0]
        job = JOB_CONFIG_MARK.match(first_line)
        if job:
            config = tmp_path / f"job-{index}.yaml"
            config.write_text(block.text)
            assert load_job_config(job.group(1), config).kind == job.group(1)
            continue
        data = yaml.safe_load(block.text)
        assert isinstance(data, dict), (
            f"{block.path.relative_to(REPO)}: a YAML block must be a mapping"
        )
        text = (
            block.text
            if {"name", "pairs"} <= data.keys()
            else yaml.safe_dump({**MINIMAL_SWEEP, **data}, sort_keys=False)
        )
        parse_sweep(text, f"{block.path.relative_to(REPO)} block {index}")


def nested_models(annotation: object) -> list[type[BaseModel]]:
    """Return the pydantic models inside a field annotation (``tuple[PairSpec, ...]`` etc.)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for argument in typing.get_args(annotation):
        found += nested_models(argument)
    return found


def spec_models() -> dict[str, type[BaseModel]]:
    """Return every model reachable from SweepSpec's fields, by class name."""
    models: dict[str, type[BaseModel]] = {}
    stack: list[type[BaseModel]] = [SweepSpec]
    while stack:
        model = stack.pop()
        if model.__name__ in models:
            continue
        models[model.__name__] = model
        for field in model.model_fields.values():
            stack += nested_models(field.annotation)
    return models


def reference_tables() -> dict[str, list[str]]:
    """Return the first-column names of each table under a heading naming a spec model or the
    policy table (key ``policies``), from docs/guide/sweep-files.md."""
    names = spec_models()
    tables: dict[str, list[str]] = {}
    section: str | None = None
    for line in SWEEP_REFERENCE.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            named = [name for name in names if f"`{name}`" in line]
            section = named[0] if named else ("policies" if "Policy names" in line else None)
            if section:
                tables.setdefault(section, [])
        row = re.match(r"^\| `(\w+)` \|", line)
        if row and section:
            tables[section].append(row.group(1))
    return tables


def test_the_sweep_file_reference_lists_exactly_the_fields_of_every_spec_model() -> None:
    tables = reference_tables()
    for name, model in spec_models().items():
        assert name in tables, f"sweep-files.md has no section naming `{name}`"
        documented, fields = tables[name], list(model.model_fields)
        assert len(documented) == len(set(documented)), f"{name}: a field is listed twice"
        missing = sorted(set(fields) - set(documented))
        unknown = sorted(set(documented) - set(fields))
        assert not missing, f"sweep-files.md, `{name}`: undocumented fields {missing}"
        assert not unknown, f"sweep-files.md, `{name}`: no such fields {unknown}"


def test_the_policy_table_gives_every_policy_with_its_parameters_and_defaults() -> None:
    assert sorted(reference_tables()["policies"]) == sorted(POLICIES)
    text = SWEEP_REFERENCE.read_text(encoding="utf-8")
    for policy in POLICIES:
        row = re.search(rf"^\| `{policy}` \| (.*) \|$", text, re.MULTILINE)
        assert row, f"no row for policy {policy}"
        shown = {
            key: yaml.safe_load(value.strip())
            for key, value in re.findall(r"`(\w+)` = ([^,|]+)", row.group(1))
        }
        assert shown == policy_parameters(policy), f"policy {policy}: {shown}"


def repository_text_files() -> list[Path]:
    """Return the repository's tracked and untracked-but-not-ignored files that are text."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout.splitlines()
    files = []
    for name in listed:
        path = REPO / name
        if path.is_file() and b"\0" not in path.read_bytes()[:8192]:
            files.append(path)
    return files


def test_nothing_in_the_repository_points_outside_it() -> None:
    files = repository_text_files()
    assert README in files
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace").lower()
        for needle in OUTSIDE_PATHS:
            assert needle not in text, f"{path.relative_to(REPO)} mentions {needle}"


def test_readme_is_a_short_guide_with_the_ci_test_command() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES
    assert TEST_COMMAND in lines
    ci_lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci_lines[-1] == TEST_COMMAND


def test_the_dashboard_serves_this_machine_only_as_the_docs_say() -> None:
    config = tomllib.loads((REPO / "dashboard" / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"
    assert "streamlit run dashboard/app.py -- --db" in README.read_text(encoding="utf-8")


def heading_anchors(path: Path) -> set[str]:
    """Return the GitHub anchors of ``path``'s headings (outside code blocks)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in strip_fences(path.read_text(encoding="utf-8")).splitlines():
        heading = re.match(r"^#{1,6} (.+)$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def strip_fences(text: str) -> str:
    """Return ``text`` without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def strip_code(text: str) -> str:
    """Return ``text`` without fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", strip_fences(text))


def test_every_relative_link_in_the_docs_resolves() -> None:
    for path in markdown_files():
        for target in LINK.findall(strip_code(path.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            assert linked.exists(), f"{path.relative_to(REPO)}: broken link {target}"
            if anchor and linked.suffix == ".md":
                assert anchor in heading_anchors(linked), (
                    f"{path.relative_to(REPO)}: no heading #{anchor} in {linked.name}"
                )


def test_heading_anchors_follow_github_slugs(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A `code` title\n\n## Second: part\n\n```\n# not a heading\n```\n")
    assert heading_anchors(page) == {"a-code-title", "second-part"}


def test_committed_result_databases_are_at_the_schema_head() -> None:
    """The stores the docs quote and the dashboard tests open are migrated with the code, so a
    reader opens them read-only without a writer's migration first."""
    import sqlite3

    from orchestrator.store.db import head_revision

    stores = sorted((REPO / "docs").rglob("*.db"))
    assert stores, "no committed result databases under docs/"
    behind = {}
    for store in stores:
        with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            (revision,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
        if revision != head_revision():
            behind[str(store.relative_to(REPO))] = revision
    assert behind == {}, (
        f"migrate these to {head_revision()} (open each once as a writer, e.g. "
        "orchestrator.store.db.upgrade_to_head, then PRAGMA journal_mode=DELETE): {behind}"
    )
