"""The import graph of our packages, read from the source with ``ast``: no package has an import
cycle; training/ and orchestrator/ modules import only their own layer and the layers below it;
the dashboard reads the store (and analyses what it reads) and nothing that runs sweeps; workers/
and policies/ import no higher package.

Every import counts: at module level, inside functions and under ``if TYPE_CHECKING:``. Imports
made by ``importlib.import_module`` (``training.jobs.JOB_KINDS``) are not read.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

from support.paths import REPO as ROOT

PACKAGES = ("policies", "workers", "training", "orchestrator", "dashboard")

#: training's layers, lowest first: a module imports its own layer and the layers below only.
#: An entry names a module or a package (then every module in it).
TRAINING_LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "training",
        "training.losses",
        "training.tokenizer",
        "training.gguf_import",
        "training.job_settings",
        "training.checkpoints",
        "training.early_exit",
    ),
    ("training.lm_trainer", "training.distributed", "training.realism"),
    ("training.pretrained_drafts", "training.eagle_training"),
    ("training.zoo",),
    ("training.jobs",),
    ("training.ray_job", "training.__main__"),
)

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path) -> str:
    """Return the dotted module name of a source file (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _known(name: str, modules: Iterable[str]) -> str | None:
    """Return the longest of ``modules`` that ``name`` is or lies in (None: not ours)."""
    found = [m for m in modules if name == m or name.startswith(m + ".")]
    return max(found, key=len) if found else None


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Return the dotted names one import statement of ``module`` loads."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - node.level + 1]
        base = ".".join([*anchor, *([base] if base else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph(root: Path, packages: Iterable[str]) -> Graph:
    """Return module -> the modules of ``packages`` it imports anywhere in its source."""
    files = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: Graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = _imported(node, module, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):
                # ``from pkg import sub`` loads pkg.sub when sub is a module, else only pkg.
                subs = [n for n in names[1:] if n in files]
                names = subs + [names[0]] * (len(subs) < len(names) - 1)
            targets.update(t for t in (_known(n, files) for n in names) if t)
        graph[module] = targets - {module}
    return graph


@functools.cache
def project_graph() -> Graph:
    """Return the repository's import graph, parsed once for every test here (read only)."""
    return import_graph(ROOT, PACKAGES)


def within(graph: Mapping[str, set[str]], prefix: str) -> Graph:
    """Return the part of ``graph`` among modules named ``prefix`` or lying under it."""

    def inside(name: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    return {m: {t for t in ts if inside(t)} for m, ts in graph.items() if inside(m)}


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """Return one import cycle as a path [a, b, ..., a], or None when the graph has none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def layer_of(module: str, layers: tuple[tuple[str, ...], ...]) -> int | None:
    """Return the index of the layer whose longest matching entry holds ``module``."""
    best: tuple[int, int] | None = None
    for index, entries in enumerate(layers):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and (
                best is None or len(entry) > best[1]
            ):
                best = (index, len(entry))
    return None if best is None else best[0]


def _rank(module: str) -> int:
    """Return ``module``'s layer in ``TRAINING_LAYERS`` (-1 when unplaced)."""
    layer = layer_of(module, TRAINING_LAYERS)
    return -1 if layer is None else layer


def test_the_graph_builder_reads_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for name in ("__init__", "a", "b", "c", "d", "sub/__init__", "sub/e"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "from pkg import b\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.c import X\n"
        "def f():\n"
        "    from .sub import e\n"
    )
    (pkg / "sub" / "e.py").write_text("from .. import d\nimport pkg.a\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.b", "pkg.c", "pkg.sub.e"}
    assert graph["pkg.sub.e"] == {"pkg.d", "pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.e", "pkg.a"]
    assert find_cycle(within(graph, "pkg.sub")) is None


def test_training_has_no_import_cycle() -> None:
    cycle = find_cycle(within(project_graph(), "training"))
    assert cycle is None, "import cycle in training/: " + " -> ".join(cycle or [])


def test_training_modules_import_only_their_layer_and_below() -> None:
    training = within(project_graph(), "training")
    unplaced = sorted(m for m in training if layer_of(m, TRAINING_LAYERS) is None)
    assert not unplaced, f"place these modules in TRAINING_LAYERS: {unplaced}"
    upward = [
        f"{module} -> {target}"
        for module, targets in sorted(training.items())
        for target in sorted(targets)
        if _rank(target) > _rank(module)
    ]
    assert not upward, "training/ imports up from a lower layer:\n" + "\n".join(upward)


#: orchestrator's layers, lowest first: a module imports its own layer and the layers below only.
#: The typed rows a store hands out (``store.records``, ``store.provenance_record``) sit below
#: the analysis that reads them; the rest of the store writes what analysis computes.
ORCHESTRATOR_LAYERS: tuple[tuple[str, ...], ...] = (
    ("orchestrator.sweep",),
    ("orchestrator.store.records", "orchestrator.store.provenance_record"),
    ("orchestrator.analysis",),
    ("orchestrator.store",),
    ("orchestrator.run",),
    ("orchestrator.api",),
    ("orchestrator.cli", "orchestrator.__main__"),
)

#: What the dashboard may import of orchestrator: it reads the store and analyses what it reads.
DASHBOARD_MAY_IMPORT = (
    "dashboard",
    "orchestrator.sweep",
    "orchestrator.store",
    "orchestrator.analysis",
)


def _inside(module: str, prefixes: Iterable[str]) -> bool:
    """Return whether ``module`` is one of ``prefixes`` or lies under one."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def top_level_imports(root: Path, package: str) -> dict[str, set[str]]:
    """Return module -> the top-level names (``ray``, ``workers``, ...) it imports anywhere."""
    found: dict[str, set[str]] = {}
    for path in (root / package).rglob("*.py"):
        module = module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
        found[module] = names
    return found


def test_no_import_cycle_in_any_package() -> None:
    cycle = find_cycle(project_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _orchestrator_rank(module: str) -> int:
    """Return ``module``'s layer in ``ORCHESTRATOR_LAYERS`` (-1: the empty package itself)."""
    layer = layer_of(module, ORCHESTRATOR_LAYERS)
    return -1 if layer is None else layer


def test_orchestrator_modules_import_only_their_layer_and_below() -> None:
    orchestrator = within(project_graph(), "orchestrator")
    unplaced = sorted(
        m for m in orchestrator if m != "orchestrator" and layer_of(m, ORCHESTRATOR_LAYERS) is None
    )
    assert not unplaced, f"place these modules in ORCHESTRATOR_LAYERS: {unplaced}"
    upward = [
        f"{module} -> {target}"
        for module, targets in sorted(orchestrator.items())
        for target in sorted(targets)
        if _orchestrator_rank(target) > _orchestrator_rank(module)
    ]
    assert not upward, "orchestrator/ imports up from a lower layer:\n" + "\n".join(upward)


def test_the_dashboard_reads_the_store_and_its_analysis_only() -> None:
    graph = project_graph()
    ours = [
        f"{module} -> {target}"
        for module, targets in sorted(within_package(graph, "dashboard").items())
        for target in sorted(targets)
        if not _inside(target, DASHBOARD_MAY_IMPORT)
    ]
    ray = sorted(m for m, names in top_level_imports(ROOT, "dashboard").items() if "ray" in names)
    assert not ours, "the dashboard imports beyond the store and analysis:\n" + "\n".join(ours)
    assert not ray, f"the dashboard imports ray: {ray}"


def within_package(graph: Mapping[str, set[str]], prefix: str) -> Graph:
    """Return the part of ``graph`` whose importing modules lie in ``prefix`` (targets kept)."""
    return {m: ts for m, ts in graph.items() if _inside(m, [prefix])}


def test_workers_and_policies_import_no_higher_package() -> None:
    graph = project_graph()
    upward = [
        f"{module} -> {target}"
        for package in ("workers", "policies")
        for module, targets in sorted(within_package(graph, package).items())
        for target in sorted(targets)
        if _inside(target, ("orchestrator", "training", "dashboard"))
    ]
    assert not upward, "workers/ or policies/ import a higher package:\n" + "\n".join(upward)


def imported_modules(tree: ast.AST) -> set[str]:
    """Return the dotted names an ``import`` or ``from … import`` in ``tree`` may load."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def test_no_test_module_imports_another() -> None:
    """Helpers shared by tests live in ``tests/support``; no test file imports a test file."""
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "tests").rglob("*.py")
        for name in imported_modules(ast.parse(path.read_text(encoding="utf-8")))
        if any(part.startswith("test_") or part == "conftest" for part in name.split("."))
    }
    assert not offenders, sorted(offenders)
