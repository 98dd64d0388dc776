"""``execution.live_check``: one mapping (the old form, same trial ids) or a list of checks."""

from __future__ import annotations

import pytest

from orchestrator.sweep.planner import plan_sweep, replay_groups
from orchestrator.sweep.spec import SweepError, parse_sweep

SWEEP = """\
name: checks
pairs:
  - name: micro
    target: {model: "zoo:micro/target"}
    draft: {model: "zoo:micro/draft-s"}
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 16}
temperatures: [0.0]
policies:
  - name: static
max_draft_lens: [2, 8]
execution: {mode: replay%s}
"""


def _checks(extra: str) -> list[tuple[str, int, str]]:
    plan = plan_sweep(parse_sweep(SWEEP % extra))
    (group,) = replay_groups(plan)
    return [(t.setting.policy, t.setting.max_draft_len, t.trial_id) for t in group.checks]


def test_one_mapping_gives_one_check_and_a_list_of_it_the_same_trial_id() -> None:
    (one,) = _checks(", live_check: {policy: static, max_draft_len: 3}")
    listed = _checks(", live_check: [{policy: static, max_draft_len: 3}, {policy: svip}]")
    assert one == listed[0] and one[:2] == ("static", 3)
    assert listed[1][:2] == ("svip", 4)


def test_the_default_checks_span_static_short_and_long_an_entropy_and_a_thompson_rule() -> None:
    default = _checks("")
    (old,) = _checks(", live_check: {policy: static}")
    assert [c[:2] for c in default] == [
        ("static", 4),
        ("static", 8),
        ("adaedl", 8),
        ("beta_ts", 8),
    ]
    assert default[0] == old


def test_a_bad_entry_of_the_list_is_reported_at_its_index() -> None:
    with pytest.raises(SweepError) as caught:
        parse_sweep(SWEEP % ", live_check: [{policy: static}, {policy: nope}]", "bad.yaml")
    (problem,) = caught.value.problems
    assert "execution.live_check[1].policy" in problem and "unknown policy 'nope'" in problem
    with pytest.raises(SweepError) as caught:
        parse_sweep(SWEEP % ", live_check: []", "bad.yaml")
    assert "execution.live_check" in caught.value.problems[0]


KINDS = SWEEP.replace(
    '    draft: {model: "zoo:micro/draft-s"}',
    '    drafts: [{model: "zoo:micro/draft-s"}, {kind: ngram, n_max: 2}]',
)


def test_a_check_runs_on_the_draft_kinds_it_names_and_one_reading_a_lookup_on_lookups() -> None:
    checks = (
        ", live_check: [{policy: static, max_draft_len: 4},"
        " {policy: adaedl, max_draft_len: 4, draft_kinds: [lm]},"
        " {policy: ngram_match, max_draft_len: 4}]"
    )
    plan = plan_sweep(parse_sweep(KINDS % checks))
    by_kind = {
        group.checks[0].served.draft_kind: [t.setting.policy for t in group.checks]
        for group in replay_groups(plan)
    }
    # ngram_match reads the lookup's match length: it is left out of the draft model's group.
    assert by_kind == {"lm": ["static", "adaedl"], "ngram": ["static", "ngram_match"]}
    # Without draft_kinds, both kinds get AdaEDL (the old plan, whose ids stay the same).
    both = plan_sweep(parse_sweep(KINDS % checks.replace(", draft_kinds: [lm]", "")))
    old = {t.trial_id for t in both.trials if t.is_check}
    assert {t.trial_id for t in plan.trials if t.is_check} < old


def test_a_check_naming_a_kind_no_pair_drafts_with_is_refused_at_its_field() -> None:
    with pytest.raises(SweepError) as caught:
        parse_sweep(
            KINDS % ", live_check: [{policy: static}, {policy: svip, draft_kinds: [eagle]}]",
            "bad.yaml",
        )
    (problem,) = caught.value.problems
    assert "execution.live_check[1].draft_kinds[0]" in problem and "'eagle'" in problem
