"""Reading the features a policy asked for out of a ``DraftStep``, with a clear error if absent."""

from __future__ import annotations

from typing import Any

from policies.base import DraftStep


def require_feature(step: DraftStep, feature: str, policy_name: str) -> Any:
    """Return ``step.<feature>``, raising ValueError if the engine did not fill it in.

    Exists so that a policy missing a feature fails with a message naming the policy and the
    feature rather than with an arithmetic error on None deep inside its formula.
    """
    value = getattr(step, feature)
    if value is None:
        raise ValueError(
            f"policy {policy_name!r} needs the step feature {feature!r}, but the step has None "
            f"(did the engine compute the features listed in policy.features?)"
        )
    return value
