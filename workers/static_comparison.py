"""Target-only AR and static-K speculative decoding on the same prompts, taking turns.

The engine benchmark and the zoo's model cards both report how much faster static-K speculative
decoding is than the target alone. On a shared machine a slow spell lands on whichever method
happens to run through it, so the methods here take turns prompt by prompt (AR, then each
draft at each K) and every ratio compares runs made under the same conditions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from policies import make_policy
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import CachedLM
from workers.records import GenerationResult
from workers.target import LocalTarget


@dataclass(frozen=True)
class StaticComparison:
    """Per-prompt results of target-only AR and of each (draft name, K) static run."""

    ar: list[GenerationResult]
    static: dict[tuple[str, int], list[GenerationResult]]

    @staticmethod
    def tokens_per_second(results: Sequence[GenerationResult]) -> float:
        """Return generated tokens over wall seconds summed across ``results``."""
        return sum(r.n_generated for r in results) / sum(r.seconds for r in results)

    def speedup(self, draft: str, k: int) -> float:
        """Return static K's tokens/s with ``draft`` over target-only AR's tokens/s."""
        return self.tokens_per_second(self.static[draft, k]) / self.tokens_per_second(self.ar)

    def acceptance(self, draft: str, k: int) -> float:
        """Return accepted over drafted tokens of static K with ``draft`` (0.0 if none drafted)."""
        runs = self.static[draft, k]
        drafted = sum(r.n_drafted for r in runs)
        return sum(r.n_accepted for r in runs) / drafted if drafted else 0.0

    def matches_ar(self, draft: str, k: int) -> bool:
        """Return whether static K with ``draft`` produced exactly AR's tokens on every prompt."""
        return [r.output_ids for r in self.static[draft, k]] == [r.output_ids for r in self.ar]


def compare_static_k(
    target: LocalTarget,
    drafts: Mapping[str, CachedLM],
    prompts: Sequence[torch.Tensor],
    settings: RequestSettings,
    ks: Sequence[int],
    progress: str | None = None,
) -> StaticComparison:
    """Return AR and static-K runs of every draft at every K, taking turns prompt by prompt.

    One AR generation of the first prompt runs first and is discarded (warm-up). ``progress``,
    when given, is the label of a progress bar over the prompts. Exists so that speedups are
    always measured side by side in the same loop (see the module docstring).
    """
    if not prompts:
        raise ValueError("compare_static_k needs at least one prompt")
    autoregressive_generate(target, prompts[0], settings)
    ar: list[GenerationResult] = []
    static: dict[tuple[str, int], list[GenerationResult]] = {
        (name, k): [] for name in drafts for k in ks
    }
    for prompt in tqdm(prompts, desc=progress, disable=progress is None):
        ar.append(autoregressive_generate(target, prompt, settings))
        for (name, k), runs in static.items():
            policy = make_policy("static", k)
            runs.append(speculative_generate(drafts[name], target, policy, prompt, settings))
    return StaticComparison(ar=ar, static=static)
