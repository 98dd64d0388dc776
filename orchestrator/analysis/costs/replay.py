"""Replay mode's pure steps: traces as JSON, the per-group cost fit, replayed trial results.

A replay sweep (``execution.mode: replay``) runs each group's AR baseline and its live check
trial on the models, records one greedy trace per prompt (stored in the ``traces`` table under
``planner.trace_key``, so a resubmission records nothing again), fits the block-aware cost
model over the group's live rounds, and replays every replay-mode trial with
``policies.replay.replay``. A replayed trial is stored like a live one: per-sample results whose
rounds are the replayed ones with projected seconds (t_draft·forwards and t_target +
t_per_verified·drafted), and sample seconds that add the group's mean non-round time per
sample, so ``orchestrator.analysis.metrics.trial_metrics`` gives its tokens/s and speedup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.analysis.costs.model import CostModelError, RoundCostFit, fit_round_costs
from orchestrator.sweep.planner import Trial
from policies import make_policy
from policies.replay import DraftPrediction, GreedyTrace, ReplayedRound, replay
from workers.records import GenerationResult, RoundRecord
from workers.trial import sample_seed

if TYPE_CHECKING:
    from orchestrator.store.records import StoredRound, StoredTrial

#: Round fields that must agree between a replayed and a live round.
ROUND_KEY = ("drafted", "accepted", "draft_forwards")


def trace_to_json(trace: GreedyTrace) -> dict[str, Any]:
    """Return ``trace`` as JSON-ready data (off-path positions as string keys)."""
    data = asdict(trace)
    data["off_path"] = {str(p): [asdict(x) for x in d] for p, d in trace.off_path.items()}
    return data


def trace_from_json(data: dict[str, Any]) -> GreedyTrace:
    """Return the trace :func:`trace_to_json` wrote."""
    return GreedyTrace(
        prompt_ids=tuple(data["prompt_ids"]),
        max_new_tokens=data["max_new_tokens"],
        cap=data["cap"],
        eos_token_id=data["eos_token_id"],
        target_tokens=tuple(data["target_tokens"]),
        target_margins=tuple(data["target_margins"]),
        on_path=tuple(DraftPrediction(**p) for p in data["on_path"]),
        off_path={
            int(p): tuple(DraftPrediction(**x) for x in d) for p, d in data["off_path"].items()
        },
    )


@dataclass(frozen=True)
class GroupFit:
    """A group's cost fit and its mean non-round seconds per sample (prefill, bookkeeping)."""

    fit: RoundCostFit
    overhead_seconds: float
    n_trials: int


def fit_group(rounds: Sequence[StoredRound], trials: Sequence[StoredTrial]) -> GroupFit:
    """Return the cost fit over the stored ``rounds`` of the group's done live ``trials``.

    The overhead is the mean of
    seconds − draft seconds − verify seconds per sample over the speculative ones (the AR
    baselines when there is none). Raises CostModelError when the rounds cannot identify the
    costs (``fit_round_costs``) or no trial is given.
    """
    if not trials:
        raise CostModelError("no done live trial in the group")
    fit = fit_round_costs(
        [r.draft_forwards for r in rounds],
        [r.drafted for r in rounds],
        [r.draft_seconds for r in rounds],
        [r.verify_seconds for r in rounds],
    )
    speculative = [t for t in trials if not t.is_baseline] or list(trials)
    outside = sum(t.seconds - t.draft_seconds - t.verify_seconds for t in speculative)
    samples = sum(t.n_samples for t in speculative)
    return GroupFit(fit, outside / samples, len(trials))


def replay_rounds(trial: Trial, traces: Sequence[GreedyTrace]) -> list[list[ReplayedRound]]:
    """Return ``trial``'s replayed rounds per prompt, as ``workers.trial.run_trial`` runs them.

    One policy object serves the trial's prompts in order, reset per prompt with its seed, so a
    policy with ``persist_across_requests`` carries its state over as it does live.
    """
    policy = make_policy(trial.policy, trial.max_draft_len, **trial.params_dict)
    return [
        replay(policy, trace, sample_seed(trial.seed, index)) for index, trace in enumerate(traces)
    ]


def replayed_results(
    rounds: Sequence[list[ReplayedRound]], traces: Sequence[GreedyTrace], group: GroupFit
) -> list[GenerationResult]:
    """Return per-prompt results of replayed ``rounds``, timed by the group's cost fit.

    Each round's seconds are the fit's prediction; a sample's seconds add the group's mean
    non-round time per sample. The output is the target's greedy output up to the tokens
    the rounds emitted (cut after EOS, as the engine cuts it).
    """
    fit = group.fit
    results = []
    for replayed, trace in zip(rounds, traces, strict=True):
        records = [
            RoundRecord(
                drafted=r.drafted,
                accepted=r.accepted,
                bonus=r.bonus,
                draft_forwards=r.draft_forwards,
                draft_seconds=float(fit.draft_seconds(r.draft_forwards)),
                verify_seconds=float(fit.verify_seconds(r.drafted)),
                mean_entropy=r.mean_entropy,
                min_max_prob=r.min_max_prob,
            )
            for r in replayed
        ]
        emitted = sum(r.emitted for r in replayed)
        output = list(trace.reference[:emitted])
        stopped = trace.eos_token_id is not None and trace.eos_token_id in output
        seconds = sum(r.draft_seconds + r.verify_seconds for r in records)
        results.append(
            GenerationResult(
                prompt_ids=list(trace.prompt_ids),
                output_ids=output,
                rounds=records,
                seconds=seconds + group.overhead_seconds,
                stopped_on_eos=stopped,
            )
        )
    return results


@dataclass(frozen=True)
class CrossCheck:
    """A live trial replayed: the share of its live rounds replay reproduces, and tokens/s.

    ``error`` is projected / measured tokens/s − 1.
    """

    trial_id: str
    same_rounds: float
    tokens_per_s: float
    projected_tokens_per_s: float

    @property
    def error(self) -> float:
        """Return the relative error of the projected tokens/s."""
        return self.projected_tokens_per_s / self.tokens_per_s - 1


def cross_check(
    trial: Trial,
    live_rounds: Sequence[StoredRound],
    live_tokens_per_s: float,
    traces: Sequence[GreedyTrace],
    group: GroupFit,
) -> CrossCheck:
    """Return the cross-check of live ``trial`` (its stored rounds) against its replay.

    A round counts as reproduced when it equals the replayed round at the same sample and
    index in drafted, accepted and draft forwards; the share divides by the larger count.
    """
    replayed = replay_rounds(trial, traces)
    results = replayed_results(replayed, traces, group)
    live_by_sample: dict[int, list[tuple[int, ...]]] = {}
    for row in live_rounds:
        live_by_sample.setdefault(row.sample_index, []).append(
            tuple(getattr(row, k) for k in ROUND_KEY)
        )
    matched = total = 0
    for index, rounds in enumerate(replayed):
        ours = [tuple(getattr(r, k) for k in ROUND_KEY) for r in rounds]
        theirs = live_by_sample.get(index, [])
        matched += sum(a == b for a, b in zip(ours, theirs, strict=False))
        total += max(len(ours), len(theirs))
    tokens = sum(r.n_generated for r in results)
    projected = tokens / sum(r.seconds for r in results)
    same = matched / total if total else 1.0
    return CrossCheck(trial.trial_id, same, live_tokens_per_s, projected)
