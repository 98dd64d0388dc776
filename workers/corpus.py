"""Built-in text present on every machine: stdlib Python functions and arithmetic word problems.

SpecSweep trains its own small model zoo on this text and builds the ``builtin:code`` and
``builtin:math`` prompt sets from its held-out part, so no download is ever needed.

Code comes from the standard library of the *running* interpreter. A function (or method) with a
docstring is held out iff a SHA-256 bucket of ``"module:qualname"`` falls in the held-out range
(~3%). The training text is the stdlib source with the held-out functions removed, and with any
other function whose source is identical to a held-out one removed too, so held-out bodies never
appear in the training text.

Math problems are generated from a handful of story templates, 2-5 operations each, seeded. The
training and held-out problems come from separate seed streams, and a question whose SHA-256
bucket is in the held-out range is only ever used as a held-out problem, so no question can be in
both splits whatever the seeds.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import random
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path, PurePath
from typing import Literal

Split = Literal["train", "heldout"]

HASH_BUCKETS = 1000
HELDOUT_BUCKETS = 30
"""Buckets (out of ``HASH_BUCKETS``) that are held out: 3%."""

DOCUMENT_SEPARATOR = "\n\n"
SKIPPED_STDLIB_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "lib2to3"})
"""Directories never read: test suites (``distutils/tests`` too), IDLE, installed packages."""


def stable_bucket(key: str, buckets: int = HASH_BUCKETS) -> int:
    """Return the SHA-256 bucket of ``key``; stable across processes, unlike ``hash()``."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % buckets


def is_heldout_key(key: str) -> bool:
    """Return True when ``key`` hashes into the held-out bucket range (about 3% of keys)."""
    return stable_bucket(key) < HELDOUT_BUCKETS


def truncate_documents(documents: Sequence[str], max_chars: int | None) -> list[str]:
    """Return the documents whose ``DOCUMENT_SEPARATOR`` join is the first ``max_chars`` chars.

    ``DOCUMENT_SEPARATOR.join(result) == DOCUMENT_SEPARATOR.join(documents)[:max_chars]``; the
    last document may be cut (or end with part of a separator). Lets callers cap text size
    while keeping document boundaries.
    """
    if max_chars is None:
        return list(documents)
    kept: list[str] = []
    used = 0
    for document in documents:
        start = used + (len(DOCUMENT_SEPARATOR) if kept else 0)
        if start >= max_chars:
            if kept:
                kept[-1] += DOCUMENT_SEPARATOR[: max_chars - used]
            break
        kept.append(document[: max_chars - start])
        used = start + len(kept[-1])
    return kept


# ---------------------------------------------------------------------------------------------
# Code: functions of the running interpreter's standard library
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeFunction:
    """A stdlib function or method with a docstring, as exact source text.

    ``signature`` is the ``def ...:`` header line(s), ``docstring`` the docstring statement as
    written (indented and quoted) and ``body`` the code after it, so
    ``source == signature + docstring + body``. Methods are dedented to column 0.
    """

    module: str
    qualname: str
    signature: str
    docstring: str
    body: str
    source: str

    @property
    def key(self) -> str:
        """The ``"module:qualname"`` string the held-out split hashes."""
        return f"{self.module}:{self.qualname}"

    @property
    def prompt(self) -> str:
        """The header and docstring, which a model completes with the body."""
        return self.signature + self.docstring


@dataclass(frozen=True)
class _LocatedFunction:
    function: CodeFunction
    first_line: int
    """0-based index of the first line to remove from the module text (decorators included)."""
    end_line: int
    """0-based index one past the function's last line."""


@dataclass(frozen=True)
class _ParsedModule:
    module: str
    lines: tuple[str, ...]
    functions: tuple[_LocatedFunction, ...]


def stdlib_root() -> Path:
    """Return the running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def _module_name(relative: PurePath) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _stdlib_files(root: Path) -> list[tuple[str, Path]]:
    files = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if SKIPPED_STDLIB_DIRS.intersection(relative.parts[:-1]):
            continue
        files.append((_module_name(relative), path))
    return sorted(files)


def _function_nodes(
    body: list[ast.stmt], prefix: str
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Yield (qualname, node) for functions in ``body`` and methods of (nested) classes."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
        elif isinstance(node, ast.ClassDef):
            yield from _function_nodes(node.body, f"{prefix}{node.name}.")


def _only_comment_after(line: str, byte_offset: int | None) -> bool:
    """True when nothing but whitespace or a comment follows ``byte_offset`` (a UTF-8 offset)."""
    rest = line.encode("utf-8")[byte_offset or 0 :].decode("utf-8", errors="replace").strip()
    return not rest or rest.startswith("#")


def _split_lines(text: str) -> tuple[str, ...]:
    """Split on newlines only, as ``ast`` numbers lines (``str.splitlines`` also splits on \\f)."""
    pieces = text.split("\n")
    lines = [piece + "\n" for piece in pieces[:-1]]
    if pieces[-1]:
        lines.append(pieces[-1])
    return tuple(lines)


def _strip_indent(lines: Sequence[str], indent: str) -> list[str]:
    return [line[len(indent) :] if line.startswith(indent) else line for line in lines]


def _locate_function(
    module: str,
    qualname: str,
    node: ast.FunctionDef | ast.AsyncFunctionDef,
    lines: Sequence[str],
) -> _LocatedFunction | None:
    """Cut a function into exact pieces; None unless it has a docstring and code after it.

    Functions whose def, docstring or end share a line with other code are skipped, so every
    piece is made of whole source lines.
    """
    docstring = node.body[0]
    if not (
        len(node.body) >= 2
        and isinstance(docstring, ast.Expr)
        and isinstance(docstring.value, ast.Constant)
        and isinstance(docstring.value.value, str)
        and docstring.value.value.strip()
        and node.end_lineno is not None
        and docstring.end_lineno is not None
    ):
        return None
    start, doc_start, doc_end, end = (
        node.lineno - 1,
        docstring.lineno - 1,
        docstring.end_lineno,
        node.end_lineno,
    )
    indent = lines[start][: node.col_offset]
    if doc_start <= start or node.body[1].lineno - 1 < doc_end or indent.strip():
        return None
    if not _only_comment_after(lines[end - 1], node.end_col_offset):
        return None
    dedented = _strip_indent(lines[start:end], indent)
    pieces = (
        "".join(dedented[: doc_start - start]),
        "".join(dedented[doc_start - start : doc_end - start]),
        "".join(dedented[doc_end - start :]),
    )
    function = CodeFunction(module, qualname, *pieces, source="".join(dedented))
    first_line = min([d.lineno - 1 for d in node.decorator_list] + [start])
    return _LocatedFunction(function, first_line, end)


def _parse_module(module: str, path: Path) -> _ParsedModule | None:
    """Parse one stdlib file; None when it cannot be read or parsed."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return None
    lines = _split_lines(text)
    located = (
        _locate_function(module, qualname, node, lines)
        for qualname, node in _function_nodes(tree.body, "")
    )
    return _ParsedModule(module, lines, tuple(f for f in located if f is not None))


@functools.cache
def _parsed_stdlib() -> tuple[_ParsedModule, ...]:
    parsed = (_parse_module(module, path) for module, path in _stdlib_files(stdlib_root()))
    return tuple(m for m in parsed if m is not None)


@functools.cache
def _split_functions() -> dict[Split, tuple[CodeFunction, ...]]:
    functions = [f.function for m in _parsed_stdlib() for f in m.functions]
    functions.sort(key=lambda f: (f.module, f.qualname))
    return {
        "train": tuple(f for f in functions if not is_heldout_key(f.key)),
        "heldout": tuple(f for f in functions if is_heldout_key(f.key)),
    }


def code_functions(split: Split) -> list[CodeFunction]:
    """Return the stdlib functions of one split, sorted by (module, qualname).

    Held out iff ``is_heldout_key("module:qualname")``. Parsing is cached per process.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return list(_split_functions()[split])


def _without_lines(lines: Sequence[str], spans: Sequence[tuple[int, int]]) -> str:
    removed = set()
    for first, end in spans:
        removed.update(range(first, end))
    return "".join(line for i, line in enumerate(lines) if i not in removed)


@functools.cache
def _code_training_documents() -> tuple[str, ...]:
    """Non-empty module texts minus held-out functions (and verbatim copies), in hash order."""
    heldout_sources = {f.source for f in _split_functions()["heldout"]}
    modules = sorted(_parsed_stdlib(), key=lambda m: (stable_bucket(m.module, 2**32), m.module))
    documents = []
    for module in modules:
        spans = [
            (f.first_line, f.end_line)
            for f in module.functions
            if is_heldout_key(f.function.key) or f.function.source in heldout_sources
        ]
        documents.append(_without_lines(module.lines, spans))
    return tuple(d for d in documents if d.strip())


def code_training_text(max_chars: int | None = None) -> str:
    """Return the stdlib source minus held-out functions, at most ``max_chars`` characters.

    Modules are joined by a blank line in a fixed order (a stable hash of the module name, so a
    short prefix still mixes many modules). Deterministic for a given interpreter.
    """
    return DOCUMENT_SEPARATOR.join(truncate_documents(_code_training_documents(), max_chars))


# ---------------------------------------------------------------------------------------------
# Math: generated multi-step arithmetic word problems
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MathProblem:
    """An arithmetic word problem, its worked solution and its integer answer.

    ``solution`` is one equation per step then ``"The answer is N."``.
    """

    question: str
    solution: str
    answer: int

    @property
    def prompt(self) -> str:
        """The question in the Q/A format, ready for the model to write the solution."""
        return f"Q: {self.question}\nA:"

    @property
    def text(self) -> str:
        """The problem and its solution as they appear in training text."""
        return f"{self.prompt} {self.solution}"


@dataclass(frozen=True)
class _Story:
    """Phrasings of one word-problem setting; fields are ``str.format`` templates."""

    start: str
    add: str
    subtract: str
    multiply: str
    divide: str
    question: str


_STORIES = (
    _Story(
        start="{name} has {value} {item}.",
        add="{Pronoun} buys {n} more {item}.",
        subtract="{Pronoun} gives {n} {item} to {friend}.",
        multiply="{Pronoun} ends up with {n} times as many {item} after a lucky trade.",
        divide="{Pronoun} splits the {item} into {n} equal piles and keeps one pile.",
        question="How many {item} does {name} have now?",
    ),
    _Story(
        start="A shop has {value} {item} in stock.",
        add="A delivery brings {n} more {item}.",
        subtract="Customers buy {n} {item}.",
        multiply="The owner makes the stock {n} times as large.",
        divide="The {item} are shared equally among {n} branches and this shop keeps one share.",
        question="How many {item} does the shop have now?",
    ),
    _Story(
        start="{name} saves {value} dollars.",
        add="{Pronoun} earns {n} dollars walking dogs.",
        subtract="{Pronoun} spends {n} dollars on a gift for {friend}.",
        multiply="A bonus makes {possessive} savings {n} times as large.",
        divide="{Pronoun} divides the money equally into {n} envelopes and keeps one envelope.",
        question="How many dollars does {name} have now?",
    ),
    _Story(
        start="A bus leaves the depot with {value} passengers.",
        add="At the next stop {n} passengers get on.",
        subtract="At the market {n} passengers get off.",
        multiply="At the stadium the number of passengers becomes {n} times as large.",
        divide="The passengers split equally into {n} groups and only one group stays on.",
        question="How many passengers are on the bus now?",
    ),
    _Story(
        start="{name} reads {value} pages of a book.",
        add="The next day {pronoun} reads {n} more pages.",
        subtract="{Pronoun} realises {n} of those pages were a repeat and does not count them.",
        multiply="By the weekend {possessive} page count is {n} times as large.",
        divide="{Pronoun} writes a summary for every {n} pages and keeps one summary per group.",
        question="How many pages does {name} count now?",
    ),
)

_PEOPLE = (
    ("Ann", "she", "her"),
    ("Ben", "he", "his"),
    ("Carla", "she", "her"),
    ("Dev", "he", "his"),
    ("Elif", "she", "her"),
    ("Femi", "he", "his"),
    ("Grace", "she", "her"),
    ("Hiro", "he", "his"),
)
_ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells")
_SYMBOLS = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}
MAX_VALUE = 5000


def _apply(operation: str, value: int, operand: int) -> int:
    if operation == "add":
        return value + operand
    if operation == "subtract":
        return value - operand
    if operation == "multiply":
        return value * operand
    return value // operand


def _choose_step(rng: random.Random, value: int) -> tuple[str, int]:
    """Pick an operation and operand that keep the running value a positive integer."""
    options: list[tuple[str, int]] = [("add", rng.randint(2, 40))]
    if value >= 3:
        options.append(("subtract", rng.randint(2, value - 1)))
    factor = rng.randint(2, 4)
    if value * factor <= MAX_VALUE:
        options.append(("multiply", factor))
    divisors = [d for d in range(2, 6) if value % d == 0]
    if divisors:
        options.append(("divide", rng.choice(divisors)))
    return rng.choice(options)


def generate_math_problem(rng: random.Random) -> MathProblem:
    """Return one problem of 2-5 steps drawn from ``rng``; the answer is worked step by step."""
    story = rng.choice(_STORIES)
    name, pronoun, possessive = rng.choice(_PEOPLE)
    friend = rng.choice([p[0] for p in _PEOPLE if p[0] != name])
    words = {
        "name": name,
        "pronoun": pronoun,
        "Pronoun": pronoun.capitalize(),
        "possessive": possessive,
        "friend": friend,
        "item": rng.choice(_ITEMS),
    }
    value = rng.randint(5, 60)
    sentences = [story.start.format(value=value, **words)]
    equations = []
    for _ in range(rng.randint(2, 5)):
        operation, operand = _choose_step(rng, value)
        result = _apply(operation, value, operand)
        sentences.append(getattr(story, operation).format(n=operand, **words))
        equations.append(f"{value} {_SYMBOLS[operation]} {operand} = {result}.")
        value = result
    sentences.append(story.question.format(**words))
    solution = " ".join([*equations, f"The answer is {value}."])
    return MathProblem(question=" ".join(sentences), solution=solution, answer=value)


def _iter_math_problems(split: Split, seed: int) -> Iterator[MathProblem]:
    """Yield the endless, deterministic problem stream of one split and seed."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    want_heldout = split == "heldout"
    index = 0
    while True:
        problem = generate_math_problem(random.Random(f"specsweep-math/{split}/{seed}/{index}"))
        index += 1
        if is_heldout_key(problem.question) == want_heldout:
            yield problem


def math_problems(split: Split, n: int, seed: int = 0) -> list[MathProblem]:
    """Return the first ``n`` problems of the split's stream for ``seed``.

    Prefix-stable: ``math_problems(s, m, seed) == math_problems(s, n, seed)[:m]`` for m <= n.
    """
    return list(islice(_iter_math_problems(split, seed), n))


def math_training_text(n_problems: int, seed: int = 0) -> str:
    """Return ``n_problems`` training problems in the Q/A format, separated by blank lines."""
    return DOCUMENT_SEPARATOR.join(p.text for p in math_problems("train", n_problems, seed))


def _math_heldout_text(max_chars: int, seed: int) -> str:
    documents: list[str] = []
    length = -len(DOCUMENT_SEPARATOR)
    for problem in _iter_math_problems("heldout", seed):
        if length >= max_chars:
            break
        documents.append(problem.text)
        length += len(DOCUMENT_SEPARATOR) + len(problem.text)
    return DOCUMENT_SEPARATOR.join(documents)[:max_chars]


# ---------------------------------------------------------------------------------------------
# What the zoo trains and validates on
# ---------------------------------------------------------------------------------------------


def training_corpus(code_chars: int, math_problems: int, seed: int = 0) -> str:
    """Return the zoo's training text: stdlib code and math problems, interleaved by ``seed``.

    The code part is the documents of ``code_training_text(code_chars)`` and the math part the
    problems of ``math_training_text(math_problems, seed)``; their order is shuffled with
    ``seed`` at document granularity and joined by blank lines. Deterministic.
    """
    code_documents = truncate_documents(_code_training_documents(), code_chars)
    math_documents = [p.text for p in islice(_iter_math_problems("train", seed), math_problems)]
    documents = code_documents + math_documents
    random.Random(f"specsweep-corpus/{seed}").shuffle(documents)
    return DOCUMENT_SEPARATOR.join(documents)


def heldout_text(kind: Literal["code", "math"], max_chars: int, seed: int = 0) -> str:
    """Return up to ``max_chars`` characters of held-out text, for validation loss/agreement.

    ``"code"``: held-out functions' sources in (module, qualname) order (``seed`` is unused, the
    held-out set is fixed). ``"math"``: held-out problems of the ``seed`` stream.
    """
    if kind == "code":
        sources = [f.source for f in _split_functions()["heldout"]]
        return DOCUMENT_SEPARATOR.join(truncate_documents(sources, max_chars))
    if kind == "math":
        return _math_heldout_text(max_chars, seed)
    raise ValueError(f"kind must be 'code' or 'math', got {kind!r}")
