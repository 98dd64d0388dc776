"""bench/common.py: the options every bench script shares (each script's flags and defaults as
they were before the module) and the preamble that resolves the models and encodes the prompts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from support.bench_scripts import load_bench_script

from orchestrator.run.git_state import GitState
from training.zoo.cache import ZooManifest
from workers.trial import GPU_WARMUP_SECONDS

PAIR = {"target": "zoo:smol/target", "draft": "zoo:smol/draft-s", "dataset": "humaneval"}
#: Each script's defaults, as its own parser had them before bench/common.py (commit 9fed4d8).
DEFAULTS = {
    "engine": {
        **PAIR,
        **{"samples": 4, "max_new_tokens": 48, "threads": None, "device": "cpu"},
        **{"dtype": "float32", "warmup_seconds": None, "out": Path("bench-engine.json")},
        # The draft kinds other than lm (bench/ngram_lookup.py), added since.
        **{"draft_kind": "lm", "ngram_n_max": 3, "ngram_n_min": 1, "ngram_window": None},
        "eagle_head": None,
    },
    "actors": {
        **PAIR,
        **{"samples": 6, "max_new_tokens": 48, "k": 4, "repeats": 6, "device": "cpu"},
        **{"dtype": "float32", "warmup_seconds": None, "out": Path("bench-actors.json")},
    },
    "replay": {
        **PAIR,
        **{"samples": 4, "prompt_tokens": 64, "max_new_tokens": 32, "thresholds": 20},
        **{"max_draft_len": 8, "cap": 16, "live_static": [2, 6], "threads": 1},
        "out": Path("bench-replay.json"),
        # The leave-one-trial-out validation over a results DB (no models), added since.
        "loo": None,
        # The sweep whose runner fit --loo uses (pooled over datasets), added since.
        "sweep": None,
    },
    "handoff": {
        **PAIR,
        **{"k": 4, "rounds": 30, "cycles": 12, "dtype": "float32"},
        "out": Path("bench-handoff.json"),
    },
    "gpu_warmup": {
        **{"target": "zoo:smol/target", "dataset": "humaneval", "samples": 4},
        **{"max_new_tokens": 48, "seconds": 75.0, "device": "cpu", "dtype": "float32"},
        "out": Path("gpu-warmup.json"),
    },
}


@pytest.mark.parametrize("script", sorted(DEFAULTS))
def test_each_script_keeps_its_options_and_their_defaults(script: str) -> None:
    args = load_bench_script(script)._parse_args([])
    assert vars(args) == DEFAULTS[script]


def test_options_the_scripts_share_parse_alike() -> None:
    args = load_bench_script("engine")._parse_args(
        ["--device", "cuda", "--dtype", "bfloat16", "--threads", "3", "--samples", "2"]
    )
    assert (args.device, args.dtype, args.threads, args.samples) == ("cuda", "bfloat16", 3, 2)
    with pytest.raises(SystemExit):
        load_bench_script("handoff")._parse_args(["--dtype", "float64"])
    with pytest.raises(SystemExit):  # handoff uses one prompt: it takes no --samples
        load_bench_script("handoff")._parse_args(["--samples", "2"])


def test_warmup_defaults_to_the_gpu_warmup_on_cuda_only() -> None:
    common = load_bench_script("common")

    def seconds(device: str, given: float | None) -> float:
        return common.warmup_seconds(argparse.Namespace(device=device, warmup_seconds=given))

    assert seconds("cpu", None) == 0.0
    assert seconds("cuda", None) == GPU_WARMUP_SECONDS
    assert seconds("cuda:1", 2.5) == 2.5 and seconds("cpu", 0.5) == 0.5


def test_prepare_resolves_the_pair_and_encodes_the_prompts(micro_zoo: ZooManifest) -> None:
    common = load_bench_script("common")
    parser = common.bench_parser("test")
    common.add_pair_arguments(parser)
    common.add_prompt_arguments(parser, samples=3, max_new_tokens=8)
    common.add_threads_argument(parser, None, "test")
    target, draft = micro_zoo.model_path("target"), micro_zoo.model_path("draft-s")
    argv = ["--target", str(target), "--draft", str(draft), "--dataset", "builtin:code"]
    threads = torch.get_num_threads()
    try:
        inputs = common.prepare(parser.parse_args([*argv, "--threads", "1"]), prompt_tokens=12)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert (inputs.target_path, inputs.draft_path) == (target.resolve(), draft.resolve())
    assert len(inputs.prompts) == 3 and all(0 < len(p) <= 12 for p in inputs.prompts)
    assert [t.tolist() for t in inputs.prompt_tensors] == inputs.prompts
    assert (inputs.device, inputs.dtype) == (torch.device("cpu"), "float32")
    model = inputs.load(inputs.draft_path)
    assert not model.training and next(model.parameters()).dtype == torch.float32


def test_options_a_script_lacks_keep_their_defaults(micro_zoo: ZooManifest) -> None:
    common = load_bench_script("common")
    args = argparse.Namespace(target=str(micro_zoo.model_path("target")), dataset="builtin:code")
    inputs = common.prepare(args, samples=1)
    assert inputs.draft_path is None and len(inputs.prompts) == 1
    assert len(inputs.prompts[0]) <= common.PROMPT_TOKENS
    assert (inputs.device, inputs.dtype) == (torch.device("cpu"), "float32")


def test_a_target_that_is_no_model_is_named(tmp_path: Path) -> None:
    common = load_bench_script("common")
    args = argparse.Namespace(target=str(tmp_path), dataset="builtin:code", samples=1)
    with pytest.raises(ValueError, match="is not a model directory"):
        common.prepare(args)


def test_the_commit_label_says_dirty_clean_or_unknown() -> None:
    common = load_bench_script("common")
    sha = "0123456789abcdef0123456789abcdef01234567"
    labels = [common.commit_label(GitState(sha, dirty)) for dirty in (True, False, None)]
    assert labels == ["0123456789ab+dirty", "0123456789ab", "0123456789ab+dirty-unknown"]
    assert common.commit_label(GitState(None, None)) is None
