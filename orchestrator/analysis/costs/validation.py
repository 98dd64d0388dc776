"""Out-of-sample error of the replay cost model: live trials projected from fits without them.

A live trial is projected from its own rounds' counts (drafted, draft forwards) and contexts and
its samples' prompt lengths, by a fit over other live trials of its group; the error is
projected / measured tokens/s − 1 = measured / projected seconds − 1 (positive: the projection
is too fast). Leave-one-trial-out repeats that for each trial of a group, the fit made from
the group's other live trials. The old model (``fit_round_costs`` plus one mean overhead per
sample) is scored the same way beside it (pure functions over stored rows).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.analysis.costs.model import CostModelError
from orchestrator.analysis.costs.run_fit import (
    TrialCounts,
    drafts_by_lookup,
    fit_round_group,
    round_fit_seconds,
)
from orchestrator.analysis.costs.step_costs import (
    RoundObservation,
    SampleObservation,
    StepCostFit,
    StepDemands,
    fit_step_costs,
)
from orchestrator.sweep.trial import record_fit_group_key
from policies import POLICIES, make_policy

if TYPE_CHECKING:
    from orchestrator.store.records import StoredRound, StoredSample, StoredTrial


def policy_demands(policy: str, max_draft_len: int, params: dict[str, Any]) -> StepDemands:
    """Return what ``policy`` asks of each draft step (nothing for the AR baseline).

    A policy its stored parameters no longer build (parameters of older code) is charged a
    decision per step and no features.
    """
    if policy not in POLICIES or max_draft_len < 1:
        return StepDemands()
    try:
        made = make_policy(policy, max_draft_len, **params)
    except (TypeError, ValueError):
        return StepDemands(asks=True)
    return StepDemands(
        features=bool({"entropy", "max_prob"} & set(made.features)),
        asks=not made.keeps_every_candidate,
    )


def policy_class(policy: str, max_draft_len: int) -> str:
    """Return the class a trial's error is summarised under (static short/long, rule kind)."""
    if policy == "static":
        return "static short" if max_draft_len <= 4 else "static long"
    classes = {
        "adaedl": "entropy rule",
        "svip": "entropy rule",
        "max_confidence": "confidence rule",
        "beta_ts": "thompson sampling",
        "cali_ts": "thompson sampling",
        "hf_heuristic": "heuristic",
    }
    return classes.get(policy, policy)


def round_contexts(prompt_len: int, rounds: Sequence[Any]) -> list[int]:
    """Return each round's context: the prompt plus the tokens emitted before it (in order).

    A round emits its accepted tokens and one more (the bonus or the target's correction).
    """
    contexts, generated = [], 0
    for round_ in rounds:
        contexts.append(prompt_len + generated)
        generated += round_.accepted + 1
    return contexts


@dataclass(frozen=True)
class LiveTrial:
    """A done live trial as the cost model reads it, with its measured counts and seconds."""

    trial_id: str
    policy: str
    max_draft_len: int
    rounds: tuple[RoundObservation, ...]
    samples: tuple[SampleObservation, ...]
    counts: TrialCounts
    stored: StoredTrial
    stored_rounds: tuple[StoredRound, ...]
    round_samples: tuple[int, ...] = ()
    sample_indices: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        """Return a short printable name."""
        return f"{self.policy} L={self.max_draft_len}"


def live_trial(
    trial: StoredTrial, rounds: Sequence[StoredRound], samples: Sequence[StoredSample]
) -> LiveTrial:
    """Return ``trial``'s observations from its stored rounds and samples."""
    demands = policy_demands(trial.policy, trial.max_draft_len, trial.params)
    by_sample: dict[int, list[StoredRound]] = {}
    for row in sorted(rounds, key=lambda r: (r.sample_index, r.round_index)):
        by_sample.setdefault(row.sample_index, []).append(row)
    observed, outside, round_samples = [], [], []
    ordered = sorted(samples, key=lambda s: s.sample_index)
    for sample in ordered:
        own = by_sample.get(sample.sample_index, [])
        round_samples += [sample.sample_index] * len(own)
        for row, context in zip(own, round_contexts(sample.prompt_len, own), strict=True):
            observed.append(
                RoundObservation(
                    row.drafted,
                    row.draft_forwards,
                    context,
                    demands,
                    row.draft_seconds,
                    row.verify_seconds,
                    target_only=trial.is_baseline,
                )
            )
        round_seconds = sum(r.draft_seconds + r.verify_seconds for r in own)
        outside.append(SampleObservation(sample.prompt_len, sample.seconds - round_seconds))
    return LiveTrial(
        trial_id=trial.trial_id,
        policy=trial.policy,
        max_draft_len=trial.max_draft_len,
        rounds=tuple(observed),
        samples=tuple(outside),
        counts=TrialCounts.from_row(trial),
        stored=trial,
        stored_rounds=tuple(rounds),
        round_samples=tuple(round_samples),
        sample_indices=tuple(s.sample_index for s in ordered),
    )


def fit_trials(trials: Sequence[LiveTrial]) -> StepCostFit:
    """Return the per-step cost fit over the rounds of ``trials`` and the samples of the
    speculative ones (the AR baselines' when there is none: an AR sample prefills no draft);
    a lookup draft's rounds also give the cost of a lookup round."""
    lookups = [t for t in trials if drafts_by_lookup(t.stored)]
    speculative = [t for t in trials if t.counts.draft_forwards > 0] + lookups or list(trials)
    return fit_step_costs(
        [r for t in trials for r in t.rounds],
        [s for t in speculative for s in t.samples],
        [r for t in lookups for r in t.rounds],
    )


def projected_seconds(fit: StepCostFit, trial: LiveTrial) -> float:
    """Return ``trial``'s seconds as ``fit`` projects them from its rounds and samples."""
    rounds = sum(_round_seconds(fit, r) for r in trial.rounds)
    return rounds + sum(fit.sample_overhead(s.prompt_len) for s in trial.samples)


def _round_seconds(fit: StepCostFit, r: RoundObservation) -> float:
    """Return one round's draft and verify seconds as ``fit`` projects them."""
    return fit.draft_seconds(r.draft_forwards, r.context, r.demands) + fit.verify_seconds(
        r.drafted, r.context, r.target_only
    )


def old_projected_seconds(trials: Sequence[LiveTrial], held_out: LiveTrial) -> float:
    """Return ``held_out``'s seconds by the old model fit over ``trials`` (its pre-#43 fit)."""
    fit, overhead = fit_round_group(
        [r for t in trials for r in t.stored_rounds], [t.stored for t in trials]
    )
    return round_fit_seconds(fit, overhead, held_out.counts)


@dataclass(frozen=True)
class HeldOut:
    """One live trial projected by fits that left it out: new and old model errors.

    An error is measured / projected seconds − 1 (projected tokens/s over measured, − 1);
    None when the other trials cannot identify that model. ``beyond_table`` is the share of
    the trial's rounds whose block is larger than any the other trials measured (costed at
    the largest measured size).
    """

    trial_id: str
    label: str
    policy_class: str
    measured_seconds: float
    projected_seconds: float | None
    error: float | None
    old_error: float | None
    beyond_table: float = 0.0
    note: str = ""


def _try(project: Callable[[], float]) -> float | None:
    """Return ``project()``, or None when its fit cannot be made (CostModelError)."""
    try:
        return project()
    except CostModelError:
        return None


def fit_group_of(trial: LiveTrial) -> str:
    """Return the cost-fit group (its ``cost_fits`` key) a live trial ran in."""
    return record_fit_group_key(trial.stored.config)


def group_level(fit: StepCostFit, trials: Sequence[LiveTrial]) -> float:
    """Return measured over projected seconds of ``trials`` (one group's live trials; 1.0 for
    none): the level of a group whose trials ran minutes apart from the pool's others.

    A pool fits one cost shape over a pair's datasets, whose groups run one after another; a
    machine that drifts between them moves a whole group's costs together (the reproduction:
    every policy off with one sign per dataset). The group's own live trials, interleaved with
    each other, set its level; the fit keeps the shape.
    """
    projected = sum(projected_seconds(fit, t) for t in trials)
    return sum(t.counts.seconds for t in trials) / projected if projected > 0 else 1.0


def _level_projection(others: Sequence[LiveTrial], trial: LiveTrial) -> float:
    """Return ``trial``'s seconds projected by the fit over ``others``, at the level that
    ``others`` of its own group measure."""
    fit = fit_trials(others)
    group = fit_group_of(trial)
    own = [t for t in others if fit_group_of(t) == group]
    return projected_seconds(fit, trial) * group_level(fit, own)


def held_out(trials: Sequence[LiveTrial], trial: LiveTrial) -> HeldOut:
    """Return ``trial`` projected by the fits over ``trials`` other than itself (the new
    model at its group's level measured by the group's other live trials)."""
    others = [t for t in trials if t.trial_id != trial.trial_id]
    measured = trial.counts.seconds
    projected = _try(lambda: _level_projection(others, trial))
    old = _try(lambda: old_projected_seconds(others, trial))
    return HeldOut(
        trial_id=trial.trial_id,
        label=trial.label,
        policy_class=policy_class(trial.policy, trial.max_draft_len),
        measured_seconds=measured,
        projected_seconds=projected,
        error=None if projected is None else measured / projected - 1,
        old_error=None if old is None else measured / old - 1,
        beyond_table=0.0 if projected is None else beyond_table(others, trial),
        note="" if projected is not None else "the other live trials cannot identify the model",
    )


def leave_one_out(trials: Sequence[LiveTrial]) -> list[HeldOut]:
    """Return each trial of one group projected by the fit over the group's other trials."""
    return [held_out(trials, trial) for trial in trials]


def beyond_table(fitted: Sequence[LiveTrial], trial: LiveTrial) -> float:
    """Return the share of ``trial``'s rounds larger than every block size ``fitted`` measured."""
    largest = max(size for size, _ in fit_trials(fitted).verify_table)
    return sum(r.drafted > largest for r in trial.rounds) / max(len(trial.rounds), 1)


@dataclass(frozen=True)
class ErrorSummary:
    """Mean absolute error and bias (mean signed error) of some held-out projections."""

    n: int
    mean_abs_error: float | None
    bias: float | None


def summarise(errors: Sequence[float | None]) -> ErrorSummary:
    """Return the summary of the errors that are not None."""
    known = [e for e in errors if e is not None]
    if not known:
        return ErrorSummary(0, None, None)
    return ErrorSummary(
        len(known), statistics.fmean(abs(e) for e in known), statistics.fmean(known)
    )


def out_of_sample_error(trials: Sequence[LiveTrial]) -> float | None:
    """Return the leave-one-trial-out mean absolute error over a group's speculative trials.

    This is the error a replayed trial's interval is widened by (None when no trial can be
    held out).
    """
    speculative = [t for t in trials if t.counts.draft_forwards > 0]
    if len(speculative) < 2:
        return None
    held = [h for h in leave_one_out(trials) if h.trial_id in {t.trial_id for t in speculative}]
    return summarise([h.error for h in held]).mean_abs_error


def prompt_spread(fit: StepCostFit, trials: Sequence[LiveTrial]) -> float | None:
    """Return the spread of ``trials``' per-prompt times about ``fit`` (one group's live trials,
    the same prompts): the standard deviation of log(measured / projected seconds) per trial and
    prompt after each trial's and each prompt's mean is removed (a two-way residual, degrees of
    freedom (trials − 1)(prompts − 1)). It holds the timing noise of one arm on one prompt and
    the model's misses that vary by prompt; a trial over P prompts carries about spread / √P of
    it in its total. None below two trials or two prompts in common.
    """
    logs = [_prompt_log_ratios(fit, trial) for trial in trials]
    common = sorted(set.intersection(*(set(row) for row in logs))) if logs else []
    if len(logs) < 2 or len(common) < 2:
        return None
    table = np.array([[row[prompt] for prompt in common] for row in logs])
    residual = (
        table - table.mean(axis=0, keepdims=True) - table.mean(axis=1, keepdims=True) + table.mean()
    )
    freedom = (table.shape[0] - 1) * (table.shape[1] - 1)
    return float(np.sqrt((residual**2).sum() / freedom))


def _prompt_log_ratios(fit: StepCostFit, trial: LiveTrial) -> dict[int, float]:
    """Return log(measured / projected seconds) of each of ``trial``'s samples (by index)."""
    measured: dict[int, float] = dict.fromkeys(trial.sample_indices, 0.0)
    projected = dict(measured)
    for index, r in zip(trial.round_samples, trial.rounds, strict=True):
        measured[index] += r.draft_seconds + r.verify_seconds
        projected[index] += _round_seconds(fit, r)
    for index, sample in zip(trial.sample_indices, trial.samples, strict=True):
        measured[index] += sample.outside_seconds
        projected[index] += fit.sample_overhead(sample.prompt_len)
    return {
        index: float(np.log(measured[index] / projected[index]))
        for index in measured
        if measured[index] > 0 and projected[index] > 0
    }
