"""The estimate at batch sizes above 1 (orchestrator.analysis.costs.batch_estimate) against
hand-computed figures, and what stored batched trials measure (estimate_sources)."""

from __future__ import annotations

import pytest
from support.store_records import stored_trial

from orchestrator.analysis.costs import batch_estimate, estimate
from orchestrator.analysis.costs.batch_estimate import BatchMeasurement
from orchestrator.analysis.costs.model import HardwareProfile
from orchestrator.run import estimate_sources
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep

#: t_draft 0.01 s, t_target 0.1 s, AR 10 tokens/s (a batch-1 AR round is 0.1 s).
PROFILE = HardwareProfile("test", "hand-made", t_draft=0.01, t_target=0.1, ar_tokens_per_s=10.0)

#: One pair, 4 prompts × 50 tokens, static K = 4, at the batch sizes given.
SWEEP = """\
name: est
pairs:
  - name: p
    target: {model: "zoo:micro/target", gpus: 1}
    draft: {model: "zoo:micro/draft-s", gpus: 1}
datasets: [{name: "builtin:code", samples: 4, max_new_tokens: 50}]
temperatures: [0]
policies: [{name: static}]
max_draft_lens: [4]
batch_sizes: %s
execution: {shard_prompts: %d}
"""

NO_LOADING = estimate.LoadTimes(target=0.0, draft=0.0)
ONE_NODE = estimate.Cluster(node_gpus=(8.0,), source="test")


def _plan(batch_sizes: str, shard_prompts: int = 4) -> object:
    return plan_sweep(parse_sweep(SWEEP % (batch_sizes, shard_prompts)))


def test_waves_fill_the_batch_and_round_up() -> None:
    assert [batch_estimate.waves(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError, match="batch_size"):
        batch_estimate.waves(3, 0)


def test_a_batch_without_measurement_is_sized_from_batch_one() -> None:
    plan = _plan("[1, 4]")
    (pair,) = estimate.pair_estimates(plan, estimate.pair_profiles(plan, PROFILE))
    # batch 1: AR 200 / 10 = 20 s; K = 4 between 20 s and 200 × (4·0.01 + 0.1) / 5 = 5.6 s.
    # batch 4: the 4 prompts are one wave of 50 rounds at a batch-1 round's cost:
    # AR 50 × 0.1 = 5 s; K = 4 between 5 s and 50 / 5 × (0.04 + 0.1) = 1.4 s.
    assert pair.seconds_upper == pytest.approx(40.0 + 10.0)
    assert pair.seconds_lower == pytest.approx(25.6 + 6.4)
    result = estimate.estimate_sweep(
        plan, PROFILE, ONE_NODE, estimate.EstimateOptions(replicas=1, loads=NO_LOADING)
    )
    assert result.wall_seconds_upper == pytest.approx(50.0)
    (cost,) = result.batch_costs
    assert (cost.pair, cost.batch_size, cost.measured) == ("p", 4, False)
    lines = "\n".join(estimate.estimate_lines(result))
    assert "batch 1: each pair's profile" in lines
    assert "batch 4, p: sized from batch 1: no measurement at B = 4" in lines
    assert batch_estimate.BATCH_ONE_ASSUMPTION in lines


def test_a_queue_longer_than_the_batch_runs_in_waves_per_shard() -> None:
    # B = 2 over shards of max(3, 2) = 3 prompts: shards of 3 and 1 prompts, so 2 and 1 waves
    # of 5 s (upper) for each of the two arms (AR and K = 4)
    plan = _plan("[2]", shard_prompts=3)
    options = estimate.EstimateOptions(shard_prompts=3, replicas=1, loads=NO_LOADING)
    work = estimate.plan_workload(plan, estimate.pair_profiles(plan, PROFILE), options)
    assert [work.upper[unit.key] for unit in work.units] == pytest.approx([2 * 10.0, 2 * 5.0])
    (pair,) = estimate.pair_estimates(plan, estimate.pair_profiles(plan, PROFILE), None, 3)
    assert pair.seconds_upper == pytest.approx(sum(work.upper.values()))
    assert pair.seconds_lower == pytest.approx(sum(work.lower.values()))


def test_a_measured_batch_size_prices_its_rounds_from_the_measurement() -> None:
    plan = _plan("[1, 4]")
    measured = {("p", 4): BatchMeasurement(4, 0.2, 0.15, None, 1)}
    options = estimate.EstimateOptions(replicas=1, loads=NO_LOADING, measured=measured)
    result = estimate.estimate_sweep(plan, PROFILE, ONE_NODE, options)
    (pair,) = result.pairs
    # batch 4: AR 50 × 0.2 = 10 s (both arms' upper); K = 4: 10 × (4 × 0.01 + 0.15) = 1.9 s
    assert pair.seconds_upper == pytest.approx(40.0 + 20.0)
    assert pair.seconds_lower == pytest.approx(25.6 + 10.0 + 1.9)
    (cost,) = result.batch_costs
    assert cost.measured and "measured at B = 4 (1 stored trial(s)" in cost.source
    assert "draft step from batch 1 on test" in cost.source


def test_batch_measurement_pools_the_done_trials_at_that_batch_size() -> None:
    rows = [
        # AR at B = 4: 200 tokens at 40 tokens/s total (5 s); 200 row-rounds of 0.08 s verify
        stored_trial(
            status="done",
            batch_size=4,
            is_baseline=True,
            generated_tokens=200,
            total_tokens_per_s=40.0,
            n_rounds=200,
            verify_seconds=16.0,
        ),
        # a speculative trial: 8 s of draft over 160 forwards
        stored_trial(
            status="done", batch_size=4, is_baseline=False, n_draft_forwards=160, draft_seconds=8.0
        ),
        stored_trial(status="failed", batch_size=4, is_baseline=True, generated_tokens=9),
        stored_trial(status="done", batch_size=2, is_baseline=False, n_draft_forwards=1),
    ]
    found = estimate_sources.batch_measurement(4, rows)
    assert found == BatchMeasurement(4, pytest.approx(0.1), pytest.approx(0.08), 0.05, 2)
    assert estimate_sources.batch_measurement(2, rows) is None  # no AR baseline at B = 2
