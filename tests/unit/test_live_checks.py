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
