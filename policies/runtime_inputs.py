"""Marking policy fields that are runtime inputs (trained heads, predictors), not sweep parameters.

A sweep sets a policy's scalar parameters by name and hashes them into the trial id; a trained
callable cannot be hashed or written to YAML, so the worker passes it to ``make_policy`` instead.
Declare such a field as ``field(default=None, repr=False, compare=False,
metadata=RUNTIME_INPUT)``: ``make_policy`` accepts it, ``policy_parameters`` leaves it out.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

RUNTIME_INPUT = MappingProxyType({"specsweep_runtime_input": True})


def is_runtime_input(policy_field: dataclasses.Field[Any]) -> bool:
    """Return True when the field carries the ``RUNTIME_INPUT`` metadata."""
    return bool(policy_field.metadata.get("specsweep_runtime_input", False))
