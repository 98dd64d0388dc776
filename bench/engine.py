"""Engine benchmark: our static-K speculative decoding vs target-only AR and transformers'
assisted generation, on one pair and prompt set, greedy, side by side in one run.

Reports tokens/s and acceptance per method, the speed ratio of our static K to transformers'
assisted generation at the same K and of our target-only AR to transformers' plain
``generate()`` on the same model (the baseline must be as optimised as the method), the target's
standalone cost t_target(n) of a block of n = 1..9 tokens per model path (one cached target
forward of n tokens, then rollback, at a mid-generation context length; a 1-token step must
not cost more than a 2-token block, or every speedup over AR is inflated), and the engine
overhead: the share of each method's wall time spent outside the models' forward calls
(sampling, verification, policy, cache bookkeeping, Python), as a share and in microseconds
per round (per token for AR), measured in a second pass over the prompts with every
``CachedLM.forward`` call timed. Beside it ("floor") the same share for a bare greedy loop that
makes the same forward calls and nothing else (``bare_speculative``, ``bare_autoregressive``:
no policy, records or clocks), taking turns with ours prompt by prompt: what driving PyTorch
from Python costs on this pair whatever the engine, so ours minus the floor is the engine's own.
Our rows run on three model paths: the plain-torch Llama path (``workers.llama_fast``, the
default: on CPU in float32 it holds oneDNN-packed copies of the weights beside the model's own
and runs each block size on the layout its calibration found fastest, ``workers.step_plan``),
the same path with unpacked weights only (``CachedLM(prepack=False)``, suffixed "(unpacked
weights)") and the transformers forward (``CachedLM(fast=False)``, suffixed "(transformers
modules)"), so the report separates what the engine loop gains from what each model path gains.
The paths' block costs are timed taking turns, and within a path AR and the static K take turns
prompt by prompt, so drift of a shared machine hits them alike.

Before those rows, target-only AR runs on every path taking turns prompt by prompt
(``bench/ar_baseline.py``; where weights pack, also on packed weights only), and the default
path's AR, the sweep's baseline, is compared with each through a paired interval (jackknife t): the
script exits with status 1, after writing its report, when another path's AR is faster beyond
that interval and the calibration's tolerance (``ar_baseline`` in the JSON).

    python bench/engine.py --target zoo:smol/target --draft zoo:smol/draft-s \
        --dataset humaneval --samples 4 --max-new-tokens 48 --out bench-engine.json

With ``--draft-kind ngram`` it runs instead n-gram prompt lookup (no draft model) against
target-only AR on the default path: static K = 2, 4, 8 and the match-length policy, tokens/s
end to end and decode only (``bench/ngram_lookup.py``):

    python bench/engine.py --target zoo:smol/target --draft-kind ngram \
        --dataset humaneval --samples 8 --max-new-tokens 128 --out bench-ngram.json

With ``--draft-kind eagle --eagle-head PATH_OR_ZOO_REF`` the same rows (static K = 1, 2, 3, 4, 8)
draft with an EAGLE head over the target (``workers.proposers.eagle``):

    python bench/engine.py --target zoo:smol/target --draft-kind eagle \
        --eagle-head zoo:smol-eagle/eagle --dataset humaneval --samples 8 --out bench-eagle.json

Prompts go through the target's chat template when its tokenizer has one, as in sweeps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
from ar_baseline import BASELINE_TOLERANCE, ar_on_every_path, check_baseline
from common import (
    add_device_arguments,
    add_out_argument,
    add_pair_arguments,
    add_prompt_arguments,
    add_threads_argument,
    add_warmup_argument,
    bench_parser,
    checkout_commit,
    prepare,
    warmup_seconds,
)
from ngram_lookup import add_ngram_arguments, lookup_main
from tqdm import tqdm

from policies import make_policy
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.json_files import write_json
from workers.lm import CachedLM, synchronize
from workers.records import GenerationResult, SamplingConfig
from workers.static_comparison import StaticComparison, compare_static_k
from workers.target import LocalTarget
from workers.trial import TrialRequest, warm_up

STATIC_KS = (2, 4, 8)
#: Passes over the prompts of the AR-on-every-path comparison (more pairs for its interval).
AR_PASSES = 3
#: The path whose AR is a sweep's baseline (a default ``CachedLM``).
BASELINE_PATH = "plain_torch"
#: Timed forwards of each block size n (the sizes take turns, after two untimed rounds).
BLOCK_REPEATS = 25
#: Name suffix of the rows run with ``CachedLM(fast=False)``: the transformers module forward.
TRANSFORMERS_MODULES = " (transformers modules)"
#: The row of transformers' plain ``generate()`` on the target (the AR baseline's reference).
TRANSFORMERS_GENERATE = "transformers generate() (target only)"
#: Each model path: its rows' name suffix and the ``CachedLM`` options that select it.
PATHS = {
    "plain_torch": ("", {"fast": True}),
    "plain_torch_unpacked": (" (unpacked weights)", {"fast": True, "prepack": False}),
    "transformers_modules": (TRANSFORMERS_MODULES, {"fast": False}),
}
#: Printed beside the packed / unpacked ratios where nothing packs (GPU, half precision): the two
#: paths then run the same code, so their ratio is the run's own spread (the timings take turns).
SAME_CODE_NOTE = " (the same code here: weights pack only on CPU in float32, so this is spread)"


@dataclass
class MethodResult:
    """One method's totals over the prompt set."""

    method: str
    tokens: int
    seconds: float
    tokens_per_s: float
    acceptance_rate: float | None = None
    mean_accepted: float | None = None
    overhead_fraction: float | None = None
    overhead_us_per_round: float | None = None
    floor_overhead_fraction: float | None = None
    floor_overhead_us_per_round: float | None = None
    floor_matches: bool | None = None
    matches_ar: bool | None = None


def _median_seconds(step, repeats: int) -> float:
    """Return the median wall time of ``step()`` over ``repeats`` calls after two warm-ups."""
    step()
    step()
    return statistics.median(_seconds(step) for _ in range(repeats))


def _seconds(step) -> float:
    """Return the wall time of one ``step()`` call."""
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


@dataclass(frozen=True)
class StandaloneCosts:
    """Model costs measured alone: one draft step and one target block of n tokens.

    Both are measured at a context as long as the middle of a generation (prompt + half the
    new tokens).
    """

    t_draft: float
    t_target: dict[int, float]


def standalone_costs(
    models: dict[str, tuple[CachedLM, CachedLM]],
    prompts: list[torch.Tensor],
    max_block: int,
    max_new_tokens: int,
) -> dict[str, StandaloneCosts]:
    """Return the standalone costs of each path's (draft, target) on these prompts (see above).

    The paths take turns, each timing every block size once per repeat, so drift hits them
    alike. A path's turn starts with an untimed one-token step, and the sizes' order rotates
    from repeat to repeat: the first forward after another path's runs with the other path's
    weights in the caches (on the micro toy, with the sizes always in order, that put
    t_target(1) above t_target(2) on every path).
    """
    context = torch.cat([prompts[0], prompts[0][-1:].repeat(max_new_tokens // 2)])
    base = context.numel()
    for draft, target in models.values():
        for lm in (draft, target):
            lm.reset()
            lm.forward(context, last_only=True)
    t_draft = {
        path: _median_seconds(_step(draft, context[-1:], base), 60)
        for path, (draft, _) in models.items()
    }
    sizes = list(range(1, max_block + 1))
    samples = {(path, n): [] for path in models for n in sizes}
    for repeat in range(BLOCK_REPEATS + 2):
        order = sizes[repeat % max_block :] + sizes[: repeat % max_block]
        for path, (_, target) in models.items():
            _step(target, context[-1:], base, last_only=False)()
            for n in order:
                seconds = _seconds(_step(target, context[-n:], base, last_only=False))
                if repeat >= 2:
                    samples[path, n].append(seconds)
    return {
        path: StandaloneCosts(
            t_draft[path], {n: statistics.median(samples[path, n]) for n in sizes}
        )
        for path in models
    }


def _step(lm: CachedLM, ids: torch.Tensor, base: int, last_only: bool = True):
    """Return a callable running one cached forward of ``ids`` (through the head at the last
    position only, or at all), waiting for the device, and rolling back to ``base``."""

    def step() -> None:
        lm.forward(ids, last_only=last_only)
        lm.crop(base)
        synchronize(lm.device)

    return step


class ForwardClock:
    """Adds up the seconds spent inside the ``forward`` calls of the given models."""

    def __init__(self, *lms: CachedLM) -> None:
        self.seconds = 0.0
        for lm in lms:
            lm.forward = self._timed(lm.forward, lm.device)

    def _timed(self, forward, device: torch.device):
        # The clock's own work counts as time outside the forwards: keep it to two readings
        # (plus, on CUDA, the waits that make them include the forward's kernels).
        wait = partial(synchronize, device) if device.type == "cuda" else None
        clock = time.perf_counter

        def timed(*args, **kwargs):
            if wait is not None:
                wait()
            start = clock()
            out = forward(*args, **kwargs)
            if wait is not None:
                wait()
            self.seconds += clock() - start
            return out

        return timed


@dataclass(frozen=True)
class BareRun:
    """One bare loop's request: its generated ids, wall seconds and rounds (tokens for AR)."""

    output_ids: list[int]
    seconds: float
    rounds: int


@torch.inference_mode()
def bare_autoregressive(target: CachedLM, prompt: torch.Tensor, max_new_tokens: int) -> BareRun:
    """Decode ``prompt`` greedily with the target alone: one one-token forward per token, its
    ``argmax`` fed back as the next input."""
    start = time.perf_counter()
    target.reset()
    if prompt.numel() > 1:
        target.forward(prompt[:-1], last_only=True)
    token = prompt[-1:]
    output = []
    for _ in range(max_new_tokens):
        token = target.forward(token).logits.argmax(dim=-1)
        output.append(token)
    output_ids = torch.cat(output).tolist()
    return BareRun(output_ids, time.perf_counter() - start, max_new_tokens)


@torch.inference_mode()
def bare_speculative(
    draft: CachedLM, target: CachedLM, prompt: torch.Tensor, k: int, max_new_tokens: int
) -> BareRun:
    """Decode ``prompt`` greedily by speculative decoding with a static draft length ``k``,
    round by round as the engine does (the last round drafts only what the budget leaves)."""
    start = time.perf_counter()
    for lm in (draft, target):
        lm.reset()
        if prompt.numel() > 1:
            lm.forward(prompt[:-1], last_only=True)
    sequence, prompt_len, rounds = prompt.tolist(), prompt.numel(), 0
    while len(sequence) - prompt_len < max_new_tokens:
        cap = min(k, max_new_tokens - (len(sequence) - prompt_len) - 1)
        pending = torch.tensor(sequence[draft.cached_len :], device=draft.device)
        tokens = [pending[-1:]]
        if cap > 0:
            tokens.append(draft.forward(pending, last_only=True).logits.argmax(dim=-1))
        for _ in range(cap - 1):
            tokens.append(draft.forward(tokens[-1], last_only=True).logits.argmax(dim=-1))
        block = torch.cat(tokens)
        base = target.cached_len + 1
        choices = target.forward(block).logits.argmax(dim=-1).tolist()
        drafted = block.tolist()[1:]
        accepted = next((i for i, t in enumerate(drafted) if t != choices[i]), len(drafted))
        target.crop(base + accepted)
        draft.crop(len(sequence) + accepted)  # a no-op when the draft holds no more
        sequence += [*drafted[:accepted], choices[accepted]]
        rounds += 1
    return BareRun(sequence[prompt_len:], time.perf_counter() - start, rounds)


@dataclass(frozen=True)
class EngineOverhead:
    """One method's time outside the models' forward calls, as a share of its wall time and in
    microseconds per round (a token for AR); the same for the bare loop (``bare_speculative``,
    ``bare_autoregressive``: the floor), and whether that loop's outputs equal the method's."""

    fraction: float
    us_per_round: float
    floor_fraction: float
    floor_us_per_round: float
    floor_matches: bool


@dataclass
class _Tally:
    """Wall seconds, forward seconds and rounds added up over one method's requests."""

    wall: float = 0.0
    forwards: float = 0.0
    rounds: int = 0

    def add(self, seconds: float, forward_seconds: float, rounds: int) -> None:
        """Count one request."""
        self.wall += seconds
        self.forwards += forward_seconds
        self.rounds += rounds

    def outside(self) -> tuple[float, float]:
        """Return the share of wall time outside the forwards and its microseconds a round."""
        outside = self.wall - self.forwards
        return outside / self.wall, outside / self.rounds * 1e6


def engine_overheads(
    draft: CachedLM,
    target: LocalTarget,
    prompts: list[torch.Tensor],
    settings: RequestSettings,
    progress: str | None = None,
) -> dict[int, EngineOverhead]:
    """Return, for AR (key 0) and each static K, the time spent outside model forwards, ours
    and the bare loop's (the floor), which take turns prompt by prompt.

    Every ``forward`` of both models is timed while this runs; the models are restored
    afterwards. ``progress``, when given, labels a progress bar over the methods.
    """
    originals = draft.forward, target.lm.forward
    clock = ForwardClock(draft, target.lm)
    overheads = {}
    try:
        for k in tqdm((0, *STATIC_KS), desc=progress, disable=progress is None):
            ours, bare, matches = _Tally(), _Tally(), True
            for prompt in prompts:
                before = clock.seconds
                result = _decode_ours(draft, target, prompt, settings, k)
                ours.add(result.seconds, clock.seconds - before, len(result.rounds))
                before = clock.seconds
                floor = _decode_bare(draft, target.lm, prompt, settings, k)
                bare.add(floor.seconds, clock.seconds - before, floor.rounds)
                matches = matches and floor.output_ids == result.output_ids
            overheads[k] = EngineOverhead(*ours.outside(), *bare.outside(), matches)
    finally:
        draft.forward, target.lm.forward = originals
    return overheads


def _decode_ours(
    draft: CachedLM, target: LocalTarget, prompt: torch.Tensor, settings: RequestSettings, k: int
) -> GenerationResult:
    """Decode ``prompt`` with our engine: target-only AR for ``k`` = 0, else static K."""
    if k == 0:
        return autoregressive_generate(target, prompt, settings)
    return speculative_generate(draft, target, make_policy("static", k), prompt, settings)


def _decode_bare(
    draft: CachedLM, target: CachedLM, prompt: torch.Tensor, settings: RequestSettings, k: int
) -> BareRun:
    """Decode ``prompt`` with the bare loop matching ``_decode_ours``."""
    max_new = settings.sampling.max_new_tokens
    if k == 0:
        return bare_autoregressive(target, prompt, max_new)
    return bare_speculative(draft, target, prompt, k, max_new)


def _summarise(
    method: str,
    results: list[GenerationResult],
    overhead: EngineOverhead | None = None,
    reference: list[list[int]] | None = None,
) -> MethodResult:
    """Aggregate per-sample results of one method (with its measured engine overhead)."""
    tokens = sum(r.n_generated for r in results)
    seconds = sum(r.seconds for r in results)
    drafted = sum(r.n_drafted for r in results)
    rounds = [round_ for r in results for round_ in r.rounds]
    summary = MethodResult(method, tokens, seconds, tokens / seconds)
    if overhead is not None:
        summary.overhead_fraction = overhead.fraction
        summary.overhead_us_per_round = overhead.us_per_round
        summary.floor_overhead_fraction = overhead.floor_fraction
        summary.floor_overhead_us_per_round = overhead.floor_us_per_round
        summary.floor_matches = overhead.floor_matches
    if drafted:
        summary.acceptance_rate = sum(r.n_accepted for r in results) / drafted
        summary.mean_accepted = sum(r.accepted for r in rounds) / len(rounds)
    if reference is not None:
        summary.matches_ar = [r.output_ids for r in results] == reference
    return summary


def _run_ours(
    draft: CachedLM,
    target: LocalTarget,
    ids: list[torch.Tensor],
    settings: RequestSettings,
    suffix: str = "",
    reference: list[list[int]] | None = None,
) -> tuple[list[MethodResult], list[list[int]]]:
    """Run target-only AR and our static K on one model path; return the results (names
    ending in ``suffix``) and the AR outputs. Outputs are compared with ``reference`` (another
    path's AR outputs) when given, else with this path's AR. The methods take turns prompt by
    prompt (``workers.static_comparison``).
    """
    runs = compare_static_k(
        target, {"": draft}, ids, settings, STATIC_KS, f"AR and static K, interleaved{suffix}"
    )
    overheads = engine_overheads(
        draft, target, ids, settings, f"engine overhead and its floor{suffix}"
    )
    outputs = [r.output_ids for r in runs.ar]
    reference = reference or outputs
    results = [_summarise(f"target-only AR{suffix}", runs.ar, overheads[0], reference)]
    for k in STATIC_KS:
        results.append(
            _summarise(f"ours static K={k}{suffix}", runs.static["", k], overheads[k], reference)
        )
    return results, outputs


def _hf_assisted(target_model, draft_model, prompts, k: int, schedule: str, max_new: int):
    """Run transformers' assisted generation; return (tokens, seconds, outputs)."""
    config = draft_model.generation_config
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = schedule
    config.assistant_confidence_threshold = 0.0
    return _hf_generate(target_model, prompts, max_new, assistant_model=draft_model)


def _hf_generate(target_model, prompts, max_new: int, **options):
    """Run ``target_model.generate`` greedily per prompt; return (tokens, seconds, outputs)."""
    tokens, seconds, outputs = 0, 0.0, []
    for prompt in prompts:
        ids = torch.tensor([prompt], device=target_model.device)
        start = time.perf_counter()
        out = target_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new,
            eos_token_id=None,  # decode past EOS like our rows (min_new_tokens would mask EOS)
            pad_token_id=target_model.config.eos_token_id,
            **options,
        )
        seconds += time.perf_counter() - start
        generated = out[0, ids.shape[1] :].tolist()
        tokens += len(generated)
        outputs.append(generated)
    return tokens, seconds, outputs


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = bench_parser(__doc__)
    add_pair_arguments(parser)
    add_prompt_arguments(parser, samples=4, max_new_tokens=48)
    add_threads_argument(parser, None, "default: all")
    add_device_arguments(parser)
    add_warmup_argument(
        parser, "untimed static K=4 decoding first, shared among the model paths", "none"
    )
    add_out_argument(parser, "bench-engine.json")
    add_ngram_arguments(parser)
    return parser.parse_args(argv)


def _warm_up_paths(
    models: dict[str, tuple[CachedLM, CachedLM]], prompts: list[list[int]], args: argparse.Namespace
) -> dict[str, list[float]]:
    """Decode the prompts untimed on every model path for its share of ``--warmup-seconds``
    (default: ``GPU_WARMUP_SECONDS`` on a GPU, none elsewhere); return each path's seconds per
    token over its passes.

    On an H200 (fourth and fifth GPU runs) every method ran faster on the second of two
    identical passes (AR 42.3 then 65.9 tokens/s), so without it the first path's rows carry
    the process's first seconds.
    """
    seconds = warmup_seconds(args)
    if seconds <= 0:
        return {}
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens)
    request = TrialRequest(prompts, sampling, "static", max_draft_len=4)
    return {
        path: list(
            warm_up(draft, LocalTarget(target), request, seconds / len(models)).seconds_per_token
        )
        for path, (draft, target) in models.items()
    }


def _run_transformers(
    target_model, draft_model, prompts: list[list[int]], max_new: int, reference: list[list[int]]
) -> list[MethodResult]:
    """Return transformers' rows: plain ``generate()``, assisted at each K, the heuristic."""
    results = []
    tokens, seconds, outputs = _hf_generate(target_model, prompts, max_new)
    plain = MethodResult(TRANSFORMERS_GENERATE, tokens, seconds, tokens / seconds)
    plain.matches_ar = outputs == reference
    results.append(plain)
    for k, schedule in [(k, "constant") for k in STATIC_KS] + [(5, "heuristic_transient")]:
        name = (
            f"transformers assisted K={k}" if schedule == "constant" else "transformers heuristic"
        )
        tokens, seconds, outputs = _hf_assisted(
            target_model, draft_model, prompts, k, schedule, max_new
        )
        results.append(
            MethodResult(name, tokens, seconds, tokens / seconds, matches_ar=outputs == reference)
        )
    return results


def _ratios(results: list[MethodResult]) -> dict[str, float]:
    """Return our rows' speed over transformers' at the same K, and our AR over generate()."""
    by_name = {r.method: r for r in results}
    ratios = {
        f"ours{label}_vs_transformers_K{k}": by_name[f"ours static K={k}{suffix}"].tokens_per_s
        / by_name[f"transformers assisted K={k}"].tokens_per_s
        for label, suffix in (("", ""), ("_transformers_modules", TRANSFORMERS_MODULES))
        for k in STATIC_KS
    }
    ratios["ours_ar_vs_transformers_generate"] = (
        by_name["target-only AR"].tokens_per_s / by_name[TRANSFORMERS_GENERATE].tokens_per_s
    )
    return ratios


def _print_report(report: dict, results: list[MethodResult], out: Path) -> None:
    """Print the methods table, the target's block costs and the ratios."""
    print(
        f"{'method':52} {'tok/s':>8} {'accept':>7} {'overhead':>9} {'us/round':>9} "
        f"{'floor':>6} {'us/round':>9} {'=AR':>4}"
    )
    for r in results:
        accept = f"{r.acceptance_rate:.3f}" if r.acceptance_rate is not None else "-"
        overhead = _cell(r.overhead_fraction, r.overhead_us_per_round)
        floor = _cell(r.floor_overhead_fraction, r.floor_overhead_us_per_round)
        match = {True: "yes", False: "NO", None: "-"}[r.matches_ar]
        if r.floor_matches is False:
            match += " (floor's outputs differ)"
        cells = f"{r.tokens_per_s:8.1f} {accept:>7} {overhead[0]:>9} {overhead[1]:>9} "
        cells += f"{floor[0]:>6} {floor[1]:>9} {match:>4}"
        print(f"{r.method:52} {cells}")
    for path, costs in report["standalone_costs"].items():
        blocks = " ".join(f"{n}:{t * 1e3:.1f}" for n, t in costs["t_target"].items())
        print(f"t_target(n) ms, {path}: {blocks}; t_draft {costs['t_draft'] * 1e3:.2f} ms")
    for name, value in report["ratios"].items():
        print(f"{name}: {value:.2f}x")
    packed = " ".join(f"{n}:{r:.2f}" for n, r in report["packed_vs_unpacked_t_target"].items())
    same_code = "" if report["weights_packed"] else SAME_CODE_NOTE
    print(f"t_target(n) packed / unpacked weights{same_code}: {packed}")
    ar = " ".join(f"{path} {rate:.1f}" for path, rate in report["ar_tokens_per_s"].items())
    baseline = report["ar_baseline"]
    print(f"target-only AR tokens/s, paths taking turns: {ar}")
    print(
        f"AR baseline: {baseline['path']}, one-token steps on {baseline['one_token_layout']} "
        f"weights{' (padded)' if baseline['padded'] else ''}; {baseline['message']}"
    )
    print(
        f"t_draft/t_target: {report['cost_ratio']:.3f}; best static vs AR: "
        f"{report['best_static_speedup_vs_ar']:.2f}x; JSON: {out}"
    )


def _cell(fraction: float | None, us_per_round: float | None) -> tuple[str, str]:
    """Return an overhead's table cells: its share and its microseconds a round, or dashes."""
    if fraction is None or us_per_round is None:
        return "-", "-"
    return f"{fraction:.1%}", f"{us_per_round:.0f}"


def _ar_targets(models: dict[str, tuple[CachedLM | None, CachedLM]]) -> dict[str, CachedLM]:
    """Return the target of every path whose AR is compared with the baseline's: each of
    ``models``' and, where weights pack, a target on packed weights only (its one-token
    padding calibrated on that layout alone)."""
    targets = {path: target for path, (_, target) in models.items()}
    baseline = targets[BASELINE_PATH]
    if "packed" not in baseline.layouts:
        return targets
    packed = CachedLM(baseline.model, single_step="plain")
    packed.calibrate_steps(layouts=("packed",))
    return {BASELINE_PATH: baseline, "plain_torch_packed": packed, **targets}


def _ar_baseline(
    models: dict[str, tuple[CachedLM | None, CachedLM]],
    ids: list[torch.Tensor],
    settings: RequestSettings,
    passes: int = AR_PASSES,
) -> dict:
    """Run target-only AR on every path taking turns (``passes`` passes over the prompts) and
    check the baseline's; return the report's ``ar_tokens_per_s`` and ``ar_baseline`` fields."""
    targets = _ar_targets(models)
    runs = ar_on_every_path(targets, ids, settings, passes, "target-only AR on every path")
    check = check_baseline(runs, BASELINE_PATH)
    plan = targets[BASELINE_PATH].plan
    return {
        "ar_tokens_per_s": {p: StaticComparison.tokens_per_second(r) for p, r in runs.items()},
        "ar_baseline": {
            "path": BASELINE_PATH,
            "step_plan": asdict(plan),
            "one_token_layout": plan.layout(1),
            "padded": plan.padded,
            "fastest_path": check.fastest,
            "ratio_vs": {p: None if r is None else asdict(r) for p, r in check.ratios.items()},
            "tolerance": BASELINE_TOLERANCE,
            "fair": check.fair,
            "message": check.message(),
        },
    }


def _device_name(device: torch.device) -> str:
    """Return what ``device`` is, in words (the GPU's name on CUDA)."""
    if device.type == "cuda":
        return f"{device}: {torch.cuda.get_device_name(device)}"
    return str(device)


def _packed(lm: CachedLM) -> bool:
    """Return whether ``lm``'s fast path holds oneDNN-packed weights (its head's product)."""
    return lm.head_product is not None and lm.head_product.packed is not None


def _calibration(lm: CachedLM) -> dict | None:
    """Return ``lm``'s one-token step calibration (times and whether steps are padded)."""
    return None if lm.calibration is None else asdict(lm.calibration)


def _run_paths(
    models: dict[str, tuple[CachedLM, CachedLM]],
    ids: list[torch.Tensor],
    settings: RequestSettings,
    save: Callable[[list[MethodResult]], None],
) -> tuple[list[MethodResult], list[list[int]]]:
    """Run our rows on every model path (``_run_ours``), ``save`` the rows so far before the
    first path and after each; return the rows and the first path's AR outputs (every path
    is compared with them)."""
    results: list[MethodResult] = []
    reference: list[list[int]] | None = None
    save(results)
    for path, (suffix, _) in PATHS.items():
        draft, target_lm = models[path]
        path_results, outputs = _run_ours(
            draft, LocalTarget(target_lm), ids, settings, suffix, reference
        )
        reference = reference or outputs
        results += path_results
        save(results)
    return results, reference


def _save_rows(out: Path, report: dict, results: list[MethodResult]) -> None:
    """Write ``report`` with the rows so far, marked incomplete, so a run stopped early (a GPU
    lease ending, say) still leaves the block costs and the paths it finished."""
    rows = [asdict(r) for r in results]
    write_json(out, {**report, "complete": False, "methods": rows})


def _lookup_report(args: argparse.Namespace, inputs, target_model) -> dict:
    """Return the run's description for the ``--draft-kind ngram`` or ``eagle`` report, with
    target-only AR on every model path and the check that the rows' AR (the default path, a
    sweep's baseline) is the fastest (``ar_baseline``; the exit status is 1 when it is not)."""
    models = {
        path: (None, CachedLM(target_model, **options)) for path, (_, options) in PATHS.items()
    }
    settings = RequestSettings(SamplingConfig(max_new_tokens=args.max_new_tokens))
    return {
        "commit": checkout_commit(),
        **_ar_baseline(models, inputs.prompt_tensors, settings, passes=1),
        "target": str(inputs.target_path),
        "dataset": args.dataset,
        "samples": len(inputs.prompts),
        "max_new_tokens": args.max_new_tokens,
        "torch_threads": torch.get_num_threads(),
        "device": _device_name(inputs.device),
        "dtype": args.dtype,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print a table and write JSON; return the exit code."""
    args = _parse_args(argv)
    if args.draft_kind in ("ngram", "eagle"):
        args.draft = None  # a lookup or an EAGLE head needs no draft model
        inputs = prepare(args)
        target_model = inputs.load(inputs.target_path)
        report = _lookup_report(args, inputs, target_model)
        return lookup_main(args, inputs, report, target_model)
    inputs = prepare(args)
    prompts, ids = inputs.prompts, inputs.prompt_tensors
    target_model, draft_model = inputs.load(inputs.target_path), inputs.load(inputs.draft_path)
    # Outputs are forced to full length (no EOS) so every method generates the same tokens.
    settings = RequestSettings(SamplingConfig(max_new_tokens=args.max_new_tokens))
    models = {
        path: (CachedLM(draft_model, **options), CachedLM(target_model, **options))
        for path, (_, options) in PATHS.items()
    }
    warmup = _warm_up_paths(models, prompts, args)
    paths = standalone_costs(models, ids, max(STATIC_KS) + 1, args.max_new_tokens)
    ar_paths = _ar_baseline(models, ids, settings)
    calibrations = {
        path: {"draft": _calibration(draft), "target": _calibration(target_lm)}
        for path, (draft, target_lm) in models.items()
    }
    report = {
        "target": str(inputs.target_path),
        "draft": str(inputs.draft_path),
        "dataset": args.dataset,
        "samples": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "torch_threads": torch.get_num_threads(),
        "device": _device_name(inputs.device),
        "dtype": args.dtype,
        "warmup_seconds_per_token": warmup,
        "standalone_costs": {name: asdict(costs) for name, costs in paths.items()},
        "single_step_calibration": calibrations,
        **ar_paths,
        "cost_ratio": paths["plain_torch"].t_draft / paths["plain_torch"].t_target[1],
        "weights_packed": _packed(models["plain_torch"][1]),
        "packed_vs_unpacked_t_target": {
            n: paths["plain_torch"].t_target[n] / paths["plain_torch_unpacked"].t_target[n]
            for n in paths["plain_torch"].t_target
        },
    }
    save = partial(_save_rows, args.out, report)
    results, reference = _run_paths(models, ids, settings, save)
    results += _run_transformers(target_model, draft_model, prompts, args.max_new_tokens, reference)
    by_name = {r.method: r for r in results}
    best_static = max(by_name[f"ours static K={k}"].tokens_per_s for k in STATIC_KS)
    report["complete"] = True
    report["methods"] = [asdict(r) for r in results]
    report["ratios"] = _ratios(results)
    report["best_static_speedup_vs_ar"] = best_static / by_name["target-only AR"].tokens_per_s
    write_json(args.out, report)
    _print_report(report, results, args.out)
    if not report["ar_baseline"]["fair"]:
        print(f"FAILED: {report['ar_baseline']['message']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
