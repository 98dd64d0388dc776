"""The CLI tests' sweep files (pair ``demo`` on the micro zoo) and hand-made trial results."""

from __future__ import annotations

import textwrap
from pathlib import Path

from orchestrator.sweep.planner import Plan, Trial
from workers.records import GenerationResult, RoundRecord

#: One pair, one dataset, greedy: the AR baseline, static K=4 and SVIP at two thresholds.
SWEEP = """\
name: cli
pairs:
  - name: demo
    target: zoo:micro/target
    draft: zoo:micro/draft-s
datasets: [{name: "builtin:code", samples: 2, max_new_tokens: 8}]
temperatures: [0]
policies:
  - name: static
  - name: svip
    grid: {threshold: [0.3, 0.5]}
max_draft_lens: [4]
"""


#: The same pair and data with only static K=4: two trials, both of which the store fills.
DONE_SWEEP = """\
name: done
pairs:
  - name: demo
    target: zoo:micro/target
    draft: zoo:micro/draft-s
datasets: [{name: "builtin:code", samples: 2, max_new_tokens: 8}]
temperatures: [0]
policies:
  - name: static
max_draft_lens: [4]
"""


def hand_made_results(
    n_rounds: int, drafted: int, accepted: int, seconds: float
) -> list[GenerationResult]:
    """Two samples of ``n_rounds`` rounds each; a round emits ``accepted + 1`` tokens."""
    tokens = n_rounds * (accepted + 1)
    rounds = [RoundRecord(drafted, accepted, False, drafted, 0.0, 0.0) for _ in range(n_rounds)]
    return [
        GenerationResult(
            prompt_ids=[1, 2, sample],
            output_ids=list(range(tokens)),
            rounds=rounds,
            seconds=seconds,
        )
        for sample in range(2)
    ]


#: AR baseline: 2 samples x 8 tokens in 0.5 s each -> 16 tokens / 1.0 s = 16 tokens/s.
BASELINE_RESULTS = hand_made_results(n_rounds=8, drafted=0, accepted=0, seconds=0.5)


#: static: 2 samples x 4 rounds x (1 accepted + 1) = 16 tokens in 0.5 s -> 32 tokens/s,
#: speedup 32 / 16 = 2, acceptance 8 accepted / 16 drafted = 0.5.
STATIC_RESULTS = hand_made_results(n_rounds=4, drafted=2, accepted=1, seconds=0.25)


def write_sweep(path: Path, text: str) -> Path:
    """Write ``text`` (dedented) to ``path``; return ``path``."""
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def trial_of(plan: Plan, policy: str, threshold: float | None = None) -> Trial:
    """Return the trial of ``plan`` with this policy and threshold."""
    return next(
        t for t in plan.trials if t.setting.policy == policy and t.setting.threshold == threshold
    )
