"""Where the estimate's inputs come from: stored fits (real SQLite), a live Ray cluster, the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import REPO

from orchestrator import cli
from orchestrator.analysis.costs import estimate
from orchestrator.analysis.costs.model import HardwareProfile
from orchestrator.run import estimate_sources
from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep

PROFILE = HardwareProfile("test", "hand-made", t_draft=0.01, t_target=0.1, ar_tokens_per_s=10.0)

SWEEP = """\
name: {name}
pairs:
  - name: {pair}
    target: {{model: "zoo:micro/target", gpus: 1}}
    draft: {{model: "zoo:micro/draft-s", gpus: 1}}
  - name: other
    target: {{model: "zoo:micro/target", gpus: 1}}
    draft: {{model: "zoo:micro/draft-m", gpus: 1}}
datasets: [{{name: "builtin:code", samples: 4, max_new_tokens: 50}}]
temperatures: [0]
policies: [{{name: static}}]
max_draft_lens: [4]
"""


def _fit_row(sweep: str, pair: str, t_target: float, n_rounds: int) -> dict[str, object]:
    return {
        "sweep": sweep,
        "group_key": f"g-{pair}-{n_rounds}",
        "pair": pair,
        "dataset": "builtin:code",
        "split": None,
        "samples": 4,
        "max_new_tokens": 50,
        "temperature": 0.0,
        "t_draft": 0.002,
        "t_target": t_target,
        "t_per_verified": 0.0,
        "r2_draft": 1.0,
        "r2_verify": 1.0,
        "r2_round": 1.0,
        "n_rounds": n_rounds,
        "n_trials": 2,
        "overhead_seconds": 0.5,
    }


def test_a_stored_fit_of_the_same_models_replaces_the_profile(tmp_path: Path) -> None:
    old = parse_sweep(SWEEP.format(name="old", pair="measured"))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url) as store:
        store.register_sweep(old, plan_sweep(old))
        store.record_cost_fit(_fit_row("old", "measured", t_target=0.04, n_rounds=100))
        store.record_cost_fit(_fit_row("old", "measured", t_target=0.07, n_rounds=300))
    new = plan_sweep(parse_sweep(SWEEP.format(name="new", pair="renamed")))
    with open_store(url, read_only=True) as store:
        fitted = estimate_sources.stored_profiles(store, new)
    # "renamed" has the models of "measured"; "other" has another draft and no fit.
    assert set(fitted) == {"renamed"}
    profile = fitted["renamed"]
    assert profile.t_target == pytest.approx((100 * 0.04 + 300 * 0.07) / 400)
    assert profile.t_draft == pytest.approx(0.002)
    # AR: one target forward per token plus 0.5 s a sample over 50 tokens.
    assert profile.ar_tokens_per_s == pytest.approx(1 / (profile.t_target + 0.01))
    options = estimate.EstimateOptions(fitted=fitted)
    result = estimate.estimate_sweep(new, PROFILE, estimate.gpus_cluster(8), options)
    by_pair = {pair.pair: pair for pair in result.pairs}
    assert by_pair["renamed"].profile == "stored fit of renamed"
    assert by_pair["other"].profile == "test"
    assert by_pair["renamed"].seconds_upper == pytest.approx(2 * 200 / profile.ar_tokens_per_s)


def test_options_read_the_sweeps_replicas_and_shard_prompts() -> None:
    spec = parse_sweep(SWEEP.format(name="s", pair="p"))
    defaults = estimate_sources.options_from_spec(spec)
    assert defaults.replicas is None
    assert defaults.shard_prompts == spec.execution.shard_prompts == estimate.DEFAULT_SHARD_PROMPTS
    assert defaults.max_concurrent_pairs == 1
    changed = {"replicas": 3, "shard_prompts": 8, "max_concurrent_pairs": 2}
    set_ = spec.model_copy(update={"execution": spec.execution.model_copy(update=changed)})
    options = estimate_sources.options_from_spec(set_)
    assert (options.replicas, options.shard_prompts, options.max_concurrent_pairs) == (3, 8, 2)


@pytest.mark.ray
@pytest.mark.slow
def test_plan_estimate_counts_the_gpus_of_a_live_ray_cluster(
    capsys: pytest.CaptureFixture,
) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    address = cluster.address
    try:
        cluster.add_node(num_cpus=1, num_gpus=4)
        cluster.add_node(num_cpus=1, num_gpus=2)
        cluster.wait_for_nodes()
        found = estimate_sources.ray_cluster(address)
        assert found.node_gpus == (4.0, 2.0)
        argv = ["plan", str(REPO / "sweeps" / "demo.yaml"), "--estimate"]
        assert cli.main([*argv, "--address", address]) == 0
    finally:
        cluster.shutdown()
    out = capsys.readouterr().out
    assert f"6 GPUs (Ray cluster at {address}): 2 replica(s)" in out


def test_plan_estimate_uses_gpus_else_the_cluster_file(capsys: pytest.CaptureFixture) -> None:
    demo = str(REPO / "sweeps" / "demo.yaml")
    assert cli.main(["plan", demo, "--estimate", "--gpus", "3"]) == 0
    assert "3 GPUs (--gpus)" in capsys.readouterr().out
    assert cli.main(["plan", demo, "--estimate"]) == 0
    assert "32 GPUs (cluster.yaml)" in capsys.readouterr().out
