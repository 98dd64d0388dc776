"""Import a script of ``bench/`` (scripts, not package modules) for a test."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from support.paths import REPO
from training.zoo.cache import ZooManifest

BENCH_DIR = REPO / "bench"


def load_bench_script(name: str) -> ModuleType:
    """Return ``bench/<name>.py`` imported as module ``bench_<name>``, with ``bench/`` on
    ``sys.path`` as when the script runs (its shared module ``common`` is imported from there)."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def micro_pair_args(zoo: ZooManifest) -> list[str]:
    """Return a bench script's options for the micro zoo's pair on its built-in code prompts."""
    return [
        *("--target", str(zoo.model_path("target"))),
        *("--draft", str(zoo.model_path("draft-s"))),
        *("--dataset", "builtin:code"),
    ]
