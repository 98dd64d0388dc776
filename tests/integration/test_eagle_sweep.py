"""Sweeps whose pair drafts with an EAGLE head run on real Ray actors with the micro zoo: a head
trained by the sweep's own ``eagle_head`` job, and a head given by path. Greedy trials (static
K and an adaptive policy) reproduce the AR baseline's tokens, sampled ones run, the trials are
stored with their draft kind; a mixed sweep replays its greedy EAGLE trials to exactly the
rounds of the same trials run live; preflight refuses a head that does not fit the pair,
naming the field."""

from __future__ import annotations

import pytest
import ray
from support.eagle_heads import trained_head, untrained_head

from orchestrator.run.preflight import PreflightError
from orchestrator.run.replica import GroupReplica
from orchestrator.run.runner import RunOptions, execute_plan, preflight
from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import SweepError, parse_sweep
from orchestrator.sweep.target_sets import solo
from workers.eagle.artifact import load_eagle_head, save_eagle_head
from workers.eagle.layers import eagle3_layers
from workers.lm import CachedLM, load_causal_lm
from workers.proposers import make_proposer
from workers.target import LocalTarget
from workers.trial import run_trial

JOB_SWEEP = """\
name: eagle-job
pairs: [{name: micro-eagle, target: "zoo:micro/target", draft: {kind: eagle, job: head}}]
datasets: [{name: "builtin:code", samples: 2, max_new_tokens: 16}]
temperatures: [0, 0.7]
policies: [{name: static}, {name: svip}]
max_draft_lens: [3]
execution: {warmup_samples: 0, retries: 0}
training_jobs:
  - name: head
    kind: eagle_head
    base: "zoo:micro/target"
    dataset: {name: "builtin:code", samples: 24}
    epochs: 2
    config: {prompt_tokens: 16, response_tokens: 16, head_vocab: 256, lr: 0.005,
             eval_fraction: 0.25}
"""

PATH_SWEEP = """\
name: eagle-path
pairs: [{name: micro-eagle, target: "zoo:micro/target", draft: {kind: eagle, model: HEAD}}]
datasets: [{name: "builtin:code", samples: 3, max_new_tokens: 16}]
temperatures: [0]
policies: [{name: static}, {name: svip}]
max_draft_lens: [3]
execution: {warmup_samples: 0, retries: 0}
"""


@pytest.fixture
def ray_local():
    """A local Ray instance with three CPUs: room for a tp_size-2 target group and its draft
    actor (every other test here needs two)."""
    ray.init(num_cpus=3, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def head_dir(micro_zoo, tmp_path):
    """An (untrained, seeded) EAGLE head over the micro target, saved as an artifact."""
    target = load_causal_lm(micro_zoo.model_path("target"))
    return save_eagle_head(tmp_path / "head", untrained_head(target), {})


def _run(spec_text: str, name: str, tmp_path):
    """Plan, preflight and run a sweep into a fresh SQLite store; return (plan, store)."""
    spec = parse_sweep(spec_text, name)
    plan = plan_sweep(spec)
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    summary = execute_plan(spec, plan, store, RunOptions(progress=False), preflight(spec, plan))
    assert (summary.ran, summary.failed) == (len(plan.trials), 0), summary.failures
    return plan, store


def _check_greedy_equals_baseline(plan, store) -> int:
    """Assert every greedy trial's outputs are its AR baseline's; return the drafted tokens."""
    drafted = 0
    for trial in plan.trials:
        if trial.sampling.temperature > 0 or trial.is_baseline:
            continue
        expected = [s.output_ids for s in store.sample_outputs(trial.baseline_id)]
        samples = store.sample_outputs(trial.trial_id)
        assert [s.output_ids for s in samples] == expected, trial.setting.policy
        drafted += sum(s.drafted for s in samples)
    return drafted


def test_a_head_trained_by_the_sweeps_job_runs_on_ray(job_env, ray_local, tmp_path):
    plan, store = _run(JOB_SWEEP, "eagle-job.yaml", tmp_path)
    assert len(plan.trials) == 6  # baseline, static, svip at each temperature
    assert _check_greedy_equals_baseline(plan, store) > 0
    sampled = [t for t in plan.trials if t.sampling.temperature > 0 and not t.is_baseline]
    assert sampled and all(
        sum(s.drafted for s in store.sample_outputs(t.trial_id)) > 0 for t in sampled
    )
    rows = store.trials("eagle-job")
    assert {row.config["draft_kind"] for row in rows} == {"eagle"}
    assert {row.draft_job for row in rows} == {"head"}
    assert [job.status for job in store.training_jobs()] == ["done"]
    store.close()


def test_a_head_given_by_path_runs_on_ray(job_env, head_dir, ray_local, tmp_path):
    plan, store = _run(PATH_SWEEP.replace("HEAD", str(head_dir)), "eagle-path.yaml", tmp_path)
    assert _check_greedy_equals_baseline(plan, store) > 0
    rows = store.trials("eagle-path")
    assert {(row.config["draft_kind"], row.draft) for row in rows} == {("eagle", str(head_dir))}
    store.close()


@pytest.fixture
def fused_head_dir(micro_zoo, tmp_path):
    """An (untrained, seeded) EAGLE head fusing the micro target's EAGLE-3 layers, saved."""
    target = load_causal_lm(micro_zoo.model_path("target"))
    layers = eagle3_layers(target.config.num_hidden_layers)
    return save_eagle_head(tmp_path / "fused", untrained_head(target, feature_layers=layers), {})


def test_a_fused_head_given_by_path_runs_on_ray_as_any_head(
    job_env, fused_head_dir, ray_local, tmp_path
):
    """The sweep names a fused head exactly as any other: the draft worker's proposer asks the
    target actor for its layers' states, and greedy trials reproduce the baseline."""
    spec_text = PATH_SWEEP.replace("HEAD", str(fused_head_dir))
    plan, store = _run(spec_text, "eagle-fused.yaml", tmp_path)
    assert _check_greedy_equals_baseline(plan, store) > 0
    store.close()


MIXED_SWEEP = (
    PATH_SWEEP.replace("name: eagle-path", "name: eagle-mixed")
    .replace("temperatures: [0]", "temperatures: [0, 0.7]")
    .replace("{name: svip}", "{name: adaedl}")
    .replace("max_draft_lens: [3]", "max_draft_lens: [4]")
    .replace("retries: 0}", "retries: 0, mode: mixed}")
)


@pytest.fixture
def trained_head_dir(micro_zoo, tmp_path):
    """An EAGLE head trained briefly on the micro target's greedy continuations, saved."""
    target = load_causal_lm(micro_zoo.model_path("target"))
    return save_eagle_head(tmp_path / "head", trained_head(target, n=32, steps=80), {})


def _rounds_of(store, trial) -> dict[tuple[int, int], tuple]:
    """Return a trial's stored rounds by (sample, round): drafted, accepted, bonus, forwards."""
    return {
        (r.sample_index, r.round_index): (r.drafted, r.accepted, r.bonus, r.draft_forwards)
        for r in store.rounds([trial.trial_id])
    }


def test_a_mixed_sweep_replays_eagle_trials_as_they_run_live(
    job_env, trained_head_dir, ray_local, tmp_path
):
    """Greedy EAGLE trials are replayed from one recorded EAGLE trace per prompt, each with
    exactly the rounds and tokens of its live twin (the default live checks hold static and
    AdaEDL at K = 4); sampled ones run live; the greedy pool's fit has a head step."""
    plan, store = _run(MIXED_SWEEP.replace("HEAD", str(trained_head_dir)), "m.yaml", tmp_path)
    replayed = [t for t in plan.trials if t.mode == "replay"]
    assert {(t.setting.policy, t.sampling.temperature) for t in replayed} == {
        ("static", 0.0),
        ("adaedl", 0.0),
    }
    assert {t.mode for t in plan.trials if t.sampling.temperature > 0} == {"live"}
    twins = {(t.setting.policy, t.setting.max_draft_len): t for t in plan.trials if t.is_check}
    accepted = 0
    for trial in replayed:
        twin = twins[(trial.setting.policy, trial.setting.max_draft_len)]
        ours = _rounds_of(store, trial)
        assert ours == _rounds_of(store, twin), trial.setting.policy
        outputs = [s.output_ids for s in store.sample_outputs(trial.trial_id)]
        assert outputs == [s.output_ids for s in store.sample_outputs(twin.trial_id)]
        accepted += sum(r[1] for r in ours.values())
    assert accepted > 0, "the trained head should have drafts accepted"
    rows = {row.trial_id: row for row in store.trials("eagle-mixed")}
    assert {rows[t.trial_id].mode for t in replayed} == {"replay"}
    (fit,) = [f for f in store.cost_fits("eagle-mixed") if f.temperature == 0]
    assert fit.check_same_rounds == 1.0 and fit.step_model["t_draft"] > 0
    store.close()


def _refused(text: str) -> list[str]:
    """Return the preflight problems of sweep ``text`` (it must be refused)."""
    spec = parse_sweep(text, "refused.yaml")
    with pytest.raises(PreflightError) as refused:
        preflight(spec, plan_sweep(spec))
    return refused.value.problems


def test_a_model_directory_that_is_not_a_head_is_refused(job_env):
    problems = _refused(PATH_SWEEP.replace("HEAD", "zoo:micro/draft-xs"))
    assert len(problems) == 1
    assert problems[0].startswith("pairs[0].draft.model: ")
    assert "not an EAGLE head" in problems[0]


def test_a_head_job_trained_on_another_model_is_refused(job_env):
    text = JOB_SWEEP.replace('base: "zoo:micro/target"', 'base: "zoo:micro/draft-xs"')
    problems = _refused(text)
    assert len(problems) == 1
    assert problems[0].startswith("pairs[0].draft.job: job 'head' trains its head on ")


@pytest.mark.slow
def test_a_head_over_a_tensor_parallel_target_runs_on_ray(
    job_env, trained_head_dir, ray_local, tmp_path
):
    """A DeepSpeed AutoTP target of two ranks serves a head: rank 0 sends the features (whole:
    each layer's output is all-reduced). Greedy trials reproduce the sharded baseline, and
    every prompt drafts and accepts exactly what the same head does over the unsharded target
    in this process, so the features it was sent were the unsharded model's. (A fused head's
    layer states from the ranks: test_tensor_parallel.)"""
    text = (
        PATH_SWEEP.replace("HEAD", str(trained_head_dir))
        .replace("name: eagle-path", "name: eagle-tp")
        .replace(
            'target: "zoo:micro/target"',
            'target: {model: "zoo:micro/target", backend: deepspeed, tp_size: 2}',
        )
    )
    plan, store = _run(text, "eagle-tp.yaml", tmp_path)
    assert _check_greedy_equals_baseline(plan, store) > 0
    spec = parse_sweep(text, "eagle-tp.yaml")
    inputs = preflight(spec, plan)
    whole = load_causal_lm(inputs.model_paths["micro-eagle"].target)
    target = LocalTarget(CachedLM(whole))
    proposer = make_proposer("eagle", head=load_eagle_head(trained_head_dir, whole))
    replica = GroupReplica(solo(spec.pairs[0]), inputs, True, store)
    accepted = 0
    for trial in plan.trials:
        in_process = run_trial(proposer, target, replica._request(trial))
        stored = store.sample_outputs(trial.trial_id)
        assert [(r.output_ids, r.n_drafted, r.n_accepted) for r in in_process] == [
            (s.output_ids, s.drafted, s.accepted) for s in stored
        ], trial.setting.policy
        accepted += sum(s.accepted for s in stored)
    assert accepted > 0, "the trained head should have drafts accepted"
    store.close()


def test_a_fused_head_reaching_past_the_targets_layers_is_refused(job_env, micro_zoo, tmp_path):
    target = load_causal_lm(micro_zoo.model_path("target"))
    depth = target.config.num_hidden_layers
    head = untrained_head(target, feature_layers=(0, depth))
    head_dir = save_eagle_head(tmp_path / "deep", head, {})
    problems = _refused(PATH_SWEEP.replace("HEAD", str(head_dir)))
    assert problems == [
        f"pairs[0].draft.model: the EAGLE head's feature_layers [0, {depth}] reach past the "
        f"target's {depth} layers; a head fits only the target it was trained for"
    ]


def test_a_sweeps_head_job_with_a_bad_layer_choice_is_refused_naming_the_setting():
    text = JOB_SWEEP.replace("eval_fraction: 0.25}", "eval_fraction: 0.25, feature_layers: [1, 1]}")
    with pytest.raises(SweepError) as refused:
        parse_sweep(text, "refused.yaml")
    expected = "training_jobs[0].config: setting 'feature_layers' must list distinct layers"
    assert expected in str(refused.value)
