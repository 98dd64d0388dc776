"""The comparisons a sweep's ``report`` section declares (``analysis.declared_claims``).

A synthetic sweep of two pairs on one target (drafts ``small`` and ``medium``) is stored through
the store's writer: AR baselines, static K = 1, 2, 4, SVIP and AdaEDL. ``report`` declares the
drafts ``medium`` against ``small`` (static) and SVIP against AdaEDL. The report must compare
each declared pair of sides on the test prompts, by speed and by acceptance, in the one Holm
family of every claim; identical drafts must come out not distinguishable, a clear difference
decided with its sign; a bad declaration is refused naming its field.
"""

from __future__ import annotations

import math

import pytest
from support import store_db

from orchestrator.analysis.claim_cells import DRAFT_ACCEPTANCE, DRAFT_SPEED, POLICY_VS_POLICY
from orchestrator.analysis.metrics import trial_metrics
from orchestrator.analysis.pairing import SampleSpeed, acceptance_counts, paired_ratio
from orchestrator.analysis.reproduction import report_markdown, reproduction_report
from orchestrator.store import Store
from orchestrator.sweep.planner import Trial
from orchestrator.sweep.spec import SweepError, SweepSpec, parse_sweep
from workers.records import GenerationResult, RoundRecord

db_url = store_db.db_url
store = store_db.store

PROMPTS = 8
SWEEP = """\
name: declared
pairs:
  - {name: small, target: zoo:micro/target, draft: zoo:micro/draft-s}
  - {name: medium, target: zoo:micro/target, draft: zoo:micro/draft-m}
datasets:
  - {name: "builtin:code", samples: 8, max_new_tokens: 8, holdout: {dev_fraction: 0.5}}
temperatures: [0]
policies:
  - name: static
  - {name: svip, grid: {threshold: [0.3, 0.5]}}
  - {name: adaedl, grid: {threshold: [0.5]}}
max_draft_lens: [1, 2, 4]
report:
  drafts: [{a: medium, b: small}]
  policies: [{a: svip, b: adaedl}]
"""
#: Speedup over AR by setting (static K = 2 the best static; SVIP 0.3 at K = 4 10% above it).
STATIC_SPEED = {1: 1.2, 2: 1.5, 4: 1.4}


def _speed(trial: Trial) -> float:
    setting = trial.setting
    if setting.policy == "static":
        return STATIC_SPEED[setting.max_draft_len]
    if setting.policy == "svip":
        return 1.65 if (setting.threshold, setting.max_draft_len) == (0.3, 4) else 1.3
    return 1.5 if setting.policy == "adaedl" else 1.0


def _results(
    trial: Trial, faster: float, accepted: int, machine: float = 1.0
) -> list[GenerationResult]:
    """One sample per prompt: 8 tokens in seconds that vary by prompt (± 1% noise by setting),
    ``faster`` times the setting's speed (the AR baseline too at ``machine`` times its speed);
    eight rounds of K drafted tokens, each accepting ``accepted`` (at most K), the last one more
    on odd prompts."""
    k = trial.setting.max_draft_len
    phase = k + len(trial.setting.policy) * 0.9 + (trial.setting.threshold or 0) * 5
    speed = _speed(trial) * machine * (1.0 if trial.is_baseline else faster)
    results = []
    for i in range(PROMPTS):
        seconds = (1.0 + 0.25 * i) / speed * (1 + 0.01 * math.sin(i * 1.7 + phase))
        taken = [min(k, accepted)] * 7 + [min(k, accepted + i % 2)]
        results.append(
            GenerationResult(
                prompt_ids=[200 + i, 5, 6],
                output_ids=list(range(8)),
                rounds=[RoundRecord(k, n, False, k, 0.001, 0.002) for n in taken],
                seconds=seconds,
                prefill_seconds=seconds / 4,
                decode_seconds=seconds * 3 / 4,
            )
        )
    return results


def _stored(
    store: Store, medium: tuple[float, int], text: str = SWEEP, machine: float = 1.0
) -> SweepSpec:
    """Store every trial of ``text``: pair small at speed factor 1 accepting 1 token a round,
    pair medium at ``medium`` (speed factor, accepted tokens) on a machine ``machine`` times as
    fast while it runs (its AR baseline too)."""
    spec, plan = store_db.spec_and_plan(text)
    store.register_sweep(spec, plan)
    for trial in plan.trials:
        faster, accepted = medium if trial.pair == "medium" else (1.0, 1)
        results = _results(trial, faster, accepted, machine if trial.pair == "medium" else 1.0)
        store.record_trial(trial, results, trial_metrics(results))
    return spec


def _declared(store: Store, spec: SweepSpec):
    rows = store.trials(spec.name)
    samples = store.trials_sample_speeds(row.trial_id for row in rows)
    return reproduction_report(spec, rows, samples)


def _by_form(report) -> dict[str, list]:
    forms: dict[str, list] = {}
    for claim in report.declared_claims:
        forms.setdefault(claim.pick.form, []).append(claim)
    return forms


def test_identical_drafts_are_not_distinguishable(store: Store) -> None:
    report = _declared(store, _stored(store, medium=(1.0, 1)))
    forms = _by_form(report)
    (speed,) = forms[DRAFT_SPEED]
    (acceptance,) = forms[DRAFT_ACCEPTANCE]
    for claim in (speed, acceptance):
        assert claim.comparison.ratio.estimate == pytest.approx(1.0)
        assert claim.comparison.verdict == "not distinguishable"
    assert (speed.pick.name_a, speed.pick.name_b) == ("medium", "small")
    assert (speed.pick.a.pair, speed.pick.b.pair) == ("medium", "small")
    assert speed.pick.b.max_draft_len == 2 and speed.pick.a.max_draft_len == 2
    assert acceptance.verdict_text == "not distinguishable"


def test_draft_speed_is_a_ratio_of_speedups_so_machine_drift_cancels(store: Store) -> None:
    # pair medium ran while the machine was 20% slower, AR baseline included: same draft
    (speed,) = _by_form(_declared(store, _stored(store, (1.0, 1), machine=0.8)))[DRAFT_SPEED]
    assert speed.comparison.ratio.estimate == pytest.approx(1.0)
    assert speed.comparison.verdict == "not distinguishable"


def test_a_clear_difference_is_decided_with_its_sign(store: Store) -> None:
    report = _declared(store, _stored(store, medium=(1.2, 2)))
    (speed,) = _by_form(report)[DRAFT_SPEED]
    (acceptance,) = _by_form(report)[DRAFT_ACCEPTANCE]
    assert speed.comparison.ratio.estimate == pytest.approx(1.2, rel=0.02)
    assert speed.comparison.verdict == "faster"
    # acceptance at B's chosen setting (static K = 2): A accepts every drafted token, B about
    # half (8 or 9 of 16 a prompt)
    assert acceptance.pick.a.max_draft_len == acceptance.pick.b.max_draft_len == 2
    assert acceptance.pick.picked_a is None and acceptance.comparison.ratio.estimate > 1.7
    assert acceptance.comparison.verdict == "faster" and acceptance.verdict_text == "higher"
    flipped = SWEEP.replace("{a: medium, b: small}", "{a: small, b: medium}")
    report = _declared(store, parse_sweep(flipped))
    (speed,) = _by_form(report)[DRAFT_SPEED]
    (acceptance,) = _by_form(report)[DRAFT_ACCEPTANCE]
    assert speed.comparison.verdict == "slower"
    assert acceptance.comparison.verdict == "slower" and acceptance.verdict_text == "lower"


def test_declared_claims_join_the_one_holm_family(store: Store) -> None:
    report = _declared(store, _stored(store, medium=(1.2, 2)))
    policy, declared = report.policy_claims, report.declared_claims
    # svip and adaedl against the best static K on both pairs; svip vs adaedl on both pairs;
    # medium vs small on speed and acceptance: m = 4 + 2 + 2
    assert len(policy) == 4 and len(declared) == 4
    assert [c.pick.form for c in declared].count(POLICY_VS_POLICY) == 2
    assert {c.comparison.family_size for c in report.claims} == {8}
    for claim in report.claims:
        assert claim.comparison.ratio.confidence == pytest.approx(1 - 0.05 / 8)
        assert claim.comparison.adjusted_p >= claim.comparison.ratio.p_value
    svip_vs_adaedl = next(c for c in declared if c.pick.form == POLICY_VS_POLICY)
    assert svip_vs_adaedl.pick.a.threshold == 0.3 and svip_vs_adaedl.pick.b.policy == "adaedl"
    assert svip_vs_adaedl.comparison.ratio.estimate == pytest.approx(1.1, rel=0.02)
    text = report_markdown(report)
    assert "Holm over the m = 8 claims of this report" in text
    assert "| claim | cell | A | B | A / B |" in text
    row = next(line for line in text.splitlines() if line.startswith("| draft acceptance |"))
    assert "| medium vs small · builtin:code · T=0 · seed 0 | medium: static K=2" in row
    assert row.count(" | higher | ") == 1


def test_a_report_without_declarations_prints_no_second_table(store: Store) -> None:
    plain = SWEEP.split("report:")[0]
    text = report_markdown(_declared(store, _stored(store, (1.0, 1), plain)))
    assert "| claim |" not in text and "Declared comparisons" not in text


@pytest.mark.parametrize(
    ("declaration", "field", "message"),
    [
        ("drafts: [{a: large, b: small}]", "report.drafts[0].a", "no pair named 'large'"),
        ("drafts: [{a: small, b: small}]", "report.drafts[0].b", "with itself"),
        ("drafts: [{a: medium, b: other}]", "report.drafts[0].b", "different targets"),
        ("drafts: [{a: medium, b: small, policy: svip}]", "report.drafts[0].policy", "both"),
        ("policies: [{a: svip, b: oracle}]", "report.policies[0].b", "no policies[] entry"),
        ("policies: [{a: svip, b: svip}]", "report.policies[0].b", "with itself"),
        ("drafts: [{a: medium, b: small, k: 2}]", "report.drafts[0].k", "Extra inputs"),
    ],
)
def test_a_bad_declaration_is_refused_naming_its_field(
    declaration: str, field: str, message: str
) -> None:
    text = SWEEP.split("report:")[0].replace(
        "  - {name: svip,", "  - {name: svip, pairs: [small, other],"
    )
    text = text.replace(
        "pairs:\n",
        "pairs:\n  - {name: other, target: zoo:micro/draft-m, draft: zoo:micro/draft-s}\n",
        1,
    )
    with pytest.raises(SweepError) as refused:
        parse_sweep(text + f"report:\n  {declaration}\n")
    (problem,) = refused.value.problems
    assert f": {field}: " in problem and message in problem


def test_acceptance_counts_compare_acceptance_rates_by_the_paired_interval() -> None:
    def samples(accepted: list[int]) -> list[SampleSpeed]:
        return [SampleSpeed(f"p{i}", i, 8, 1.0, 0.5, 4, a) for i, a in enumerate(accepted)]

    a, b = acceptance_counts(samples([2, 3, 2, 3])), acceptance_counts(samples([1, 2, 1, 1]))
    compared = paired_ratio(a, b)
    assert compared.ratio.estimate == pytest.approx((10 / 16) / (5 / 16))
    assert acceptance_counts([SampleSpeed("p", 0, 8, 1.0)]) is None
