"""Is the AR baseline on its fastest path? Target-only AR on every model path, taking turns.

A sweep's AR baseline is a default ``CachedLM`` target: its one-token steps run on the weight
layout its calibration found fastest (``workers.step_plan``). ``bench/engine.py`` decodes the
prompts target-only on that model and on every other path it measures (packed weights only,
unpacked weights only, the transformers modules), the paths taking turns prompt by prompt and
pass by pass, and ``check_baseline`` compares the baseline's tokens/s with each path's through
the paired interval of ``orchestrator.analysis.stats`` (a jackknife t on the log ratio): the
baseline fails when some path is faster beyond that interval and beyond ``BASELINE_TOLERANCE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from orchestrator.analysis.stats import Interval, paired_speed_ratio
from workers.engine import RequestSettings, autoregressive_generate
from workers.lm import CachedLM
from workers.records import GenerationResult
from workers.static_comparison import StaticComparison
from workers.step_plan import LAYOUT_MIN_GAIN
from workers.target import LocalTarget

#: How much slower than another path the baseline may be, beyond the interval, before it fails:
#: the calibration leaves the packed layout only for a gain of ``LAYOUT_MIN_GAIN``, so a path
#: faster by less is the calibration's own tolerance, not a wrong choice.
BASELINE_TOLERANCE = LAYOUT_MIN_GAIN


def ar_on_every_path(
    targets: Mapping[str, CachedLM],
    prompts: Sequence[torch.Tensor],
    settings: RequestSettings,
    passes: int,
    progress: str | None = None,
) -> dict[str, list[GenerationResult]]:
    """Return each path's target-only AR runs: ``passes`` passes over the prompts, the paths
    taking turns on each prompt (their order rotating), after one untimed prompt per path."""
    names = list(targets)
    for lm in targets.values():
        autoregressive_generate(LocalTarget(lm), prompts[0], settings)
    runs: dict[str, list[GenerationResult]] = {name: [] for name in names}
    turns = [(p, prompt) for p in range(passes) for prompt in prompts]
    for index, (_, prompt) in enumerate(tqdm(turns, desc=progress, disable=progress is None)):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(autoregressive_generate(LocalTarget(targets[name]), prompt, settings))
    return runs


@dataclass(frozen=True)
class BaselineCheck:
    """The baseline's tokens/s over each other path's (paired interval), the fastest path by
    tokens/s, and whether no path beats the baseline beyond noise and ``BASELINE_TOLERANCE``."""

    baseline: str
    ratios: dict[str, Interval | None]
    fastest: str
    fair: bool

    def message(self) -> str:
        """Return the verdict in words, naming the paths that beat the baseline."""
        beaten = [name for name, r in self.ratios.items() if r is not None and _beaten(r)]
        if not beaten:
            return f"the AR baseline ({self.baseline}) is the fastest AR path within noise"
        figures = ", ".join(
            f"{name} (baseline at {self.ratios[name].estimate:.2f}x, 95% interval "
            f"{self.ratios[name].low:.2f}-{self.ratios[name].high:.2f})"
            for name in beaten
        )
        return (
            f"the AR baseline ({self.baseline}) is slower than {figures}: every speedup over AR "
            "is flattered; check the calibration's step plan (single_step_calibration)"
        )


def check_baseline(runs: Mapping[str, Sequence[GenerationResult]], baseline: str) -> BaselineCheck:
    """Compare ``runs[baseline]`` with every other path's runs (entry i of each: the same
    prompt); the baseline fails when a path's paired ratio lies wholly below 1 −
    ``BASELINE_TOLERANCE``."""
    ours = runs[baseline]
    ratios = {
        name: paired_speed_ratio(
            [r.n_generated for r in ours],
            [r.seconds for r in ours],
            [r.n_generated for r in other],
            [r.seconds for r in other],
        )
        for name, other in runs.items()
        if name != baseline
    }
    fastest = max(runs, key=lambda name: StaticComparison.tokens_per_second(runs[name]))
    fair = not any(r is not None and _beaten(r) for r in ratios.values())
    return BaselineCheck(baseline, ratios, fastest, fair)


def _beaten(ratio: Interval) -> bool:
    """Return whether a baseline-over-path ratio lies wholly below 1 − ``BASELINE_TOLERANCE``."""
    return ratio.high < 1 - BASELINE_TOLERANCE
