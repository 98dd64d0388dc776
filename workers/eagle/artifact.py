"""Save and load EAGLE heads: this project's artifact layout and speculators' published one.

This project's artifact (``training.jobs.eagle_head``, the zoo's ``eagle``): a directory with
``config.json`` (``kind`` = ``EAGLE_KIND``, ``eagle``: the ``EagleConfig``, and the job's
provenance and metrics) and ``HEAD_FILE`` holding the head's own weights only.

Published heads in speculators' layout (``eagle`` and ``eagle3``) load through
``workers.eagle.speculators``.

Either kind is built over the target the caller passes (its embeddings, norm and LM head);
``load_head_for_target`` loads that target's parts from its checkpoint (a sweep's draft worker).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from workers.eagle.head import EagleConfig, EagleHead, TargetParts
from workers.eagle.speculators import (
    CONFIG_FILE,
    is_speculators,
    load_speculators,
    speculators_eagle_config,
)
from workers.lm import DTYPES, load_causal_lm
from workers.model_spec import ModelSpec

EAGLE_KIND = "eagle_head"
HEAD_FILE = "eagle_head.safetensors"


def save_eagle_head(directory: Path, head: EagleHead, meta: dict[str, Any]) -> Path:
    """Write ``head``'s own weights and ``config.json`` (``meta`` added) to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(weights, str(directory / HEAD_FILE))
    config = {**meta, "kind": EAGLE_KIND, "eagle": head.config.to_json()}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    return directory


def read_config(path: str | Path) -> dict[str, Any]:
    """Return a head directory's ``config.json``; ValueError names a missing one."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise ValueError(f"{file} does not exist: an EAGLE head is a directory with config.json")
    return json.loads(file.read_text())


def read_eagle_config(path: str | Path, target_depth: int | None = None) -> EagleConfig:
    """Return the ``EagleConfig`` of the head at ``path`` (either layout; of its weights, a
    speculators EAGLE-3 head's names and vocabulary mapping are read). ``target_depth``: the
    target's layer count, which places an EAGLE-3 head's default layers.

    ValueError names the file when the directory holds no EAGLE head (a model's directory,
    another artifact kind) or a speculators head of a kind not supported.
    """
    config = read_config(path)
    if is_speculators(config):
        return speculators_eagle_config(config, Path(path), target_depth)
    if config.get("kind") != EAGLE_KIND:
        raise ValueError(
            f"{Path(path) / CONFIG_FILE} has kind {config.get('kind')!r}, not {EAGLE_KIND!r}: "
            "not an EAGLE head (an eagle_head job's artifact, a zoo eagle head such as "
            "zoo:smol-eagle/eagle, or a speculators checkpoint)"
        )
    return EagleConfig.from_json(config["eagle"])


def load_eagle_head(path: str | Path, target: PreTrainedModel) -> EagleHead:
    """Return the head at ``path`` (either layout) over ``target``'s frozen parts, eval mode.

    ValueError names the file and what does not fit (another kind, another target's shape).
    """
    config = read_config(path)
    if is_speculators(config):
        return load_speculators(config, Path(path), target)
    head = EagleHead(read_eagle_config(path), TargetParts.of(target))
    head.load_state_dict(load_file(str(Path(path) / HEAD_FILE)))
    return head.eval()


def load_head_for_target(path: str | Path, target: ModelSpec, device: str) -> EagleHead:
    """Return the head at ``path`` on ``device``, in ``target``'s dtype, over the frozen parts
    of the target ``target`` names (what a draft worker serving an EAGLE pair holds).

    The target loads on the CPU and only its embeddings, final norm and LM head move to
    ``device`` with the head; the rest of it is dropped when this returns.
    """
    model = load_causal_lm(target.path, target.dtype, "cpu", target.trust_remote_code)
    head = load_eagle_head(path, model)
    return head.to(device=device, dtype=DTYPES[target.dtype])
