"""What the bench scripts share: their common options and the preamble that turns them into the
resolved models, the target's tokenizer and the encoded prompts.

A script adds the options it takes (each keeps its own defaults), then calls :func:`prepare`:

    parser = bench_parser(__doc__)
    add_pair_arguments(parser)
    add_prompt_arguments(parser, samples=4, max_new_tokens=48)
    add_device_arguments(parser)
    add_out_argument(parser, "bench-x.json")
    inputs = prepare(parser.parse_args(argv))
    target = inputs.load(inputs.target_path)

The scripts run as ``python bench/NAME.py``, so this module is imported as ``common`` (the
script's own folder is first on ``sys.path``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from orchestrator.run.git_state import GitState, git_state
from orchestrator.run.preflight import resolve_model_path
from workers.json_files import write_json
from workers.lm import DTYPES, load_causal_lm
from workers.prompt_format import encode_dataset
from workers.trial import GPU_WARMUP_SECONDS

DEFAULT_TARGET = "zoo:smol/target"
DEFAULT_DRAFT = "zoo:smol/draft-s"
#: Each encoded prompt's token budget (the chat template's markers kept whole).
PROMPT_TOKENS = 256


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """Return a parser whose help shows the script's docstring ``doc`` as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)


def add_pair_arguments(parser: argparse.ArgumentParser, *, draft: bool = True) -> None:
    """Add ``--target`` and, unless ``draft`` is False, ``--draft`` (model directories or
    ``zoo:PROFILE/NAME`` refs; the demo's SmolLM2 pair by default)."""
    parser.add_argument("--target", default=DEFAULT_TARGET, help="model directory or zoo ref")
    if draft:
        parser.add_argument("--draft", default=DEFAULT_DRAFT, help="model directory or zoo ref")


def add_prompt_arguments(
    parser: argparse.ArgumentParser,
    *,
    samples: int | None,
    max_new_tokens: int | None,
    dataset_help: str = "a hub dataset (humaneval, gsm8k, ...) or builtin:code / builtin:math",
) -> None:
    """Add ``--dataset`` and, where their default is not None, ``--samples`` (prompts) and
    ``--max-new-tokens``."""
    parser.add_argument("--dataset", default="humaneval", help=dataset_help)
    if samples is not None:
        parser.add_argument("--samples", type=int, default=samples, help="prompts")
    if max_new_tokens is not None:
        parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)


def add_device_arguments(
    parser: argparse.ArgumentParser,
    *,
    device: bool = True,
    device_help: str = "torch device of the models (cpu, cuda, ...)",
) -> None:
    """Add ``--device`` (unless ``device`` is False; default cpu) and ``--dtype`` (the models'
    weights, a ``workers.lm.DTYPES`` name; default float32)."""
    if device:
        parser.add_argument("--device", default="cpu", help=device_help)
    parser.add_argument(
        "--dtype", default="float32", choices=sorted(DTYPES), help="the models' weights"
    )


def add_threads_argument(parser: argparse.ArgumentParser, default: int | None, note: str) -> None:
    """Add ``--threads`` (torch threads; :func:`prepare` sets them when given)."""
    parser.add_argument("--threads", type=int, default=default, help=f"torch threads ({note})")


def add_warmup_argument(parser: argparse.ArgumentParser, what: str, on_cpu: str) -> None:
    """Add ``--warmup-seconds``: ``what`` runs untimed first, by default
    ``GPU_WARMUP_SECONDS`` on CUDA and ``on_cpu`` (in words) elsewhere."""
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=None,
        help=f"{what} (default {GPU_WARMUP_SECONDS:g} on cuda, else {on_cpu})",
    )


def warmup_seconds(args: argparse.Namespace) -> float:
    """Return ``--warmup-seconds``, or its default for ``--device``: ``GPU_WARMUP_SECONDS`` on
    CUDA, else 0 (for the warm-ups of ``workers.trial``, at least one pass)."""
    if args.warmup_seconds is not None:
        return args.warmup_seconds
    return GPU_WARMUP_SECONDS if torch.device(args.device).type == "cuda" else 0.0


def add_out_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """Add ``--out``: where the script writes its JSON report."""
    parser.add_argument("--out", type=Path, default=Path(default), help="JSON report")


@dataclass(frozen=True)
class BenchInputs:
    """What the common options resolve to: the models' directories (``draft_path`` None for a
    script without ``--draft``), the target's tokenizer, the encoded prompts, and the device and
    dtype name (a ``workers.lm.DTYPES`` key) the models load in."""

    target_path: Path
    draft_path: Path | None
    tokenizer: PreTrainedTokenizerBase
    prompts: list[list[int]]
    device: torch.device
    dtype: str

    @property
    def prompt_tensors(self) -> list[torch.Tensor]:
        """Return the prompts as 1-D tensors of token ids (on the CPU)."""
        return [torch.tensor(prompt) for prompt in self.prompts]

    def load(self, path: Path) -> PreTrainedModel:
        """Return the causal LM at ``path`` in this device and dtype, in eval mode."""
        return load_causal_lm(path, self.dtype, str(self.device))


def prepare(
    args: argparse.Namespace, *, samples: int | None = None, prompt_tokens: int = PROMPT_TOKENS
) -> BenchInputs:
    """Run the common preamble on the parsed options and return its :class:`BenchInputs`.

    Sets torch's threads when ``--threads`` is given, resolves ``--target`` and ``--draft``
    (building a zoo model on first use), loads the target's tokenizer and encodes the first
    ``--samples`` (or ``samples``) prompts of ``--dataset``, at most ``prompt_tokens`` each,
    through its chat template when it has one, as sweeps do. An option the script does not take
    keeps its default: no draft, the CPU, float32, torch's threads as they are.
    """
    threads = getattr(args, "threads", None)
    if threads:
        torch.set_num_threads(threads)
    target_path = resolve_model_path(args.target)
    draft = getattr(args, "draft", None)
    draft_path = None if draft is None else resolve_model_path(draft)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    count = args.samples if samples is None else samples
    prompts = encode_dataset(tokenizer, args.dataset, count, prompt_tokens)
    device = torch.device(getattr(args, "device", "cpu"))
    return BenchInputs(
        target_path, draft_path, tokenizer, prompts, device, getattr(args, "dtype", "float32")
    )


def write_report(out: Path, report: Any) -> None:
    """Write ``report`` as JSON to ``out`` (whole, ``workers.json_files.write_json``) and say
    where."""
    write_json(out, report)
    print(f"JSON: {out}")


def commit_label(state: GitState) -> str | None:
    """Return ``state``'s commit as 12 hex digits, with ``+dirty`` when the tree has changes
    (staged or not) and ``+dirty-unknown`` when that cannot be told; None outside git."""
    if state.commit is None:
        return None
    suffix = {True: "+dirty", False: "", None: "+dirty-unknown"}[state.dirty]
    return state.commit[:12] + suffix


def checkout_commit() -> str | None:
    """Return this repository's :func:`commit_label`, read without running git
    (``orchestrator.run.git_state``)."""
    return commit_label(git_state(Path(__file__).resolve().parent.parent))
