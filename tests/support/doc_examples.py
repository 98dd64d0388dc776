"""The docs' examples as data: fenced code blocks, the SpecSweep commands their shell blocks show,
and those commands' ``--help`` run in one interpreter (``tests/unit/test_docs.py`` and
``tests/integration/test_doc_script_commands.py``)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support.paths import REPO

README = REPO / "README.md"
GUIDE = REPO / "docs" / "guide"
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL_BREAKS = {"&&", "||", ";", "|", "&"}


@dataclass(frozen=True)
class CodeBlock:
    """A fenced code block of a Markdown file."""

    path: Path
    lang: str
    text: str


@dataclass(frozen=True)
class DocCommand:
    """A command shown in the docs: how it runs (module or script) and its arguments."""

    source: Path
    program: str  # "orchestrator", "training" or a bench/ script path
    args: tuple[str, ...]

    def flags(self) -> list[str]:
        """Return the long options the example uses (without any ``=value``)."""
        return [arg.split("=", 1)[0] for arg in self.args if arg.startswith("--")]


def guide_files() -> list[Path]:
    """Return the files whose examples are checked: the README, the guide, the lab's index."""
    return [README, *sorted(GUIDE.glob("*.md")), REPO / "docs" / "lab" / "README.md"]


def markdown_files() -> list[Path]:
    """Return every Markdown file whose links are checked."""
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


def code_blocks(path: Path) -> list[CodeBlock]:
    """Return the fenced code blocks of ``path`` with their language tag."""
    blocks: list[CodeBlock] = []
    lang: str | None = None
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fence = FENCE.match(line.strip())
        if fence and lang is None:
            lang, lines = fence.group(1), []
        elif line.strip() == "```" and lang is not None:
            blocks.append(CodeBlock(path, lang, "\n".join(lines)))
            lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def shell_commands(block: CodeBlock) -> list[list[str]]:
    """Return the shell commands of a block as token lists (continuations joined, comments off)."""
    commands: list[list[str]] = []
    pending = ""
    for raw in block.text.splitlines():
        line = raw[2:] if raw.startswith("$ ") else raw
        if not pending and not line.strip():
            continue
        pending = f"{pending} {line.rstrip()}" if pending else line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            tokens = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        commands.append(tokens)
        pending = ""
    assert not pending, f"{block.path}: unterminated command {pending!r}"
    return commands


def segments(tokens: list[str]) -> list[list[str]]:
    """Split a command's tokens at ``&&``, ``;``, pipes and the like."""
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token in SHELL_BREAKS:
            parts.append([])
        else:
            parts[-1].append(token)
    return [part for part in parts if part]


def doc_command(source: Path, tokens: list[str]) -> DocCommand | None:
    """Return the SpecSweep command in ``tokens`` (after any ``ray job submit ... --``), if any."""
    for index, token in enumerate(tokens):
        if not Path(token).name.startswith("python"):
            continue
        rest = tokens[index + 1 :]
        if rest[:1] == ["-m"] and len(rest) > 1 and rest[1] in ("orchestrator", "training"):
            return DocCommand(source, rest[1], tuple(rest[2:]))
        if rest and rest[0].startswith("bench/") and rest[0].endswith(".py"):
            return DocCommand(source, rest[0], tuple(rest[1:]))
    return None


def documented_commands() -> list[DocCommand]:
    """Return every SpecSweep command in the shell blocks of the README and the guide."""
    found: list[DocCommand] = []
    for path in guide_files():
        for block in code_blocks(path):
            if block.lang not in ("bash", "sh", "shell", "console", ""):
                continue
            for tokens in shell_commands(block):
                for part in segments(tokens):
                    command = doc_command(path, part)
                    if command is not None:
                        found.append(command)
    return found


#: Runs each [program, argv] of its JSON input as ``python -m`` / ``python SCRIPT`` would, in one
#: interpreter (torch is imported once), and prints [exit code, stdout] per item as JSON.
HELP_RUNNER = """
import contextlib, io, json, runpy, sys
items = json.loads(sys.stdin.read())
results = []
sys.path.insert(0, "bench")
for program, argv in items:
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            if program.endswith(".py"):
                sys.argv = [program, *argv]
                runpy.run_path(program, run_name="__main__")
            else:
                sys.argv = [program, *argv]
                runpy.run_module(program, run_name="__main__", alter_sys=True)
        except SystemExit as exit_request:
            code = exit_request.code if isinstance(exit_request.code, int) else 1
    results.append([code, out.getvalue()])
sys.__stdout__.write(json.dumps(results))
"""


def script_helps(commands: list[DocCommand]) -> list[tuple[int, str]]:
    """Return (exit code, help text) of each command run with ``--help`` appended."""
    items = [[command.program, [*command.args, "--help"]] for command in commands]
    done = subprocess.run(
        [sys.executable, "-c", HELP_RUNNER],
        input=json.dumps(items),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [tuple(result) for result in json.loads(done.stdout)]
