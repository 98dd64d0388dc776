"""Draft kinds: the proposers the engine's round loop drafts from (``base`` has the contract).

``lm`` is an independent draft language model, ``ngram`` prompt lookup, ``eagle`` an
EAGLE-style feature head over the target's hidden states.
"""

from __future__ import annotations

from typing import Any

from workers.eagle.artifact import load_eagle_head
from workers.lm import CachedLM
from workers.proposers.base import Candidate, Proposer, check_features
from workers.proposers.draft_lm import DraftLMProposer
from workers.proposers.eagle import EagleProposer
from workers.proposers.ngram import NgramProposer, NgramSettings

#: The kind of a draft that names a model (the default, so older sweeps mean it).
DEFAULT_KIND = "lm"
#: Every draft kind a sweep may name.
DRAFT_KINDS = ("lm", "ngram", "eagle")

__all__ = [
    "DEFAULT_KIND",
    "DRAFT_KINDS",
    "Candidate",
    "DraftLMProposer",
    "EagleProposer",
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
    fields (n_max, n_min, window); ``eagle`` takes ``head`` (an ``EagleHead``) or ``head_path``
    and ``target_model`` (the head's directory, loaded over the target's frozen parts), and
    ``prepack``. Raises ValueError naming a bad kind or parameter."""
    if kind == "lm":
        if lm is None or params:
            raise ValueError("draft kind 'lm' needs a draft model and takes no parameters")
        return DraftLMProposer(lm)
    if kind == "ngram":
        _check_parameters(kind, params, {"n_max", "n_min", "window"})
        return NgramProposer(NgramSettings(**params))
    if kind == "eagle":
        return _eagle(params)
    raise ValueError(f"unknown draft kind {kind!r}; valid kinds: {', '.join(DRAFT_KINDS)}")


def _check_parameters(kind: str, params: dict[str, Any], valid: set[str]) -> None:
    """Raise ValueError naming the parameters of ``params`` that ``kind`` does not take."""
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for draft kind {kind!r}; "
            f"valid: {', '.join(sorted(valid))}"
        )


def _eagle(params: dict[str, Any]) -> EagleProposer:
    """Return the ``eagle`` proposer of ``make_proposer``'s parameters."""
    _check_parameters("eagle", params, {"head", "head_path", "target_model", "prepack"})
    prepack = params.get("prepack", True)
    if params.get("head") is not None:
        return EagleProposer(params["head"], prepack=prepack)
    if params.get("head_path") is None or params.get("target_model") is None:
        raise ValueError(
            "draft kind 'eagle' needs 'head' (an EagleHead) or 'head_path' and 'target_model' "
            "(the head's directory and the target model it was trained for)"
        )
    head = load_eagle_head(params["head_path"], params["target_model"])
    return EagleProposer(head, prepack=prepack)
