"""The three placements ``bench/actors.py`` compares, behind one interface.

- ``in_process``: draft and target in this process and thread (:class:`InProcess`);
- ``processes``: the actors' own classes (``TargetWorker`` and ``DraftWorker`` unwrapped from
  Ray) in two spawned processes, the draft calling the target over the same direct channel, this
  process calling the draft over a pipe (:class:`PlainProcesses`): the split without Ray;
- ``actors``: the same classes as Ray actors (:class:`OnActors`), as a sweep runs them.

Each placement starts the target first and the draft once the target is ready, as a sweep's
worker group does (``orchestrator.run.replica.GroupReplica``): each model's one-token step
calibration (``CachedLM.calibrate_steps``) then runs while the other process is idle.
Started together, the draft's calibration ran while the target loaded, measured 7.3 ms for one
token against 6.0 for two (3.7 against 4.1 in process) and padded the draft's steps.
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import asdict
from multiprocessing.connection import Connection

import ray
import torch

from workers.actors import (
    ChannelTargetGroup,
    DraftWorker,
    ModelSpec,
    TargetWorker,
    load_model,
)
from workers.channel import ChannelAddress, ChannelClient, serve_connection
from workers.lm import SingleStepCalibration
from workers.process_usage import ProcessUsage, actor_process_usage, process_usage
from workers.records import GenerationResult
from workers.target import LocalTarget
from workers.trial import TrialRequest, run_trial, warm_up

#: What this process may ask a plain process's host.
HOST_METHODS = frozenset(
    {"open_channel", "run_trial", "warm_up", "single_step_calibration", "process_usage"}
)


def calibration_fields(calibration: SingleStepCalibration | None) -> dict | None:
    """Return a one-token step calibration as JSON-ready fields (None when there is none)."""
    return None if calibration is None else asdict(calibration)


class InProcess:
    """Draft and target in this process, one torch thread."""

    name = "in_process"

    def __init__(self, draft: ModelSpec, target: ModelSpec, device: str) -> None:
        self.target = LocalTarget(load_model(target, device))
        self.draft = load_model(draft, device)

    def run(self, request: TrialRequest) -> list[GenerationResult]:
        """Run one trial here."""
        return run_trial(self.draft, self.target, request)

    def warm_up(self, request: TrialRequest, seconds: float) -> None:
        """Decode ``request`` untimed for ``seconds`` (at least one pass)."""
        warm_up(self.draft, self.target, request, seconds)

    def usage(self) -> ProcessUsage:
        """Return what this process used so far."""
        return process_usage()

    def calibrations(self) -> dict[str, dict | None]:
        """Return both models' one-token step calibrations."""
        return {
            "draft": calibration_fields(self.draft.calibration),
            "target": calibration_fields(self.target.lm.calibration),
        }


def _serve_host(
    control: Connection, model: ModelSpec, device: str, target: ChannelAddress | None
) -> None:
    """A plain process's main: host ``model`` as the target (``target`` None) or as the draft
    of the target at ``target``, then answer this process's calls on ``control`` until it hangs
    up."""
    if torch.device(device).type == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a host outside Ray takes a GPU it can see
    torch.set_num_threads(1)  # as Ray sets it for a one-CPU actor
    if target is None:
        host = TargetWorker.__ray_actor_class__(model)
    else:
        host = DraftWorker.__ray_actor_class__(model, [])
        host.target = ChannelTargetGroup([target])

    def call(method: str, args: tuple) -> object:
        return process_usage() if method == "process_usage" else getattr(host, method)(*args)

    serve_connection(control, call, HOST_METHODS)


def _start_host(model: ModelSpec, device: str, target: ChannelAddress | None) -> ChannelClient:
    """Spawn a plain process hosting ``model`` (``_serve_host``); return its control channel
    once the model is loaded."""
    context = multiprocessing.get_context("spawn")
    near, far = context.Pipe()
    process = context.Process(target=_serve_host, args=(far, model, device, target), daemon=True)
    process.start()
    far.close()
    host = ChannelClient(near)
    host.call("single_step_calibration")  # answered once the model is loaded
    return host


class PlainProcesses:
    """The actors' classes in two spawned processes, without Ray."""

    name = "processes"

    def __init__(self, draft: ModelSpec, target: ModelSpec, device: str) -> None:
        self.target_host = _start_host(target, device, None)
        address = self.target_host.call("open_channel")
        self.draft_host = _start_host(draft, device, address)
        self.hosts = [self.target_host, self.draft_host]

    def run(self, request: TrialRequest) -> list[GenerationResult]:
        """Run one trial in the draft's process."""
        return self.draft_host.call("run_trial", request)

    def warm_up(self, request: TrialRequest, seconds: float) -> None:
        """Decode ``request`` untimed for ``seconds`` (at least one pass)."""
        self.draft_host.call("warm_up", request, seconds)

    def usage(self) -> ProcessUsage:
        """Return what both processes used so far."""
        return sum((host.call("process_usage") for host in self.hosts), ProcessUsage())

    def calibrations(self) -> dict[str, dict | None]:
        """Return both models' one-token step calibrations."""
        return {
            "draft": calibration_fields(self.draft_host.call("single_step_calibration")),
            "target": calibration_fields(self.target_host.call("single_step_calibration")),
        }


class OnActors:
    """The target in a ``TargetWorker``, the draft in a ``DraftWorker`` (one CPU each, or a
    quarter of a GPU each on cuda)."""

    name = "actors"

    def __init__(self, draft: ModelSpec, target: ModelSpec, device: str) -> None:
        # An actor loads on cuda when Ray gives it a GPU share (workers.actors._device).
        gpus = 0.25 if torch.device(device).type == "cuda" else 0
        self.target = TargetWorker.options(num_cpus=1, num_gpus=gpus).remote(target)
        ray.get(self.target.node_id.remote())
        self.draft = DraftWorker.options(num_cpus=1, num_gpus=gpus).remote(draft, [self.target])
        ray.get(self.draft.node_id.remote())

    def run(self, request: TrialRequest) -> list[GenerationResult]:
        """Run one trial on the draft actor."""
        return ray.get(self.draft.run_trial.remote(request))

    def warm_up(self, request: TrialRequest, seconds: float) -> None:
        """Decode ``request`` untimed for ``seconds`` (at least one pass)."""
        ray.get(self.draft.warm_up.remote(request, seconds))

    def usage(self) -> ProcessUsage:
        """Return what both actors' processes used so far."""
        actors = (self.draft, self.target)
        usages = ray.get([actor.__ray_call__.remote(actor_process_usage) for actor in actors])
        return sum(usages, ProcessUsage())

    def calibrations(self) -> dict[str, dict | None]:
        """Return both models' one-token step calibrations."""
        return {
            "draft": calibration_fields(ray.get(self.draft.single_step_calibration.remote())),
            "target": calibration_fields(ray.get(self.target.single_step_calibration.remote())),
        }


#: The placements, in the order they load and are reported.
KINDS = (InProcess, PlainProcesses, OnActors)
PLACEMENTS = tuple(kind.name for kind in KINDS)


def start_placements(
    draft: ModelSpec, target: ModelSpec, device: str
) -> list[InProcess | PlainProcesses | OnActors]:
    """Load the pair in every placement, one after the other (Ray must be started)."""
    return [kind(draft, target, device) for kind in KINDS]
