"""The engine benchmark's ``--draft-kind ngram`` and ``--draft-kind eagle`` rows: a proposer
without a draft model against target-only AR.

Greedy, on the default model path (``workers.llama_fast``): target-only AR and the kind at
static K = 2, 4, 8 (an EAGLE head also at K = 1 and 3, so its best static K is among the rows),
plus for n-gram lookup (``workers.proposers.ngram``) the ``ngram_match``
policy (draft as far as the match length vouches, cap 8) on the same proposals, taking turns
prompt by prompt after one untimed AR decode. ``--draft-kind eagle`` drafts with the EAGLE head
at ``--eagle-head`` (a directory or zoo reference; ``workers.proposers.eagle``) over the target.
Each row reports tokens/s end to end (the request's wall time, prefill included) and decode only
(the rounds' draft and verify time, prefill excluded), its speed-up over AR on both, acceptance,
the share of rounds the kind proposed in, and whether its outputs equal AR's (they must: the
method is lossless).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from tqdm import tqdm

from orchestrator.analysis.stats import paired_speed_ratio
from orchestrator.run.preflight import resolve_model_path
from policies import make_policy
from workers.eagle.artifact import load_eagle_head
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.json_files import write_json
from workers.lm import CachedLM
from workers.proposers import EagleProposer, NgramProposer, NgramSettings, Proposer
from workers.records import GenerationResult, SamplingConfig
from workers.target import LocalTarget

STATIC_KS = (2, 4, 8)
#: An EAGLE head's static Ks: its best is usually short (step 1's agreement bounds the rest).
EAGLE_KS = (1, 2, 3, 4, 8)
#: The match-length policy's cap and ratio (candidate i kept while i <= ratio × match length).
MATCH_CAP, MATCH_RATIO = 8, 1.0


@dataclass(frozen=True)
class LookupRow:
    """One method's totals over the prompts."""

    method: str
    tokens: int
    seconds: float
    decode_seconds: float
    tokens_per_s: float
    decode_tokens_per_s: float
    speedup_vs_ar: float | None = None
    decode_speedup_vs_ar: float | None = None
    acceptance_rate: float | None = None
    proposing_rounds: float | None = None
    matches_ar: bool | None = None
    speedup_interval: tuple[float, float] | None = None
    decode_speedup_interval: tuple[float, float] | None = None


def add_ngram_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--draft-kind``, the lookup's n range and window, and ``--eagle-head``."""
    parser.add_argument(
        "--draft-kind",
        choices=("lm", "ngram", "eagle"),
        default="lm",
        help="lm: the draft model's rows (the full report); ngram: prompt lookup vs AR only; "
        "eagle: the EAGLE head at --eagle-head vs AR only",
    )
    parser.add_argument("--ngram-n-max", type=int, default=3, help="longest n looked up")
    parser.add_argument("--ngram-n-min", type=int, default=1, help="shortest n looked up")
    parser.add_argument("--ngram-window", type=int, default=None, help="tokens searched back")
    parser.add_argument(
        "--eagle-head",
        default=None,
        help="eagle: the head's directory or zoo reference (e.g. zoo:smol-eagle/eagle)",
    )


def _methods(kind: str) -> dict[str, tuple[str, int, dict]]:
    """Return each row's name: (policy, cap, policy parameters) for draft ``kind``."""
    ks = EAGLE_KS if kind == "eagle" else STATIC_KS
    rows = {f"{kind} static K={k}": ("static", k, {}) for k in ks}
    if kind == "ngram":
        rows[f"ngram match-length (ratio {MATCH_RATIO:g}, cap {MATCH_CAP})"] = (
            "ngram_match",
            MATCH_CAP,
            {"ratio": MATCH_RATIO},
        )
    return rows


def run_lookup(
    target: CachedLM,
    ids: list[torch.Tensor],
    max_new_tokens: int,
    proposer: Callable[[], Proposer],
    kind: str = "ngram",
) -> dict[str, list[GenerationResult]]:
    """Decode every prompt with AR and each row of ``kind`` (a new ``proposer()`` each),
    taking turns prompt by prompt."""
    local = LocalTarget(target)
    request = RequestSettings(SamplingConfig(max_new_tokens=max_new_tokens))
    autoregressive_generate(local, ids[0], request)
    runs: dict[str, list[GenerationResult]] = {"target-only AR": []}
    methods = _methods(kind)
    runs.update({name: [] for name in methods})
    for prompt in tqdm(ids, desc=f"AR and {kind}, interleaved"):
        runs["target-only AR"].append(autoregressive_generate(local, prompt, request))
        for name, (policy, cap, params) in methods.items():
            policy_object = make_policy(policy, cap, **params)
            result = speculative_generate(proposer(), local, policy_object, prompt, request)
            runs[name].append(result)
    return runs


def summarise(runs: dict[str, list[GenerationResult]]) -> list[LookupRow]:
    """Return each method's row, its speed-ups taken over the AR row."""
    ar = _row("target-only AR", runs["target-only AR"], None)
    return [ar] + [_row(name, results, ar) for name, results in runs.items() if name != ar.method]


def _row(name: str, results: list[GenerationResult], ar: LookupRow | None) -> LookupRow:
    """Aggregate one method's results (speed-ups and AR agreement when ``ar`` is given)."""
    tokens = sum(r.n_generated for r in results)
    seconds = sum(r.seconds for r in results)
    rounds = [round_ for r in results for round_ in r.rounds]
    decode = sum(_decode_seconds(r) for r in results)
    if ar is None:
        return LookupRow(name, tokens, seconds, decode, tokens / seconds, tokens / decode)
    drafted = sum(r.n_drafted for r in results)
    return LookupRow(
        name,
        tokens,
        seconds,
        decode,
        tokens / seconds,
        tokens / decode,
        speedup_vs_ar=tokens / seconds / ar.tokens_per_s,
        decode_speedup_vs_ar=tokens / decode / ar.decode_tokens_per_s,
        acceptance_rate=sum(r.n_accepted for r in results) / drafted if drafted else None,
        proposing_rounds=sum(1 for r in rounds if r.drafted) / len(rounds),
        matches_ar=None,
    )


def _decode_seconds(result: GenerationResult) -> float:
    """Return ``result``'s decode time: its rounds' draft and verify seconds, prefill excluded."""
    return sum(r.draft_seconds + r.verify_seconds for r in result.rounds)


def with_intervals(
    rows: list[LookupRow], runs: dict[str, list[GenerationResult]]
) -> list[LookupRow]:
    """Return ``rows`` with each speed-up's paired 95% interval over AR (prompt by prompt: a
    jackknife t on the log ratio, ``orchestrator.analysis.stats.paired_speed_ratio``)."""
    ar = runs["target-only AR"]
    return [
        row
        if row.method == "target-only AR"
        else replace(
            row,
            speedup_interval=_interval(runs[row.method], ar, lambda r: r.seconds),
            decode_speedup_interval=_interval(runs[row.method], ar, _decode_seconds),
        )
        for row in rows
    ]


def _interval(
    results: list[GenerationResult],
    ar: list[GenerationResult],
    seconds: Callable[[GenerationResult], float],
) -> tuple[float, float] | None:
    """Return the paired interval of ``results``' tokens/s over ``ar``'s, timed by ``seconds``."""
    found = paired_speed_ratio(
        [r.n_generated for r in results],
        [seconds(r) for r in results],
        [r.n_generated for r in ar],
        [seconds(r) for r in ar],
    )
    return None if found is None else (found.low, found.high)


def with_agreement(
    rows: list[LookupRow], runs: dict[str, list[GenerationResult]]
) -> list[LookupRow]:
    """Return ``rows`` with ``matches_ar`` set from the outputs."""
    reference = [r.output_ids for r in runs["target-only AR"]]
    return [
        row
        if row.method == "target-only AR"
        else LookupRow(**{**asdict(row), "matches_ar": _outputs(runs[row.method]) == reference})
        for row in rows
    ]


def _outputs(results: list[GenerationResult]) -> list[list[int]]:
    """Return the generated ids of each result."""
    return [r.output_ids for r in results]


def _span(interval: tuple[float, float] | None) -> str:
    """Return ``interval`` as "[low, high]", or "" without one."""
    return "" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"


def print_rows(rows: list[LookupRow]) -> None:
    """Print the lookup table (the last column: the decode-only speed-up's paired 95%
    interval over AR)."""
    print(
        f"{'method':44} {'tok/s':>7} {'xAR':>6} {'decode tok/s':>13} {'xAR':>6} "
        f"{'accept':>7} {'propose':>8} {'=AR':>4}  decode xAR 95%"
    )
    for r in rows:
        speedup = f"{r.speedup_vs_ar:.2f}" if r.speedup_vs_ar is not None else "-"
        decode = f"{r.decode_speedup_vs_ar:.2f}" if r.decode_speedup_vs_ar is not None else "-"
        accept = f"{r.acceptance_rate:.3f}" if r.acceptance_rate is not None else "-"
        propose = f"{r.proposing_rounds:.1%}" if r.proposing_rounds is not None else "-"
        match = {True: "yes", False: "NO", None: "-"}[r.matches_ar]
        print(
            f"{r.method:44} {r.tokens_per_s:7.1f} {speedup:>6} {r.decode_tokens_per_s:13.1f} "
            f"{decode:>6} {accept:>7} {propose:>8} {match:>4}  {_span(r.decode_speedup_interval)}"
        )


def lookup_main(args: argparse.Namespace, inputs, report: dict, target_model) -> int:
    """Run the ``--draft-kind ngram`` or ``eagle`` benchmark on ``target_model`` and write its
    JSON; return the exit code (1 when a row's outputs differ from AR's or ``report``'s AR
    baseline check failed)."""
    target = CachedLM(target_model)
    if args.draft_kind == "eagle":
        if args.eagle_head is None:
            raise SystemExit("--draft-kind eagle needs --eagle-head (a directory or zoo ref)")
        head_path = resolve_model_path(args.eagle_head)
        head = load_eagle_head(head_path, target_model)
        runs = run_lookup(
            target, inputs.prompt_tensors, args.max_new_tokens, lambda: EagleProposer(head), "eagle"
        )
        report = {**report, "draft_kind": "eagle", "eagle_head": str(head_path)}
    else:
        settings = NgramSettings(args.ngram_n_max, args.ngram_n_min, args.ngram_window)
        runs = run_lookup(
            target, inputs.prompt_tensors, args.max_new_tokens, lambda: NgramProposer(settings)
        )
        report = {**report, "draft_kind": "ngram", "ngram": asdict(settings)}
    rows = with_intervals(with_agreement(summarise(runs), runs), runs)
    report["methods"] = [asdict(r) for r in rows]
    write_json(args.out, report)
    print_rows(rows)
    print(f"AR baseline: {report['ar_baseline']['message']}")
    print(f"JSON: {args.out}")
    lossless = all(r.matches_ar is not False for r in rows)
    return 0 if lossless and report["ar_baseline"]["fair"] else 1
