"""The comparisons a sweep's ``report`` section declares (pure; ``SweepSpec.report``).

``report.drafts`` entry ``{a, b, policy}``: in every cell of pair ``b`` (dataset entry,
sampling, seed, draft kind) that pair ``a`` also holds, two claims. Speed: A's best setting of
``policy`` against B's, each chosen on the dev prompts by its speedup over its own pair's AR
baseline, compared on the test prompts by that speedup (A's over B's: the two pairs' arms are
not interleaved together, so their raw tokens/s would carry the machine's drift). Acceptance:
A's trial at B's chosen setting (same policy, parameters and max draft length) against B's,
compared on the test prompts by acceptance rate (Σ accepted / Σ drafted), so the drafts are
compared at one draft length.

``report.policies`` entry ``{a, b}``: in every cell that holds done trials of both policies,
A's best setting against B's, each chosen on the dev prompts.

Both come out as :class:`~orchestrator.analysis.claim_cells.Pick`; the report compares them
with its other claims in one Holm family.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.analysis.claim_cells import (
    DRAFT_ACCEPTANCE,
    DRAFT_SPEED,
    POLICY_VS_POLICY,
    CellKey,
    Pick,
    candidates,
    cell_label,
    of_policy,
)
from orchestrator.analysis.holdout import BestSetting, DatasetKey, PromptSplit, best_setting
from orchestrator.analysis.pairing import SampleSpeed
from orchestrator.store.records import StoredTrial
from orchestrator.sweep.spec import DraftComparisonSpec, PolicyComparisonSpec

Cells = Mapping[CellKey, Sequence[StoredTrial]]
Samples = Mapping[str, Sequence[SampleSpeed]]
#: A claim's two sides as chosen: A's trial, B's trial, how A's and how B's was chosen.
Chosen = tuple[StoredTrial, StoredTrial, BestSetting, BestSetting]


def draft_picks(
    comparison: DraftComparisonSpec,
    cells: Cells,
    samples: Samples,
    splits: Mapping[DatasetKey, PromptSplit],
    skipped: list[str],
) -> list[Pick]:
    """Return the speed and acceptance claims of one ``report.drafts`` entry, cell by cell of
    pair ``b``; note in ``skipped`` what cannot be claimed."""
    picks: list[Pick] = []
    for key, rows_b in cells.items():
        if key[0] != comparison.b:
            continue
        label = cell_label(rows_b[0], f"{comparison.a} vs {comparison.b}")
        rows_a = cells.get((comparison.a, *key[1:]))
        if not rows_a:
            skipped.append(f"{label}: {comparison.a} has no done trial in this cell")
            continue
        found = _draft_cell(comparison, label, (rows_a, rows_b), samples, splits[key[1]], skipped)
        picks += found
    return picks


def _draft_cell(
    comparison: DraftComparisonSpec,
    label: str,
    rows: tuple[Sequence[StoredTrial], Sequence[StoredTrial]],
    samples: Samples,
    split: PromptSplit,
    skipped: list[str],
) -> list[Pick]:
    """Return one cell's speed claim and, when A ran B's chosen setting, its acceptance claim."""
    policy = comparison.policy
    chosen = _best_sides((of_policy(rows[0], policy), of_policy(rows[1], policy)), samples, split)
    if chosen is None:
        skipped.append(f"{label}: {policy}: a pair has no done trial with a done AR baseline")
        return []
    names = (comparison.a, comparison.b)
    speed = Pick(DRAFT_SPEED, label, *names, *chosen, split)
    _, b, _, best_b = chosen
    same = at_setting(rows[0], b, samples)
    if same is None:
        skipped.append(f"{label}: acceptance: {comparison.a} has no done trial at B's setting")
        return [speed]
    return [speed, Pick(DRAFT_ACCEPTANCE, label, *names, same, b, None, best_b, split)]


def _best_sides(
    sides: tuple[Sequence[StoredTrial], Sequence[StoredTrial]], samples: Samples, split: PromptSplit
) -> Chosen | None:
    """Return each side's best setting chosen on the dev prompts (``holdout.best_setting``) as
    a claim holds them: A's trial, B's trial, how A's and how B's was chosen; None when a side
    has no done trial with a done AR baseline."""
    best_a, best_b = (best_setting(candidates(side, samples), split) for side in sides)
    if best_a is None or best_b is None:
        return None
    by_id = {row.trial_id: row for side in sides for row in side}
    return by_id[best_a.trial_id], by_id[best_b.trial_id], best_a, best_b


def at_setting(
    rows: Sequence[StoredTrial], trial: StoredTrial, samples: Samples
) -> StoredTrial | None:
    """Return the grid trial among ``rows`` (a live check left out) with ``trial``'s policy,
    parameters and max draft length and with samples; None when there is none."""
    setting = (trial.policy, trial.params, trial.max_draft_len)
    for row in rows:
        if (row.policy, row.params, row.max_draft_len) != setting:
            continue
        if not row.config.get("is_check") and samples.get(row.trial_id):
            return row
    return None


def policy_picks(
    comparison: PolicyComparisonSpec,
    cells: Cells,
    samples: Samples,
    splits: Mapping[DatasetKey, PromptSplit],
    skipped: list[str],
) -> list[Pick]:
    """Return the claims of one ``report.policies`` entry: A's best against B's in every cell
    that holds done trials of both; note in ``skipped`` what cannot be claimed."""
    picks: list[Pick] = []
    for key, rows in cells.items():
        rows_a, rows_b = of_policy(rows, comparison.a), of_policy(rows, comparison.b)
        if not rows_a or not rows_b:
            continue
        label = cell_label(rows[0])
        split = splits[key[1]]
        chosen = _best_sides((rows_a, rows_b), samples, split)
        if chosen is None:
            skipped.append(
                f"{label}: {comparison.a} vs {comparison.b}: a policy has no done trial with "
                "a done AR baseline"
            )
            continue
        picks.append(Pick(POLICY_VS_POLICY, label, comparison.a, comparison.b, *chosen, split))
    return picks
