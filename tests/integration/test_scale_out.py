"""Prompt shards over replicas on a real multi-node Ray cluster on one machine.

``ray.cluster_utils.Cluster``: a head node without worker resources (it holds the driver and
the test's fault point) and three nodes of {CPU: 2, GPU: 1}, fake GPUs, so a pair whose
target asks for one GPU fits one worker group per node, and the runner's default is three
replicas. The micro zoo's models run on the CPU, so the sweeps set ``warmup_seconds: 0`` (one
warm-up pass per new draft actor): the 20 s default of a GPU group would warm nothing here.

- Replicas on different nodes share a trial's prompts, and the stored greedy output ids equal
  those of a single-replica run.
- Each group's rendezvous port is picked on its own node (the node of its bundle 0).
- A node removed mid-sweep, at a known point (the draft actor reports it is inside round 2
  of a given shard and waits there; then the test removes its node), loses nothing and
  duplicates nothing: every trial has each sample once, each shard stored once.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from ray import cloudpickle
from ray.cluster_utils import Cluster

from orchestrator.run import replica as replica_module
from orchestrator.run.placement import actor_options_for_rank, create_worker_group
from orchestrator.run.replica import rendezvous_port
from orchestrator.run.runner import RunOptions, execute_plan
from orchestrator.store import Store, open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep
from workers.actors import DraftWorker

pytestmark = pytest.mark.ray

NODES = 3
SAMPLES = 6
SHARD_PROMPTS = 2
#: The fault point: the static trial's shard holding this sample, inside this round.
PAUSE_SAMPLE = 2
PAUSE_ROUND = 2
POINT_NAME = "specsweep-fault-point"


def sweep_text(name: str, replicas: int | None = None) -> str:
    """Return a greedy micro sweep (AR baseline + static K=4) of 6 prompts in shards of 2."""
    execution: dict[str, Any] = {"retries": 2, "warmup_samples": 1, "warmup_seconds": 0}
    execution["shard_prompts"] = SHARD_PROMPTS
    if replicas is not None:
        execution["replicas"] = replicas
    sweep = {
        "name": name,
        "pairs": [
            {
                "name": "micro",
                "target": {"model": "zoo:micro/target", "gpus": 1},
                "draft": {"model": "zoo:micro/draft-s"},
            }
        ],
        "datasets": [{"name": "builtin:code", "samples": SAMPLES, "max_new_tokens": 12}],
        "temperatures": [0.0],
        "policies": [{"name": "static"}],
        "max_draft_lens": [4],
        "execution": execution,
    }
    return yaml.safe_dump(sweep, sort_keys=False)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head node (no worker resources) and three {CPU: 2, GPU: 1} nodes, the driver on it."""
    fast_failure = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "resources": {"head": 1}, "_system_config": fast_failure},
    )
    for _ in range(NODES):
        cluster.add_node(num_cpus=2, num_gpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def zoo_env(micro_zoo: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point zoo references at the session's micro zoo."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    return micro_zoo


def _run(text: str, url: str) -> tuple[Any, Store, Any]:
    spec = parse_sweep(text, "scale-out.yaml")
    plan = plan_sweep(spec)
    store = open_store(url)
    store.register_sweep(spec, plan)
    return spec, plan, store


def _outputs(store: Store, plan: Any) -> dict[str, list[list[int]]]:
    return {
        t.trial_id: [s.output_ids for s in store.sample_outputs(t.trial_id)] for t in plan.trials
    }


def _assert_each_sample_once(store: Store, plan: Any) -> None:
    """Every trial done with samples 0..SAMPLES-1 once; each shard stored once, done."""
    for trial in plan.trials:
        (row,) = store.trial_rows([trial.trial_id])
        assert row.status == "done", row.error
        samples = store.sample_outputs(trial.trial_id)
        assert [s.sample_index for s in samples] == list(range(SAMPLES))
        shards = store.trial_shards([trial.trial_id])
        assert [s.shard for s in shards] == list(range(SAMPLES // SHARD_PROMPTS))
        assert all(s.status == "done" for s in shards)
        covered = Counter(index for s in shards for index in s.prompts)
        assert covered == Counter(range(SAMPLES))
        assert store.shard_results(trial.trial_id) == []  # cleared once the trial is done


@pytest.mark.slow
def test_replicas_on_three_nodes_share_a_trials_prompts_and_match_one_replica(
    cluster: Cluster, zoo_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    spec, plan, store = _run(sweep_text("spread"), f"sqlite:///{tmp_path / 'spread.db'}")
    summary = execute_plan(spec, plan, store, RunOptions(progress=False))
    assert (summary.ran, summary.failed) == (len(plan.trials), 0), summary.failures
    _assert_each_sample_once(store, plan)
    # The baseline's three shards are the first three units: one to each replica, one per node.
    baseline = store.trial_shards([plan.trials[0].trial_id])
    assert len({s.node_id for s in baseline}) == NODES

    one_spec, one_plan, single = _run(
        sweep_text("single", replicas=1), f"sqlite:///{tmp_path / 'single.db'}"
    )
    execute_plan(one_spec, one_plan, single, RunOptions(progress=False))
    shards = single.trial_shards(t.trial_id for t in one_plan.trials)
    assert len({s.node_id for s in shards}) == 1
    assert _outputs(single, one_plan) == _outputs(store, plan)
    speculative = [t for t in plan.trials if not t.is_baseline]
    assert all(
        _outputs(store, plan)[t.trial_id] == _outputs(store, plan)[plan.trials[0].trial_id]
        for t in speculative
    )
    with capsys.disabled():
        print(
            f"\n[scale-out] {len(plan.trials)} trials × {SAMPLES // SHARD_PROMPTS} shards over "
            f"{NODES} replicas on {NODES} nodes: greedy outputs equal one replica's"
        )
    store.close()
    single.close()


def test_each_groups_rendezvous_port_is_picked_on_its_own_node(
    cluster: Cluster, zoo_env: Any
) -> None:
    spec = parse_sweep(sweep_text("ports"), "ports.yaml")
    pair = spec.pairs[0]
    groups = [create_worker_group([pair], timeout_s=60) for _ in range(NODES)]
    try:
        where = ray.remote(lambda: ray.get_runtime_context().get_node_id())
        rank0_nodes = [
            ray.get(where.options(**actor_options_for_rank(group, 0)).remote()) for group in groups
        ]
        picked = [rendezvous_port(group) for group in groups]
    finally:
        for group in groups:
            ray.util.remove_placement_group(group)
    assert len(set(rank0_nodes)) == NODES  # one group per node
    assert [p.node_id for p in picked] == rank0_nodes
    driver_node = ray.get_runtime_context().get_node_id()
    assert driver_node not in rank0_nodes
    assert all(1024 <= p.port < 65536 for p in picked)


@ray.remote(num_cpus=0, resources={"head": 0.01})
class FaultPoint:
    """Where the draft actor reports reaching the fault point (once) and the test looks."""

    def __init__(self) -> None:
        self.node: str | None = None

    def reach(self, node: str) -> bool:
        """Record the node that reached the point; True the first time only (then pause)."""
        first = self.node is None
        self.node = self.node or node
        return first

    def reached(self) -> str | None:
        """Return the node that reached the point, or None."""
        return self.node


class PausingDraftWorker(DraftWorker.__ray_actor_class__):  # type: ignore[name-defined,misc]
    """The draft actor, pausing the group shard whose static arm holds :data:`PAUSE_SAMPLE`
    inside that arm's round :data:`PAUSE_ROUND` (the AR arm never verifies) after reporting it
    to the fault point (the first time only)."""

    def run_arms(self, group: Any) -> Any:
        hit = any(
            arm.request.policy == "static" and PAUSE_SAMPLE in (arm.request.indices or ())
            for arm in group.arms
        )
        if not hit:
            return super().run_arms(group)
        verify = self.target.verify
        rounds = itertools.count(1)

        def counted(verify_request: Any) -> Any:
            if next(rounds) == PAUSE_ROUND:
                point = ray.get_actor(POINT_NAME)
                node = ray.get_runtime_context().get_node_id()
                if ray.get(point.reach.remote(node)):
                    time.sleep(3600)  # inside the round: the test removes this node now
            return verify(verify_request)

        self.target.verify = counted
        try:
            return super().run_arms(group)
        finally:
            self.target.verify = verify


@pytest.mark.slow
def test_a_node_removed_inside_a_round_of_a_shard_loses_and_duplicates_nothing(
    cluster: Cluster,
    zoo_env: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    point = FaultPoint.options(name=POINT_NAME).remote()
    monkeypatch.setattr(replica_module, "DraftWorker", ray.remote(PausingDraftWorker))
    spec, plan, store = _run(sweep_text("node-loss"), f"sqlite:///{tmp_path / 'loss.db'}")
    outcome: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: outcome.update(
            summary=execute_plan(spec, plan, store, RunOptions(progress=False))
        )
    )
    thread.start()
    while (node := ray.get(point.reached.remote())) is None:
        assert thread.is_alive(), "the sweep ended before reaching the fault point"
        time.sleep(0.05)
    (victim,) = [n for n in cluster.worker_nodes if n.node_id == node]
    cluster.remove_node(victim, allow_graceful=False)
    thread.join(timeout=600)
    assert not thread.is_alive()
    summary = outcome["summary"]
    assert (summary.ran, summary.failed) == (len(plan.trials), 0), summary.failures

    _assert_each_sample_once(store, plan)
    static = next(t for t in plan.trials if t.setting.policy == "static")
    shards = {s.shard: s for s in store.trial_shards([static.trial_id])}
    hit = PAUSE_SAMPLE // SHARD_PROMPTS
    assert shards[hit].attempts == 2 and shards[hit].node_id != node
    (row,) = store.trial_rows([static.trial_id])
    assert len(row.attempt_errors) == 1
    outputs = _outputs(store, plan)
    assert outputs[static.trial_id] == outputs[plan.trials[0].trial_id]
    with capsys.disabled():
        print(
            f"\n[scale-out] node removed inside round {PAUSE_ROUND} of shard {hit}: "
            f"{len(plan.trials)} trials stored, 0 lost, 0 duplicated; the shard reran on "
            f"another node ({row.attempt_errors[0].split(':')[0]})"
        )
    store.close()
