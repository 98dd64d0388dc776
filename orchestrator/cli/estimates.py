"""The sweep estimate ``plan --estimate`` and ``submit`` print: its options, cluster and fits."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from orchestrator.analysis.costs import estimate
from orchestrator.analysis.costs.estimate import SweepEstimate
from orchestrator.cli.common import (
    DEFAULT_CLUSTER_FILE,
    UserError,
)
from orchestrator.store import (
    StoreError,
    open_store,
)
from orchestrator.sweep.planner import Plan
from orchestrator.sweep.spec import SweepSpec

if TYPE_CHECKING:
    from orchestrator.analysis.costs.batch_estimate import BatchMeasurement
    from orchestrator.analysis.costs.model import HardwareProfile


DEFAULT_ESTIMATE_PROFILE = "specdecpp-70b-7b-2xa100"


def add_estimate_options(command: argparse.ArgumentParser) -> None:
    """Add the options the estimate reads: ``--profile``, ``--gpus`` and ``--cluster``."""
    from orchestrator.analysis.costs.model import HARDWARE_PROFILES

    command.add_argument(
        "--profile",
        choices=sorted(HARDWARE_PROFILES),
        default=DEFAULT_ESTIMATE_PROFILE,
        help=f"hardware profile of the estimate (default: {DEFAULT_ESTIMATE_PROFILE})",
    )
    command.add_argument(
        "--gpus",
        type=float,
        metavar="N",
        help="GPUs the estimate assumes on one node, when --address is not given "
        "(default: the nodes of --cluster)",
    )
    command.add_argument(
        "--cluster",
        metavar="CLUSTER.yaml",
        default=None,
        help="Ray cluster-launcher file whose GPU node types the estimate assumes (default: "
        "plan: the repository's cluster.yaml; submit: this machine's GPUs, where a local Ray "
        "runs the sweep)",
    )


def sweep_estimate(
    args: argparse.Namespace, spec: SweepSpec, plan: Plan, local: bool = False
) -> SweepEstimate:
    """Return the plan's estimate on ``--profile`` (or stored fits) over the cluster's GPUs."""
    from orchestrator.analysis.costs.model import hardware_profile
    from orchestrator.run import estimate_sources

    try:
        options = estimate_sources.options_from_spec(spec, *_stored_sources(args.db, plan))
        return estimate.estimate_sweep(
            plan, hardware_profile(args.profile), estimate_cluster(args, local), options
        )
    except estimate.EstimateError as error:
        raise UserError([f"error: {error}"]) from None


def estimate_cluster(args: argparse.Namespace, local: bool = False) -> estimate.Cluster:
    """Return the GPUs of ``--address``'s Ray cluster, else ``--gpus N``, else ``--cluster``'s;
    without any of them, ``local`` (submit on a local Ray) counts this machine's GPUs and
    ``plan`` reads the repository's cluster.yaml."""
    from orchestrator.run import estimate_sources

    if args.address is not None:
        return estimate_sources.ray_cluster(args.address)
    if args.gpus is not None:
        return estimate.gpus_cluster(args.gpus)
    if args.cluster is None and local:
        return _local_gpus()
    return estimate.parse_cluster_yaml(_shown_path(Path(args.cluster or DEFAULT_CLUSTER_FILE)))


def _local_gpus() -> estimate.Cluster:
    """Return this machine's GPUs as the cluster a local Ray runs on (EstimateError: none)."""
    from orchestrator.run.provenance import local_gpu_count

    count = local_gpu_count()
    if count == 0:
        raise estimate.EstimateError(
            "this machine has no GPU and the sweep runs on a local Ray here; the estimate's "
            "profiles are GPU ones (give --address, --gpus or --cluster to estimate a cluster)"
        )
    return estimate.gpus_cluster(count, source="this machine")


def _stored_sources(
    url: str | None, plan: Plan
) -> tuple[dict[str, HardwareProfile], dict[tuple[str, int], BatchMeasurement]]:
    """Return the fitted profiles of ``plan``'s pairs and what stored trials measured at its
    batch sizes above 1, from the store at ``url`` (both empty without one)."""
    from orchestrator.run import estimate_sources

    try:
        store = open_store(url, read_only=True)
    except StoreError:
        return {}, {}
    with store:
        fitted = estimate_sources.stored_profiles(store, plan)
        return fitted, estimate_sources.stored_batch_measurements(store, plan)


def _shown_path(path: Path) -> Path:
    """Return ``path`` relative to the working directory when it lies under it."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def print_estimate(console: Console, result: SweepEstimate) -> None:
    """Print an estimate's lines."""
    for line in estimate.estimate_lines(result):
        console.print(line, markup=False)
