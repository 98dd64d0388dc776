"""Draft kinds: the proposers the engine's round loop drafts from (``base`` has the contract).

``lm`` is an independent draft language model, ``ngram`` prompt lookup; an EAGLE-style head
is the next kind the contract leaves room for (not yet implemented).
"""

from __future__ import annotations

from typing import Any

from workers.lm import CachedLM
from workers.proposers.base import Candidate, Proposer, check_features
from workers.proposers.draft_lm import DraftLMProposer
from workers.proposers.ngram import NgramProposer, NgramSettings

#: The kind of a draft that names a model (the default, so older sweeps mean it).
DEFAULT_KIND = "lm"
#: Every draft kind a sweep may name.
DRAFT_KINDS = ("lm", "ngram")

__all__ = [
    "DEFAULT_KIND",
    "DRAFT_KINDS",
    "Candidate",
    "DraftLMProposer",
    "NgramProposer",
    "NgramSettings",
    "Proposer",
    "as_proposer",
    "check_features",
    "make_proposer",
]


def as_proposer(draft: CachedLM | Proposer) -> Proposer:
    """Return ``draft`` as a proposer: a ``CachedLM`` (or anything with its ``forward``,
    ``crop``, ``reset`` and ``cached_len``, as tests' stand-ins) becomes the ``lm`` kind."""
    if callable(getattr(draft, "first", None)):
        return draft
    return DraftLMProposer(draft)


def make_proposer(kind: str, lm: CachedLM | None = None, **params: Any) -> Proposer:
    """Return a proposer of ``kind``: ``lm`` wraps ``lm``; ``ngram`` takes NgramSettings'
    fields (n_max, n_min, window). Raises ValueError naming a bad kind or parameter."""
    if kind == "lm":
        if lm is None or params:
            raise ValueError("draft kind 'lm' needs a draft model and takes no parameters")
        return DraftLMProposer(lm)
    if kind == "ngram":
        valid = {"n_max", "n_min", "window"}
        unknown = sorted(set(params) - valid)
        if unknown:
            raise ValueError(
                f"unknown parameter(s) {', '.join(unknown)} for draft kind 'ngram'; "
                f"valid: {', '.join(sorted(valid))}"
            )
        return NgramProposer(NgramSettings(**params))
    raise ValueError(f"unknown draft kind {kind!r}; valid kinds: {', '.join(DRAFT_KINDS)}")
