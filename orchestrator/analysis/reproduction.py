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

The sweep's ``report`` section declares further claims of the same family
(``orchestrator.analysis.declared_claims``): a policy's best against another policy's best, and
two pairs' drafts (one target) under one policy, on speed (the ratio of the two speedups, each
over its own pair's AR baseline) and on acceptance rate (Σ accepted / Σ drafted), by the same
paired interval on the log ratio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.analysis.claim_cells import (
    DRAFT_ACCEPTANCE,
    DRAFT_SPEED,
    POLICY,
    POLICY_VS_POLICY,
    STATIC,
    CellKey,
    Pick,
    candidates,
    cell_key,
    cell_label,
    of_policy,
)
from orchestrator.analysis.declared_claims import draft_picks, policy_picks
from orchestrator.analysis.holdout import (
    DECODE,
    DatasetKey,
    PromptSplit,
    best_setting,
    headline_measure,
    holdout_splits,
)
from orchestrator.analysis.metrics import FitError, ModelError, paired_model_error
from orchestrator.analysis.pairing import (
    Comparison,
    SampleSpeed,
    acceptance_counts,
    compare_family,
    decode_speeds,
)
from orchestrator.analysis.report import MISSING, format_params, model_error_cell
from orchestrator.store.records import StoredTrial
from orchestrator.sweep.spec import SweepSpec

#: Static K the grid must hold: the short drafts a tuned threshold rule is often no better than.
REQUIRED_STATIC = (1, 2)
#: Policies that make no claim of their own: the AR baseline and the oracle (an upper bound).
NOT_CLAIMED = frozenset({"ar", "oracle", STATIC})
#: An acceptance claim's verdicts, by the verdict of its ratio.
ACCEPTANCE_VERDICTS = {"faster": "higher", "slower": "lower"}


class ReproductionError(ValueError):
    """The sweep cannot give a report by the rule (the message names the sweep field)."""


@dataclass(frozen=True)
class Claim:
    """One claim: its two sides and how each was chosen (``pick``: a policy's best setting
    against the best static K, or a comparison the sweep's ``report`` section declares), their
    comparison on the test prompts (``comparison``, in the report's Holm family), and its n
    (test prompts × ``repeats`` × ``new_tokens``)."""

    pick: Pick
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

    @property
    def verdict_text(self) -> str:
        """Return the verdict as printed: an acceptance claim's is "higher" or "lower"."""
        verdict = str(self.comparison.verdict)
        if self.pick.form == DRAFT_ACCEPTANCE:
            return ACCEPTANCE_VERDICTS.get(verdict, verdict)
        return verdict


@dataclass(frozen=True)
class ReproductionReport:
    """A sweep's claims, the measure they compare, the static grid, and what was not claimed."""

    sweep: str
    measure: str
    static_grid: tuple[int, ...]
    claims: tuple[Claim, ...]
    skipped: tuple[str, ...]

    @property
    def policy_claims(self) -> tuple[Claim, ...]:
        """Return the claims of each policy's best against the best static K."""
        return tuple(claim for claim in self.claims if claim.pick.form == POLICY)

    @property
    def declared_claims(self) -> tuple[Claim, ...]:
        """Return the claims the sweep's ``report`` section declares."""
        return tuple(claim for claim in self.claims if claim.pick.form != POLICY)


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


def _splits(spec: SweepSpec) -> dict[DatasetKey, PromptSplit]:
    """Return each dataset entry's dev/test split; raise naming an entry without one."""
    for index, entry in enumerate(spec.datasets):
        if entry.holdout is None:
            raise ReproductionError(
                f"datasets[{index}].holdout: {entry.name} holds out no test prompts; every "
                "claim is chosen on dev prompts and measured on test prompts: add e.g. "
                "holdout: {dev_fraction: 0.5}"
            )
    return holdout_splits(spec)


def _compared_samples(
    pick: Pick, speeds: Sequence[SampleSpeed], prompts: int, measure: str
) -> list[SampleSpeed]:
    """Return what a claim compares of one side's samples (of ``prompts`` prompts) on the test
    prompts (every repeat of each): acceptance counts in an acceptance claim, else the speeds
    timed by ``measure``."""
    test = set(pick.split.test)
    chosen = [s for s in speeds if s.sample_index % max(prompts, 1) in test]
    if pick.form == DRAFT_ACCEPTANCE:
        return acceptance_counts(chosen) or []
    timed = decode_speeds(chosen) if measure == DECODE else None
    return chosen if timed is None else timed


def _sides(
    pick: Pick, samples: Mapping[str, Sequence[SampleSpeed]], measure: str
) -> list[list[SampleSpeed]]:
    """Return the sides a claim compares: A and B, and for a draft speed claim their pairs' AR
    baselines too (A's speedup over B's: the two pairs' arms are not interleaved together)."""
    ids = [pick.a.trial_id, pick.b.trial_id]
    if pick.form == DRAFT_SPEED:
        ids += [pick.a.baseline_id or "", pick.b.baseline_id or ""]
    return [_compared_samples(pick, samples[i], pick.a.samples, measure) for i in ids]


def _cell_picks(
    rows: Sequence[StoredTrial],
    samples: Mapping[str, Sequence[SampleSpeed]],
    split: PromptSplit,
    skipped: list[str],
) -> list[Pick]:
    """Return one cell's claims (each policy's best against the best static K); note in
    ``skipped`` what cannot be claimed."""
    by_id = {row.trial_id: row for row in rows}
    label = cell_label(rows[0])
    best_static = best_setting(candidates(of_policy(rows, STATIC), samples), split)
    policies = dict.fromkeys(r.policy for r in rows if r.policy not in NOT_CLAIMED)
    if best_static is None:
        skipped += [f"{label}: {name}: no done static trial to compare with" for name in policies]
        return []
    picks = []
    static = by_id[best_static.trial_id]
    for policy in policies:
        found = best_setting(candidates(of_policy(rows, policy), samples), split)
        if found is None:
            skipped.append(f"{label}: {policy}: no done trial with a done AR baseline")
            continue
        chosen = by_id[found.trial_id]
        picks.append(Pick(POLICY, label, policy, STATIC, chosen, static, found, best_static, split))
    return picks


def _picks(
    spec: SweepSpec,
    cells: Mapping[CellKey, Sequence[StoredTrial]],
    samples: Mapping[str, Sequence[SampleSpeed]],
    skipped: list[str],
) -> list[Pick]:
    """Return every claim of the report before it is compared: each cell's policy claims,
    then the comparisons ``spec.report`` declares, in its order."""
    splits = _splits(spec)
    picks = [
        pick
        for key, members in cells.items()
        for pick in _cell_picks(members, samples, splits[key[1]], skipped)
    ]
    for policies in spec.report.policies:
        picks += policy_picks(policies, cells, samples, splits, skipped)
    for drafts in spec.report.drafts:
        picks += draft_picks(drafts, cells, samples, splits, skipped)
    return picks


def _model_errors(picks: Sequence[Pick], fits: Mapping[str, FitError]) -> list[ModelError | None]:
    """Return the cost-model error each claim carries (None: both sides live, not known, or an
    acceptance claim, which times nothing)."""
    return [
        None
        if p.form == DRAFT_ACCEPTANCE
        else paired_model_error(fits.get(p.a.trial_id), fits.get(p.b.trial_id))
        for p in picks
    ]


def reproduction_report(
    spec: SweepSpec,
    rows: Sequence[StoredTrial],
    samples: Mapping[str, Sequence[SampleSpeed]],
    fits: Mapping[str, FitError] | None = None,
) -> ReproductionReport:
    """Return the sweep's report from its done trials ``rows`` and their ``samples`` (by id);
    ``fits`` holds each replayed trial's cost fit (``Store.side_fits``; a replayed trial not in
    it carries no model error).

    Raises ReproductionError when the static grid lacks K = 1 or 2 or a dataset entry has no
    holdout (the message names the field).
    """
    grid = static_grid(spec)
    cells: dict[CellKey, list[StoredTrial]] = {}
    for row in rows:
        if row.status == "done":
            cells.setdefault(cell_key(row), []).append(row)
    skipped: list[str] = []
    picks = _picks(spec, cells, samples, skipped)
    timed = [p for p in picks if p.form != DRAFT_ACCEPTANCE]
    measure = headline_measure([samples[t.trial_id] for p in timed for t in (p.a, p.b)])
    sides = [_sides(p, samples, measure) for p in picks]
    family = compare_family(sides, _model_errors(picks, fits or {})) if picks else []
    claims = tuple(
        Claim(pick, compared, spec.execution.repeats, pick.a.max_new_tokens)
        for pick, compared in zip(picks, family, strict=True)
    )
    return ReproductionReport(spec.name, measure, grid, claims, tuple(skipped))


def _setting(row: StoredTrial) -> str:
    """Return a trial's setting in a table cell: policy, its parameters, K, and "replayed"."""
    params = format_params(row.params)
    shown = "" if params == MISSING else f" ({params})"
    replayed = ", replayed" if row.mode == "replay" else ""
    return f"{row.policy}{shown} K={row.max_draft_len}{replayed}"


def _ratio_cells(claim: Claim) -> list[str]:
    """Return the ratio, interval, model error, Holm p and verdict cells of one claim."""
    compared = claim.comparison
    ratio = compared.ratio
    error = model_error_cell(compared.model_error)
    if ratio is None:
        return ["-", f"no interval ({compared.n_prompts} test prompts)", error, "-", "not tested"]
    return [
        f"{ratio.estimate:.3f}",
        f"[{ratio.low:.3f}, {ratio.high:.3f}]",
        error,
        f"{compared.adjusted_p:.3g}",
        claim.verdict_text,
    ]


def _rule_lines(report: ReproductionReport) -> list[str]:
    """Return the report's title and the bullets of its rule."""
    m = sum(claim.comparison.ratio is not None for claim in report.claims)
    level = 100 * (1 - 0.05 / max(m, 1))
    measure = "decode-only" if report.measure == DECODE else "end-to-end"
    return [
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
    ]


#: The rule of the declared comparisons, printed when the report has any.
DECLARED_RULE = (
    "- Declared comparisons (the sweep's `report` section; second table), in the same Holm "
    "family and by the same interval: *policy vs policy*: policy A's best setting against "
    "policy B's in one cell, each chosen on the dev prompts as above; *draft speed*: pair A's "
    "draft against pair B's (one target) under one policy, each at its best setting chosen on "
    "the dev prompts by its speedup over its own pair's AR baseline, A's speedup over its AR "
    "baseline over B's over its own on the same test prompts (each pair's arms are interleaved "
    "with its own AR baseline, not with the other pair's: the ratio of speedups cancels a "
    "change of the machine's speed between the pairs); *draft acceptance*: A at B's "
    "chosen setting against B, A's acceptance rate (accepted over drafted tokens) over B's on "
    "the same test prompts (verdict higher or lower)."
)


def _claim_rows(claims: Sequence[Claim], declared: bool) -> list[str]:
    """Return one table row per claim (a declared claim's row starts with its form and names
    a draft claim's pairs)."""
    rows = []
    for claim in claims:
        pick = claim.pick
        sides = [_setting(pick.a), _setting(pick.b)]
        if pick.form not in (POLICY, POLICY_VS_POLICY):
            sides = [f"{pick.name_a}: {sides[0]}", f"{pick.name_b}: {sides[1]}"]
        form = [pick.form] if declared else []
        cells = [*form, pick.cell, *sides, *_ratio_cells(claim), claim.n_text]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def report_markdown(report: ReproductionReport) -> str:
    """Return the report as markdown: the rule, then one table row per claim (the declared
    comparisons in a second table)."""
    declared = report.declared_claims
    lines = [
        *_rule_lines(report),
        *([DECLARED_RULE] if declared else []),
        "",
        "| cell | A: best of policy | B: best static K | A / B | interval | model error | Holm p "
        "| verdict | n |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *_claim_rows(report.policy_claims, declared=False),
    ]
    if not report.policy_claims:
        lines.append("| (no claim: no cell has a done policy and static trial) |" + " |" * 8)
    if declared:
        lines += [
            "",
            "| claim | cell | A | B | A / B | interval | model error | Holm p | verdict | n |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            *_claim_rows(declared, declared=True),
        ]
    lines += ["", *(f"- not claimed: {line}" for line in report.skipped)]
    return "\n".join(lines).rstrip() + "\n"
