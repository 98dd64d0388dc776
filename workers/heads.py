"""Trained policy inputs: the SpecDec++ acceptance head and the Cali-TS predictor, and loaders.

The modules are defined here (the training jobs import them) so that an artifact written by
``training.jobs.specdecpp_head`` or ``training.jobs.cali_ts_predictor`` loads without the
training package. An artifact is a directory with ``config.json`` (its ``kind`` and shapes) and
one safetensors file; nothing is unpickled. Loaders return plain callables that run under
``torch.inference_mode`` on whatever device the hidden states arrive on, batch 1.

``load_runtime_inputs(policy, path)`` gives the keyword arguments ``make_policy`` takes for a
policy's trained input (``RUNTIME_INPUT_LOADERS``), for ``TrialRequest.runtime_inputs``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from policies import DraftStep

CONFIG_FILE = "config.json"
HEAD_KIND = "specdecpp_head"
HEAD_FILE = "head.safetensors"
PREDICTOR_KIND = "cali_ts_predictor"
PREDICTOR_FILE = "predictor.safetensors"


class AcceptanceHead(nn.Module):
    """SpecDec++'s (D+1)-layer ResNet: D blocks x ← x + SiLU(Linear(x)), then Linear(d, 1).

    Maps the draft's last hidden state e [..., d] to the acceptance logit f(e) [...].
    """

    def __init__(self, hidden_size: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(depth))
        self.output = nn.Linear(hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return the logit f(e) for each hidden state (last dim removed)."""
        x = hidden
        for block in self.blocks:
            x = x + nn.functional.silu(block(x))
        return self.output(x).squeeze(-1)


class CaliPredictor(nn.Module):
    """EESD's Cali-TS predictor: θ_M = sigmoid(W_p [W^i H_t, H_{t+i}]) for offsets i = 1..max.

    ``target_hidden`` H_t [..., d_t] is the target's last hidden state, ``draft_hidden``
    H_{t+i} [..., d_d] the draft's, ``offset`` i [...] (1-based, long). W^i is a bias-free
    d_t → ``projection_dim`` map per offset; W_p a linear map to one logit.
    """

    def __init__(
        self, target_size: int, draft_size: int, projection_dim: int, max_offset: int
    ) -> None:
        super().__init__()
        self.max_offset = max_offset
        self.offset_maps = nn.Parameter(torch.empty(max_offset, projection_dim, target_size))
        for matrix in self.offset_maps.data:
            nn.init.kaiming_uniform_(matrix, a=5**0.5)
        self.output = nn.Linear(projection_dim + draft_size, 1)

    def forward(
        self, target_hidden: torch.Tensor, draft_hidden: torch.Tensor, offset: torch.Tensor
    ) -> torch.Tensor:
        """Return the logit of θ_M for each (H_t, H_{t+i}, i) (last dim removed)."""
        index = offset.clamp(1, self.max_offset) - 1
        if index.dim() == 0:
            projected = target_hidden @ self.offset_maps[index].T
        else:
            projected = target_hidden.new_zeros(*index.shape, self.offset_maps.shape[1])
            for value in index.unique():
                rows = index == value
                projected[rows] = target_hidden[rows] @ self.offset_maps[value].T
        return self.output(torch.cat([projected, draft_hidden], dim=-1)).squeeze(-1)


def read_artifact_config(path: str | Path, kind: str) -> dict[str, Any]:
    """Return the artifact's ``config.json``, checking that it holds a ``kind`` artifact."""
    config_path = Path(path) / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {path}: not a trained head/predictor")
    config = json.loads(config_path.read_text())
    if config.get("kind") != kind:
        raise ValueError(f"{path} holds a {config.get('kind')!r} artifact, expected {kind!r}")
    return config


def build_acceptance_head(config: dict[str, Any]) -> AcceptanceHead:
    """Return an untrained head of the shape an artifact config describes."""
    return AcceptanceHead(int(config["hidden_size"]), int(config["depth"]))


def build_cali_predictor(config: dict[str, Any]) -> CaliPredictor:
    """Return an untrained predictor of the shape an artifact config describes."""
    return CaliPredictor(
        int(config["target_hidden_size"]),
        int(config["draft_hidden_size"]),
        int(config["projection_dim"]),
        int(config["max_offset"]),
    )


class _OnDevice:
    """A frozen float32 module, copied to the device of the inputs it is called with."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module.float().eval().requires_grad_(False)
        self.device = torch.device("cpu")

    def to(self, device: torch.device) -> nn.Module:
        """Return the module on ``device`` (moved there on the first call from it)."""
        if device != self.device:
            self.module.to(device)
            self.device = device
        return self.module


def load_acceptance_head(path: str | Path) -> Callable[[torch.Tensor], float]:
    """Return hidden [d] → f(e), the trained SpecDec++ head's acceptance logit, from ``path``.

    ``SpecDecPPPolicy`` takes it as ``head``.
    """
    config = read_artifact_config(path, HEAD_KIND)
    head = build_acceptance_head(config)
    head.load_state_dict(load_file(str(Path(path) / HEAD_FILE)))
    holder = _OnDevice(head)

    @torch.inference_mode()
    def acceptance_logit(hidden: torch.Tensor) -> float:
        module = holder.to(hidden.device)
        return float(module(hidden.reshape(-1).float()))

    return acceptance_logit


def load_cali_predictor(path: str | Path) -> Callable[[DraftStep], float]:
    """Return step → θ_M ∈ [0, 1], the trained Cali-TS predictor from ``path``.

    Uses ``step.index`` as the offset i (clamped to the predictor's ``max_offset``),
    ``step.hidden`` as H_{t+i} and ``step.target_hidden`` as H_t. In a request's first round
    the engine has no target hidden state yet (the target has only been prefilled); there the
    predictor returns the acceptance base rate of its training data. ``CaliTSPolicy`` takes it
    as ``predictor``.
    """
    config = read_artifact_config(path, PREDICTOR_KIND)
    predictor = build_cali_predictor(config)
    predictor.load_state_dict(load_file(str(Path(path) / PREDICTOR_FILE)))
    holder = _OnDevice(predictor)
    base_rate = float(config["base_rate"])

    @torch.inference_mode()
    def theta_model(step: DraftStep) -> float:
        if step.hidden is None:
            raise ValueError("the Cali-TS predictor needs the draft hidden state (step.hidden)")
        if step.target_hidden is None:
            return base_rate
        module = holder.to(step.hidden.device)
        offset = torch.tensor(step.index, device=step.hidden.device)
        logit = module(
            step.target_hidden.reshape(-1).to(step.hidden.device, torch.float32),
            step.hidden.reshape(-1).float(),
            offset,
        )
        return float(torch.sigmoid(logit))

    return theta_model


#: Policy name → (the keyword its constructor takes, the loader of its trained artifact).
RUNTIME_INPUT_LOADERS: dict[str, tuple[str, Callable[[str | Path], Callable[..., float]]]] = {
    "specdecpp": ("head", load_acceptance_head),
    "cali_ts": ("predictor", load_cali_predictor),
}


def load_runtime_inputs(policy: str, artifact_path: str | Path) -> dict[str, Any]:
    """Return ``{keyword: callable}`` loaded from ``artifact_path`` for ``make_policy(policy)``."""
    if policy not in RUNTIME_INPUT_LOADERS:
        raise ValueError(
            f"policy {policy!r} takes no trained artifact; policies that do: "
            f"{', '.join(sorted(RUNTIME_INPUT_LOADERS))}"
        )
    keyword, loader = RUNTIME_INPUT_LOADERS[policy]
    return {keyword: loader(artifact_path)}
