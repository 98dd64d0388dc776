"""bench/sample_size.py --measure acceptance on the committed KD database: prompts of two drafts
at one setting, paired by prompt, each pair of trials scaled to an acceptance ratio of 1."""

from __future__ import annotations

import numpy as np
from support.bench_scripts import load_bench_script
from support.paths import REPO

KD_DB = f"sqlite:///{REPO / 'docs/lab/data/kd-demo-before-protocol.db'}"


def test_pooled_acceptance_pairs_two_drafts_at_one_setting_scaled_to_a_ratio_of_one() -> None:
    sample_size = load_bench_script("sample_size")
    pooled = np.asarray(sample_size.pooled_acceptance(KD_DB))
    # 4 drafts: 6 pairs of drafts x 3 static K x 2 datasets x 8 prompts, at least
    assert len(pooled) >= 6 * 3 * 2 * 8
    accepted, drafted, other_accepted, other_drafted = pooled.T
    assert (drafted > 0).all() and (other_drafted > 0).all()
    overall = (accepted.sum() / drafted.sum()) / (other_accepted.sum() / other_drafted.sum())
    assert abs(overall - 1.0) < 0.05


def test_acceptance_half_width_shrinks_with_more_prompts() -> None:
    sample_size = load_bench_script("sample_size")
    pooled = sample_size.pooled_acceptance(KD_DB)
    widths = [sample_size.half_width(pooled, n, draws=10, seed=n) for n in (6, 60)]
    assert 0 < widths[1] < widths[0]
