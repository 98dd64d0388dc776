"""``batch_sizes``: a trial axis (planner), batch-1 ids unchanged, and what validation refuses."""

from __future__ import annotations

import textwrap

import pytest
from support.store_records import stored_trial

from orchestrator.analysis import report
from orchestrator.store.records import StoredTrial
from orchestrator.store.row_values import trial_values
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import SweepError, parse_sweep
from orchestrator.sweep.trial import fit_group_key

BASE = """\
name: batches
pairs:
  - name: p
    target: zoo:micro/target
    draft: zoo:micro/draft-s
datasets:
  - {name: "builtin:code", samples: 4, max_new_tokens: 8}
temperatures: [0]
policies:
  - name: static
max_draft_lens: [2, 4]
"""


def _plan(extra: str = ""):
    return plan_sweep(parse_sweep(textwrap.dedent(BASE) + extra))


def test_batch_sizes_default_to_one_and_leave_ids_unchanged() -> None:
    plain, explicit = _plan(), _plan("batch_sizes: [1]\n")
    assert parse_sweep(textwrap.dedent(BASE)).batch_sizes == (1,)
    assert [t.trial_id for t in plain.trials] == [t.trial_id for t in explicit.trials]
    assert all(t.batch_size == 1 for t in plain.trials)
    assert all("batch_size" not in t.identity() for t in plain.trials)
    assert all("batch_size" not in trial_values(t) for t in plain.trials)


def test_each_batch_size_is_a_group_with_its_own_baseline() -> None:
    plain, batched = _plan(), _plan("batch_sizes: [4, 1]\n")
    assert len(batched.trials) == 2 * len(plain.trials)
    ones = [t for t in batched.trials if t.batch_size == 1]
    fours = [t for t in batched.trials if t.batch_size == 4]
    assert [t.trial_id for t in ones] == [t.trial_id for t in plain.trials]
    assert batched.trials[: len(ones)] == tuple(ones)  # batch 1 first: sizes ascend
    (baseline,) = [t for t in fours if t.is_baseline]
    assert baseline.setting.policy == "ar"
    assert {t.baseline_id for t in fours if not t.is_baseline} == {baseline.trial_id}
    assert not {t.trial_id for t in fours} & {t.trial_id for t in ones}
    assert all(t.identity()["batch_size"] == 4 for t in fours)
    assert trial_values(fours[1])["batch_size"] == 4
    assert fit_group_key(fours[0]) != fit_group_key(ones[0])
    assert batched.counts()["baselines"] == 2


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ("batch_sizes: [0]\n", "batch_sizes[0]", "greater than or equal to 1"),
        ("batch_sizes: []\n", "batch_sizes", "at least one"),
    ],
)
def test_bad_batch_sizes_are_refused_by_field(extra: str, field: str, says: str) -> None:
    with pytest.raises(SweepError) as caught:
        parse_sweep(textwrap.dedent(BASE) + extra)
    problems = "\n".join(caught.value.problems)
    assert f"{field}:" in problems
    assert says in problems


def test_greedy_batches_replay_a_policy_told_the_batch_size_too() -> None:
    replayed = _plan("batch_sizes: [1, 2]\nexecution: {mode: replay}\n")
    at_two = [t for t in replayed.trials if t.batch_size == 2]
    assert {t.mode for t in at_two if not t.is_baseline and not t.is_check} == {"replay"}
    assert any(t.is_check for t in at_two)
    scheduled = "  - name: batch_schedule\n"
    mixed = _plan("batch_sizes: [1, 2]\nexecution: {mode: mixed}\n").trials
    assert {t.mode for t in mixed if t.setting.policy == "static" and not t.is_check} == {"replay"}
    text = textwrap.dedent(BASE).replace("  - name: static\n", "  - name: static\n" + scheduled)
    plan = plan_sweep(parse_sweep(text + "batch_sizes: [1, 2]\nexecution: {mode: mixed}\n"))
    modes = {(t.batch_size, t.mode) for t in plan.trials if t.setting.policy == "batch_schedule"}
    # The queue simulator tells it the rows of every round (costs.batch_replay).
    assert modes == {(1, "replay"), (2, "replay")}
    only_scheduled = textwrap.dedent(BASE).replace("  - name: static\n", scheduled)
    parse_sweep(only_scheduled + "batch_sizes: [1, 2]\nexecution: {mode: replay}\n")


def test_batches_need_a_draft_model_and_fresh_policies() -> None:
    text = textwrap.dedent(BASE).replace(
        "    draft: zoo:micro/draft-s\n", "    draft: {kind: ngram}\n"
    )
    persisting = "  - name: hf_heuristic\n    params: {persist_across_requests: true}\n"
    text = text.replace("  - name: static\n", persisting)
    with pytest.raises(SweepError) as caught:
        parse_sweep(text + "batch_sizes: [1, 2]\n")
    problems = "\n".join(caught.value.problems)
    assert "pairs[0].draft.kind:" in problems
    assert "policies[0]:" in problems and "persist_across_requests" in problems
    parse_sweep(text + "batch_sizes: [1]\n")  # batch 1 runs them as before


def test_a_lookup_in_a_drafts_list_is_refused_at_batch_sizes_by_its_own_field() -> None:
    listed = "    drafts: [zoo:micro/draft-s, {kind: ngram}]\n"
    text = textwrap.dedent(BASE).replace("    draft: zoo:micro/draft-s\n", listed)
    with pytest.raises(SweepError) as caught:
        parse_sweep(text + "batch_sizes: [1, 2]\n")
    (problem,) = caught.value.problems
    assert "pairs[0].drafts[1].kind: batch sizes [2] (batch_sizes) need a draft model" in problem


def _stored(batch: int | None, total: float) -> StoredTrial:
    """A done static trial at ``batch`` with its total tokens/s."""
    return stored_trial(
        trial_id=f"t{batch}",
        pair="p",
        dataset="code",
        temperature=0.0,
        policy="static",
        params={},
        max_draft_len=2,
        status="done",
        batch_size=batch,
        tokens_per_s=total / 2,
        total_tokens_per_s=total,
    )


def test_summary_and_labels_show_the_batch_size_only_when_a_sweep_has_one() -> None:
    plain = [_stored(1, 10.0)]
    group, columns = report.summary_layout(plain)
    assert (group, columns) == (report.SUMMARY_GROUP, report.SUMMARY_COLUMNS)
    assert "total_tokens_per_s" not in report.summary_rows(plain, group)[0]
    assert "batch" not in report.trial_label(plain[0])
    batched = [_stored(1, 10.0), _stored(4, 30.0)]
    group, columns = report.summary_layout(batched)
    assert group == (*report.SUMMARY_GROUP, "batch_size")
    assert columns[-1] == "total_tokens_per_s" and "batch_size" in columns
    rows = report.summary_rows(batched, group)
    assert [(r["batch_size"], r["total_tokens_per_s"]) for r in rows] == [(1, 10.0), (4, 30.0)]
    assert report.trial_label(batched[1]).endswith("temp 0, batch 4)")
