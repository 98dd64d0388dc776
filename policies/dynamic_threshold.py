"""The AdaEDL dynamic threshold λ and the base of policies that stop when a score falls below λ.

Used by ``max_confidence`` (score = max_x q_i(x)) and ``adaedl`` (score = 1 − sqrt(γ·H(q_i))).
The rule (docs/methods.md, "Draft-length policies", item 3), after a round with n_drafted
proposed and n_acc accepted tokens and max draft length L:

    AR_i = n_acc / n_drafted;   AR ← β1·AR + (1 − β1)·AR_i
    λ' = λ + ε if AR < α;  λ − ε elif n_acc ≠ L;  λ otherwise
    λ ← β2·λ + (1 − β2)·λ'

Choices this module makes where docs/methods.md is silent:
- AR starts at 0 for each request, as in the Draft & Verify code the rule comes from.
- A round that drafted nothing (the policy stopped before the first candidate) carries no
  acceptance evidence: AR is left as it is and λ' = λ − ε, because stopping before the first
  candidate means λ is above even the most confident next token; without this a λ that rose too
  high could never come down again.
- The controller restarts from the initial λ at every request, so a request's decisions depend
  on that request and its seed only.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field

from policies.base import Decision, DraftPolicy, DraftStep, RequestContext, RoundOutcome


@dataclass(frozen=True)
class DynamicThresholdConfig:
    """The controller's constants (AdaEDL defaults)."""

    acceptance_smoothing: float = 0.5
    threshold_smoothing: float = 0.9
    threshold_step: float = 0.01
    target_acceptance: float = 0.9


@dataclass(frozen=True)
class DynamicThresholdState:
    """The controller's state: the current threshold λ and the smoothed acceptance rate AR."""

    threshold: float
    acceptance_rate: float = 0.0


def update_dynamic_threshold(
    state: DynamicThresholdState,
    outcome: RoundOutcome,
    config: DynamicThresholdConfig,
    max_draft_len: int,
) -> DynamicThresholdState:
    """Return the controller state after one verified round (the rule in the module docstring);
    ``max_draft_len`` is the policy's cap L.

    Pure so that the λ trajectory can be tested against hand arithmetic and shared by every
    threshold policy.
    """
    if outcome.n_drafted > 0:
        round_acceptance = outcome.n_accepted / outcome.n_drafted
        acceptance_rate = (
            config.acceptance_smoothing * state.acceptance_rate
            + (1.0 - config.acceptance_smoothing) * round_acceptance
        )
        if acceptance_rate < config.target_acceptance:
            proposed = state.threshold + config.threshold_step
        elif outcome.n_accepted != max_draft_len:
            proposed = state.threshold - config.threshold_step
        else:
            proposed = state.threshold
    else:
        acceptance_rate = state.acceptance_rate
        proposed = state.threshold - config.threshold_step
    threshold = (
        config.threshold_smoothing * state.threshold + (1.0 - config.threshold_smoothing) * proposed
    )
    return DynamicThresholdState(threshold=threshold, acceptance_rate=acceptance_rate)


@dataclass
class ThresholdPolicy(DraftPolicy):
    """A policy that stops before a candidate whose ``acceptance_score`` is below λ.

    ``threshold`` is λ (the initial λ when ``dynamic``); the other fields are the dynamic
    controller's constants β1 (``acceptance_smoothing``), β2 (``threshold_smoothing``),
    ε (``threshold_step``) and α (``target_acceptance``), used only when ``dynamic`` is True.
    """

    threshold: float = 0.5
    dynamic: bool = False
    acceptance_smoothing: float = 0.5
    threshold_smoothing: float = 0.9
    threshold_step: float = 0.01
    target_acceptance: float = 0.9
    _controller: DynamicThresholdState = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._controller = DynamicThresholdState(threshold=self.threshold)

    @property
    def current_threshold(self) -> float:
        """Return the λ the next decision compares against."""
        return self._controller.threshold

    def controller_config(self) -> DynamicThresholdConfig:
        """Return the controller constants held in this policy's fields."""
        return DynamicThresholdConfig(
            acceptance_smoothing=self.acceptance_smoothing,
            threshold_smoothing=self.threshold_smoothing,
            threshold_step=self.threshold_step,
            target_acceptance=self.target_acceptance,
        )

    @abstractmethod
    def acceptance_score(self, step: DraftStep) -> float:
        """Return the score compared against λ (higher means more likely to be accepted)."""

    def decide(self, step: DraftStep) -> Decision:
        """Return STOP_BEFORE when the candidate's score is below the current λ, else keep it.

        AdaEDL and max-confidence decide before drafting token i, from q_i: a stop drafts
        nothing more, and the candidate sampled from q_i is not proposed.
        """
        if self.acceptance_score(step) < self._controller.threshold:
            return Decision.STOP_BEFORE
        return Decision.KEEP_CONTINUE

    def _reset_state(self, context: RequestContext) -> None:
        self._controller = DynamicThresholdState(threshold=self.threshold)

    def update(self, outcome: RoundOutcome) -> None:
        """Move λ by the dynamic rule when ``dynamic``; a fixed threshold ignores outcomes."""
        if self.dynamic:
            self._controller = update_dynamic_threshold(
                self._controller, outcome, self.controller_config(), self.max_draft_len
            )
