"""The policy registry: names to classes, construction by name, and sweepable parameters."""

from __future__ import annotations

import dataclasses
from typing import Any

from policies.adaedl import AdaEDLPolicy
from policies.base import DraftPolicy
from policies.batch_schedule import BatchSchedulePolicy
from policies.confidence import MaxConfidencePolicy
from policies.heuristic import HFHeuristicPolicy
from policies.ngram_match import NgramMatchPolicy
from policies.oracle import GreedyOraclePolicy
from policies.runtime_inputs import is_runtime_input
from policies.specdecpp import SpecDecPPPolicy
from policies.static import StaticPolicy
from policies.svip import SVIPPolicy
from policies.thompson import BetaTSPolicy, CaliTSPolicy

POLICIES: dict[str, type[DraftPolicy]] = {
    policy.name: policy
    for policy in (
        StaticPolicy,
        MaxConfidencePolicy,
        AdaEDLPolicy,
        SVIPPolicy,
        HFHeuristicPolicy,
        BetaTSPolicy,
        CaliTSPolicy,
        SpecDecPPPolicy,
        GreedyOraclePolicy,
        NgramMatchPolicy,
        BatchSchedulePolicy,
    )
}

_BASE_FIELDS = frozenset(f.name for f in dataclasses.fields(DraftPolicy))


def _policy_class(name: str) -> type[DraftPolicy]:
    """Return the class registered under ``name``, or raise ValueError listing the valid names."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; valid policies: {', '.join(sorted(POLICIES))}"
        ) from None


def _settable_fields(policy_class: type[DraftPolicy]) -> list[dataclasses.Field[Any]]:
    """Return the constructor fields a caller may set by name (base fields excluded)."""
    return [f for f in dataclasses.fields(policy_class) if f.init and f.name not in _BASE_FIELDS]


def policy_parameters(name: str) -> dict[str, Any]:
    """Return the sweepable parameters of policy ``name`` with their defaults.

    For the planner and CLI: runtime inputs (trained heads and predictors) are left out, since
    they are supplied by the worker rather than by a sweep file.
    """
    return {
        f.name: f.default for f in _settable_fields(_policy_class(name)) if not is_runtime_input(f)
    }


def make_policy(name: str, max_draft_len: int, **params: Any) -> DraftPolicy:
    """Return a new policy ``name`` with cap ``max_draft_len`` and the given parameters.

    Raises ValueError naming an unknown policy or unknown parameters and listing the valid ones,
    so that a typo in a sweep file fails before any model is loaded.
    """
    policy_class = _policy_class(name)
    valid = [f.name for f in _settable_fields(policy_class)]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for policy {name!r}; "
            f"valid parameters: {', '.join(valid) or '(none)'}"
        )
    return policy_class(max_draft_len=max_draft_len, **params)
