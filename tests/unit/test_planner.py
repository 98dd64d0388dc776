"""Grid expansion: counts, identity, baselines, skipping, ordering, jobs and resources."""

from __future__ import annotations

import hashlib
import itertools
import textwrap

import pytest
from support.paths import REPO

from orchestrator.cli.plan import replay_line
from orchestrator.sweep.planner import (
    CODE_VERSION,
    Plan,
    canonical_json,
    config_id,
    plan_sweep,
    replay_groups,
)
from orchestrator.sweep.spec import SweepError, SweepSpec, load_sweep, parse_sweep
from orchestrator.sweep.trial import fit_pool_key

BASE = """\
name: grid
pairs:
  - name: p1
    target: zoo:micro/target
    draft: zoo:micro/draft-m
  - name: p2
    target: zoo:micro/target
    draft: zoo:micro/draft-s
datasets:
  - {name: "builtin:code", samples: 4, max_new_tokens: 16}
  - {name: "builtin:math", samples: 4, max_new_tokens: 16}
temperatures: [0, 0.8]
policies:
  - name: static
  - name: adaedl
    grid: {threshold: [0.2, 0.4, 0.6]}
  - name: svip
    params: {length_cap: 30}
    grid: {threshold: [0.3, 0.5]}
  - name: oracle
max_draft_lens: [4, 8]
seeds: [0, 1]
"""


def _spec(text: str = BASE) -> SweepSpec:
    return parse_sweep(textwrap.dedent(text))


def _plan(text: str = BASE) -> Plan:
    return plan_sweep(_spec(text))


def test_counts_follow_the_grid_formula() -> None:
    plan = _plan()
    pairs, datasets, temperatures, lengths, seeds = 2, 2, 2, 2, 2
    settings_greedy = 1 + 3 + 2 + 1
    settings_sampled = 1 + 3 + 2  # the oracle is greedy-only
    groups = pairs * datasets * seeds
    policy_trials = groups * (settings_greedy + settings_sampled) * lengths
    baselines = pairs * datasets * temperatures * seeds
    assert plan.counts() == {
        "trials": policy_trials + baselines,
        "baselines": baselines,
        "policy_trials": policy_trials,
        "skipped": groups * lengths,
        "jobs": 0,
    }
    assert len({trial.trial_id for trial in plan.trials}) == len(plan.trials)


def test_greedy_only_policy_is_skipped_with_a_reason() -> None:
    plan = _plan()
    assert {
        (t.setting.policy, t.sampling.temperature)
        for t in plan.trials
        if t.setting.policy == "oracle"
    } == {("oracle", 0.0)}
    assert {group.policy for group in plan.skipped} == {"oracle"}
    assert all(group.temperature == 0.8 for group in plan.skipped)
    assert all("greedy-only" in group.reason for group in plan.skipped)
    keys = {(g.pair, g.dataset, g.seed) for g in plan.skipped}
    assert len(keys) == len(plan.skipped) == 2 * 2 * 2  # pairs × datasets × seeds
    assert all(group.n_trials == 2 for group in plan.skipped)  # one setting × two lengths


def test_baselines_one_per_group_and_linked() -> None:
    plan = _plan()
    baselines = {t.trial_id: t for t in plan.trials if t.is_baseline}
    keys = {(t.pair, t.prompts.dataset, t.sampling.temperature, t.seed) for t in baselines.values()}
    assert len(keys) == len(baselines) == 16
    for baseline in baselines.values():
        assert (
            baseline.setting.policy,
            baseline.setting.max_draft_len,
            baseline.setting.params,
        ) == ("ar", 0, ())
        assert baseline.baseline_id is None
    for trial in plan.trials:
        if trial.is_baseline:
            continue
        baseline = baselines[trial.baseline_id]
        assert (
            baseline.pair,
            baseline.prompts.dataset,
            baseline.sampling.temperature,
            baseline.seed,
        ) == (
            trial.pair,
            trial.prompts.dataset,
            trial.sampling.temperature,
            trial.seed,
        )


def test_order_groups_pairs_and_puts_baselines_first() -> None:
    plan = _plan()
    pair_runs = [name for name, _ in itertools.groupby(t.pair for t in plan.trials)]
    assert pair_runs == ["p1", "p2"]
    group_key = lambda t: (t.pair, t.prompts.dataset, t.sampling.temperature, t.seed)  # noqa: E731
    seen_groups = []
    for key, group in itertools.groupby(plan.trials, key=group_key):
        trials = list(group)
        assert trials[0].is_baseline
        assert not any(t.is_baseline for t in trials[1:])
        seen_groups.append(key)
    assert len(seen_groups) == len(set(seen_groups)) == 16


def test_params_have_defaults_and_threshold_column() -> None:
    plan = _plan()
    adaedl = [t for t in plan.trials if t.setting.policy == "adaedl"]
    assert {t.setting.threshold for t in adaedl} == {0.2, 0.4, 0.6}
    assert all(t.setting.params_dict["gamma"] == 0.2 for t in adaedl)
    assert all(t.setting.params_dict["dynamic"] is True for t in adaedl)
    svip = [t for t in plan.trials if t.setting.policy == "svip"]
    assert all(
        t.setting.params_dict == {"threshold": t.setting.threshold, "length_cap": 30} for t in svip
    )
    assert all(
        t.setting.threshold is None
        for t in plan.trials
        if t.setting.policy in ("static", "oracle", "ar")
    )
    assert all(list(t.setting.params) == sorted(t.setting.params) for t in plan.trials)


def test_config_id_is_sha256_of_canonical_json() -> None:
    config = {"b": [1.5, "x"], "a": 1}
    text = '{"a":1,"b":[1.5,"x"]}'
    assert canonical_json(config) == text
    assert config_id(config) == hashlib.sha256(text.encode()).hexdigest()[:16]
    assert config_id({"a": 1, "b": [1.5, "x"]}) == config_id(config)
    with pytest.raises(ValueError):
        canonical_json({"a": float("nan")})


def test_ids_ignore_labels_spelling_and_defaults() -> None:
    ids = {t.trial_id for t in _plan().trials}
    relabelled = (
        BASE.replace("name: grid", "name: other\ndescription: same trials")
        .replace("name: p1", "name: first")
        .replace("[0.2, 0.4, 0.6]", "[0.20, 0.4, 6.0e-1]")
        .replace("temperatures: [0, 0.8]", "temperatures: [0.0, {temperature: 0.80}]")
        .replace("params: {length_cap: 30}", "params: {length_cap: 30.0}")
        .replace("  - name: static\n", "  - {name: static, params: {}}\n")
        .replace("  - name: adaedl\n", "  - name: adaedl\n    params: {gamma: 0.2}\n")
    )
    assert {t.trial_id for t in _plan(relabelled).trials} == ids
    assert all(t.sweep == "other" for t in _plan(relabelled).trials)


def test_ids_change_with_what_is_measured() -> None:
    ids = {t.trial_id for t in _plan().trials}
    for old, new in [
        ("seeds: [0, 1]", "seeds: [2, 3]"),
        ("samples: 4, max_new_tokens: 16", "samples: 5, max_new_tokens: 16"),
        ("samples: 4, max_new_tokens: 16", "samples: 4, max_new_tokens: 17"),
        ("temperatures: [0, 0.8]", "temperatures: [0.1, 0.9]"),
        ("target: zoo:micro/target", "target: {model: zoo:micro/target, dtype: bfloat16}"),
        ("seeds: [0, 1]", "seeds: [0, 1]\nexecution: {warmup_samples: 2}"),
    ]:
        changed = BASE.replace(old, new)
        assert changed != BASE
        assert ids.isdisjoint(t.trial_id for t in _plan(changed).trials), new


def test_changing_one_pairs_draft_changes_only_its_trials() -> None:
    plan = _plan()
    changed = _plan(BASE.replace("draft: zoo:micro/draft-s", "draft: zoo:micro/draft-m"))
    p1_ids = {t.trial_id for t in plan.trials if t.pair == "p1"}
    p2_ids = {t.trial_id for t in plan.trials if t.pair == "p2"}
    assert {t.trial_id for t in changed.trials if t.pair == "p1"} == p1_ids
    assert p2_ids.isdisjoint(t.trial_id for t in changed.trials if t.pair == "p2")


def test_greedy_ignores_top_k_and_duplicates_are_dropped() -> None:
    plan = _plan()
    duplicated = BASE.replace(
        "temperatures: [0, 0.8]", "temperatures: [0, {temperature: 0, top_k: 50}, 0.8, 0.80]"
    ).replace("max_draft_lens: [4, 8]", "max_draft_lens: [4, 8, 4]")
    assert [t.trial_id for t in _plan(duplicated).trials] == [t.trial_id for t in plan.trials]
    assert _plan(duplicated).skipped == plan.skipped


def test_top_k_matters_when_sampling() -> None:
    both = _plan(BASE.replace("[0, 0.8]", "[0.8, {temperature: 0.8, top_k: 50}]"))
    plain = _plan(BASE.replace("[0, 0.8]", "[0.8]"))
    sampled = [t for t in both.trials if t.setting.policy == "static" and t.sampling.top_k == 50]
    assert len(sampled) == 2 * 2 * 2 * 2  # pairs × datasets × lengths × seeds
    assert len(both.trials) == 2 * len(plain.trials)


JOBS = """\
name: kd
pairs:
  - name: distilled
    target: zoo:micro/target
    draft: {job: kd_draft}
datasets: ["builtin:code"]
temperatures: [0]
policies:
  - {name: static}
  - {name: specdecpp, job: head, grid: {threshold: [0.5, 0.7]}}
max_draft_lens: [4]
training_jobs:
  - {name: kd_draft, kind: distillspec, base: zoo:micro/draft-s, teacher: zoo:micro/target,
     dataset: "builtin:code", epochs: 1, config: {divergence: forward_kl}}
  - {name: head, kind: specdecpp_head, base: zoo:micro/draft-s, teacher: zoo:micro/target,
     dataset: {name: "builtin:code", samples: 32}}
"""


def test_jobs_and_requirements() -> None:
    plan = _plan(JOBS)
    jobs = {job.name: job for job in plan.jobs}
    assert set(jobs) == {"kd_draft", "head"}
    assert jobs["kd_draft"].config == {"divergence": "forward_kl"}
    assert jobs["head"].samples == 32
    for trial in plan.trials:
        expected = ("kd_draft", "head") if trial.setting.policy == "specdecpp" else ("kd_draft",)
        assert trial.requires_jobs == expected
        assert trial.job_ids == tuple(jobs[name].job_id for name in expected)
        assert trial.served.draft is None and trial.served.draft_job == "kd_draft"
    assert len(plan.trials) == 1 + 1 + 2


def test_job_config_changes_job_and_trial_ids() -> None:
    plan = _plan(JOBS)
    changed = _plan(JOBS.replace("divergence: forward_kl", "divergence: reverse_kl"))
    assert plan.jobs[0].job_id != changed.jobs[0].job_id
    assert plan.jobs[1].job_id == changed.jobs[1].job_id
    old_ids = {t.trial_id for t in plan.trials}
    assert old_ids.isdisjoint(t.trial_id for t in changed.trials)
    renamed = _plan(JOBS.replace("kd_draft", "teacher_copy"))
    assert {t.trial_id for t in renamed.trials} == old_ids


def test_resources_per_pair() -> None:
    text = BASE.replace(
        "  - name: p2\n    target: zoo:micro/target\n",
        "  - name: p2\n"
        "    target: {model: zoo:micro/target, backend: deepspeed, tp_size: 2, gpus: 1}\n",
    ).replace("draft: zoo:micro/draft-s", "draft: {model: zoo:micro/draft-s, gpus: 0.5}")
    resources = {r.pair: r for r in _plan(text).resources()}
    assert (resources["p1"].cpus, resources["p1"].gpus) == (2, 0.0)
    p2 = resources["p2"]
    assert (p2.backend, p2.target_actors, p2.gpus_per_target_actor) == ("deepspeed", 2, 1.0)
    assert (p2.cpus, p2.gpus, p2.draft_gpus) == (3, 2 * 1.0 + 0.5, 0.5)


def test_demo_sweep_plan() -> None:
    spec = load_sweep(REPO / "sweeps" / "demo.yaml")
    plan = plan_sweep(spec)
    counts = plan.counts()
    # Greedy, per draft kind: static, hf_heuristic, beta_ts, cali_ts, specdecpp, oracle once,
    # max_confidence and adaedl with 3 thresholds, svip with 4 = 16 settings x 4 caps on the
    # draft model and on the EAGLE head, and ngram_match x 4 caps more on the lookup; two live
    # checks per kind. At 0.7: static K 1 and AdaEDL at 4 on the draft model only. Per dataset.
    assert counts["policy_trials"] == 2 * (2 * (16 * 4 + 2) + (17 * 4 + 2) + 2)
    assert counts["baselines"] == 2 * 3  # the EAGLE head's worker pair runs greedy only
    live = [t for t in plan.trials if t.mode == "live"]
    assert len(live) == 2 * (3 + 3 * 2 + 2)  # AR (2 greedy, 1 at 0.7), checks, sampled trials
    sampled = {(t.served.draft_kind, t.setting.policy) for t in live if t.sampling.temperature}
    assert sampled == {("lm", "ar"), ("lm", "static"), ("lm", "adaedl")}
    assert all(dataset.holdout is not None for dataset in spec.datasets)
    assert not [
        t for t in plan.trials if t.setting.policy == "specdecpp" and t.sampling.temperature > 0
    ]
    assert all(t.code_version == CODE_VERSION for t in plan.trials)


CHAINED = JOBS.replace(
    "  - {name: head, kind: specdecpp_head, base: zoo:micro/draft-s,",
    "  - {name: head, kind: specdecpp_head, base: 'job:kd_draft',",
)


def test_a_job_on_another_jobs_draft_comes_after_it_and_inherits_its_identity() -> None:
    # Listed head-first, planned upstream-first.
    reordered = CHAINED.replace("training_jobs:\n", "training_jobs:\n  - HEAD\n")
    lines = reordered.splitlines()
    head_start = next(i for i, line in enumerate(lines) if "name: head," in line)
    head = lines[head_start : head_start + 2]
    del lines[head_start : head_start + 2]
    marker = lines.index("  - HEAD")
    lines[marker : marker + 1] = head
    plan = _plan("\n".join(lines) + "\n")
    assert [job.name for job in plan.jobs] == ["kd_draft", "head"]
    assert plan.jobs[1].base == "job:kd_draft"
    changed = _plan(CHAINED.replace("divergence: forward_kl", "divergence: tvd"))
    assert changed.jobs[1].job_id != plan.jobs[1].job_id  # the upstream draft changed
    assert _plan(CHAINED).jobs[1].job_id == plan.jobs[1].job_id  # listing order is not identity


def test_policy_pairs_restrict_a_policy_to_its_pairs() -> None:
    text = JOBS.replace(
        "  - {name: specdecpp, job: head, grid: {threshold: [0.5, 0.7]}}",
        "  - {name: specdecpp, job: head, grid: {threshold: [0.5, 0.7]}, pairs: [zoo]}",
    ).replace(
        "    draft: {job: kd_draft}\n",
        "    draft: {job: kd_draft}\n"
        "  - {name: zoo, target: zoo:micro/target, draft: zoo:micro/draft-s}\n",
    )
    plan = _plan(text)
    by_pair = {
        pair: sorted(t.setting.policy for t in plan.trials if t.pair == pair)
        for pair in ("distilled", "zoo")
    }
    assert by_pair == {
        "distilled": ["ar", "static"],
        "zoo": ["ar", "specdecpp", "specdecpp", "static"],
    }


def test_policy_temperatures_restrict_a_policy_to_those_temperatures() -> None:
    text = BASE.replace(
        "  - name: adaedl\n    grid: {threshold: [0.2, 0.4, 0.6]}\n",
        "  - name: adaedl\n    grid: {threshold: [0.2, 0.4, 0.6]}\n    temperatures: [0]\n"
        "  - name: adaedl\n    grid: {threshold: [0.4]}\n    temperatures: [0.8]\n",
    )
    plan = _plan(text)
    thresholds = {
        temperature: sorted(
            {
                t.setting.threshold
                for t in plan.trials
                if t.setting.policy == "adaedl" and t.sampling.temperature == temperature
            }
        )
        for temperature in (0.0, 0.8)
    }
    assert thresholds == {0.0: [0.2, 0.4, 0.6], 0.8: [0.4]}
    unrestricted = {t.trial_id for t in _plan().trials if t.setting.policy != "adaedl"}
    assert unrestricted == {t.trial_id for t in plan.trials if t.setting.policy != "adaedl"}
    with pytest.raises(SweepError, match=r"no temperature 0.5"):
        _spec(BASE.replace("  - name: static\n", "  - name: static\n    temperatures: [0.5]\n"))


def test_policy_max_draft_lens_replace_the_sweeps_for_that_entry() -> None:
    text = BASE.replace("  - name: static\n", "  - name: static\n    max_draft_lens: [2, 16, 2]\n")
    plan = _plan(text)
    caps = {t.setting.max_draft_len for t in plan.trials if t.setting.policy == "static"}
    assert caps == {2, 16}
    assert {t.setting.max_draft_len for t in plan.trials if t.setting.policy == "adaedl"} == {4, 8}
    assert plan.counts()["trials"] == _plan().counts()["trials"]  # 2 caps instead of 2 caps
    assert _spec(text).grid_size() == _spec().grid_size()
    with pytest.raises(SweepError):
        _spec(BASE.replace("  - name: static\n", "  - name: static\n    max_draft_lens: []\n"))


NGRAM_PAIR = """\
  - name: p3
    target: zoo:micro/target
    draft: {kind: ngram, n_max: 4}
datasets:"""


def test_an_ngram_draft_is_its_own_pair_and_leaves_the_lm_ids_unchanged() -> None:
    plan = _plan()
    with_lookup = _plan(BASE.replace("datasets:", NGRAM_PAIR, 1))
    explicit = _plan(
        BASE.replace("draft: zoo:micro/draft-s", "draft: {kind: lm, model: zoo:micro/draft-s}")
    )
    lm_ids = [t.trial_id for t in plan.trials]
    assert [t.trial_id for t in explicit.trials] == lm_ids
    assert [t.trial_id for t in with_lookup.trials if t.pair != "p3"] == lm_ids
    lookup = [t for t in with_lookup.trials if t.pair == "p3"]
    assert lookup and all(t.served.draft_kind == "ngram" and t.served.draft is None for t in lookup)
    assert dict(lookup[0].served.draft_settings) == {"n_max": 4, "n_min": 1, "window": None}
    assert {t.trial_id for t in lookup}.isdisjoint(lm_ids)
    assert {t.served.draft_kind for t in plan.trials} == {"lm"}


EAGLE_PAIRS = """\
  - name: e1
    target: zoo:micro/target
    draft: {kind: eagle, model: zoo:micro/eagle}
  - name: e2
    target: zoo:micro/target
    draft: {kind: eagle, model: /heads/other}
  - name: e3
    target: zoo:micro/target
    draft: {kind: eagle, job: head}
datasets:"""

EAGLE_JOB = """\
training_jobs:
  - {name: head, kind: eagle_head, base: zoo:micro/target, dataset: "builtin:code"}
"""


def test_an_eagle_draft_is_its_own_pair_identified_by_its_head() -> None:
    """An EAGLE head's trials carry its kind and its model (or job) in their ids; the draft
    models' ids do not move, and an ``eagle_head`` job needs no teacher."""
    plan = _plan()
    with_heads = _plan(BASE.replace("datasets:", EAGLE_PAIRS, 1) + EAGLE_JOB)
    lm_ids = [t.trial_id for t in plan.trials]
    assert [t.trial_id for t in with_heads.trials if t.pair in ("p1", "p2")] == lm_ids
    heads = {pair: [t for t in with_heads.trials if t.pair == pair] for pair in ("e1", "e2", "e3")}
    assert all(heads.values())
    first = heads["e1"][0].served
    assert (first.draft_kind, first.draft, first.draft_settings) == ("eagle", "zoo:micro/eagle", ())
    identity = first.identity()
    assert identity["draft_kind"] == "eagle" and identity["draft"] == "zoo:micro/eagle"
    made = heads["e3"][0].served
    assert (made.draft, made.draft_job, made.draft_kind) == (None, "head", "eagle")
    assert made.draft_job_id == with_heads.jobs[0].job_id
    ids = [{t.trial_id for t in trials} for trials in heads.values()]
    assert all(a.isdisjoint(b) for a, b in itertools.combinations([*ids, set(lm_ids)], 2))


def test_eagle_pairs_replay_in_a_mixed_sweep_as_draft_models_do() -> None:
    """Greedy trials of an EAGLE pair replay (live checks and baselines live), sampled ones run
    live; each head has its own traces; the plan's replay line counts the kinds."""
    text = BASE.replace("datasets:", EAGLE_PAIRS, 1) + EAGLE_JOB
    plan = plan_sweep(_spec(text + "execution: {mode: mixed, record_rounds: true}\n"))
    eagle = [t for t in plan.trials if t.served.draft_kind == "eagle"]
    greedy = [t for t in eagle if t.sampling.temperature == 0 and not t.is_baseline]
    assert {t.mode for t in eagle if t.sampling.temperature > 0} == {"live"}
    assert {(t.is_check, t.mode) for t in greedy} == {(True, "live"), (False, "replay")}
    groups = replay_groups(plan)
    by_kind = {
        kind: {g.trace_key for g in groups if g.trials[0].served.draft_kind == kind}
        for kind in ("lm", "eagle")
    }
    assert len(by_kind["eagle"]) == 3 * 2  # pairs × datasets (a greedy trace has no seed)
    assert by_kind["lm"] and by_kind["lm"].isdisjoint(by_kind["eagle"])
    replayed = [t for t in plan.trials if t.mode == "replay"]
    n_eagle = sum(t.served.draft_kind == "eagle" for t in replayed)
    live = len(plan.trials) - len(replayed)
    baselines = sum(t.is_baseline for t in plan.trials)
    checks = sum(t.is_check for t in plan.trials)
    sampled = sum(t.sampling.temperature > 0 and not t.is_baseline for t in plan.trials)
    assert replay_line(plan) == (
        f"mode replay: {len(replayed)} trials replayed from greedy traces (by draft kind: "
        f"eagle {n_eagle}, lm {len(replayed) - n_eagle}), {live} run live ({baselines} AR "
        f"baselines, {checks} live checks, {sampled} that do not replay)"
    )
    assert replay_line(_plan(text)) == ""


def test_every_kind_of_a_drafts_list_replays_with_its_own_traces_and_fit_pool() -> None:
    listed = BASE.replace(
        "    draft: zoo:micro/draft-s\n",
        "    drafts: [zoo:micro/draft-s, {kind: ngram}, {kind: eagle, model: zoo:micro/eagle}]\n",
    )
    assert listed != BASE
    plan = _plan(listed + "execution: {mode: mixed, record_rounds: true}\n")
    groups = [g for g in replay_groups(plan) if g.trials[0].pair.startswith("p2")]
    kinds = {g.trials[0].served.draft_kind for g in groups}
    assert kinds == {"lm", "ngram", "eagle"}
    for kind in kinds:
        mine = [g for g in groups if g.trials[0].served.draft_kind == kind]
        others = [g for g in groups if g.trials[0].served.draft_kind != kind]
        assert {g.trace_key for g in mine}.isdisjoint(g.trace_key for g in others)
        pools = {fit_pool_key(t) for g in mine for t in g.pool}
        assert pools and pools.isdisjoint(fit_pool_key(t) for g in others for t in g.pool)


@pytest.mark.parametrize(
    "pair,message",
    [
        ("draft: {kind: eagle, job: kd}", "job 'kd' is a distillspec job; this needs eagle_head"),
        ("draft: {job: head}", "job 'head' is a eagle_head job; this needs adaspec"),
    ],
)
def test_a_draft_job_must_make_what_the_kind_drafts_with(pair: str, message: str) -> None:
    jobs = EAGLE_JOB + (
        "  - {name: kd, kind: distillspec, base: zoo:micro/draft-s, teacher: zoo:micro/target,"
        ' dataset: "builtin:code"}\n'
    )
    with pytest.raises(SweepError, match=message):
        _spec(BASE.replace("draft: zoo:micro/draft-s", pair) + jobs)


@pytest.mark.parametrize(
    "draft,message",
    [
        ("{kind: ngram, model: zoo:micro/draft-s}", "has no 'model' or 'job'"),
        ("{kind: ngram, n_max: 1, n_min: 2}", "n_min"),
        ("{model: zoo:micro/draft-s, n_max: 5}", "kind: ngram"),
        ("{kind: medusa}", "kind"),
        ("{kind: eagle}", "exactly one of the EAGLE head's 'model'"),
        ("{kind: eagle, model: heads/e, job: e}", "exactly one of the EAGLE head's 'model'"),
        ("{kind: eagle, model: heads/e, window: 8}", "kind: ngram"),
    ],
)
def test_bad_draft_kinds_name_the_field(draft: str, message: str) -> None:
    with pytest.raises(SweepError, match=message):
        _spec(BASE.replace("draft: zoo:micro/draft-s", f"draft: {draft}"))


def _with_drafts(drafts: str) -> str:
    """Return BASE with pair p1's ``draft`` replaced by the ``drafts`` list ``drafts``."""
    return BASE.replace("draft: zoo:micro/draft-m", f"drafts: {drafts}", 1)


def test_a_pair_with_several_drafts_plans_each_with_its_single_draft_ids() -> None:
    """``drafts`` is the draft as a sweep axis: each draft's trials have the ids a pair of that
    draft alone would give them, so committed single-draft ids stay valid."""
    single = _plan()
    lookup_alone = _plan(BASE.replace("draft: zoo:micro/draft-m", "draft: {kind: ngram}", 1))
    several = _plan(_with_drafts("[zoo:micro/draft-m, {kind: ngram}]"))
    ids = {t.trial_id for t in several.trials}
    assert {t.trial_id for t in single.trials} <= ids
    lookup_ids = {t.trial_id for t in lookup_alone.trials if t.pair == "p1" and not t.is_baseline}
    assert lookup_ids <= ids
    kinds = {t.served.draft_kind for t in several.trials if t.pair == "p1"}
    assert kinds == {"lm", "ngram"}
    assert [p.name for p in several.pairs] == ["p1", "p2"]


def test_a_lookup_draft_shares_the_first_drafts_ar_baseline_and_group() -> None:
    """The lookup's arms join the first draft's worker pair and its one AR baseline per
    (dataset, temperature, seed): the runner's groups (by baseline id) interleave them."""
    plan = _plan(_with_drafts("[zoo:micro/draft-m, {kind: ngram, n_max: 4}]"))
    p1 = [t for t in plan.trials if t.pair == "p1"]
    baselines = {t.trial_id: t for t in p1 if t.is_baseline}
    assert len(baselines) == 2 * 2 * 2  # datasets × temperatures × seeds: one per cell
    assert {b.served.draft for b in baselines.values()} == {"zoo:micro/draft-m"}
    lookup = [t for t in p1 if t.served.draft_kind == "ngram"]
    assert lookup and all(t.baseline_id in baselines for t in lookup)
    for baseline_id in baselines:
        arms = {t.served.draft_kind for t in p1 if t.baseline_id == baseline_id}
        assert arms == {"lm", "ngram"}


def test_a_second_draft_model_runs_on_its_own_worker_pair_with_its_own_baseline() -> None:
    """A further draft model needs its own draft actor (a group shard runs on one), so its
    trials are worker pair ``p1~1`` with their own AR baseline, ids as a pair of it alone."""
    plan = _plan(_with_drafts("[zoo:micro/draft-m, zoo:micro/draft-xs]"))
    alone = _plan(BASE.replace("draft: zoo:micro/draft-m", "draft: zoo:micro/draft-xs", 1))
    second = [t for t in plan.trials if t.pair == "p1~1"]
    assert [t.trial_id for t in second] == [t.trial_id for t in alone.trials if t.pair == "p1"]
    assert {t.served.draft for t in second} == {"zoo:micro/draft-xs"}
    assert [p.name for p in plan.pairs] == ["p1", "p1~1", "p2"]
    assert plan.pairs[1].draft is not None and plan.pairs[1].draft.model == "zoo:micro/draft-xs"


def test_policy_pair_restrictions_name_the_sweeps_pair_for_every_draft() -> None:
    text = _with_drafts("[zoo:micro/draft-m, zoo:micro/draft-xs, {kind: ngram}]").replace(
        "  - name: oracle\n", "  - name: oracle\n    pairs: [p1]\n"
    )
    plan = _plan(text)
    oracle = {(t.pair, t.served.draft_kind) for t in plan.trials if t.setting.policy == "oracle"}
    assert oracle == {("p1", "lm"), ("p1~1", "lm"), ("p1", "ngram")}


def test_policy_draft_kind_restrictions_keep_a_policy_to_those_kinds() -> None:
    """``draft_kinds: [lm]`` runs the entry on the pair's draft models only, the lookup keeping
    every other entry; the ids of what runs are those of the unrestricted plan."""
    text = _with_drafts("[zoo:micro/draft-m, {kind: ngram}]")
    restricted = text.replace("  - name: oracle\n", "  - name: oracle\n    draft_kinds: [lm]\n")
    full, plan = _plan(text), _plan(restricted)
    oracle = {(t.pair, t.served.draft_kind) for t in plan.trials if t.setting.policy == "oracle"}
    assert oracle == {("p1", "lm"), ("p2", "lm")}
    dropped = {t.trial_id for t in full.trials} - {t.trial_id for t in plan.trials}
    assert dropped and all(
        t.setting.policy == "oracle" and t.served.draft_kind == "ngram"
        for t in full.trials
        if t.trial_id in dropped
    )


def test_a_draft_kind_restriction_names_a_kind_the_sweep_has() -> None:
    text = BASE.replace("  - name: oracle\n", "  - name: oracle\n    draft_kinds: [ngram]\n")
    with pytest.raises(
        SweepError, match=r"policies\[3\]\.draft_kinds\[0\]: no draft of kind 'ngram'"
    ):
        _spec(text)


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        (
            "draft: zoo:micro/draft-m\n    drafts: [{kind: ngram}]",
            "pairs[0].drafts: give 'draft' (one draft) or 'drafts' (a list of drafts), not both",
        ),
        ("drafts: []", "pairs[0].drafts"),
        ("drafts: [{kind: ngram}, {kind: ngram, n_max: 3}]", "drafts[1]: the same draft as"),
        ("drafts: [{kind: ngram, model: x}]", "pairs[0].drafts[0]"),
        ("drafts: [zoo:micro/draft-m, {job: nope}]", "pairs[0].drafts[1].job: no training job"),
    ],
)
def test_bad_draft_lists_name_the_field(pair: str, message: str) -> None:
    with pytest.raises(SweepError) as caught:
        _spec(BASE.replace("draft: zoo:micro/draft-m", pair, 1))
    assert message in str(caught.value)


def test_a_pair_without_draft_or_drafts_is_refused() -> None:
    with pytest.raises(SweepError, match="pairs\\[0\\]: needs 'draft'"):
        _spec(BASE.replace("    draft: zoo:micro/draft-m\n", "", 1))


def test_the_grid_size_counts_every_draft() -> None:
    assert _spec(_with_drafts("[zoo:micro/draft-m, {kind: ngram}]")).grid_size() == (
        _spec().grid_size() * 3 // 2
    )


def test_a_lookup_only_policy_is_skipped_for_the_draft_models_of_a_pair() -> None:
    plan = _plan(
        _with_drafts("[zoo:micro/draft-m, {kind: ngram}]").replace(
            "  - name: oracle\n", "  - name: oracle\n  - name: ngram_match\n"
        )
    )
    ran = {(t.pair, t.served.draft_kind) for t in plan.trials if t.setting.policy == "ngram_match"}
    assert ran == {("p1", "ngram")}
    skipped = [g for g in plan.skipped if g.policy == "ngram_match"]
    assert {(g.pair, g.draft) for g in skipped} == {
        ("p1", "zoo:micro/draft-m"),
        ("p2", "zoo:micro/draft-s"),
    }
    assert all("reads match_length, which only ngram drafts show" in g.reason for g in skipped)


def test_lookup_drafts_replay_in_replay_and_mixed_sweeps_with_their_own_checks() -> None:
    """A lookup's greedy trials replay (a lookup trace serves every policy), with live checks
    of their own: the lookup's cost fit is its own group, apart from the first draft's."""
    text = _with_drafts("[zoo:micro/draft-m, {kind: ngram}]").replace(
        "temperatures: [0, 0.8]", "temperatures: [0]"
    )
    for mode in ("replay", "mixed"):
        plan = _plan(
            text.replace("seeds: [0, 1]\n", f"seeds: [0, 1]\nexecution: {{mode: {mode}}}\n")
        )
        lookup = [t for t in plan.trials if t.served.draft_kind == "ngram"]
        assert {t.mode for t in lookup if not t.is_check} == {"replay"}, mode
        assert any(t.is_check for t in lookup), mode
        groups = replay_groups(plan)
        kinds = [{t.served.draft_kind for t in g.replayed} for g in groups]
        assert {"ngram"} in kinds and {"lm"} in kinds
        assert all(len(k) == 1 for k in kinds)  # one kind per fit group
