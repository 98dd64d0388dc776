"""The cells of a reproduction report and a claim before its family is compared (pure).

A cell is one pair's trials on one dataset entry, sampling setting, seed and draft kind; a
claim (:class:`Pick`) sets two trials of cells side by side, each a best setting chosen on the
dev prompts (``holdout.best_setting``). ``orchestrator.analysis.reproduction`` makes the policy
claims and the report, ``orchestrator.analysis.declared_claims`` the comparisons a sweep's
``report`` section declares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from orchestrator.analysis.holdout import (
    BestSetting,
    Candidate,
    DatasetKey,
    PromptSplit,
    dataset_key,
)
from orchestrator.analysis.pairing import SampleSpeed
from orchestrator.store.records import StoredTrial

STATIC = "static"

#: What a claim compares: a policy's best setting with the best static K (every policy), with
#: another policy's best (``report.policies``), or two pairs' drafts under one policy
#: (``report.drafts``) on speed and on acceptance.
ClaimForm = Literal["policy", "policy vs policy", "draft speed", "draft acceptance"]
POLICY: ClaimForm = "policy"
POLICY_VS_POLICY: ClaimForm = "policy vs policy"
DRAFT_SPEED: ClaimForm = "draft speed"
DRAFT_ACCEPTANCE: ClaimForm = "draft acceptance"

#: A cell: pair, dataset entry, temperature, top-k, top-p, seed, draft kind.
CellKey = tuple[str, DatasetKey, float, int, float, int, str]


@dataclass(frozen=True)
class Pick:
    """One claim before the family is compared: its form, its cell, what A and B are (a policy
    or a pair), their trials, how each was chosen on the dev prompts (``picked_a`` None: A's
    trial is the one at B's setting, an acceptance claim), and the cell's prompt split."""

    form: ClaimForm
    cell: str
    name_a: str
    name_b: str
    a: StoredTrial
    b: StoredTrial
    picked_a: BestSetting | None
    picked_b: BestSetting
    split: PromptSplit


def cell_key(row: StoredTrial) -> CellKey:
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


def cell_label(row: StoredTrial, name: str | None = None) -> str:
    """Return a cell's printable name: ``name`` (default: the trial's pair), the draft kind when
    it is not a draft model, dataset, sampling and seed."""
    sampling = f"T={row.temperature:g}"
    if row.temperature > 0 and (row.top_k or row.top_p < 1):
        sampling += f" top-k {row.top_k} top-p {row.top_p:g}"
    kind = "" if row.draft_kind == "lm" else f" ({row.draft_kind})"
    return f"{name or row.pair}{kind} · {row.dataset} · {sampling} · seed {row.seed}"


def candidates(
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


def of_policy(rows: Sequence[StoredTrial], policy: str) -> list[StoredTrial]:
    """Return the trials of ``rows`` that run ``policy``."""
    return [row for row in rows if row.policy == policy]
