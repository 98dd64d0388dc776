"""Tests for the built-in corpus: stdlib functions, the held-out split, generated math."""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import re
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers import corpus

EQUATION = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)\.")


def sha256_bucket(key: str) -> int:
    """The held-out bucket computed straight from hashlib, independently of the module."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:16], 16) % 1000


@pytest.fixture(scope="module")
def heldout() -> list[corpus.CodeFunction]:
    return corpus.code_functions("heldout")


@pytest.fixture(scope="module")
def train() -> list[corpus.CodeFunction]:
    return corpus.code_functions("train")


@pytest.fixture(scope="module")
def training_text() -> str:
    return corpus.code_training_text()


def file_segment(function: corpus.CodeFunction) -> str | None:
    """The function's text as it stands in its stdlib file, found by re-indenting its source."""
    module_path = function.module.replace(".", "/")
    root = corpus.stdlib_root()
    path = root / f"{module_path}.py"
    if not path.exists():
        path = root / module_path / "__init__.py"
    text = path.read_text(encoding="utf-8")
    for depth in range(0, 7):
        segment = textwrap.indent(function.source, "    " * depth)
        if segment in text:
            return segment
    return None


def test_stable_bucket_is_sha256_mod_1000() -> None:
    for key in ["", "json:dumps", "a" * 100, "模块:函数"]:
        assert corpus.stable_bucket(key) == sha256_bucket(key)


def test_split_follows_the_hash_rule(
    train: list[corpus.CodeFunction], heldout: list[corpus.CodeFunction]
) -> None:
    assert all(sha256_bucket(f"{f.module}:{f.qualname}") < 30 for f in heldout)
    assert all(sha256_bucket(f"{f.module}:{f.qualname}") >= 30 for f in train)
    assert len(train) > 1000
    assert 0.015 < len(heldout) / (len(train) + len(heldout)) < 0.045
    for split in (train, heldout):
        assert [(f.module, f.qualname) for f in split] == sorted(
            (f.module, f.qualname) for f in split
        )


def test_skipped_directories_are_not_read(train: list[corpus.CodeFunction]) -> None:
    for function in train:
        parts = function.module.split(".")
        assert parts[0] not in {"test", "idlelib", "lib2to3"}
        assert "tests" not in parts and "test" not in parts


def test_pieces_reassemble_into_parsable_source(heldout: list[corpus.CodeFunction]) -> None:
    for function in heldout:
        assert function.signature + function.docstring + function.body == function.source
        assert function.prompt == function.signature + function.docstring
        assert re.match(r"(async )?def ", function.signature)
        assert function.body.strip()
        node = ast.parse(function.source).body[0]
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        assert node.name == function.qualname.split(".")[-1]
        docstring = ast.get_docstring(node)
        assert docstring
        assert inspect.cleandoc(ast.literal_eval(function.docstring.strip())) == docstring


def test_source_is_exactly_what_inspect_reports(
    train: list[corpus.CodeFunction], heldout: list[corpus.CodeFunction]
) -> None:
    by_key = {f.key: f for f in train + heldout}
    assert by_key["json:dumps"].source == inspect.getsource(json.dumps)
    assert by_key["textwrap:TextWrapper.wrap"].source == textwrap.dedent(
        inspect.getsource(textwrap.TextWrapper.wrap)
    )
    assert by_key["textwrap:TextWrapper.wrap"].signature == "def wrap(self, text):\n"


def test_heldout_functions_are_absent_from_training_text(
    heldout: list[corpus.CodeFunction], training_text: str
) -> None:
    segments = [file_segment(f) for f in heldout]
    found = [s for s in segments if s is not None]
    assert len(found) >= 0.95 * len(heldout)
    assert not [s for s in found if s in training_text]
    assert not [f.source for f in heldout if f.source in training_text]


def test_training_functions_are_present_in_training_text(
    train: list[corpus.CodeFunction], training_text: str
) -> None:
    sample = train[:: max(1, len(train) // 150)]
    segments = [s for s in (file_segment(f) for f in sample) if s is not None]
    assert len(segments) >= 0.9 * len(sample)
    assert all(s in training_text for s in segments)


def test_code_training_text_is_a_deterministic_prefix(training_text: str) -> None:
    assert corpus.code_training_text(1234) == training_text[:1234]
    assert corpus.code_training_text(0) == ""
    assert len(training_text) > 5_000_000


@given(
    st.lists(st.text(alphabet="ab\n", max_size=8), max_size=6),
    st.one_of(st.none(), st.integers(0, 60)),
)
def test_truncate_documents_is_a_prefix_of_the_join(
    documents: list[str], limit: int | None
) -> None:
    kept = corpus.truncate_documents(documents, limit)
    joined = "\n\n".join(documents)
    assert "\n\n".join(kept) == (joined if limit is None else joined[:limit])


def check_worked_solution(problem: corpus.MathProblem) -> None:
    """Recompute every step from the numbers written in the solution."""
    equations = EQUATION.findall(problem.solution)
    assert 2 <= len(equations) <= 5
    assert problem.solution.endswith(f"The answer is {problem.answer}.")
    start = int(re.search(r"\d+", problem.question).group())
    assert int(equations[0][0]) == start
    previous = start
    for left, symbol, right, result in equations:
        a, b, c = int(left), int(right), int(result)
        assert a == previous and a > 0 and b > 0 and c > 0
        expected = {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[symbol]
        assert c == expected
        assert str(b) in problem.question
        previous = c
    assert previous == problem.answer


def test_math_solutions_are_correct_step_by_step() -> None:
    problems = corpus.math_problems("train", 300) + corpus.math_problems("heldout", 50)
    for problem in problems:
        check_worked_solution(problem)
        assert problem.question.endswith("?")
    assert {len(EQUATION.findall(p.solution)) for p in problems} == {2, 3, 4, 5}
    assert {e[1] for p in problems for e in EQUATION.findall(p.solution)} == set("+-*/")
    assert len({p.question.split(" ", 2)[1] for p in problems}) >= 4


def test_math_problems_are_seeded_and_prefix_stable() -> None:
    first = corpus.math_problems("train", 40, seed=3)
    assert first == corpus.math_problems("train", 40, seed=3)
    assert first[:15] == corpus.math_problems("train", 15, seed=3)
    assert first != corpus.math_problems("train", 40, seed=4)
    assert len({p.question for p in first}) == 40


def test_math_heldout_never_meets_training() -> None:
    heldout = corpus.math_problems("heldout", 200)
    assert all(sha256_bucket(p.question) < 30 for p in heldout)
    train_text = corpus.math_training_text(3000)
    train_questions = {p.question for p in corpus.math_problems("train", 3000)}
    assert all(sha256_bucket(q) >= 30 for q in train_questions)
    assert not train_questions & {p.question for p in heldout}
    assert not [p for p in heldout if p.question in train_text]


def test_math_training_text_format() -> None:
    problems = corpus.math_problems("train", 3, seed=1)
    expected = "\n\n".join(f"Q: {p.question}\nA: {p.solution}" for p in problems)
    assert corpus.math_training_text(3, seed=1) == expected
    assert problems[0].prompt == f"Q: {problems[0].question}\nA:"


def test_heldout_text(heldout: list[corpus.CodeFunction]) -> None:
    code = corpus.heldout_text("code", 3000)
    assert code == "\n\n".join(f.source for f in heldout)[:3000]
    math = corpus.heldout_text("math", 2000, seed=2)
    problems = corpus.math_problems("heldout", 40, seed=2)
    assert math == "\n\n".join(f"Q: {p.question}\nA: {p.solution}" for p in problems)[:2000]
    with pytest.raises(ValueError):
        corpus.heldout_text("prose", 10)  # type: ignore[arg-type]


def test_training_corpus_mixes_both_parts_deterministically(
    heldout: list[corpus.CodeFunction],
) -> None:
    text = corpus.training_corpus(code_chars=200_000, math_problems=50, seed=7)
    assert text == corpus.training_corpus(code_chars=200_000, math_problems=50, seed=7)
    assert text != corpus.training_corpus(code_chars=200_000, math_problems=50, seed=8)
    problems = corpus.math_problems("train", 50, seed=7)
    assert all(f"Q: {p.question}\nA: {p.solution}" in text for p in problems)
    math_chars = sum(len(f"Q: {p.question}\nA: {p.solution}") + 2 for p in problems)
    assert len(text) == len(corpus.code_training_text(200_000)) + math_chars
    assert not [f for f in heldout if f.source in text]
    assert not [p for p in corpus.math_problems("heldout", 50, seed=7) if p.question in text]
