"""Replay benchmark: the cost of evaluating a grid of draft-length configs by greedy trace replay
versus running each live, the round agreement between the two, and projected vs live tokens/s.

Records one greedy trace per prompt (``workers.trace.record_trace`` at the largest cap in the
grid, about the cost of one live static-K run), builds the grid (static K = 1..cap, and each
threshold policy at quantiles of the recorded feature it compares), replays every config over
the traces (``policies.replay.replay``), and runs a few of the configs live through
``workers.engine.speculative_generate`` (greedy, no EOS, so every config generates the same
tokens). Replay's cost per config includes the recording,
amortised over the grid. Projected seconds of a config are Σ over its replayed rounds of
t_draft·N_draft + t_target (``orchestrator.analysis.costs.model`` fit on the live runs' rounds) plus
each prompt's non-round time (prefill, bookkeeping: its median over the live runs); the held-out
error repeats the comparison with the fit leaving the config's own live run out, and the
block-aware error adds a per-drafted-token target cost to the fit (the target's forward grows
with the block it verifies, which the two-cost model leaves out).

    python bench/replay.py --target zoo:smol/target --draft zoo:smol/draft-s \
        --dataset humaneval --samples 4 --max-new-tokens 32 --out bench-replay.json

Prompts go through the target's chat template when its tokenizer has one, as in sweeps.

With ``--loo [DB]`` it runs no model: it reads every done live trial of a results database
(default docs/demo-results.db), projects each from the cost model fit over the other live
trials of its group (``orchestrator.analysis.costs.validation``, leave-one-trial-out), and
writes each trial's error, the mean absolute error and bias per policy class, and the old
model's figures beside the new:

    python bench/replay.py --loo --out docs/lab/data/replay-validation.json

``--sweep FILE`` (with ``--loo``) adds the runner's own fit: the sweep's plan pooled as the
runner pools it (``orchestrator.run.group_fits.live_pools``), fit by its code
(``costs.replay.fit_group``), every speculative live trial held out in turn, and per fit group the
spread of its trials' per-prompt times about the fit (``validation.prompt_spread``) with the
mean absolute error that spread alone would give (how much of the error is the prompts'
timing scatter rather than the model's; docs/lab/replay-validation.md):

    python bench/replay.py --loo --sweep sweeps/demo.yaml --out /tmp/runner-fit.json
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import (
    add_out_argument,
    add_pair_arguments,
    add_prompt_arguments,
    add_threads_argument,
    bench_parser,
    prepare,
)
from tqdm import tqdm

from orchestrator.analysis.costs.model import CostModelError, fit_cost_model, fit_round_costs
from orchestrator.analysis.costs.replay import fit_group
from orchestrator.analysis.costs.step_costs import StepCostFit
from orchestrator.analysis.costs.validation import (
    HeldOut,
    LiveTrial,
    fit_group_of,
    fit_trials,
    leave_one_out,
    live_trial,
    prompt_spread,
    summarise,
)
from orchestrator.run.group_fits import live_pools, live_trials_from_store
from orchestrator.store.results import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import load_sweep
from policies import make_policy
from policies.adaedl import entropy_acceptance_bound
from policies.replay import GreedyTrace, ReplayedRound, replay
from workers.engine import RequestSettings, speculative_generate
from workers.json_files import write_json
from workers.lm import CachedLM
from workers.records import GenerationResult, SamplingConfig
from workers.target import LocalTarget
from workers.trace import record_trace

#: AdaEDL's γ (its default); the grid's AdaEDL thresholds are quantiles of 1 − sqrt(γ·H).
ADAEDL_GAMMA = 0.2


@dataclass(frozen=True)
class Config:
    """One point of the grid: policy, its parameters, max draft length."""

    policy: str
    params: dict[str, Any]
    max_draft_len: int

    @property
    def label(self) -> str:
        """Return a short printable name."""
        params = ",".join(f"{k}={v:.3g}" for k, v in self.params.items())
        return f"{self.policy}({params}) L={self.max_draft_len}"


@dataclass(frozen=True)
class LiveRun:
    """One config run live: per-prompt results and their total wall time."""

    results: list[GenerationResult]
    seconds: float


@dataclass
class ConfigReport:
    """Replay (and, for live configs, live) results of one config over all prompts.

    ``projection_error`` is projected / live tokens/s − 1 with the cost model fit on every live
    config's rounds; ``held_out_error`` the same with the fit leaving this config out;
    ``block_aware_error`` with the block-aware fit of ``Projection``.
    """

    label: str
    replay_seconds: float
    replayed_rounds: int
    mean_accepted: float
    projected_tokens_per_s: float
    live_seconds: float | None = None
    live_tokens_per_s: float | None = None
    same_requests: float | None = None
    same_rounds: float | None = None
    projection_error: float | None = None
    held_out_error: float | None = None
    block_aware_error: float | None = None


@dataclass(frozen=True)
class Projection:
    """Per-round cost coefficients fit on live rounds, and each prompt's non-round seconds.

    A round's features are (draft forwards, 1) for the project's cost model, and (draft
    forwards, 1, drafted tokens) for the block-aware variant, whose third coefficient is the
    extra target time per verified token (the target's forward grows with the block on CPU).
    """

    coefficients: tuple[float, ...]
    overheads: list[float]
    r2: float

    def seconds(self, replayed: list[list[ReplayedRound]]) -> float:
        """Return the projected wall time of decoding every prompt with these rounds."""
        block_aware = len(self.coefficients) == 3
        rows = [_features(r, block_aware) for rounds in replayed for r in rounds]
        return sum(self.overheads) + float(np.sum(np.asarray(rows) @ self.coefficients))


def _features(round_: Any, block_aware: bool) -> tuple[float, ...]:
    """Return a round's cost-model features (see ``Projection``)."""
    if block_aware:
        return (round_.draft_forwards, 1.0, round_.drafted)
    return (round_.draft_forwards, 1.0)


def fit_projection(live: list[list[GenerationResult]], block_aware: bool = False) -> Projection:
    """Return the projection fit on these live runs (one list of per-prompt results each).

    Each round is an observation (its features, T = its draft + verify seconds), fit by
    ``orchestrator.analysis.costs.model.fit_cost_model``; block-aware, by
    ``orchestrator.analysis.costs.model.fit_round_costs`` (draft seconds on draft forwards, verify
    seconds on (1, drafted), fit separately). A prompt's non-round time (prefill,
    bookkeeping) is its median over the runs.
    """
    rounds = [r for results in live for result in results for r in result.rounds]
    seconds = np.array([r.draft_seconds + r.verify_seconds for r in rounds])
    if block_aware:
        round_fit = fit_round_costs(
            [r.draft_forwards for r in rounds],
            [r.drafted for r in rounds],
            [r.draft_seconds for r in rounds],
            [r.verify_seconds for r in rounds],
        )
        coefficients = np.array([round_fit.t_draft, round_fit.t_target, round_fit.t_per_verified])
        r2 = round_fit.r2_round
    else:
        fit = fit_cost_model([r.draft_forwards for r in rounds], [1] * len(rounds), seconds)
        coefficients, r2 = np.array([fit.t_draft, fit.t_target]), fit.r2
    overheads = [
        statistics.median(_non_round_seconds(results[index]) for results in live)
        for index in range(len(live[0]))
    ]
    return Projection(tuple(float(c) for c in coefficients), overheads, r2)


def grid(traces: list[GreedyTrace], thresholds: int, max_draft_len: int, cap: int) -> list[Config]:
    """Return the grid: static K = 1..cap and ``thresholds`` values of three threshold policies.

    Thresholds are evenly spaced quantiles (2.5% to 97.5%) of the feature each policy compares,
    over the traces' on-path draft predictions, so every value lands where it changes decisions.
    """
    steps = [p for trace in traces for p in trace.on_path]
    quantiles = np.linspace(0.025, 0.975, thresholds)
    features = {
        "svip": [math.sqrt(max(p.entropy, 0.0)) for p in steps],
        "adaedl": [entropy_acceptance_bound(p.entropy, ADAEDL_GAMMA) for p in steps],
        "max_confidence": [p.max_prob for p in steps],
    }
    configs = [Config("static", {}, k) for k in range(1, cap + 1)]
    for policy, values in features.items():
        configs += [
            Config(policy, {"threshold": round(float(v), 4)}, max_draft_len)
            for v in np.quantile(values, quantiles)
        ]
    return configs


def live_choice(configs: list[Config], static_ks: tuple[int, ...]) -> list[Config]:
    """Return the configs also run live: the given static Ks and each threshold policy's median."""
    chosen = [c for c in configs if c.policy == "static" and c.max_draft_len in static_ks]
    for policy in ("svip", "adaedl", "max_confidence"):
        sweep = [c for c in configs if c.policy == policy]
        chosen.append(sweep[len(sweep) // 2])
    return chosen


def _key(rounds: list[Any]) -> list[tuple[int, int, int]]:
    return [(r.drafted, r.accepted, r.draft_forwards) for r in rounds]


def _non_round_seconds(result: GenerationResult) -> float:
    """Return a live request's time outside its rounds (prefill, bookkeeping)."""
    return result.seconds - sum(r.draft_seconds + r.verify_seconds for r in result.rounds)


def run_live(
    configs: list[Config],
    draft: CachedLM,
    target: LocalTarget,
    ids: list[torch.Tensor],
    max_new: int,
) -> dict[str, LiveRun]:
    """Run ``configs`` live on every prompt (sample i: seed i, as in a trial); key by label.

    Prompt by prompt, every config in turn, so that load drifting on a shared machine falls on
    all configs alike; a config's seconds are the sum of its requests' wall times.
    """
    results: dict[str, list[GenerationResult]] = {c.label: [] for c in configs}
    for seed, prompt in enumerate(tqdm(ids, desc="live runs")):
        settings = RequestSettings(SamplingConfig(max_new_tokens=max_new), seed=seed)
        for config in configs:
            policy = make_policy(config.policy, config.max_draft_len, **config.params)
            results[config.label].append(
                speculative_generate(draft, target, policy, prompt, settings)
            )
    return {label: LiveRun(runs, sum(r.seconds for r in runs)) for label, runs in results.items()}


def _replay_all(
    config: Config, traces: list[GreedyTrace]
) -> tuple[list[list[ReplayedRound]], float]:
    """Replay ``config`` over every trace; return the rounds and the wall time."""
    start = time.perf_counter()
    rounds = [
        replay(
            make_policy(config.policy, config.max_draft_len, **config.params),
            trace,
            seed,
        )
        for seed, trace in enumerate(traces)
    ]
    return rounds, time.perf_counter() - start


def _report(
    config: Config,
    replayed: list[list[ReplayedRound]],
    seconds: float,
    tokens: int,
    live: dict[str, LiveRun],
    fits: tuple[Projection, Projection],
) -> ConfigReport:
    """Summarise one config; compare with its live run when it has one.

    ``fits`` are the cost-model and the block-aware projections fit on every live run.
    """
    flat = [r for rounds in replayed for r in rounds]
    projection, block_aware = fits
    report = ConfigReport(
        label=config.label,
        replay_seconds=seconds,
        replayed_rounds=len(flat),
        mean_accepted=sum(r.accepted for r in flat) / len(flat),
        projected_tokens_per_s=tokens / projection.seconds(replayed),
    )
    run = live.get(config.label)
    if run is None:
        return report
    report.live_seconds = run.seconds
    report.live_tokens_per_s = sum(r.n_generated for r in run.results) / sum(
        r.seconds for r in run.results
    )
    pairs = [
        (_key(r.rounds), _key(rounds)) for r, rounds in zip(run.results, replayed, strict=True)
    ]
    report.same_requests = sum(a == b for a, b in pairs) / len(pairs)
    matched = sum(x == y for a, b in pairs for x, y in zip(a, b, strict=False))
    report.same_rounds = matched / sum(max(len(a), len(b)) for a, b in pairs)
    report.projection_error = report.projected_tokens_per_s / report.live_tokens_per_s - 1
    report.block_aware_error = tokens / block_aware.seconds(replayed) / report.live_tokens_per_s - 1
    others = [other.results for label, other in live.items() if label != config.label]
    if len(others) >= 2:
        held_out = tokens / fit_projection(others).seconds(replayed)
        report.held_out_error = held_out / report.live_tokens_per_s - 1
    return report


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = bench_parser(__doc__)
    add_pair_arguments(parser)
    add_prompt_arguments(parser, samples=4, max_new_tokens=32)
    parser.add_argument("--prompt-tokens", type=int, default=64, help="keep the last N tokens")
    parser.add_argument("--thresholds", type=int, default=20, help="values per threshold policy")
    parser.add_argument("--max-draft-len", type=int, default=8, help="for threshold policies")
    parser.add_argument("--cap", type=int, default=16, help="largest static K = trace cap")
    parser.add_argument(
        "--live-static", type=int, nargs="+", default=[2, 6], help="static Ks also run live"
    )
    add_threads_argument(parser, 1, "1: no stalls on a shared machine")
    add_out_argument(parser, "bench-replay.json")
    parser.add_argument(
        "--loo",
        nargs="?",
        const=DEMO_DB,
        default=None,
        metavar="DB",
        help=f"leave-one-trial-out over a results DB's live trials (default {DEMO_DB}); no models",
    )
    parser.add_argument(
        "--sweep",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --loo: also hold each speculative live trial of this sweep's plan out of "
        "the runner's own fit (its pools and code), and print each fit group's per-prompt "
        "spread and the error it alone would give",
    )
    return parser.parse_args(argv)


#: The committed demo database the leave-one-trial-out validation reads by default.
DEMO_DB = "docs/demo-results.db"


def _group_key(trial: Any) -> tuple[Any, ...]:
    """Return a stored trial's cost-fit group: pair, prompts, output length, sampling."""
    return (
        trial.pair,
        trial.dataset,
        trial.split,
        trial.samples,
        trial.max_new_tokens,
        trial.temperature,
        trial.top_k,
        trial.top_p,
    )


@dataclass(frozen=True)
class GroupSpread:
    """A fit group's per-prompt spread about its pool's full fit (``prompt_spread``; None
    below two trials or prompts) and the mean absolute leave-one-out error it alone would give
    one of the group's trials."""

    group: str
    trials: int
    trial_ids: list[str]
    prompts: int
    spread: float | None
    expected_abs_error: float | None


@dataclass(frozen=True)
class RunnerValidation:
    """Each speculative live trial of a sweep's plan held out of the runner's own fit, and
    each fit group's :class:`GroupSpread`."""

    held: list[HeldOut]
    spreads: list[GroupSpread]


def load_live_groups(
    db: str, sweep: Path | None = None
) -> tuple[dict[tuple[Any, ...], list[LiveTrial]], RunnerValidation]:
    """Return the done live trials of SQLite file ``db`` (or a database URL), by fit group,
    and (with a ``sweep`` file) the runner's own fit validated (:class:`RunnerValidation`).

    A SQLite file is read from a temporary copy, opened as a writer so that an older schema
    is migrated there and never in the file itself.
    """
    if "://" in db:
        store = open_store(db, read_only=True)
        return _live_groups(store), _runner_validation(store, sweep)
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "results.db"
        shutil.copyfile(db, copy)
        store = open_store(f"sqlite:///{copy}")
        return _live_groups(store), _runner_validation(store, sweep)


def _runner_validation(store: Any, sweep: Path | None) -> RunnerValidation:
    """Return each done speculative live trial of ``sweep``'s plan held out of the fit the
    runner makes (``orchestrator.run.group_fits``: its pools, its fit, every such trial taken
    as a check) and each fit group's prompt spread; empty without a sweep file."""
    if sweep is None:
        return RunnerValidation([], [])
    plan = plan_sweep(load_sweep(sweep))
    held: list[HeldOut] = []
    spreads: list[GroupSpread] = []
    for trials, _ in live_pools(plan.trials):
        checks = {t.trial_id for t in trials if not t.is_baseline}
        live = live_trials_from_store(store, trials)
        try:
            pool = fit_group(live, checks)
        except CostModelError:
            continue
        held += pool.checks
        spreads += _group_spreads(pool.steps, live)
    return RunnerValidation(held, spreads)


def _group_spreads(fit: StepCostFit, trials: list[LiveTrial]) -> list[GroupSpread]:
    """Return each fit group's spread about ``fit`` (the pool's full fit), and the mean
    absolute leave-one-out error that spread alone would give one of its trials: a held-out
    trial's own P prompts and its group's other n − 1 trials (its level) each carry
    spread / √P, so sqrt(2/π) · spread / √P · sqrt(1 + 1/(n − 1))."""
    groups: dict[str, list[LiveTrial]] = {}
    for trial in trials:
        groups.setdefault(fit_group_of(trial), []).append(trial)
    rows = []
    for members in groups.values():
        spread = prompt_spread(fit, members)
        prompts, n = len(members[0].sample_indices), len(members)
        expected = (
            math.sqrt(2 / math.pi) * spread / math.sqrt(prompts) * math.sqrt(1 + 1 / (n - 1))
            if spread is not None
            else None
        )
        first = members[0].stored
        rows.append(
            GroupSpread(
                group=f"{first.pair} {first.draft_kind} {first.dataset} T={first.temperature:g}",
                trials=n,
                trial_ids=[trial.trial_id for trial in members],
                prompts=prompts,
                spread=spread,
                expected_abs_error=expected,
            )
        )
    return rows


def _live_groups(store: Any) -> dict[tuple[Any, ...], list[LiveTrial]]:
    """Return a store's done live trials by fit group."""
    groups: dict[tuple[Any, ...], list[LiveTrial]] = {}
    rows = [t for t in store.trials() if t.mode == "live" and t.status == "done"]
    rounds: dict[str, list[Any]] = {}
    for row in store.rounds(t.trial_id for t in rows):
        rounds.setdefault(row.trial_id, []).append(row)
    for trial in rows:
        observed = live_trial(
            trial, rounds.get(trial.trial_id, []), store.sample_outputs(trial.trial_id)
        )
        groups.setdefault(_group_key(trial), []).append(observed)
    return groups


def _summary_rows(held: list[HeldOut]) -> dict[str, Any]:
    """Return mean absolute error and bias per policy class, new model and old."""
    classes: dict[str, list[HeldOut]] = {}
    for h in held:
        classes.setdefault(h.policy_class, []).append(h)
    return {
        name: {
            "new": asdict(summarise([h.error for h in rows])),
            "old": asdict(summarise([h.old_error for h in rows])),
        }
        for name, rows in sorted(classes.items())
    }


#: The two fit pools the validation reports: the runner's fit group (pair, prompts, output
#: length, sampling), and the pair at one sampling setting across its datasets.
POOLS = ("group", "pair")


def _pooled(
    groups: dict[tuple[Any, ...], list[LiveTrial]],
) -> dict[tuple[Any, ...], list[LiveTrial]]:
    """Return the trials pooled by pair and sampling (temperature, top-k, top-p)."""
    pooled: dict[tuple[Any, ...], list[LiveTrial]] = {}
    for key, trials in groups.items():
        pooled.setdefault((key[0], *key[5:]), []).extend(trials)
    return pooled


def _validation(groups: dict[tuple[Any, ...], list[LiveTrial]]) -> dict[str, Any]:
    """Return every trial held out of its pool, and the summaries (new model and old)."""
    held = [(key, h) for key, trials in groups.items() for h in leave_one_out(trials)]
    speculative = [h for _, h in held if h.policy_class != "ar"]
    in_range = [h for h in speculative if h.beyond_table == 0.0]
    return {
        "all_speculative": {
            "new": asdict(summarise([h.error for h in speculative])),
            "old": asdict(summarise([h.old_error for h in speculative])),
        },
        "block_sizes_measured": {
            "new": asdict(summarise([h.error for h in in_range])),
            "old": asdict(summarise([h.old_error for h in in_range])),
        },
        "by_class": _summary_rows([h for _, h in held]),
        "trials": [{"pool": list(key), **asdict(h)} for key, h in held],
        "fits": [_full_fit(key, trials) for key, trials in groups.items()],
    }


def _full_fit(key: tuple[Any, ...], trials: list[LiveTrial]) -> dict[str, Any]:
    """Return the per-step fit over all of a pool's live trials (None when it cannot be made)."""
    try:
        fit: dict[str, Any] | None = asdict(fit_trials(trials))
    except CostModelError:
        fit = None
    return {"pool": list(key), "trials": len(trials), "fit": fit}


def _percent(value: float | None) -> str:
    """Return a signed percentage, or "-" for None."""
    return f"{value:+.1%}" if value is not None else "-"


def _share(value: float | None) -> str:
    """Return an unsigned percentage, or "-" for None."""
    return f"{value:.1%}" if value is not None else "-"


def validate(db: str, out: Path, sweep: Path | None = None) -> int:
    """Run the leave-one-trial-out validation over ``db``, print it and write JSON."""
    groups, runner = load_live_groups(db, sweep)
    pools = {"group": _validation(groups), "pair": _validation(_pooled(groups))}
    if sweep is not None:
        pools["runner"] = _runner_summary(runner)
    write_json(out, {"db": db, **pools})
    for name, pool in pools.items():
        if name == "runner":
            continue
        print(f"pool: {name}")
        for t in pool["trials"]:
            where = " ".join(str(part) for part in t["pool"][:2])
            print(
                f"  {where:24} {t['label']:22} new {_percent(t['error']):>7} "
                f"old {_percent(t['old_error']):>7}"
            )
        for label, row in pool["by_class"].items():
            new, old = row["new"], row["old"]
            print(
                f"  {label:18} n {new['n']:2} new MAE {_share(new['mean_abs_error'])} bias "
                f"{_percent(new['bias'])}; old MAE {_share(old['mean_abs_error'])} bias "
                f"{_percent(old['bias'])}"
            )
        everything = pool["all_speculative"]
        print(
            f"  all speculative: new MAE {_share(everything['new']['mean_abs_error'])} bias "
            f"{_percent(everything['new']['bias'])}; old MAE "
            f"{_share(everything['old']['mean_abs_error'])} bias "
            f"{_percent(everything['old']['bias'])}"
        )
    if sweep is not None:
        everything = pools["runner"]["all_speculative"]
        print(
            f"runner's fit ({sweep}): n {everything['n']} MAE "
            f"{_share(everything['mean_abs_error'])} bias {_percent(everything['bias'])}; "
            "the groups' per-prompt spread alone would give MAE "
            f"{_share(pools['runner']['spread_alone_mean_abs_error'])}"
        )
        for row in pools["runner"]["spreads"]:
            print(
                f"  {row['group']:36} {row['trials']} trials x {row['prompts']} prompts: "
                f"spread {_share(row['spread'])}, alone MAE {_share(row['expected_abs_error'])}"
            )
    print(f"JSON: {out}")
    return 0


def _runner_summary(runner: RunnerValidation) -> dict[str, Any]:
    """Return the runner's held-out trials, their summary (new model), the groups' spreads
    and the mean absolute error the spreads alone would give those trials."""
    expected = {
        trial_id: row.expected_abs_error for row in runner.spreads for trial_id in row.trial_ids
    }
    alone = [expected.get(h.trial_id) for h in runner.held]
    known = [value for value in alone if value is not None]
    return {
        "all_speculative": asdict(summarise([h.error for h in runner.held])),
        "spread_alone_mean_abs_error": statistics.fmean(known) if known else None,
        "spreads": [asdict(row) for row in runner.spreads],
        "trials": [asdict(h) for h in runner.held],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print a table and write JSON; return the exit code."""
    args = _parse_args(argv)
    if args.loo is not None:
        return validate(args.loo, args.out, args.sweep)
    inputs = prepare(args, prompt_tokens=args.prompt_tokens)
    ids = inputs.prompt_tensors
    target_path, draft_path = inputs.target_path, inputs.draft_path
    draft = CachedLM(inputs.load(draft_path))
    target_lm = CachedLM(inputs.load(target_path))
    target = LocalTarget(target_lm)
    run_live([Config("static", {}, 2)], draft, target, ids[:1], args.max_new_tokens)

    start = time.perf_counter()
    trace_cap = max(args.cap, args.max_draft_len)
    traces = [record_trace(draft, target_lm, p, args.max_new_tokens, trace_cap) for p in ids]
    record_seconds = time.perf_counter() - start
    configs = grid(traces, args.thresholds, args.max_draft_len, args.cap)
    live_configs = live_choice(configs, tuple(args.live_static))
    live = run_live(live_configs, draft, target, ids, args.max_new_tokens)
    tokens = sum(len(t.reference) for t in traces)
    runs = [run.results for run in live.values()]
    fits = (fit_projection(runs), fit_projection(runs, block_aware=True))
    reports = []
    for config in configs:
        replayed, seconds = _replay_all(config, traces)
        reports.append(_report(config, replayed, seconds, tokens, live, fits))
    summary = _summary(args, reports, record_seconds, live, fits)
    summary.update(target=str(target_path), draft=str(draft_path), samples=len(ids))
    write_json(args.out, {**summary, "reports": [asdict(r) for r in reports]})
    _print(reports, summary, args.out)
    return 0


def _summary(
    args: argparse.Namespace,
    reports: list[ConfigReport],
    record_seconds: float,
    live: dict[str, LiveRun],
    fits: tuple[Projection, Projection],
) -> dict[str, Any]:
    """Return the headline numbers: cost per config both ways, agreement, projection error."""
    replay_per_config = (record_seconds + sum(r.replay_seconds for r in reports)) / len(reports)
    live_per_config = statistics.mean(run.seconds for run in live.values())
    compared = [r for r in reports if r.live_seconds is not None]
    held_out = [abs(r.held_out_error) for r in compared if r.held_out_error is not None]
    fit, block_aware = fits
    return {
        "dataset": args.dataset,
        "max_new_tokens": args.max_new_tokens,
        "prompt_tokens": args.prompt_tokens,
        "cap": args.cap,
        "torch_threads": torch.get_num_threads(),
        "configs": len(reports),
        "live_configs": len(compared),
        "record_seconds": record_seconds,
        "replay_seconds_per_config": replay_per_config,
        "replay_only_seconds_per_config": statistics.mean(r.replay_seconds for r in reports),
        "live_seconds_per_config": live_per_config,
        "live_over_replay": live_per_config / replay_per_config,
        "same_requests": statistics.mean(r.same_requests for r in compared),
        "same_rounds": statistics.mean(r.same_rounds for r in compared),
        "max_abs_projection_error": max(abs(r.projection_error) for r in compared),
        "max_abs_held_out_error": max(held_out) if held_out else None,
        "max_abs_block_aware_error": max(abs(r.block_aware_error) for r in compared),
        "cost_fit": {"t_draft_t_target": fit.coefficients, "r2": fit.r2},
        "block_aware_fit": {
            "t_draft_t_target_t_per_drafted": block_aware.coefficients,
            "r2": block_aware.r2,
        },
    }


def _print(reports: list[ConfigReport], summary: dict[str, Any], out: Path) -> None:
    """Print the live-vs-replay table, the best replayed configs and the headline numbers."""
    header = f"{'config':40} {'live tok/s':>10} {'proj tok/s':>10} {'err':>7} {'held-out':>8}"
    print(f"{header} {'block-aware':>11} {'same rounds':>11}")
    for r in reports:
        if r.live_seconds is None:
            continue
        held_out = f"{r.held_out_error:+.1%}" if r.held_out_error is not None else "-"
        print(
            f"{r.label:40} {r.live_tokens_per_s:10.2f} {r.projected_tokens_per_s:10.2f} "
            f"{r.projection_error:+7.1%} {held_out:>8} {r.block_aware_error:+11.1%} "
            f"{r.same_rounds:11.1%}"
        )
    best = sorted(reports, key=lambda r: -r.projected_tokens_per_s)[:5]
    print("best by replay: " + "; ".join(f"{r.label} {r.projected_tokens_per_s:.2f}" for r in best))
    t_draft, t_target = summary["cost_fit"]["t_draft_t_target"]
    print(
        f"{summary['configs']} configs; recording {summary['record_seconds']:.1f} s; per config: "
        f"replay {summary['replay_seconds_per_config']:.3f} s with recording amortised "
        f"({summary['replay_only_seconds_per_config'] * 1e3:.1f} ms without), live "
        f"{summary['live_seconds_per_config']:.1f} s; live/replay "
        f"{summary['live_over_replay']:.0f}x; same rounds {summary['same_rounds']:.2%}; "
        f"t_draft {t_draft * 1e3:.2f} ms, t_target {t_target * 1e3:.2f} ms, "
        f"R² {summary['cost_fit']['r2']:.3f}; JSON: {out}"
    )


if __name__ == "__main__":
    sys.exit(main())
