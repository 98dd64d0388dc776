"""What a worker is asked to load: a model's location, an EAGLE head's, and a tensor-parallel
rank's place.

Plain data with no Ray or torch import, so the actors and the tensor-parallel target (and the
orchestrator that builds both) share it without importing each other.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Literal

from workers.step_plan import StepPlan

#: How a model's forwards run (``workers.lm.CachedLM``): decided by timing ("auto"), every size
#: on the default layout with one-token steps as themselves ("plain") or as two-token blocks
#: ("padded"), or a ``StepPlan`` chosen before.
SingleStep = Literal["auto", "plain", "padded"] | StepPlan


@dataclass(frozen=True)
class ModelSpec:
    """Where a model is and how to load it; ``single_step`` is passed to ``CachedLM`` ("auto":
    time its weight layouts and block sizes at load; a ``StepPlan``: the choice an earlier
    replica on the node made, ``orchestrator.run.step_choices``)."""

    path: str
    dtype: str = "float32"
    trust_remote_code: bool = False
    single_step: SingleStep = "auto"


@dataclass(frozen=True)
class EagleHeadSpec:
    """An EAGLE head a draft worker loads (``workers.eagle``): the head's directory and the
    target it reads, whose frozen embeddings, final norm and LM head the head is built over
    (loaded from the target's checkpoint; the rest of the target is not kept)."""

    path: str
    target: ModelSpec


@dataclass(frozen=True)
class RankSpec:
    """This rank's place in a tensor-parallel target group.

    An empty ``master_addr`` means this node's address (all ranks of a group are packed on one
    node, so every rank resolves the same one).
    """

    rank: int
    world_size: int
    master_addr: str
    master_port: int


def free_port(host: str = "") -> int:
    """Return a TCP port free now on this host (``host``: the address to bind, "" for all): a
    tensor-parallel group's rendezvous (``RankSpec.master_port``), a test server's port."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
