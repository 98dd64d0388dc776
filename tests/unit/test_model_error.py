"""The cost model's error in a paired ratio with a replayed side (``metrics.paired_model_error``,
``stats.band_p_value``, ``pairing.compare_family``; issue #43 point 5).

A replayed side against a live side is widened by its fit's out-of-sample error e; two replayed
sides of one fit by the error of a ratio of two projections, measured on the fit's live checks
of the same prompts; two fits by both. The ratio stays, the interval and the p-value widen
together, and a verdict only the ignored error made comes out "not distinguishable". A replayed
trial's fit is found among the stored ones by its group and the error it stored
(``store.fit_errors``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from support.store_records import stored_trial

from orchestrator.analysis.metrics import (
    CheckError,
    FitError,
    ModelError,
    paired_model_error,
    same_fit_ratio_error,
    widen,
)
from orchestrator.analysis.pairing import SampleSpeed, compare_family, paired_ratio
from orchestrator.analysis.stats import Interval, band_p_value, paired_speed_ratio
from orchestrator.store.fit_errors import fit_of, side_fit
from orchestrator.store.records import StoredCostFit

E = 0.0347
#: The committed reproduction's fit: two live checks on each of two datasets' prompts.
CHECKS = (
    CheckError("humaneval", -0.0340),
    CheckError("humaneval", 0.0059),
    CheckError("math", 0.0406),
    CheckError("math", 0.0582),
)
FIT = FitError("sweep/group", E, CHECKS)
PROMPT_SECONDS = [1.0, 1.4, 0.8, 2.1, 1.7, 0.9, 1.2, 1.5, 1.1, 1.3]


def _samples(seconds: list[float], tokens: int = 48) -> list[SampleSpeed]:
    """One sample per prompt, ``tokens`` each."""
    return [SampleSpeed(f"p{i}", i, tokens, s, s) for i, s in enumerate(seconds)]


def _noisy(factor: float) -> list[SampleSpeed]:
    """The prompts' seconds over ``factor`` (A that many times B's speed), with ± 1% noise."""
    return _samples(
        [s / factor * (1 + 0.01 * math.sin(3.1 * i)) for i, s in enumerate(PROMPT_SECONDS)]
    )


def test_two_live_sides_carry_no_model_error_and_a_replayed_side_its_fits_e() -> None:
    assert paired_model_error(None, None) is None
    assert paired_model_error(FIT, None) == ModelError(E, "one side replayed")
    assert paired_model_error(None, FIT) == ModelError(E, "one side replayed")
    unmeasured = FitError("other", None)
    assert paired_model_error(None, unmeasured) == ModelError(None, "one side replayed")


def test_a_replayed_side_against_a_live_one_is_widened_by_e_the_ratio_unchanged() -> None:
    a, b = _noisy(1.1), _samples(PROMPT_SECONDS)
    plain = paired_ratio(a, b)
    widened = paired_ratio(a, b, paired_model_error(FIT, None))
    assert widened.ratio.estimate == plain.ratio.estimate
    assert widened.ratio.low == pytest.approx(plain.ratio.low * (1 - E))
    assert widened.ratio.high == pytest.approx(plain.ratio.high * (1 + E))
    assert widened.adjusted_p > plain.adjusted_p
    assert widened.model_error == ModelError(E, "one side replayed")


def test_two_sides_of_one_fit_carry_the_ratio_error_of_its_checks_on_the_same_prompts() -> None:
    found = same_fit_ratio_error(FIT)
    humaneval = 1.0059 / 0.9660 - 1
    math_ = 1.0582 / 1.0406 - 1
    assert found == ModelError(pytest.approx((humaneval + math_) / 2), "one fit")
    assert 0.02 < found.error < E  # what the fit gets wrong for both sides cancels
    assert paired_model_error(FIT, FitError("sweep/group", E, CHECKS)) == found
    # the order of the checks does not matter: the larger of a gap and its inverse
    assert same_fit_ratio_error(FitError("f", E, CHECKS[::-1])).error == pytest.approx(found.error)


def test_one_fit_whose_checks_share_no_prompts_falls_back_to_its_e() -> None:
    lone = FitError("f", E, (CheckError("humaneval", 0.01), CheckError("math", -0.02)))
    assert same_fit_ratio_error(lone) == ModelError(E, "one fit, its e")
    assert same_fit_ratio_error(FitError("f", E)) == ModelError(E, "one fit, its e")


def test_sides_of_two_fits_add_both_errors() -> None:
    other = FitError("other/group", -0.02, CHECKS)
    assert paired_model_error(FIT, other) == ModelError(pytest.approx(E + 0.02), "two fits")
    assert paired_model_error(FIT, FitError("x", None)) == ModelError(E, "two fits")
    assert paired_model_error(FitError("x", None), FitError("y", None)) == ModelError(
        None, "two fits"
    )


def test_two_replayed_sides_with_identical_rounds_are_not_distinguishable() -> None:
    same = _samples(PROMPT_SECONDS)
    error = paired_model_error(FIT, FIT)
    (compared,) = compare_family([(same, same)], [error])
    assert compared.ratio.estimate == 1.0
    assert compared.ratio.high - compared.ratio.low > 0.05  # [1 − e, 1 + e], e about 2.9%
    assert compared.ratio.contains(1.0) and compared.verdict == "not distinguishable"


def test_the_degenerate_interval_of_one_fits_two_projections_gets_a_width() -> None:
    """Every prompt 0.979× on both sides' projections (SVIP's 0.979 [0.979, 0.979] in
    docs/reproduction.md before): the prompts' spread is nil, the model's error is not."""
    a = _samples([s / 0.979 for s in PROMPT_SECONDS])
    b = _samples(PROMPT_SECONDS)
    plain = compare_family([(a, b)])[0]
    assert plain.ratio.low == pytest.approx(plain.ratio.high) and plain.verdict == "slower"
    widened = compare_family([(a, b)], [paired_model_error(FIT, FIT)])[0]
    assert widened.ratio.estimate == pytest.approx(0.979)
    assert widened.ratio.high - widened.ratio.low > 0.05
    assert widened.ratio.contains(1.0) and widened.verdict == "not distinguishable"
    assert widened.adjusted_p == 1.0
    # a model error smaller than the ratio's distance from 1 still decides it
    small = compare_family([(a, b)], [ModelError(0.01, "one fit")])[0]
    assert small.verdict == "slower" and small.ratio.high == pytest.approx(0.979 * 1.01)


def test_a_claim_decided_only_by_ignoring_the_error_is_not_distinguishable_in_its_family() -> None:
    live = (_noisy(1.25), _samples(PROMPT_SECONDS))
    replayed = (_noisy(1.02), _samples(PROMPT_SECONDS))
    before = compare_family([live, replayed])
    assert [c.verdict for c in before] == ["faster", "faster"]
    after = compare_family([live, replayed], [None, paired_model_error(FIT, FIT)])
    assert [c.verdict for c in after] == ["faster", "not distinguishable"]
    assert after[0].ratio == before[0].ratio and after[0].model_error is None
    assert after[1].ratio.estimate == before[1].ratio.estimate
    assert after[1].ratio.contains(1.0)


@pytest.mark.parametrize("confidence", [0.95, 0.99, 0.9969])
@pytest.mark.parametrize("error", [0.0, 0.01, 0.03, 0.08])
@pytest.mark.parametrize("factor", [0.9, 0.96, 1.0, 1.02, 1.07])
def test_the_widened_p_value_falls_below_alpha_exactly_when_the_widened_interval_excludes_1(
    confidence: float, error: float, factor: float
) -> None:
    a, b = _noisy(factor), _samples(PROMPT_SECONDS)
    tokens = [float(s.tokens) for s in a]
    interval = paired_speed_ratio(
        tokens, [s.seconds for s in a], tokens, [s.seconds for s in b], confidence
    )
    widened = widen(interval, error)
    assert widened.p_value == pytest.approx(
        interval.p_value if error == 0 else band_p_value(interval, error)
    )
    excluded = widened.low > 1 or widened.high < 1
    assert (widened.p_value < 1 - confidence) == excluded


def test_band_p_value_is_one_inside_the_band_and_none_without_a_p_value() -> None:
    inside = Interval(1.02, 1.0199, 1.0201, 10, p_value=0.0)
    assert band_p_value(inside, 0.03) == 1.0
    assert band_p_value(Interval(1.02, 1.0, 1.04, 10), 0.03) is None
    assert band_p_value(inside, 1.5) == 1.0


def _fit(id_: int, error: float | None, **values: object) -> StoredCostFit:
    """A stored cost fit of group (demo, humaneval, 8 prompts, 48 tokens, greedy)."""
    empty = dict.fromkeys(field.name for field in dataclasses.fields(StoredCostFit))
    group = {"pair": "demo", "dataset": "humaneval", "split": None, "samples": 8}
    return StoredCostFit(
        **{
            **empty,
            **group,
            "id": id_,
            "sweep": "s",
            "group_key": f"g{id_}",
            "max_new_tokens": 48,
            "temperature": 0.0,
            "out_of_sample_error": error,
            "checks": [{"trial_id": "c1", "error": -0.03}, {"trial_id": "c2", "error": 0.02}],
            **values,
        }
    )


def test_a_replayed_trials_fit_is_its_groups_with_the_error_it_stored() -> None:
    columns = {"pair": "demo", "dataset": "humaneval", "split": None, "samples": 8}
    row = stored_trial(
        trial_id="r",
        mode="replay",
        max_new_tokens=48,
        temperature=0.0,
        **columns,
        metrics={"cost_model_error": 0.025},
    )
    fits = [_fit(3, 0.025), _fit(2, 0.025), _fit(1, 0.04), _fit(4, 0.025, dataset="math")]
    assert fit_of(row, fits).id == 2  # the oldest of its group with its error
    checks = {
        "c1": stored_trial(trial_id="c1", baseline_id="ar"),
        "c2": stored_trial(trial_id="c2", baseline_id="ar"),
    }
    side = side_fit(row, fit_of(row, fits), checks)
    assert side == FitError("s/g2", 0.025, (CheckError("ar", -0.03), CheckError("ar", 0.02)))
    assert same_fit_ratio_error(side).error == pytest.approx(1.02 / 0.97 - 1)
    # no stored fit matches: a fit of its own, its stored e, no checks
    assert fit_of(row, [_fit(1, 0.04)]) is None
    assert side_fit(row, None, checks) == FitError("trial r", 0.025)
    # a check whose row is not stored is left out
    assert side_fit(row, fits[1], {"c1": checks["c1"]}).checks == (CheckError("ar", -0.03),)
