"""The training and bench commands the docs show answer ``--help`` with every flag they use.

Each runs in one subprocess that imports torch, transformers, DeepSpeed and Ray once (about ten
seconds on two cores), so it lives in the integration tier; the orchestrator's commands are
checked in process by ``tests/unit/test_docs.py``.
"""

from __future__ import annotations

import shlex

from support.doc_examples import documented_commands, script_helps
from support.paths import REPO


def test_training_and_bench_commands_in_the_docs_answer_help_with_their_flags() -> None:
    commands = [c for c in documented_commands() if c.program != "orchestrator"]
    for command in commands:
        if command.program.endswith(".py"):
            assert (REPO / command.program).is_file(), (
                f"{command.source.relative_to(REPO)}: no {command.program}"
            )
    for command, (code, help_text) in zip(commands, script_helps(commands), strict=True):
        shown = f"{command.source.relative_to(REPO)}: {command.program} {shlex.join(command.args)}"
        assert code == 0, f"{shown}: --help exited {code}"
        assert "usage:" in help_text, f"{shown}: --help printed no usage"
        for flag in command.flags():
            assert flag in help_text, f"{shown}: {flag} is not in its --help"
