"""Worker-group placement: the pure bundle maths, then a real three-node Ray cluster in-process.

The cluster has a CPU-only head and two GPU workers (``num_gpus`` is a fake count: Ray only
books it, no device is touched). Each worker node carries a custom ``node_label`` resource so the
tests can tell which node an actor landed on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util import placement_group_table

from orchestrator.run.placement import (
    GROUP_STRATEGY,
    PlacementError,
    actor_options_for_rank,
    create_worker_group,
    draft_actor_options,
    remove_worker_group,
    unplaceable_message,
)
from orchestrator.sweep.bundles import (
    bundle_totals,
    draft_bundle,
    fits_on_node,
    target_bundles,
    worker_group_bundles,
)
from orchestrator.sweep.planner import Plan
from orchestrator.sweep.spec import PairSpec

pytestmark = pytest.mark.ray

GPUS_PER_WORKER_NODE = 3
CPUS_PER_WORKER_NODE = 5
OBJECT_STORE_BYTES = 100 * 1024 * 1024
PLACEMENT_TIMEOUT_S = 3.0


def make_pair(
    tp_size: int, target_gpus: float, draft_gpus: float, name: str = "big-pair"
) -> PairSpec:
    """Return a pair served by ``tp_size`` deepspeed ranks (or one hf actor when tp_size is 1)."""
    backend = "deepspeed" if tp_size > 1 else "hf"
    return PairSpec.model_validate(
        {
            "name": name,
            "target": {
                "model": "zoo:micro/target",
                "backend": backend,
                "tp_size": tp_size,
                "gpus": target_gpus,
            },
            "draft": {"model": "zoo:micro/draft", "gpus": draft_gpus},
        }
    )


# --- pure: bundles and messages -----------------------------------------------------------


def test_bundles_of_a_two_rank_gpu_pair() -> None:
    pair = make_pair(tp_size=2, target_gpus=1, draft_gpus=0.5)
    assert target_bundles(pair) == [{"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}]
    assert draft_bundle(pair) == {"CPU": 1.0, "GPU": 0.5}
    assert worker_group_bundles([pair]) == [*target_bundles(pair), {"CPU": 1.0, "GPU": 0.5}]
    assert bundle_totals(worker_group_bundles([pair])) == {"CPU": 3.0, "GPU": 2.5}


def test_cpu_only_pair_has_no_gpu_entries() -> None:
    pair = make_pair(tp_size=1, target_gpus=0, draft_gpus=0)
    assert worker_group_bundles([pair]) == [{"CPU": 1.0}, {"CPU": 1.0}]


@pytest.mark.parametrize(
    ("tp_size", "target_gpus", "draft_gpus"), [(1, 0, 0), (1, 1, 0.25), (4, 1, 0.5), (8, 0.9, 0.1)]
)
def test_group_totals_match_the_planner(
    tp_size: int, target_gpus: float, draft_gpus: float
) -> None:
    pair = make_pair(tp_size, target_gpus, draft_gpus)
    plan = Plan(sweep="s", trials=(), jobs=(), skipped=(), pairs=(pair,))
    (resources,) = plan.resources()
    totals = bundle_totals(worker_group_bundles([pair]))
    assert totals["CPU"] == resources.cpus == tp_size + 1
    assert totals.get("GPU", 0.0) == pytest.approx(resources.gpus)
    assert totals.get("GPU", 0.0) == pytest.approx(tp_size * target_gpus + draft_gpus)


def test_fits_on_node_compares_every_needed_resource() -> None:
    need = {"CPU": 3.0, "GPU": 2.5}
    assert fits_on_node(need, {"CPU": 3.0, "GPU": 3.0, "memory": 1e9})
    assert not fits_on_node(need, {"CPU": 3.0, "GPU": 2.0})
    assert not fits_on_node(need, {"CPU": 8.0})


def test_message_when_no_node_is_large_enough() -> None:
    pair = make_pair(tp_size=4, target_gpus=1, draft_gpus=0.5, name="llama-70b")
    nodes = [{"CPU": 1.0}, {"CPU": 5.0, "GPU": 3.0}, {"CPU": 5.0, "GPU": 3.0}]
    message = unplaceable_message([pair], 3.0, nodes)
    assert "pair 'llama-70b'" in message
    assert "within 3 s" in message
    assert "4 target rank(s) × {CPU: 1, GPU: 1}" in message
    assert "draft {CPU: 1, GPU: 0.5}" in message
    assert "= {CPU: 5, GPU: 4.5}" in message
    assert "STRICT_PACK" in message
    assert "3 alive node(s)" in message
    assert "largest per resource: {CPU: 5, GPU: 3}" in message
    assert "No node is that large" in message


def test_message_when_a_node_is_large_enough_but_busy() -> None:
    pair = make_pair(tp_size=2, target_gpus=1, draft_gpus=0.5)
    message = unplaceable_message([pair], 600, [{"CPU": 96.0, "GPU": 8.0}])
    assert "= {CPU: 3, GPU: 2.5}" in message
    assert "large enough in total" in message
    assert "other work holds its resources" in message


# --- Ray: a head and two GPU worker nodes ----------------------------------------------------


@ray.remote(num_cpus=0)
class Probe:
    """A trivial actor that reports where it runs and what Ray gave it."""

    def where(self) -> dict:
        context = ray.get_runtime_context()
        return {
            "node": context.get_node_id(),
            "gpu_ids": ray.get_gpu_ids(),
            "resources": context.get_assigned_resources(),
        }


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[dict[str, str]]:
    """Start head + two GPU worker nodes, connect, yield {node_id: label}; shut all down after."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "num_gpus": 0,
            "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": False,
            "resources": {"node_head": 1},
        },
    )
    try:
        for label in ("a", "b"):
            cluster.add_node(
                num_cpus=CPUS_PER_WORKER_NODE,
                num_gpus=GPUS_PER_WORKER_NODE,
                object_store_memory=OBJECT_STORE_BYTES,
                resources={f"node_{label}": 1},
            )
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        labels = {}
        for node in ray.nodes():
            (name,) = [key for key in node["Resources"] if key.startswith("node_")]
            labels[node["NodeID"]] = name.removeprefix("node_")
        yield labels
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_group_is_strict_pack_and_actors_land_in_their_bundles(ray_cluster: dict) -> None:
    pair = make_pair(tp_size=2, target_gpus=1, draft_gpus=0.5)
    group = create_worker_group([pair], timeout_s=60)
    try:
        table = placement_group_table(group)
        assert table["strategy"] == GROUP_STRATEGY == "STRICT_PACK"
        assert len(table["bundles"]) == 3
        bundle_nodes = set(table["bundles_to_node_id"].values())
        assert len(bundle_nodes) == 1

        ranks = [Probe.options(**actor_options_for_rank(group, rank)).remote() for rank in (0, 1)]
        draft = Probe.options(**draft_actor_options(group)).remote()
        rank_places = ray.get([rank.where.remote() for rank in ranks], timeout=60)
        draft_place = ray.get(draft.where.remote(), timeout=60)

        nodes = {place["node"] for place in [*rank_places, draft_place]}
        assert nodes == bundle_nodes
        (node,) = nodes
        assert ray_cluster[node] in {"a", "b"}
        for place in rank_places:
            assert place["resources"] == {"CPU": 1.0, "GPU": 1.0}
            assert len(place["gpu_ids"]) == 1
        assert rank_places[0]["gpu_ids"] != rank_places[1]["gpu_ids"]
        assert draft_place["resources"] == {"CPU": 1.0, "GPU": 0.5}
        assert len(draft_place["gpu_ids"]) == 1
        for actor in [*ranks, draft]:
            ray.kill(actor)
    finally:
        remove_worker_group(group)


def test_rank_index_outside_the_target_ranks_is_rejected(ray_cluster: dict) -> None:
    group = create_worker_group([make_pair(tp_size=1, target_gpus=0, draft_gpus=0)], timeout_s=60)
    try:
        assert actor_options_for_rank(group, 0)["num_gpus"] == 0.0
        with pytest.raises(ValueError, match=r"rank must be in 0\.\.0 "):
            actor_options_for_rank(group, 1)
    finally:
        remove_worker_group(group)


def test_whole_node_target_fits_only_when_the_draft_shares_a_gpu(ray_cluster: dict) -> None:
    whole_gpus = make_pair(tp_size=GPUS_PER_WORKER_NODE, target_gpus=1, draft_gpus=0.1)
    with pytest.raises(PlacementError, match="No node is that large"):
        create_worker_group([whole_gpus], timeout_s=PLACEMENT_TIMEOUT_S)
    sharing = make_pair(tp_size=GPUS_PER_WORKER_NODE, target_gpus=0.9, draft_gpus=0.1)
    remove_worker_group(create_worker_group([sharing], timeout_s=60))


def test_impossible_group_raises_a_clear_error_within_the_timeout(ray_cluster: dict) -> None:
    pair = make_pair(tp_size=4, target_gpus=1, draft_gpus=0.5, name="too-big")
    assert 2 * GPUS_PER_WORKER_NODE >= 4 * 1 + 0.5  # the cluster holds it, no single node does
    start = time.monotonic()
    with pytest.raises(PlacementError) as raised:
        create_worker_group([pair], timeout_s=PLACEMENT_TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert PLACEMENT_TIMEOUT_S <= elapsed < PLACEMENT_TIMEOUT_S + 10
    message = str(raised.value)
    assert "pair 'too-big'" in message
    assert "= {CPU: 5, GPU: 4.5}" in message
    assert f"largest per resource: {{CPU: {CPUS_PER_WORKER_NODE}, GPU: 3}}" in message
    assert "No node is that large" in message
    time.sleep(0.5)
    states = [entry["state"] for entry in placement_group_table().values()]
    assert "PENDING" not in states
