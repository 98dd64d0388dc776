"""The sweep estimate (orchestrator.estimate) checked against hand-computed figures."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from orchestrator import estimate
from orchestrator.cost_model import HardwareProfile
from orchestrator.planner import plan_sweep
from orchestrator.spec import parse_sweep

REPO = Path(__file__).resolve().parents[1]

#: t_draft 0.01 s, t_target 0.1 s, AR 10 tokens/s: round numbers to compute by hand.
PROFILE = HardwareProfile("test", "hand-made", t_draft=0.01, t_target=0.1, ar_tokens_per_s=10.0)

#: One pair on 1 target GPU + 1 draft GPU, 4 prompts × 50 tokens (200 tokens a trial).
SWEEP = """\
name: est
pairs:
  - name: p
    target: {model: "zoo:demo/target", gpus: 1}
    draft: {model: "zoo:demo/draft-s", gpus: 1}
datasets: [{name: "builtin:code", samples: 4, max_new_tokens: 50}]
temperatures: [0]
policies: [{name: static}]
max_draft_lens: %s
"""

ONE_NODE = estimate.Cluster(node_gpus=(8.0,), source="test")


def _plan(max_draft_lens: str, extra: str = "") -> object:
    return plan_sweep(parse_sweep(SWEEP % max_draft_lens + textwrap.dedent(extra)))


def test_live_plan_matches_the_hand_computed_bounds() -> None:
    plan = _plan("[4]")
    result = estimate.estimate_sweep(plan, PROFILE, ONE_NODE, max_concurrent_pairs=1)
    (pair,) = result.pairs
    assert pair.trials == 2 and pair.group_gpus == 2
    # AR baseline: 200 / 10 = 20 s; static K=4: at worst 20 s, at best 200 × (4·0.01 + 0.1) / 5.
    assert pair.seconds_upper == pytest.approx(40.0)
    assert pair.seconds_lower == pytest.approx(20.0 + 5.6)
    assert pair.gpu_hours_upper == pytest.approx(40.0 * 2 / 3600)
    assert result.wall_seconds_upper == pytest.approx(40.0)
    assert pair.replay_saved_seconds == 0


def test_replay_group_costs_its_live_runs_and_one_trace_recording() -> None:
    plan = _plan("[2, 4, 8]", "execution: {mode: replay, live_check: {policy: static}}\n")
    live = [trial for trial in plan.trials if trial.mode == "live"]
    replayed = [trial for trial in plan.trials if trial.mode == "replay"]
    assert len(live) == 2 and len(replayed) == 3
    (pair,) = estimate.pair_estimates(plan, PROFILE)
    # baseline 20 s + live check ≤ 20 s + the group's trace recording 20 s; replayed: free.
    assert pair.seconds_upper == pytest.approx(60.0)
    # replaying saves the 3 replayed trials' 3 × 20 s minus the 20 s recording.
    assert pair.replay_saved_seconds == pytest.approx(40.0)


def test_pairs_share_the_slots_the_nodes_hold() -> None:
    assert estimate.makespan([3.0, 2.0, 2.0], slots=2) == 4.0
    assert estimate.makespan([3.0, 2.0, 2.0], slots=1) == 7.0
    cluster = estimate.Cluster(node_gpus=(8.0, 8.0), source="test")
    assert estimate.groups_held(cluster, [5.0, 2.0]) == 2
    assert estimate.groups_held(cluster, [4.0]) == 4


def test_a_group_larger_than_every_node_is_an_error_naming_the_source() -> None:
    plan = _plan("[4]")
    with pytest.raises(estimate.EstimateError, match="--gpus"):
        estimate.estimate_sweep(plan, PROFILE, estimate.gpus_cluster(1), 1)


def test_the_repository_cluster_yaml_is_four_nodes_of_eight_gpus() -> None:
    cluster = estimate.parse_cluster_yaml(REPO / "cluster.yaml")
    assert cluster.node_gpus == (8.0, 8.0, 8.0, 8.0) and cluster.gpus == 32


def test_a_cluster_file_without_gpu_nodes_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("available_node_types: {head: {resources: {CPU: 4}, max_workers: 1}}\n")
    with pytest.raises(estimate.EstimateError, match=r"c\.yaml"):
        estimate.parse_cluster_yaml(path)
