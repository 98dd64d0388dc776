"""Micro-zoo sweep files for tests that run real trials (pair ``micro``, greedy, max DL 4)."""

from __future__ import annotations

from typing import Any

import yaml

#: Samples per dataset in these sweeps.
SAMPLES = 2


CODE_DATASET = {"name": "builtin:code", "samples": SAMPLES, "max_new_tokens": 12}


#: The AR baseline and four policy trials: static K=4, SVIP at two thresholds, AdaEDL.
FIVE_POLICIES = [
    {"name": "static"},
    {"name": "svip", "grid": {"threshold": [0.3, 0.6]}},
    {"name": "adaedl", "grid": {"threshold": [0.5]}},
]


def sweep_yaml(
    name: str,
    policies: list[dict[str, Any]] = FIVE_POLICIES,
    datasets: list[dict[str, Any]] | None = None,
    retries: int = 2,
    warmup_samples: int = 1,
    execution: dict[str, Any] | None = None,
) -> str:
    """Return a greedy micro-zoo sweep file (pair ``micro``: target and draft-s, max DL 4);
    ``execution`` adds settings to its ``execution`` block."""
    sweep = {
        "name": name,
        "pairs": [
            {
                "name": "micro",
                "target": {"model": "zoo:micro/target"},
                "draft": {"model": "zoo:micro/draft-s"},
            }
        ],
        "datasets": datasets or [CODE_DATASET],
        "temperatures": [0.0],
        "policies": policies,
        "max_draft_lens": [4],
        "execution": {"retries": retries, "warmup_samples": warmup_samples, **(execution or {})},
    }
    return yaml.safe_dump(sweep, sort_keys=False)
