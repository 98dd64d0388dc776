"""Preflight checks of an EAGLE pair (``draft: {kind: eagle}``): the head fits its target.

A head reads its target's last-layer features and drafts through the target's own frozen
embeddings, norm and LM head (``workers.eagle``), so it fits only a target of its width and
vocabulary: a head given by ``model`` is checked against the target's config (a head fusing
several layers also against its depth), and a head made by an ``eagle_head`` job (``job``) must
be trained on the pair's target (the job's ``base``). The draft worker is fed the target's
features over the target group's channel; a tensor-parallel (deepspeed) target's rank 0 answers
from its sharded forward, whose hidden states are whole on every rank (each layer's output is
all-reduced), so any backend serves a head.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.sweep.spec import PairSpec
from workers.eagle.artifact import read_eagle_config
from workers.eagle.head import EagleConfig

#: The target config fields a head must share with its target.
SHARED_FIELDS = ("hidden_size", "vocab_size")


def eagle_pair_problems(
    where: str,
    pair: PairSpec,
    draft: Path | None,
    target: Path,
    target_config: Any,
    draft_at: str | None = None,
) -> list[str]:
    """Return the problems of EAGLE pair ``pair`` (at ``where``, e.g. ``pairs[0]``; its draft
    at ``draft_at``, default ``where.draft``, e.g. ``pairs[0].drafts[1]`` in a list): ``draft``
    is its head's directory (``model``) or its job's base (``job``), None when it did not
    resolve (a problem already recorded); ``target`` its target's path and ``target_config``
    that target's config."""
    draft_at = draft_at or f"{where}.draft"
    if draft is None:
        return []
    if pair.draft.job is not None:
        if draft == target:
            return []
        return [
            f"{draft_at}.job: job {pair.draft.job!r} trains its head on {draft}, not on "
            f"this pair's target {target}; a head fits only the target it was trained on: "
            "set the job's base to the pair's target model"
        ]
    try:
        head = read_eagle_config(draft, getattr(target_config, "num_hidden_layers", None))
    except ValueError as exc:
        return [f"{draft_at}.model: {exc}"]
    return head_fit_problems(f"{draft_at}.model", head, target_config)


def head_fit_problems(where: str, head: EagleConfig, target_config: Any) -> list[str]:
    """Return a problem for each of ``SHARED_FIELDS`` where ``head`` differs from the target
    config ``target_config`` (a transformers config), and one when it fuses a layer the target
    does not have."""
    problems = []
    depth = getattr(target_config, "num_hidden_layers", None)
    if head.feature_layers and depth is not None and max(head.feature_layers) >= depth:
        problems.append(
            f"{where}: the EAGLE head's feature_layers {list(head.feature_layers)} reach past "
            f"the target's {depth} layers; a head fits only the target it was trained for"
        )
    for name in SHARED_FIELDS:
        mine, theirs = getattr(head, name), getattr(target_config, name, None)
        if mine != theirs:
            problems.append(
                f"{where}: the EAGLE head's {name} is {mine} but the target's is {theirs}; a "
                "head fits only the target it was trained for: give a head trained on this "
                "target (an eagle_head job with it as base)"
            )
    return problems
