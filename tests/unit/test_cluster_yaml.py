"""``cluster.yaml``: valid for Ray's cluster launcher, installs SpecSweep, GPU workers fit pairs.

Validation uses the schema shipped inside the installed ``ray`` package
(``ray/autoscaler/ray-schema.json``) and then the launcher's own preparation and checks
(``prepare_config`` + ``validate_config``, what ``ray up`` runs before touching AWS).
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from support.paths import REPO

from orchestrator.sweep.bundles import bundle_totals, fits_on_node, worker_group_bundles
from orchestrator.sweep.spec import PairSpec

CLUSTER_YAML = REPO / "cluster.yaml"
RAY_SCHEMA = Path(ray.autoscaler.__file__).parent / "ray-schema.json"

#: GPUs per instance of the GPU types this config may use (AWS instance specifications).
GPUS_PER_INSTANCE = {"p4d.24xlarge": 8, "p4de.24xlarge": 8, "p5.48xlarge": 8}
INSTALL = re.compile(r"pip install\b.*\s-e\s+\"?\./(?P<dir>[\w.-]+)\[(?P<extras>[\w,\s-]+)\]\"?")


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    """Return cluster.yaml parsed."""
    return yaml.safe_load(CLUSTER_YAML.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    """Return Ray's cluster-launcher JSON schema."""
    return json.loads(RAY_SCHEMA.read_text(encoding="utf-8"))


def worker_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Return the node types other than the head's."""
    head = config["head_node_type"]
    return {name: spec for name, spec in config["available_node_types"].items() if name != head}


def test_valid_against_rays_schema(config: dict[str, Any], schema: dict[str, Any]) -> None:
    jsonschema.validate(config, schema)


def test_schema_check_is_live(config: dict[str, Any], schema: dict[str, Any]) -> None:
    broken = copy.deepcopy(config)
    broken["worker_start_ray_comands"] = ["ray start"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_passes_the_launchers_own_checks(config: dict[str, Any]) -> None:
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_setup_installs_this_checkout_with_its_extras(config: dict[str, Any]) -> None:
    installs = [m for cmd in config["setup_commands"] if (m := INSTALL.search(cmd))]
    assert len(installs) == 1, config["setup_commands"]
    (install,) = installs
    extras = {extra.strip() for extra in install["extras"].split(",")}
    assert {"deepspeed", "postgres"} <= extras
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert extras <= set(pyproject["project"]["optional-dependencies"])
    mounted = config["file_mounts"]
    remote = f"~/{install['dir']}"
    assert remote in mounted, f"{remote} is not a file mount: {mounted}"
    local = (CLUSTER_YAML.parent / mounted[remote]).resolve()
    assert local == REPO
    assert ".gitignore" in config["rsync_filter"]


def test_worker_nodes_have_gpus_and_the_head_runs_no_workers(config: dict[str, Any]) -> None:
    workers = worker_types(config)
    assert workers
    for spec in workers.values():
        instance = spec["node_config"]["InstanceType"]
        assert spec["resources"]["GPU"] == GPUS_PER_INSTANCE[instance] >= 1
        assert 0 <= spec.get("min_workers", 0) <= spec["max_workers"] <= config["max_workers"]
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"].get("CPU") == 0
    assert head["resources"].get("GPU", 0) == 0
    assert config["docker"]["worker_image"].endswith("-gpu")
    assert "py311" in config["docker"]["worker_image"]
    assert "py311" in config["docker"]["head_image"]


def test_start_commands_start_a_head_and_join_it(config: dict[str, Any]) -> None:
    head = " ".join(config["head_start_ray_commands"])
    worker = " ".join(config["worker_start_ray_commands"])
    assert "ray start --head --port=6379" in head
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
    assert "ray start --address=$RAY_HEAD_IP:6379" in worker


def test_dashboard_listens_on_the_heads_localhost_only(config: dict[str, Any]) -> None:
    """Ray's dashboard serves the unauthenticated Jobs API: bound to 127.0.0.1 on the head, it
    is reached through ``ray dashboard cluster.yaml`` (an SSH tunnel), not by the security group."""
    head = " ".join(config["head_start_ray_commands"])
    assert re.findall(r"--dashboard-host[= ](\S+)", head) == ["127.0.0.1"]
    assert "0.0.0.0" not in CLUSTER_YAML.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("tp_size", "target_gpus", "draft_gpus", "fits"),
    [(4, 1, 1, True), (7, 1, 1, True), (8, 0.9, 0.1, True), (8, 1, 0.5, False)],
)
def test_worker_node_holds_the_pairs_it_should(
    config: dict[str, Any], tp_size: int, target_gpus: float, draft_gpus: float, fits: bool
) -> None:
    pair = PairSpec.model_validate(
        {
            "name": "p",
            "target": {
                "model": "org/target",
                "backend": "deepspeed",
                "tp_size": tp_size,
                "gpus": target_gpus,
            },
            "draft": {"model": "org/draft", "gpus": draft_gpus},
        }
    )
    need = bundle_totals(worker_group_bundles([pair]))
    for spec in worker_types(config).values():
        node = {name: float(amount) for name, amount in spec["resources"].items()}
        assert fits_on_node(need, node) is fits
