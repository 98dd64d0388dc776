"""A reproduction report by one rule (issue #43 point 6): pure, from a sweep's stored trials.

Every claim is one paired comparison: in one cell (pair, dataset entry, sampling setting, seed,
draft kind), the best setting of a policy against the best static K, each chosen on the dev
prompts by its speedup over the cell's AR baseline (``holdout.best_setting``) and compared on
the test prompts only: A's tokens/s over B's on the same prompts, a t interval on the log ratio
with the jackknife standard error over prompts (``pairing.compare_family``, the interval
``compare`` prints). The claims of one report are one family: Holm-adjusted verdicts and
intervals at 1 − 0.05/m. A claim with a replayed side is widened by the cost model's error it
carries (``metrics.paired_model_error``: its interval and p-value, before Holm), so a verdict
only the cost model's error could explain is not made. The best static K is chosen from a grid
that must hold K = 1 and 2 (the report refuses otherwise, naming the sweep field), and every
dataset entry must hold out test prompts (``datasets[i].holdout``). Each claim names its n: test
prompts × repeats × new tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.analysis.holdout import (
    DECODE,
    BestSetting,
    Candidate,
    PromptSplit,
    best_setting,
    dataset_key,
    headline_measure,
    holdout_splits,
)
from orchestrator.analysis.metrics import FitError, ModelError, paired_model_error
from orchestrator.analysis.pairing import Comparison, SampleSpeed, compare_family, decode_speeds
from orchestrator.analysis.report import MISSING, format_params, model_error_cell
from orchestrator.store.records import StoredTrial
from orchestrator.sweep.spec import SweepSpec

STATIC = "static"
#: Static K the grid must hold: the short drafts a tuned threshold rule is often no better than.
REQUIRED_STATIC = (1, 2)
#: Policies that make no claim of their own: the AR baseline and the oracle (an upper bound).
NOT_CLAIMED = frozenset({"ar", "oracle", STATIC})


class ReproductionError(ValueError):
    """The sweep cannot give a report by the rule (the message names the sweep field)."""


@dataclass(frozen=True)
class Claim:
    """One claim: the best setting of ``policy`` (``chosen``) against the best static K
    (``static``) in one cell, their comparison on the test prompts (``comparison``, in the
    report's Holm family), and its n (test prompts × ``repeats`` × ``new_tokens``)."""

    cell: str
    policy: str
    chosen: StoredTrial
    static: StoredTrial
    picked: BestSetting
    picked_static: BestSetting
    comparison: Comparison
    repeats: int
    new_tokens: int

    @property
    def n_text(self) -> str:
        """Return the claim's n: "3 test prompts × 2 repeats × 48 new tokens"."""
        prompts = self.comparison.n_prompts
        return (
            f"{prompts} test prompts × {self.repeats} repeat{'s' * (self.repeats != 1)} × "
            f"{self.new_tokens} new tokens"
        )


@dataclass(frozen=True)
class ReproductionReport:
    """A sweep's claims, the measure they compare, the static grid, and what was not claimed."""

    sweep: str
    measure: str
    static_grid: tuple[int, ...]
    claims: tuple[Claim, ...]
    skipped: tuple[str, ...]


def static_grid(spec: SweepSpec) -> tuple[int, ...]:
    """Return the static K the sweep runs; raise ReproductionError naming the field that sets
    them when K = 1 or 2 is missing (or no static policy is swept)."""
    entries = [(i, p) for i, p in enumerate(spec.policies) if p.name == STATIC]
    if not entries:
        raise ReproductionError(
            "policies: no static entry; the best static K is chosen from a static grid that "
            f"must include K = {', '.join(map(str, REQUIRED_STATIC))}: add {{name: static}}"
        )
    grid = tuple(sorted({k for _, p in entries for k in spec.policy_max_draft_lens(p)}))
    missing = [k for k in REQUIRED_STATIC if k not in grid]
    if missing:
        fields = [
            f"policies[{i}].max_draft_lens" if p.max_draft_lens else "max_draft_lens"
            for i, p in entries
        ]
        raise ReproductionError(
            f"{' / '.join(dict.fromkeys(fields))}: the static grid {list(grid)} lacks K = "
            f"{', '.join(map(str, missing))}; the best static K must be chosen from a grid "
            "that includes K = 1 and 2: add them"
        )
    return grid


def _splits(spec: SweepSpec) -> dict[tuple, PromptSplit]:
    """Return each dataset entry's dev/test split; raise naming an entry without one."""
    for index, entry in enumerate(spec.datasets):
        if entry.holdout is None:
            raise ReproductionError(
                f"datasets[{index}].holdout: {entry.name} holds out no test prompts; every "
                "claim is chosen on dev prompts and measured on test prompts: add e.g. "
                "holdout: {dev_fraction: 0.5}"
            )
    return holdout_splits(spec)


def _cell_key(row: StoredTrial) -> tuple:
    """Return a trial's cell: pair, dataset entry, sampling setting, seed, draft kind (a lookup
    draft shares its pair's worker and AR baseline, not its claims)."""
    return (
        row.pair,
        dataset_key(row),
        row.temperature,
        row.top_k,
        row.top_p,
        row.seed,
        row.draft_kind,
    )


def _cell_label(row: StoredTrial) -> str:
    """Return a cell's printable name (the draft kind shown when it is not a draft model)."""
    sampling = f"T={row.temperature:g}"
    if row.temperature > 0 and (row.top_k or row.top_p < 1):
        sampling += f" top-k {row.top_k} top-p {row.top_p:g}"
    kind = "" if row.draft_kind == "lm" else f" ({row.draft_kind})"
    return f"{row.pair}{kind} · {row.dataset} · {sampling} · seed {row.seed}"


def _candidates(
    rows: Sequence[StoredTrial], samples: Mapping[str, Sequence[SampleSpeed]]
) -> dict[str, Candidate]:
    """Return the done grid trials among ``rows`` that have samples and a baseline with
    samples (a live check repeats a grid setting and is left out)."""
    return {
        row.trial_id: Candidate(samples[row.trial_id], samples[row.baseline_id])
        for row in rows
        if row.baseline_id
        and not row.config.get("is_check")
        and samples.get(row.trial_id)
        and samples.get(row.baseline_id)
    }


def _test_speeds(
    speeds: Sequence[SampleSpeed], split: PromptSplit, prompts: int, measure: str
) -> list[SampleSpeed]:
    """Return the samples of the test prompts (every repeat of each), timed by ``measure``."""
    test = set(split.test)
    chosen = [s for s in speeds if s.sample_index % max(prompts, 1) in test]
    timed = decode_speeds(chosen) if measure == DECODE else None
    return chosen if timed is None else timed


@dataclass(frozen=True)
class _Pick:
    """One claim before the family is compared: the cell, the policy and both best settings."""

    cell: str
    policy: str
    chosen: StoredTrial
    static: StoredTrial
    picked: BestSetting
    picked_static: BestSetting
    split: PromptSplit


def _cell_picks(
    rows: Sequence[StoredTrial],
    samples: Mapping[str, Sequence[SampleSpeed]],
    split: PromptSplit,
    skipped: list[str],
) -> list[_Pick]:
    """Return one cell's claims (each policy's best against the best static K); note in
    ``skipped`` what cannot be claimed."""
    by_id = {row.trial_id: row for row in rows}
    label = _cell_label(rows[0])
    statics = _candidates([r for r in rows if r.policy == STATIC], samples)
    best_static = best_setting(statics, split)
    policies = dict.fromkeys(r.policy for r in rows if r.policy not in NOT_CLAIMED)
    if best_static is None:
        skipped += [f"{label}: {name}: no done static trial to compare with" for name in policies]
        return []
    picks = []
    for policy in policies:
        found = best_setting(_candidates([r for r in rows if r.policy == policy], samples), split)
        if found is None:
            skipped.append(f"{label}: {policy}: no done trial with a done AR baseline")
            continue
        chosen, static = by_id[found.trial_id], by_id[best_static.trial_id]
        picks.append(_Pick(label, policy, chosen, static, found, best_static, split))
    return picks


def _model_errors(picks: Sequence[_Pick], fits: Mapping[str, FitError]) -> list[ModelError | None]:
    """Return the cost-model error each claim carries (None: both sides live, or not known)."""
    return [
        paired_model_error(fits.get(p.chosen.trial_id), fits.get(p.static.trial_id)) for p in picks
    ]


def reproduction_report(
    spec: SweepSpec,
    rows: Sequence[StoredTrial],
    samples: Mapping[str, Sequence[SampleSpeed]],
    fits: Mapping[str, FitError] | None = None,
) -> ReproductionReport:
    """Return the sweep's report from its done trials ``rows`` and their ``samples`` (by id);
    ``fits`` holds each replayed trial's cost fit (``Store.side_fits``); a replayed trial not
    in it is compared as if it were live, without its model's error.

    Raises ReproductionError when the static grid lacks K = 1 or 2 or a dataset entry has no
    holdout (the message names the field).
    """
    grid = static_grid(spec)
    splits = _splits(spec)
    cells: dict[tuple, list[StoredTrial]] = {}
    for row in rows:
        if row.status == "done":
            cells.setdefault(_cell_key(row), []).append(row)
    skipped: list[str] = []
    picks = [
        pick
        for key, members in cells.items()
        for pick in _cell_picks(members, samples, splits[key[1]], skipped)
    ]
    measure = headline_measure([samples[t.trial_id] for p in picks for t in (p.chosen, p.static)])
    pairs = [
        tuple(
            _test_speeds(samples[t.trial_id], p.split, t.samples, measure)
            for t in (p.chosen, p.static)
        )
        for p in picks
    ]
    family = compare_family(pairs, _model_errors(picks, fits or {})) if pairs else []
    claims = tuple(
        Claim(
            cell=p.cell,
            policy=p.policy,
            chosen=p.chosen,
            static=p.static,
            picked=p.picked,
            picked_static=p.picked_static,
            comparison=compared,
            repeats=spec.execution.repeats,
            new_tokens=p.chosen.max_new_tokens,
        )
        for p, compared in zip(picks, family, strict=True)
    )
    return ReproductionReport(spec.name, measure, grid, claims, tuple(skipped))


def _setting(row: StoredTrial) -> str:
    """Return a trial's setting in a table cell: policy, its parameters, K, and "replayed"."""
    params = format_params(row.params)
    shown = "" if params == MISSING else f" ({params})"
    replayed = ", replayed" if row.mode == "replay" else ""
    return f"{row.policy}{shown} K={row.max_draft_len}{replayed}"


def _ratio_cells(compared: Comparison) -> list[str]:
    """Return the ratio, interval, model error, Holm p and verdict cells of one claim."""
    ratio = compared.ratio
    error = model_error_cell(compared.model_error)
    if ratio is None:
        return ["-", f"no interval ({compared.n_prompts} test prompts)", error, "-", "not tested"]
    return [
        f"{ratio.estimate:.3f}",
        f"[{ratio.low:.3f}, {ratio.high:.3f}]",
        error,
        f"{compared.adjusted_p:.3g}",
        str(compared.verdict),
    ]


def report_markdown(report: ReproductionReport) -> str:
    """Return the report as markdown: the rule, then one table row per claim."""
    m = sum(claim.comparison.ratio is not None for claim in report.claims)
    level = 100 * (1 - 0.05 / max(m, 1))
    measure = "decode-only" if report.measure == DECODE else "end-to-end"
    lines = [
        f"# Reproduction report: {report.sweep}",
        "",
        "One rule for every claim:",
        "",
        "- A claim compares the best setting of a policy (A) with the best static K (B) in one "
        "cell (pair, draft kind, dataset, sampling, seed). Each is chosen on the dev prompts by "
        "its speedup over the cell's AR baseline and measured on the test prompts only.",
        f"- The best static K is chosen from K ∈ {{{', '.join(map(str, report.static_grid))}}}.",
        f"- Ratio: A's {measure} tokens/s over B's on the same test prompts (paired by prompt; "
        "repeats summed within their prompt), a t interval on the log ratio with the jackknife "
        "standard error over prompts (as `compare`).",
        f"- Holm over the m = {m} claims of this report: verdicts from Holm-adjusted p-values "
        f"(family-wise error 5%), intervals at {level:.4g}%, which hold together.",
        "- n = test prompts × repeats × new tokens.",
        "- A replayed side's seconds are projected by its cost fit, so a claim with one "
        'includes the model\'s measured error (column "model error"; docs/methods.md, '
        "\"Replay's per-step cost model\"): against a live side the fit's out-of-sample error "
        "e; for two replayed sides of one fit the mean error of a ratio of two projections, "
        "measured on the fit's live checks of the same prompts; two fits, both e added. The "
        "interval becomes [low·(1 − e), high·(1 + e)] and the Holm p is the widened "
        "interval's; the ratio is unchanged.",
        "",
        "| cell | A: best of policy | B: best static K | A / B | interval | model error | Holm p "
        "| verdict | n |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for claim in report.claims:
        cells = [
            claim.cell,
            _setting(claim.chosen),
            _setting(claim.static),
            *_ratio_cells(claim.comparison),
            claim.n_text,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if not report.claims:
        lines.append("| (no claim: no cell has a done policy and static trial) |" + " |" * 8)
    lines += ["", *(f"- not claimed: {line}" for line in report.skipped)]
    return "\n".join(lines).rstrip() + "\n"
