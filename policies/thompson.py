"""EESD's Thompson-sampling draft controllers: Beta-TS and calibrated Gaussian Cali-TS.

EESD's Algorithm 1, per round: (line 6) the draft produces x_i; (7) x_i is added to the round's
drafted set Q_d; (8) θ is sampled from the posterior; (9) χ ~ Bernoulli(θ); (11) break if
χ = 0. So x_i stays in the round when the round stops, and every round drafts at least one
token: in the engine's protocol (``policies.base``) each candidate is kept, and χ = 0 means
KEEP_STOP, χ = 1 KEEP_CONTINUE. After verification the posterior is updated (Beta-TS:
``beta_posterior_update``; Cali-TS: the running mean θ̂ and count n of ``calibrated_posterior``).
The two differ only in the posterior. Randomness comes only from the policy's ``rng``, reseeded
per request with the request's seed, so decisions are reproducible for a seed.

By default the posterior restarts at the prior for each request
(``persist_across_requests=False``), so a sample's result does not depend on the samples before
it. EESD keeps the posterior across a run: with the field True, a trial keeps one policy for all
its prompts, in order (``workers.trial.run_trial``), and the posterior carries over.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from policies.base import Decision, DraftPolicy, DraftStep, RequestContext, RoundOutcome
from policies.runtime_inputs import RUNTIME_INPUT


def keep_and_sample_stop(theta: float, uniform: float) -> Decision:
    """Return Algorithm 1's lines 9–11 for a kept candidate: χ ~ Bernoulli(θ), stop if χ = 0."""
    return Decision.KEEP_CONTINUE if uniform < theta else Decision.KEEP_STOP


def beta_posterior_update(alpha: float, beta: float, outcome: RoundOutcome) -> tuple[float, float]:
    """Return Beta-TS's (α, β) after a verified round.

    docs/methods.md gives EESD's counts as r = |Q_v| − 1 successes out of n = min(|Q_v| + 1, |Q_d|)
    trials. The reading implemented here treats each drafted token as a Bernoulli trial that
    the target observes up to the first rejection: r = n_accepted successes and
    n = min(n_accepted + 1, n_drafted) trials, i.e. every accepted token is a success, the
    first rejected token (if any) is the one failure, and tokens after it are unobserved. So a
    fully accepted round adds n_drafted to α and nothing to β, and any other round adds
    n_accepted to α and 1 to β; a round that drafted nothing changes nothing. r is clamped to
    [0, n] so malformed outcomes cannot make a parameter decrease. In the paper's symbols, with
    Q_v the tokens the round verified into the output (accepted ones plus the target's own,
    |Q_v| = n_accepted + 1), r = |Q_v| − 1 is the printed count, and n = min(|Q_v|, |Q_d|) is one
    less than the printed n whenever a token after the first rejected one was drafted: the
    printed n would count a second failure for a token the target never judged.
    """
    trials = min(outcome.n_accepted + 1, outcome.n_drafted)
    successes = min(max(outcome.n_accepted, 0), max(trials, 0))
    failures = max(trials, 0) - successes
    return alpha + successes, beta + failures


def calibrated_posterior(
    theta_model: float,
    theta_observed: float,
    n_verifications: int,
    sigma_model: float,
    sigma_sample: float,
) -> tuple[float, float]:
    """Return Cali-TS's posterior (μ, σ) for the continuation probability θ.

    Gaussian prior N(θ_M, σ_M²) from the predictor combined with n observations of mean θ̂ and
    noise σ_S² (docs/methods.md, item 8):
    μ = σ_S²/(nσ_M² + σ_S²)·θ_M + nσ_M²/(nσ_M² + σ_S²)·θ̂,  1/σ² = 1/σ_M² + n/σ_S².
    """
    prior_var = sigma_model**2
    sample_var = sigma_sample**2
    denominator = n_verifications * prior_var + sample_var
    mean = (sample_var * theta_model + n_verifications * prior_var * theta_observed) / denominator
    variance = 1.0 / (1.0 / prior_var + n_verifications / sample_var)
    return mean, math.sqrt(variance)


@dataclass
class BetaTSPolicy(DraftPolicy):
    """EESD Beta-TS: keep each candidate, then θ ~ Beta(α, β), χ ~ Bernoulli(θ); stop if χ = 0.

    Prior Beta(``prior_alpha``, ``prior_beta``) = Beta(1, 1), the uniform prior; the update is
    ``beta_posterior_update``.
    """

    name: ClassVar[str] = "beta_ts"

    prior_alpha: float = 1.0
    prior_beta: float = 1.0
    persist_across_requests: bool = False
    _alpha: float = field(init=False, repr=False)
    _beta: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.prior_alpha <= 0 or self.prior_beta <= 0:
            raise ValueError(
                f"beta_ts prior must be positive, got ({self.prior_alpha}, {self.prior_beta})"
            )
        self._alpha, self._beta = self.prior_alpha, self.prior_beta

    @property
    def posterior(self) -> tuple[float, float]:
        """Return the current Beta posterior parameters (α, β)."""
        return self._alpha, self._beta

    def decide(self, step: DraftStep) -> Decision:
        """Keep the candidate; stop after it when χ = 0 for θ ~ Beta(α, β) from ``self.rng``."""
        theta = self.rng.beta(self._alpha, self._beta)
        return keep_and_sample_stop(theta, self.rng.random())

    def _reset_state(self, context: RequestContext) -> None:
        if not self.persist_across_requests:
            self._alpha, self._beta = self.prior_alpha, self.prior_beta

    def update(self, outcome: RoundOutcome) -> None:
        """Add the round's successes and failures to the posterior."""
        self._alpha, self._beta = beta_posterior_update(self._alpha, self._beta, outcome)


@dataclass
class CaliTSPolicy(DraftPolicy):
    """EESD Cali-TS: keep each candidate, then θ ~ N(μ, σ²), χ ~ Bernoulli(clip(θ)); stop if χ = 0.

    μ and σ come from ``calibrated_posterior``.

    θ_M comes from ``predictor(step)`` (a trained predictor given the draft's and the target's
    hidden states) or, until one exists, the constant ``theta_model``. θ̂ is the running mean
    over verified rounds of the round's acceptance ratio n_accepted / n_drafted, and n is the
    number of such rounds (rounds that drafted nothing are not counted); before the first
    verification θ̂ = ``initial_observed_acceptance`` (θ̂_0), which then has weight n = 0 in μ
    and so only matters if the posterior is read before any verification. ``sigma_model`` (σ_M)
    and ``sigma_sample`` (σ_S) have no published defaults; 0.2 and 0.5 say the predictor is
    trusted to about ±0.2 and a single round's ratio to about ±0.5 (the largest standard
    deviation a ratio in [0, 1] can have).
    """

    name: ClassVar[str] = "cali_ts"

    theta_model: float = 0.7
    sigma_model: float = 0.2
    sigma_sample: float = 0.5
    initial_observed_acceptance: float = 0.7
    persist_across_requests: bool = False
    predictor: Callable[[DraftStep], float] | None = field(
        default=None, repr=False, compare=False, metadata=RUNTIME_INPUT
    )
    _observed_sum: float = field(init=False, repr=False, default=0.0)
    _n_verifications: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        if self.sigma_model <= 0 or self.sigma_sample <= 0:
            raise ValueError(
                f"cali_ts sigmas must be positive, got ({self.sigma_model}, {self.sigma_sample})"
            )

    @property
    def features(self) -> frozenset[str]:  # type: ignore[override]
        """Return the hidden states a trained predictor reads, or nothing for a constant θ_M."""
        if self.predictor is None:
            return frozenset()
        return frozenset({"hidden", "target_hidden"})

    @property
    def n_verifications(self) -> int:
        """Return n, the number of verified rounds folded into θ̂."""
        return self._n_verifications

    @property
    def observed_acceptance(self) -> float:
        """Return θ̂, the mean acceptance ratio of the verified rounds (θ̂_0 before any)."""
        if self._n_verifications == 0:
            return self.initial_observed_acceptance
        return self._observed_sum / self._n_verifications

    def posterior(self, step: DraftStep) -> tuple[float, float]:
        """Return (μ, σ) of θ for this candidate."""
        theta_model = self.theta_model if self.predictor is None else float(self.predictor(step))
        return calibrated_posterior(
            theta_model,
            self.observed_acceptance,
            self._n_verifications,
            self.sigma_model,
            self.sigma_sample,
        )

    def decide(self, step: DraftStep) -> Decision:
        """Keep the candidate; stop after it when χ = 0 for θ ~ N(μ, σ²) clipped to [0, 1]."""
        mean, std = self.posterior(step)
        theta = min(max(self.rng.normal(mean, std), 0.0), 1.0)
        return keep_and_sample_stop(theta, self.rng.random())

    def _reset_state(self, context: RequestContext) -> None:
        if not self.persist_across_requests:
            self._observed_sum, self._n_verifications = 0.0, 0

    def update(self, outcome: RoundOutcome) -> None:
        """Fold the round's acceptance ratio into θ̂ and count the verification."""
        if outcome.n_drafted > 0:
            self._observed_sum += outcome.n_accepted / outcome.n_drafted
            self._n_verifications += 1
