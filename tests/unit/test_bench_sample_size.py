"""bench/sample_size.py on a committed results store: prompts pooled by prompt, each trial at 1."""

from __future__ import annotations

import numpy as np
from support.bench_scripts import load_bench_script
from support.paths import REPO

#: The demo database before the protocol: 6 prompts per dataset, the spread the sizing read.
BEFORE_PROTOCOL = f"sqlite:///{REPO / 'docs/lab/data/demo-before-protocol.db'}"


def test_pooled_prompts_pair_by_prompt_and_scale_each_trial_to_a_speedup_of_one() -> None:
    sample_size = load_bench_script("sample_size")
    pooled = np.asarray(sample_size.pooled_prompts(BEFORE_PROTOCOL))
    assert len(pooled) > 100
    tokens, seconds, base_tokens, base_seconds = pooled.T
    assert (tokens > 0).all() and (base_seconds > 0).all()
    overall = (tokens.sum() / seconds.sum()) / (base_tokens.sum() / base_seconds.sum())
    assert abs(overall - 1.0) < 0.05


def test_half_width_shrinks_with_more_prompts() -> None:
    sample_size = load_bench_script("sample_size")
    pooled = sample_size.pooled_prompts(BEFORE_PROTOCOL)
    widths = [sample_size.half_width(pooled, n, draws=10, seed=n) for n in (6, 60)]
    assert 0 < widths[1] < widths[0]
