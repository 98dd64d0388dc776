"""The Ray runner end to end on the micro zoo: real actors, real SQLite, resumption."""

from __future__ import annotations

import textwrap

import pytest
import ray
import torch

from orchestrator.run.runner import PreflightError, RunOptions, execute_plan, preflight
from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import parse_sweep
from orchestrator.sweep.target_sets import solo
from workers.lm import CachedLM, load_causal_lm
from workers.step_plan import StepPlan
from workers.target import LocalTarget
from workers.trial import run_trial

pytestmark = pytest.mark.ray

SWEEP = """
name: runner-test
pairs:
  - name: micro
    target: {model: "zoo:micro/target"}
    draft: {model: "zoo:micro/draft-s"}
datasets:
  - {name: "builtin:code", samples: 3, max_new_tokens: 16}
temperatures: [0.0, {temperature: 1.0, top_k: 20}]
policies:
  - name: static
  - name: adaedl
    grid: {threshold: [0.5]}
  - name: oracle
max_draft_lens: [4]
seeds: [0]
execution: {retries: 1, warmup_samples: 1}
"""


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance with room for a tp_size-2 target group and its draft actor."""
    ray.init(num_cpus=3, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def zoo_env(micro_zoo, monkeypatch):
    """Point zoo references at the session's micro zoo."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    return micro_zoo


def test_sweep_runs_on_actors_matches_in_process_and_resumes(zoo_env, ray_local, tmp_path):
    spec = parse_sweep(SWEEP, "runner-test.yaml")
    plan = plan_sweep(spec)
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    inputs = preflight(spec, plan)
    summary = execute_plan(spec, plan, store, RunOptions(progress=False), inputs)
    assert (summary.ran, summary.failed, summary.already_done) == (len(plan.trials), 0, 0)
    rows = {row.trial_id: row for row in store.trials("runner-test")}
    assert len(rows) == len(plan.trials)
    assert all(row.status == "done" for row in rows.values())
    assert all(row.tokens_per_s > 0 for row in rows.values())
    # provenance: one run, every trial points to it; intervals bracket their estimates
    (run,) = store.runs()
    assert {row.run_id for row in rows.values()} == {run.id}
    assert run.sweep == "runner-test" and run.torch_threads >= 1
    for row in rows.values():
        assert row.tokens_per_s_low <= row.tokens_per_s <= row.tokens_per_s_high
        assert row.speedup_low <= row.speedup <= row.speedup_high
        # prefill and decode apart, on actors: they add up to the request's seconds, and
        # decode-only is faster than end to end
        assert row.decode_tokens_per_s_low <= row.decode_tokens_per_s
        assert row.decode_tokens_per_s <= row.decode_tokens_per_s_high
        assert row.decode_tokens_per_s > row.tokens_per_s and row.decode_speedup is not None
        assert row.prefill_seconds > 0
        assert row.prefill_seconds + row.decode_seconds == pytest.approx(row.seconds)
        for sample in store.sample_outputs(row.trial_id):
            assert sample.prefill_seconds > 0 and sample.decode_seconds > 0
            total = sample.prefill_seconds + sample.decode_seconds
            assert total == pytest.approx(sample.seconds)
    drafting = [row.trial_id for row in rows.values() if row.n_drafted]
    assert drafting
    positions = list(store.position_acceptance(drafting).itertuples(index=False))
    assert {p.trial_id for p in positions} == set(drafting)
    for trial_id in drafting:
        rounds = store.rounds([trial_id])
        first = next(p for p in positions if p.trial_id == trial_id and p.position == 1)
        assert first.drafted == sum(r.drafted >= 1 for r in rounds)
        assert first.accepted == sum(r.accepted >= 1 for r in rounds)
    fits = store.cost_fits("runner-test")
    assert fits and all(fit.projection_fit in ("round", "run") for fit in fits)
    assert all(fit.run_mre >= 0 and fit.round_trial_mre >= 0 for fit in fits)
    assert len(summary.fit_notes) == len(fits)
    assert all("run-level fit R²" in note for note in summary.fit_notes)

    from orchestrator.run.replica import GroupReplica

    paths = inputs.model_paths["micro"]
    draft = CachedLM(load_causal_lm(paths.draft))
    target = LocalTarget(CachedLM(load_causal_lm(paths.target)))
    runner = GroupReplica(solo(spec.pairs[0]), inputs, True, store)
    torch.manual_seed(0)
    for trial in plan.trials:
        in_process = run_trial(draft, target, runner._request(trial))
        stored = store.sample_outputs(trial.trial_id)
        assert [r.output_ids for r in in_process] == [s.output_ids for s in stored]
        assert [r.n_accepted for r in in_process] == [s.accepted for s in stored]

    again = execute_plan(spec, plan, store, RunOptions(progress=False), inputs)
    assert (again.ran, again.already_done) == (0, len(plan.trials))
    assert again.provenance_notes == []
    with store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE runs SET torch_threads = torch_threads + 7")
    moved = execute_plan(spec, plan, store, RunOptions(progress=False), inputs)
    assert len(moved.provenance_notes) == 1
    assert f"{len(plan.trials)} done trial(s)" in moved.provenance_notes[0]
    assert "torch_threads" in moved.provenance_notes[0]


def _pads_single_step(replica) -> tuple[bool, bool]:
    """Return whether ``replica``'s target rank 0 and its draft run one-token steps padded."""
    return (
        ray.get(replica.ranks[0].__ray_call__.remote(lambda a: a.target.lm.pad_single_step)),
        ray.get(replica.drafts["micro"].__ray_call__.remote(lambda a: a.draft.pad_single_step)),
    )


def test_replicas_on_a_node_load_with_the_step_choice_made_there(zoo_env, ray_local, tmp_path):
    from orchestrator.run.replica import GroupReplica
    from orchestrator.run.step_choices import SingleStepChoices, StepKey

    spec = parse_sweep(SWEEP, "runner-test.yaml")
    inputs = preflight(spec, plan_sweep(spec))
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    node = ray.get_runtime_context().get_node_id()
    paths = inputs.model_paths["micro"]
    keys = [StepKey(node, str(path), "float32") for path in (paths.target, paths.draft)]
    choices = SingleStepChoices()
    first = GroupReplica(solo(spec.pairs[0]), inputs, False, store, step_choices=choices)
    first._draft("micro")
    actors = (first.ranks[0], first.drafts["micro"])
    calibrations = ray.get([actor.single_step_calibration.remote() for actor in actors])
    assert None not in calibrations
    padded = tuple(calibration.padded for calibration in calibrations)
    assert _pads_single_step(first) == padded
    assert [choices.known(key) for key in keys] == [c.plan for c in calibrations]
    first.close()

    # A later replica on the node takes the recorded plan as is: seeded with the opposite
    # padding and layouts of what this node measured, it loads with that and does not time its
    # steps again.
    seeded = SingleStepChoices()
    opposite = [_opposite(calibration.plan) for calibration in calibrations]
    for key, plan in zip(keys, opposite, strict=True):
        seeded.load(key, lambda mode, plan=plan: plan)
    later = GroupReplica(solo(spec.pairs[0]), inputs, False, store, step_choices=seeded)
    later._draft("micro")
    actors = (later.ranks[0], later.drafts["micro"])
    assert ray.get([actor.single_step_calibration.remote() for actor in actors]) == [None, None]
    assert _pads_single_step(later) == tuple(not p for p in padded)
    plans = [
        ray.get(actors[0].__ray_call__.remote(lambda a: a.target.lm.plan)),
        ray.get(actors[1].__ray_call__.remote(lambda a: a.draft.plan)),
    ]
    assert plans == opposite
    later.close()


def _opposite(plan: StepPlan) -> StepPlan:
    """Return ``plan`` with its padding and its one-token layout the other way round."""
    flipped = "packed" if plan.layout(1) == "unpacked" else "unpacked"
    return StepPlan(((1, flipped),), padded=not plan.padded)


def test_preflight_names_missing_model_and_tokenizer_mismatch(zoo_env, tmp_path):
    other = tmp_path / "other-tokenizer-model"
    model = load_causal_lm(zoo_env.model_path("draft-xs"))
    model.save_pretrained(other)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(zoo_env.model_path("draft-xs"))
    tokenizer.add_tokens(["<extra-token>"])
    tokenizer.save_pretrained(other)
    bad = SWEEP.replace('"zoo:micro/draft-s"', f'"{other}"').replace(
        '"zoo:micro/target"', '"zoo:micro/target"'
    )
    missing = textwrap.dedent(SWEEP).replace('"zoo:micro/draft-s"', f'"{tmp_path}/nope"')
    for text, expected in ((bad, "tokenizer"), (missing, "pairs[0].draft.model")):
        spec = parse_sweep(text, "bad.yaml")
        with pytest.raises(PreflightError) as caught:
            preflight(spec, plan_sweep(spec))
        assert expected in str(caught.value)


@pytest.mark.slow
def test_deepspeed_target_group_on_actors_gives_the_unsharded_greedy_output(
    zoo_env, ray_local, tmp_path
):
    text = SWEEP.replace(
        'target: {model: "zoo:micro/target"}',
        'target: {model: "zoo:micro/target", backend: deepspeed, tp_size: 2}',
    ).replace("temperatures: [0.0, {temperature: 1.0, top_k: 20}]", "temperatures: [0.0]")
    spec = parse_sweep(text, "deepspeed.yaml")
    plan = plan_sweep(spec)
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    inputs = preflight(spec, plan)
    summary = execute_plan(spec, plan, store, RunOptions(progress=False), inputs)
    assert (summary.ran, summary.failed) == (len(plan.trials), 0), summary.failures

    from orchestrator.run.replica import GroupReplica

    paths = inputs.model_paths["micro"]
    target = LocalTarget(CachedLM(load_causal_lm(paths.target)))
    draft = CachedLM(load_causal_lm(paths.draft))
    runner = GroupReplica(solo(spec.pairs[0]), inputs, True, store)
    for trial in plan.trials:
        unsharded = run_trial(draft, target, runner._request(trial))
        stored = store.sample_outputs(trial.trial_id)
        assert [r.output_ids for r in unsharded] == [s.output_ids for s in stored]


SHARED_TOO_WIDE = """
name: too-wide
pairs:
  - {name: xs, target: {model: "zoo:micro/target"}, draft: {model: "zoo:micro/draft-xs"}}
  - {name: s, target: {model: "zoo:micro/target"}, draft: {model: "zoo:micro/draft-s"}}
  - {name: m, target: {model: "zoo:micro/target"}, draft: {model: "zoo:micro/draft-m"}}
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 8}
temperatures: [0.0]
policies:
  - name: static
max_draft_lens: [2]
execution: {retries: 0, warmup_samples: 0}
"""


def test_pairs_sharing_a_target_wider_than_the_node_run_in_groups_that_fit(
    zoo_env, ray_local, tmp_path
):
    """Three pairs share one target: 1 + 3 actors, one CPU each, on a 3-CPU node. The group is
    cut into groups that fit (xs+s, then m) instead of waiting for a reservation Ray never
    grants."""
    spec = parse_sweep(SHARED_TOO_WIDE, "too-wide.yaml")
    plan = plan_sweep(spec)
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    summary = execute_plan(spec, plan, store, RunOptions(progress=False))
    assert (summary.ran, summary.failed) == (len(plan.trials), 0), summary.failures
    rows = store.trials("too-wide")
    assert {row.pair for row in rows} == {"xs", "s", "m"}
    assert all(row.status == "done" for row in rows)
    store.close()
