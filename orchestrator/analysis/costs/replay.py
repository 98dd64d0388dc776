"""Replay mode's pure steps: traces as JSON, the per-group cost fit, replayed trial results.

A replay sweep (``execution.mode: replay``) runs each group's AR baseline and its live check
trials on the models, records one greedy trace per prompt (stored in the ``traces`` table under
``planner.trace_key``, so a resubmission records nothing again), fits the per-step cost model
(``costs.step_costs``) over the live rounds and samples of the group's pool (the pair at its
sampling setting, every dataset: ``planner.ReplayGroup.pool``), projects each live check from
the fit over the pool's other live trials (its out-of-sample error), and replays every replay-mode
trial with ``policies.replay.replay``. A replayed trial is stored like a live one: per-sample
results whose rounds are the replayed ones with projected seconds (the per-step model at each
round's context, for the policy's step demands), and sample seconds that add the model's
overhead for the prompt's length, so ``orchestrator.analysis.metrics.trial_metrics`` gives its
tokens/s and speedup; its intervals are widened by its fit's out-of-sample error
(``metrics.trial_metrics``'s ``cost_model_error``, stored with the trial so that a refresh keeps
it, and the speedups' by the store).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.analysis.costs.model import RoundCostFit
from orchestrator.analysis.costs.run_fit import fit_round_group
from orchestrator.analysis.costs.step_costs import StepCostFit, StepDemands
from orchestrator.analysis.costs.validation import (
    HeldOut,
    LiveTrial,
    fit_group_of,
    fit_trials,
    group_level,
    held_out,
    policy_demands,
    round_contexts,
    summarise,
)
from orchestrator.sweep.planner import Trial, fit_group_key
from policies import make_policy
from policies.replay import DraftPrediction, GreedyTrace, ReplayedRound, replay
from workers.records import GenerationResult, RoundRecord
from workers.trial import sample_seed

if TYPE_CHECKING:
    from orchestrator.store.records import StoredRound

#: Round fields that must agree between a replayed and a live round.
ROUND_KEY = ("drafted", "accepted", "draft_forwards")


def trace_to_json(trace: GreedyTrace) -> dict[str, Any]:
    """Return ``trace`` as JSON-ready data (off-path positions, lookup and EAGLE chain round
    starts as string keys)."""
    data = asdict(trace)
    data["off_path"] = _by_position(trace.off_path)
    data["lookups"] = None if trace.lookups is None else _by_position(trace.lookups)
    data["chains"] = None if trace.chains is None else _by_position(trace.chains)
    return data


def _by_position(
    predictions: dict[int, tuple[DraftPrediction, ...]],
) -> dict[str, list[dict[str, Any]]]:
    """Return predictions by position as JSON-ready data (string keys)."""
    return {str(p): [asdict(x) for x in d] for p, d in predictions.items()}


def _from_positions(data: dict[str, Any]) -> dict[int, tuple[DraftPrediction, ...]]:
    """Return the predictions :func:`_by_position` wrote."""
    return {int(p): tuple(DraftPrediction(**x) for x in d) for p, d in data.items()}


def trace_from_json(data: dict[str, Any]) -> GreedyTrace:
    """Return the trace :func:`trace_to_json` wrote (traces stored before lookup or EAGLE
    traces existed are a draft model's)."""
    return GreedyTrace(
        prompt_ids=tuple(data["prompt_ids"]),
        max_new_tokens=data["max_new_tokens"],
        cap=data["cap"],
        eos_token_id=data["eos_token_id"],
        target_tokens=tuple(data["target_tokens"]),
        target_margins=tuple(data["target_margins"]),
        on_path=tuple(DraftPrediction(**p) for p in data["on_path"]),
        off_path=_from_positions(data["off_path"]),
        lookups=None if data.get("lookups") is None else _from_positions(data["lookups"]),
        step_cost=data.get("step_cost", 1),
        chains=None if data.get("chains") is None else _from_positions(data["chains"]),
    )


@dataclass(frozen=True)
class GroupFit:
    """A group's cost fits: the per-step model replay projects with, and its measured error.

    ``fit`` and ``overhead_seconds`` are the block-aware round fit and the mean non-round
    seconds per sample (stored in ``cost_fits`` beside the run-level fit); ``steps`` is the
    :class:`StepCostFit` every replayed round and sample is timed by. ``checks`` are the live
    check trials each projected by the fit over the group's other live trials, and
    ``out_of_sample_error`` their mean absolute error (None when no check could be held out).
    """

    fit: RoundCostFit
    overhead_seconds: float
    n_trials: int
    steps: StepCostFit
    checks: tuple[HeldOut, ...] = ()
    out_of_sample_error: float | None = None
    levels: tuple[tuple[str, float], ...] = ()

    def level(self, fit_group: str) -> float:
        """Return the level of a cost-fit group of the pool (``validation.group_level``: its
        live trials' measured over projected seconds; 1.0 for a group without any)."""
        return dict(self.levels).get(fit_group, 1.0)


def fit_group(trials: Sequence[LiveTrial], check_ids: Collection[str] = ()) -> GroupFit:
    """Return the cost fits over the group's done live ``trials``, checks held out in turn.

    Raises CostModelError when the rounds cannot identify the costs or no trial is given.
    """
    fit, overhead = fit_round_group(
        [r for t in trials for r in t.stored_rounds], [t.stored for t in trials]
    )
    checks = tuple(held_out(trials, t) for t in trials if t.trial_id in check_ids)
    steps = fit_trials(trials)
    by_group: dict[str, list[LiveTrial]] = {}
    for trial in trials:
        by_group.setdefault(fit_group_of(trial), []).append(trial)
    return GroupFit(
        fit=fit,
        overhead_seconds=overhead,
        n_trials=len(trials),
        steps=steps,
        checks=checks,
        out_of_sample_error=summarise([c.error for c in checks]).mean_abs_error,
        levels=tuple((key, group_level(steps, own)) for key, own in sorted(by_group.items())),
    )


def replay_rounds(trial: Trial, traces: Sequence[GreedyTrace]) -> list[list[ReplayedRound]]:
    """Return ``trial``'s replayed rounds per prompt, as ``workers.trial.run_trial`` runs them.

    One policy object serves the trial's prompts in order, reset per prompt with its seed, so a
    policy with ``persist_across_requests`` carries its state over as it does live.
    """
    setting = trial.setting
    policy = make_policy(setting.policy, setting.max_draft_len, **setting.params_dict)
    return [
        replay(policy, trace, sample_seed(trial.seed, index)) for index, trace in enumerate(traces)
    ]


def trial_demands(trial: Trial) -> StepDemands:
    """Return what ``trial``'s policy asks of each draft step."""
    setting = trial.setting
    return policy_demands(setting.policy, setting.max_draft_len, setting.params_dict)


def replayed_results(
    rounds: Sequence[list[ReplayedRound]],
    traces: Sequence[GreedyTrace],
    group: GroupFit,
    demands: StepDemands,
    level: float = 1.0,
) -> list[GenerationResult]:
    """Return per-prompt results of replayed ``rounds``, timed by the group's per-step model.

    Each round's seconds are the model's prediction at the round's context for a policy with
    these step ``demands``: the sample's decode seconds. Its prefill seconds are the model's
    per-sample overhead for its prompt length (prefill and bookkeeping, outside the rounds); its
    seconds their sum. Every time is multiplied by ``level``, the trial's group's
    (:meth:`GroupFit.level`). The output is the target's greedy output up to the tokens the
    rounds emitted (cut after EOS, as the engine cuts it).
    """
    steps = group.steps
    results = []
    for replayed, trace in zip(rounds, traces, strict=True):
        contexts = round_contexts(len(trace.prompt_ids), replayed)
        records = timed_rounds(
            replayed,
            [
                (
                    level * steps.draft_seconds(r.draft_forwards, context, demands),
                    level * steps.verify_seconds(r.drafted, context),
                )
                for r, context in zip(replayed, contexts, strict=True)
            ],
        )
        seconds = sum(r.draft_seconds + r.verify_seconds for r in records)
        overhead = level * steps.sample_overhead(len(trace.prompt_ids))
        results.append(
            replayed_result(
                trace,
                replayed,
                records,
                seconds=overhead + seconds,
                prefill_seconds=overhead,
                decode_seconds=seconds,
            )
        )
    return results


def trial_results(
    trial: Trial,
    rounds: Sequence[list[ReplayedRound]],
    traces: Sequence[GreedyTrace],
    group: GroupFit,
) -> list[GenerationResult]:
    """Return ``trial``'s replayed ``rounds`` timed as :func:`replayed_results` times them: at
    its policy's step demands and its group's level."""
    level = group.level(fit_group_key(trial))
    return replayed_results(rounds, traces, group, trial_demands(trial), level)


def timed_rounds(
    replayed: Sequence[ReplayedRound], seconds: Sequence[tuple[float, float]]
) -> list[RoundRecord]:
    """Return ``replayed`` rounds as stored rounds, each with its (draft, verify) ``seconds``."""
    return [
        RoundRecord(
            drafted=r.drafted,
            accepted=r.accepted,
            bonus=r.bonus,
            draft_forwards=r.draft_forwards,
            draft_seconds=draft,
            verify_seconds=verify,
            mean_entropy=r.mean_entropy,
            min_max_prob=r.min_max_prob,
        )
        for r, (draft, verify) in zip(replayed, seconds, strict=True)
    ]


def replayed_result(
    trace: GreedyTrace,
    replayed: Sequence[ReplayedRound],
    records: list[RoundRecord],
    *,
    seconds: float,
    prefill_seconds: float,
    decode_seconds: float,
) -> GenerationResult:
    """Return one prompt's result of its ``replayed`` rounds (stored as ``records``) with these
    times: the target's greedy output up to the tokens the rounds emitted (cut after EOS, as
    the engine cuts it)."""
    output = list(trace.reference[: sum(r.emitted for r in replayed)])
    return GenerationResult(
        prompt_ids=list(trace.prompt_ids),
        output_ids=output,
        rounds=records,
        seconds=seconds,
        stopped_on_eos=trace.eos_token_id is not None and trace.eos_token_id in output,
        prefill_seconds=prefill_seconds,
        decode_seconds=decode_seconds,
    )


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
    results = trial_results(trial, replayed, traces, group)
    tokens = sum(r.n_generated for r in results)
    projected = tokens / sum(r.seconds for r in results)
    same = same_round_share(replayed, live_rounds)
    return CrossCheck(trial.trial_id, same, live_tokens_per_s, projected)


def same_round_share(
    replayed: Sequence[Sequence[ReplayedRound]], live_rounds: Sequence[StoredRound]
) -> float:
    """Return the share of rounds where replay equals the live round at the same sample and
    index in drafted, accepted and draft forwards (over the larger count; 1.0 for none)."""
    live_by_sample: dict[int, list[tuple[int, ...]]] = {}
    for row in sorted(live_rounds, key=lambda r: (r.sample_index, r.round_index)):
        live_by_sample.setdefault(row.sample_index, []).append(
            tuple(getattr(row, k) for k in ROUND_KEY)
        )
    matched = total = 0
    for index, rounds in enumerate(replayed):
        ours = [tuple(getattr(r, k) for k in ROUND_KEY) for r in rounds]
        theirs = live_by_sample.get(index, [])
        matched += sum(a == b for a, b in zip(ours, theirs, strict=False))
        total += max(len(ours), len(theirs))
    return matched / total if total else 1.0
