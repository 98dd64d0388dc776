"""EAGLE heads over a tiny target for engine tests: untrained (perturbed) or briefly trained on
the planted pattern (the target's own greedy continuations of random prompts)."""

from __future__ import annotations

import torch

from support.tiny_models import prompts
from training.eagle_training import EagleLossWeights, sequence_features, train_steps
from training.lm_trainer import TrainConfig
from workers.eagle.head import EagleConfig, EagleHead, TargetParts
from workers.lm import CachedLM
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget


def untrained_head(target, seed: int = 0, **variant) -> EagleHead:
    """Return a head over ``target`` with its initial weights perturbed by seeded noise."""
    torch.manual_seed(seed)
    head = EagleHead(EagleConfig.for_target(target, **variant), TargetParts.of(target))
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return head.eval()


def greedy_continuations(target, n: int, seed: int, new_tokens: int = 16) -> torch.Tensor:
    """Return [n, 3 + new_tokens] rows: a 3-token random prompt and the target's greedy
    continuation of it."""
    local = LocalTarget(CachedLM(target, single_step="plain"))
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=new_tokens)
    rows = []
    for prompt in prompts(n, seed=seed):
        result = local.generate(prompt[:3], RequestSettings(sampling=sampling, seed=0))
        rows.append(torch.cat([prompt[:3], torch.tensor(result.output_ids)]))
    return torch.stack(rows)


def trained_head(target, n: int = 48, steps: int = 150) -> EagleHead:
    """Return a head trained briefly on ``n`` greedy continuations of ``target``."""
    tokens = greedy_continuations(target, n, seed=11)
    data = sequence_features(target, tokens, torch.ones_like(tokens, dtype=torch.bool))
    head = untrained_head(target, seed=1).train()
    config = TrainConfig(steps=steps, batch_size=8, lr=3e-3, warmup_steps=10, seed=0)
    train_steps(head, data, config, EagleLossWeights(noise=0.05))
    return head.eval()
