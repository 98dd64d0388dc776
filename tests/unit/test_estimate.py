"""The sweep estimate (orchestrator.analysis.costs.estimate) checked against hand-computed
figures."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support.paths import REPO

from orchestrator.analysis.costs import estimate
from orchestrator.analysis.costs.model import HardwareProfile
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep
from orchestrator.sweep.work_units import live_group_units

#: t_draft 0.01 s, t_target 0.1 s, AR 10 tokens/s: round numbers to compute by hand.
PROFILE = HardwareProfile("test", "hand-made", t_draft=0.01, t_target=0.1, ar_tokens_per_s=10.0)

#: One pair on 1 target GPU + 1 draft GPU, 4 prompts × 50 tokens (200 tokens a trial).
SWEEP = """\
name: est
pairs:
  - name: p
    target: {model: "zoo:micro/target", gpus: 1}
    draft: {model: "zoo:micro/draft-s", gpus: 1}
datasets: [{name: "builtin:code", samples: 4, max_new_tokens: 50}]
temperatures: [0]
policies: [{name: static}]
max_draft_lens: %s
"""

ONE_NODE = estimate.Cluster(node_gpus=(8.0,), source="test")


def _plan(max_draft_lens: str, extra: str = "") -> object:
    return plan_sweep(parse_sweep(SWEEP % max_draft_lens + textwrap.dedent(extra)))


NO_LOADING = estimate.EstimateOptions(loads=estimate.LoadTimes(target=0.0, draft=0.0))


def test_live_plan_matches_the_hand_computed_bounds() -> None:
    plan = _plan("[4]")
    one_replica = estimate.EstimateOptions(replicas=1, loads=estimate.LoadTimes(30.0, 5.0))
    result = estimate.estimate_sweep(plan, PROFILE, ONE_NODE, one_replica)
    (pair,) = result.pairs
    assert pair.trials == 2 and pair.group_gpus == 2
    # AR baseline: 200 / 10 = 20 s; static K=4: at worst 20 s, at best 200 × (4·0.01 + 0.1) / 5.
    assert pair.seconds_upper == pytest.approx(40.0)
    assert pair.seconds_lower == pytest.approx(20.0 + 5.6)
    assert pair.gpu_hours_upper == pytest.approx(40.0 * 2 / 3600)
    # one replica: loading (30 s target + 5 s draft), then both trials one after the other.
    assert result.replicas == (1,)
    assert result.wall_seconds_upper == pytest.approx(35.0 + 40.0)
    assert result.wall_seconds_lower == pytest.approx(35.0 + 25.6)
    assert pair.replay_saved_seconds == 0


def test_replicas_share_the_prompt_shards_of_the_trials() -> None:
    plan = _plan("[4]")
    # 8 GPUs hold 4 replicas of 2 GPUs; 4 prompts in shards of 1 → 8 units of 5 s (upper).
    result = estimate.estimate_sweep(
        plan, PROFILE, ONE_NODE, estimate.EstimateOptions(shard_prompts=1, loads=NO_LOADING.loads)
    )
    assert result.replicas == (4,)
    assert result.wall_seconds_upper == pytest.approx(10.0)
    assert result.upper.utilisation == pytest.approx(1.0)
    whole = estimate.estimate_sweep(plan, PROFILE, ONE_NODE, NO_LOADING)
    # default shards (4 prompts) keep the 4-prompt group whole: one unit of both arms, 40 s.
    assert whole.wall_seconds_upper == pytest.approx(40.0)


def test_the_estimate_plans_the_runners_group_shards() -> None:
    plan = _plan("[2, 4]", "seeds: [0, 1]\nexecution: {shard_prompts: 3}\n")
    options = estimate.EstimateOptions(shard_prompts=3, loads=NO_LOADING.loads)
    work = estimate.plan_workload(plan, estimate.pair_profiles(plan, PROFILE), options)
    # what the runner runs: per seed one group (AR, K=2, K=4) cut into shards of 3 prompts
    assert list(work.units) == live_group_units(plan.trials, "p", 3)
    assert [len(unit.arms) for unit in work.units] == [3, 3, 3, 3]
    assert [unit.prompts for unit in work.units] == [(0, 1, 2), (3,)] * 2
    # a shard of 3 of the 4 prompts costs 3/4 of each arm's 20 s (upper)
    assert work.upper[work.units[0].key] == pytest.approx(3 * 15.0)
    assert sum(work.upper.values()) == pytest.approx(6 * 20.0)


def test_repeats_multiply_a_trials_seconds_and_its_samples_per_shard() -> None:
    plan = _plan("[4]", "execution: {repeats: 2}\n")
    (pair,) = estimate.pair_estimates(plan, estimate.pair_profiles(plan, PROFILE))
    assert pair.seconds_upper == pytest.approx(2 * 40.0)
    options = estimate.EstimateOptions(shard_prompts=1, replicas=1, loads=NO_LOADING.loads)
    result = estimate.estimate_sweep(plan, PROFILE, ONE_NODE, options)
    assert result.wall_seconds_upper == pytest.approx(2 * 40.0)


def test_pairs_with_the_same_target_share_one_replica_and_load_it_once() -> None:
    spec = parse_sweep(
        (SWEEP % "[4]").replace(
            "pairs:\n",
            'pairs:\n  - name: q\n    target: {model: "zoo:micro/target", gpus: 1}\n'
            '    draft: {model: "zoo:micro/draft-m", gpus: 1}\n',
        )
    )
    plan = plan_sweep(spec)
    (shared,) = estimate.target_sets(plan.pairs)
    assert shared.pairs == ("q", "p") and shared.gpus == 3
    assert shared.load_seconds(estimate.LoadTimes(30.0, 5.0)) == 40.0
    options = estimate.EstimateOptions(loads=estimate.LoadTimes(30.0, 5.0))
    result = estimate.estimate_sweep(plan, PROFILE, ONE_NODE, options)
    # 8 GPUs hold 2 replicas of 3; 4 trials of 20 s (upper) over 2 replicas after 40 s loading.
    assert result.replicas == (2,)
    assert result.wall_seconds_upper == pytest.approx(40.0 + 40.0)


def _counts(cluster, sets, units, **options) -> list[int]:
    return estimate.replica_counts(cluster, sets, units, estimate.EstimateOptions(**options))


def test_replica_counts_follow_the_runner() -> None:
    sets = [estimate.TargetSet("a", ("p",), 5.0), estimate.TargetSet("b", ("q",), 2.0)]
    two_nodes = estimate.Cluster(node_gpus=(8.0, 8.0), source="test")
    # one set at a time (the default): each takes what the nodes hold (a: one a node, b: four)
    assert _counts(two_nodes, sets, [10, 10]) == [2, 8]
    # two at once: each gets its share of what the nodes hold
    assert _counts(two_nodes, sets, [10, 10], max_concurrent_pairs=2) == [1, 4]
    assert _counts(two_nodes, sets, [10, 10], replicas=1) == [1, 1]
    assert _counts(two_nodes, sets, [1, 3]) == [1, 3]  # no more replicas than units


def test_replicas_count_a_fractional_sets_gpus_whole_unless_capped() -> None:
    # gpu_smoke's groups (target 0.4 + draft 0.1 of a GPU) on one GPU: by default one replica,
    # as the runner starts (bundles.groups_held); an explicit replicas: 2 shares the GPU.
    sets = [estimate.TargetSet("a", ("p",), 0.5)]
    one_gpu = estimate.Cluster(node_gpus=(1.0,), source="test")
    assert _counts(one_gpu, sets, [4]) == [1]
    assert _counts(one_gpu, sets, [4], replicas=2) == [2]
    assert _counts(estimate.Cluster(node_gpus=(2.0,), source="test"), sets, [4]) == [2]


def test_target_sets_run_max_concurrent_pairs_at_a_time() -> None:
    # two pairs with different targets (2 sets), each group 0.5 of a GPU, on one GPU
    second = '  - name: q\n    target: {model: "zoo:micro/draft-m", gpus: 0.4}\n'
    second += '    draft: {model: "zoo:micro/draft-s", gpus: 0.1}\n'
    text = (SWEEP % "[4]").replace("gpus: 1}", "gpus: 0.4}", 1).replace("gpus: 1}", "gpus: 0.1}")
    spec = parse_sweep(text.replace("datasets:", second + "datasets:"))
    plan = plan_sweep(spec)
    assert [s.gpus for s in estimate.target_sets(plan.pairs)] == [0.5, 0.5]
    one_gpu = estimate.Cluster(node_gpus=(1.0,), source="test")
    options = estimate.EstimateOptions(loads=estimate.LoadTimes(30.0, 5.0))
    result = estimate.estimate_sweep(plan, PROFILE, one_gpu, options)
    # one after the other: each loads (35 s), then its AR and static trials (20 + 20 s, upper)
    assert result.replicas == (1, 1)
    assert result.wall_seconds_upper == pytest.approx(2 * (35.0 + 40.0))
    assert result.load_seconds == pytest.approx(70.0)
    assert result.upper.utilisation == pytest.approx(80.0 / 150.0)
    both = estimate.EstimateOptions(max_concurrent_pairs=2, loads=options.loads)
    together = estimate.estimate_sweep(plan, PROFILE, one_gpu, both)
    assert together.replicas == (1, 1)  # the runner still starts one each, sharing the GPU
    assert together.wall_seconds_upper == pytest.approx(35.0 + 40.0)


def test_replay_group_costs_its_live_runs_and_one_trace_recording() -> None:
    plan = _plan("[2, 4, 8]", "execution: {mode: replay, live_check: {policy: static}}\n")
    live = [trial for trial in plan.trials if trial.mode == "live"]
    replayed = [trial for trial in plan.trials if trial.mode == "replay"]
    assert len(live) == 2 and len(replayed) == 3
    (pair,) = estimate.pair_estimates(plan, estimate.pair_profiles(plan, PROFILE))
    # baseline 20 s + live check ≤ 20 s + the group's trace recording 20 s; replayed: free.
    assert pair.seconds_upper == pytest.approx(60.0)
    # replaying saves the 3 replayed trials' 3 × 20 s minus the 20 s recording.
    assert pair.replay_saved_seconds == pytest.approx(40.0)


def test_replay_wall_time_counts_the_trace_recording_as_units() -> None:
    plan = _plan("[2, 4, 8]", "execution: {mode: replay, live_check: {policy: static}}\n")
    options = estimate.EstimateOptions(replicas=1, loads=NO_LOADING.loads)
    result = estimate.estimate_sweep(plan, PROFILE, ONE_NODE, options)
    assert result.wall_seconds_upper == pytest.approx(60.0)
    work = estimate.plan_workload(plan, estimate.pair_profiles(plan, PROFILE), options)
    # the runner's replay unit: the pair's recordings, after its live group shard
    *live, replay = work.units
    assert replay.key == "replay:p" and replay.after == tuple(unit.key for unit in live)
    assert work.upper[replay.key] == pytest.approx(20.0)


def test_a_group_larger_than_every_node_is_an_error_naming_the_source() -> None:
    plan = _plan("[4]")
    with pytest.raises(estimate.EstimateError, match="--gpus"):
        estimate.estimate_sweep(plan, PROFILE, estimate.gpus_cluster(1), NO_LOADING)


def test_the_repository_cluster_yaml_is_four_nodes_of_eight_gpus() -> None:
    cluster = estimate.parse_cluster_yaml(REPO / "cluster.yaml")
    assert cluster.node_gpus == (8.0, 8.0, 8.0, 8.0) and cluster.gpus == 32


def test_a_cluster_file_without_gpu_nodes_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("available_node_types: {head: {resources: {CPU: 4}, max_workers: 1}}\n")
    with pytest.raises(estimate.EstimateError, match=r"c\.yaml"):
        estimate.parse_cluster_yaml(path)
