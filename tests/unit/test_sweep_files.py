"""Every ``sweeps/*.yaml`` validates, plans to the size its grid implies, waits for the training
jobs it names and fits the hardware it declares; the seed papers' sweeps match docs/methods.md.

A sweep file declares its hardware in a comment line ``# hardware: N node(s) x G GPU(s)``; a
file without one must run on CPU (0 GPUs).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import REPO

from orchestrator.cli import main as cli_main
from orchestrator.sweep.planner import KIND_FEATURES, REPLAYABLE_KINDS, Plan, Trial, plan_sweep
from orchestrator.sweep.spec import SweepSpec, check_local_paths, load_sweep
from policies import POLICIES

#: Table 1's policies: every registered one but batch_schedule, a batch-level K schedule that
#: only batched decoding (not Table 1's batch 1) gives a meaning.
PER_REQUEST_POLICIES = set(POLICIES) - {"batch_schedule"}

SWEEP_FILES = sorted((REPO / "sweeps").glob("*.yaml"))
HARDWARE_LINE = re.compile(r"^#\s*hardware:\s*(\d+)\s+nodes?\s+x\s+(\d+)\s+GPUs?\s*$", re.MULTILINE)
GPU_TOLERANCE = 1e-9


@dataclass(frozen=True)
class DeclaredHardware:
    """The machines a sweep file says it is sized for."""

    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class PlannedSweep:
    """A sweep file as raw YAML, as a validated spec and as a plan."""

    raw: dict[str, Any]
    spec: SweepSpec
    plan: Plan


@functools.cache
def planned(path: Path) -> PlannedSweep:
    """Return the file parsed three ways (cached: table1 expands to ~11k trials)."""
    spec = load_sweep(path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return PlannedSweep(raw=raw, spec=spec, plan=plan_sweep(spec))


def declared_hardware(text: str) -> DeclaredHardware:
    """Return the ``# hardware:`` declaration of a sweep file (CPU only when there is none)."""
    match = HARDWARE_LINE.search(text)
    if match is None:
        return DeclaredHardware(nodes=1, gpus_per_node=0)
    return DeclaredHardware(nodes=int(match.group(1)), gpus_per_node=int(match.group(2)))


def raw_temperature(entry: Any) -> float:
    """Return the temperature of a raw ``temperatures`` entry (bare number or mapping)."""
    return float(entry) if isinstance(entry, int | float) else float(entry["temperature"])


def raw_grid_size(policy: dict[str, Any]) -> int:
    """Return how many settings a raw policy entry's grid has (1 without a grid)."""
    return math.prod(len(values) for values in (policy.get("grid") or {}).values())


def raw_model(entry: Any) -> dict[str, Any]:
    """Return a raw pair ``target``/``draft`` as a mapping (a bare string is a model ref)."""
    return {"model": entry} if isinstance(entry, str) else entry


#: Live checks per replaying group when a sweep names none (static at half and at the largest
#: max draft length, AdaEDL, Beta-TS; distinct when the largest is at least 2).
DEFAULT_CHECKS = 4


def raw_drafts(pair: dict[str, Any]) -> list[dict[str, Any]]:
    """Return a raw pair's drafts as mappings (``drafts``, else its one ``draft``)."""
    return [raw_model(entry) for entry in pair.get("drafts") or [pair["draft"]]]


def policy_count(policy: dict[str, Any], raw: dict[str, Any], kind: str, temperature: float):
    """Return (run, skipped) trials of one raw policy entry on a draft of ``kind``, or None
    where its ``draft_kinds`` or ``temperatures`` leave it out (not planned, not skipped)."""
    if temperature not in policy.get("temperatures", [temperature]):
        return None
    if kind not in policy.get("draft_kinds", [kind]):
        return None
    trials = raw_grid_size(policy) * len(set(policy.get("max_draft_lens", raw["max_draft_lens"])))
    policy_class = POLICIES[policy["name"]]
    features = policy_class.features if isinstance(policy_class.features, frozenset) else set()
    foreign = any(f in features and KIND_FEATURES[f] != kind for f in KIND_FEATURES)
    skipped = (policy_class.greedy_only and temperature > 0) or foreign
    return (0, trials) if skipped else (trials, 0)


def checks_per_group(named: Any, kind: str) -> int:
    """Return the live checks of one replaying group whose draft is of ``kind``: one per
    ``live_check`` entry whose ``draft_kinds`` (if it names any) hold ``kind``, four when the
    sweep names none."""
    if not named:
        return DEFAULT_CHECKS
    entries = named if isinstance(named, list) else [named]
    return sum(kind in entry.get("draft_kinds", [kind]) for entry in entries)


def expected_counts(raw: dict[str, Any]) -> dict[str, int]:
    """Return baselines, policy trials and skipped trials by the grid formula, from raw YAML.

    policy trials = Σ over pairs and their drafts of datasets x seeds x Σ over temperatures of
    the settings x max draft lens of the policies run on that draft at that temperature (a
    policy's ``pairs``, ``draft_kinds`` and ``temperatures`` lists restrict it, its
    ``max_draft_lens`` replace the sweep's; greedy-only policies only at temperature 0, a policy
    reading a feature of another kind skipped), plus in ``mode: replay`` the live check trials
    per baseline and replayable draft (``mode: mixed``: per greedy one): one per ``live_check``
    entry on that draft's kind, four when it is left out. One AR baseline per (worker pair,
    dataset, temperature, seed) where that worker pair runs a trial: a pair's first draft and
    its lookups share one, each further draft model has its own.
    """
    cells = len(raw["datasets"]) * len(raw.get("seeds", [0]))
    temperatures = [raw_temperature(entry) for entry in raw["temperatures"]]
    mode = raw.get("execution", {}).get("mode")
    named = raw.get("execution", {}).get("live_check")
    run = skipped = baselines = checks = 0
    for pair in raw["pairs"]:
        for members, temperature in itertools.product(worker_drafts(pair), temperatures):
            measured = 0
            for draft in members:
                kind = draft.get("kind", "lm")
                if kind in REPLAYABLE_KINDS and mode in ("replay", "mixed"):
                    per_group = checks_per_group(named, kind) * (
                        mode == "replay" or temperature == 0
                    )
                    checks, measured = checks + per_group, measured + per_group
                for policy in raw["policies"]:
                    if pair["name"] not in policy.get("pairs", [pair["name"]]):
                        continue
                    counted = policy_count(policy, raw, kind, temperature)
                    if counted is not None:
                        run, skipped = run + counted[0], skipped + counted[1]
                        measured += counted[0]
            baselines += measured > 0
    return {
        "baselines": cells * baselines,
        "policy_trials": cells * (run + checks),
        "skipped": cells * skipped,
    }


def worker_drafts(pair: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Return a raw pair's drafts by the worker pair that runs them: its first draft with its
    lookups, then each further draft model alone."""
    drafts = raw_drafts(pair)
    further = drafts[1:]
    first = [drafts[0], *(d for d in further if d.get("kind", "lm") == "ngram")]
    return [first, *([d] for d in further if d.get("kind", "lm") != "ngram")]


def fits(demands: list[float], hardware: DeclaredHardware) -> bool:
    """Return whether each demand fits one node, placed first-fit by decreasing size."""
    free = [float(hardware.gpus_per_node)] * hardware.nodes
    for demand in sorted(demands, reverse=True):
        node = next((i for i, left in enumerate(free) if demand <= left + GPU_TOLERANCE), None)
        if node is None:
            return False
        free[node] -= demand
    return True


sweep_files = pytest.mark.parametrize("path", SWEEP_FILES, ids=[p.name for p in SWEEP_FILES])


def test_the_sweeps_directory_holds_the_paper_sweeps() -> None:
    names = {path.name for path in SWEEP_FILES}
    assert {"demo.yaml", "table1.yaml", *PUBLISHED} <= names


@sweep_files
def test_file_validates_and_plans(path: Path) -> None:
    sweep = planned(path)
    assert sweep.spec.name == sweep.raw["name"]
    assert sweep.plan.sweep == sweep.raw["name"]
    assert sweep.plan.trials
    assert check_local_paths(sweep.spec) == []


@sweep_files
def test_trial_count_follows_the_grid_formula(path: Path) -> None:
    sweep = planned(path)
    expected = expected_counts(sweep.raw)
    counts = sweep.plan.counts()
    assert counts["baselines"] == expected["baselines"]
    assert counts["policy_trials"] == expected["policy_trials"]
    assert counts["skipped"] == expected["skipped"]
    assert counts["trials"] == expected["baselines"] + expected["policy_trials"]
    assert counts["jobs"] == len(sweep.raw.get("training_jobs", []))
    assert len({trial.trial_id for trial in sweep.plan.trials}) == counts["trials"]


@sweep_files
def test_trials_depend_on_the_jobs_they_name(path: Path) -> None:
    sweep = planned(path)
    job_ids = {job.name: job.job_id for job in sweep.plan.jobs}
    assert set(job_ids) == {job["name"] for job in sweep.raw.get("training_jobs", [])}
    draft_job = {p["name"]: raw_drafts(p)[0].get("job") for p in sweep.raw["pairs"]}
    for pair, raw in zip(sweep.spec.pairs, sweep.raw["pairs"], strict=True):
        for index, draft in enumerate(raw_drafts(raw)):  # a further model: its own worker pair
            draft_job.setdefault(pair.worker_name(index), draft.get("job"))
    policy_jobs: dict[str, set[str | None]] = {}
    for policy in sweep.raw["policies"]:
        policy_jobs.setdefault(policy["name"], set()).add(policy.get("job"))
    for trial in sweep.plan.trials:
        needed = [draft_job[trial.pair]]
        assert trial.served.draft_job == draft_job[trial.pair]
        lookup = trial.served.draft_kind == "ngram"
        assert (trial.served.draft is None) == (lookup or draft_job[trial.pair] is not None)
        if not trial.is_baseline:
            assert trial.setting.job in policy_jobs[trial.setting.policy]
            needed.append(trial.setting.job)
        names = tuple(name for name in needed if name is not None)
        assert trial.requires_jobs == names
        assert trial.job_ids == tuple(job_ids[name] for name in names)
    used = {name for trial in sweep.plan.trials for name in trial.requires_jobs}
    assert used == set(job_ids), "every training job is needed by some trial"


@sweep_files
def test_pairs_fit_the_declared_hardware(path: Path) -> None:
    sweep = planned(path)
    hardware = declared_hardware(path.read_text(encoding="utf-8"))
    resources = {r.pair: r for r in sweep.plan.resources()}
    demands = []
    for pair in sweep.raw["pairs"]:
        target, draft = raw_model(pair["target"]), raw_drafts(pair)[0]
        ranks = target.get("tp_size", 1)
        demand = ranks * target.get("gpus", 0.0) + draft.get("gpus", 0.0)
        planned_pair = resources[pair["name"]]
        assert planned_pair.target_actors == ranks
        assert planned_pair.cpus == ranks + 1
        assert planned_pair.gpus == pytest.approx(demand)
        assert fits([demand], hardware), f"{pair['name']} needs {demand} GPUs on one node"
        demands.append(demand)
    concurrent = sorted(demands, reverse=True)[: sweep.spec.execution.max_concurrent_pairs]
    assert fits(concurrent, hardware), f"{concurrent} concurrent GPU groups on {hardware}"


def test_fit_check_rejects_what_does_not_fit() -> None:
    node8 = DeclaredHardware(nodes=1, gpus_per_node=8)
    assert fits([5.0, 2.0], node8)
    assert not fits([5.0, 5.0], node8)
    assert fits([5.0, 5.0], DeclaredHardware(nodes=2, gpus_per_node=8))
    assert fits([2 * 0.9 + 0.2], DeclaredHardware(nodes=1, gpus_per_node=2))
    assert not fits([0.5], declared_hardware("# no declaration"))
    assert declared_hardware("x\n# hardware: 2 nodes x 8 GPUs\n") == DeclaredHardware(2, 8)


TABLE1_FILES = ("table1.yaml", "table1_sampled.yaml")


@pytest.mark.parametrize("name", TABLE1_FILES)
def test_table1_target_group_is_a_tp4_deepspeed_70b_on_4_nodes_of_8_gpus(name: str) -> None:
    path = REPO / "sweeps" / name
    sweep = planned(path)
    assert declared_hardware(path.read_text(encoding="utf-8")) == DeclaredHardware(4, 8)
    for pair in sweep.spec.pairs:
        target = pair.target
        assert (target.model, target.backend, target.tp_size, target.dtype, target.gpus) == (
            "meta-llama/Llama-2-70b-chat-hf",
            "deepspeed",
            4,
            "float16",
            1.0,
        )
    drafts = {pair.draft.model or pair.draft.job for pair in sweep.spec.pairs}
    jobs = {job.name: job for job in sweep.spec.training_jobs}
    assert "meta-llama/Llama-2-7b-chat-hf" in drafts
    kd_kinds = {jobs[name].kind for name in drafts if name in jobs}
    assert kd_kinds == {"distillspec", "adaspec"}
    for name in drafts & set(jobs):
        assert jobs[name].base in drafts, "KD jobs distil the sweep's small drafter"
        assert jobs[name].teacher == "meta-llama/Llama-2-70b-chat-hf"
    assert jobs["adaspec_vicuna68m"].config["keep_fraction"] == 0.4


def test_table1_halves_together_cover_the_whole_grid() -> None:
    trials = tuple(t for name in TABLE1_FILES for t in planned(REPO / "sweeps" / name).plan.trials)
    kinds = {
        job.kind
        for name in TABLE1_FILES
        for job in planned(REPO / "sweeps" / name).spec.training_jobs
    }
    assert {"specdecpp_head", "cali_ts_predictor"} <= kinds
    greedy = planned(REPO / "sweeps" / "table1.yaml")
    assert greedy.spec.execution.mode == "mixed"
    assert {t.sampling.temperature for t in greedy.plan.trials} == {0.0}
    # Every policy runs greedy too: the trained heads live, on the pair their head was trained on
    # (all but ngram_match, which reads an n-gram lookup's match length: Table 1 has no lookup;
    # and batch_schedule, which sets K by batch size: Table 1 is batch 1).
    lm_policies = PER_REQUEST_POLICIES - {"ngram_match"}
    assert {t.setting.policy for t in greedy.plan.trials if not t.is_baseline} == lm_policies
    heads = [t for t in trials if t.setting.job is not None]
    assert {t.mode for t in heads} == {"live"}
    assert {t.pair for t in heads} == {"llama2-70b-chat__llama2-7b-chat"}
    assert {(t.sampling.temperature, t.sampling.top_k) for t in trials} == {
        (0.0, 0),
        (0.7, 0),
        (1.0, 50),
        (1.3, 0),
    }
    assert {t.setting.max_draft_len for t in trials if not t.is_baseline} == {3, 7, 16, 40}
    assert {t.setting.policy for t in trials if not t.is_baseline} == lm_policies
    assert {t.prompts.dataset for t in trials} == {
        "alpaca",
        "humaneval",
        "gsm8k",
        "cnn_dailymail",
        "dolly",
        "wmt19",
        "mt_bench",
    }
    assert thresholds(trials, "svip") == {0.2, 0.3, 0.4, 0.5}
    assert thresholds(trials, "specdecpp") == {0.1, 0.3, 0.5, 0.7, 0.9}
    dynamic = {
        t.setting.params_dict["dynamic"] for t in trials if t.setting.policy == "max_confidence"
    }
    assert dynamic == {True, False}


def thresholds(trials: tuple[Trial, ...], policy: str) -> set[float | None]:
    """Return the thresholds the plan runs ``policy`` with."""
    return {trial.setting.threshold for trial in trials if trial.setting.policy == policy}


@dataclass(frozen=True)
class PublishedSetup:
    """What docs/methods.md says a seed paper ran; each field is checked against planned trials."""

    arxiv: str
    datasets: dict[str, int]
    sampling: set[tuple[float, int]]
    max_draft_lens: set[int]
    policies: set[str]
    targets: set[tuple[str, int, str]]
    thresholds: dict[str, set[float]] = field(default_factory=dict)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_new_tokens: int | None = None
    job_settings: dict[str, dict[str, Any]] = field(default_factory=dict)


PUBLISHED = {
    "adaedl_table1.yaml": PublishedSetup(
        arxiv="2410.18351",
        datasets={"dolly": 708, "wmt19": 600, "cnn_dailymail": 1000},
        sampling={(0.7, 0)},
        max_draft_lens={3, 7, 16},
        policies={"static", "max_confidence", "adaedl"},
        targets={("meta-llama/Llama-2-7b-chat-hf", 1, "float32")},
        params={
            "adaedl": {"dynamic": True, "gamma": 0.2, "acceptance_smoothing": 0.5},
            "max_confidence": {"dynamic": True, "threshold_smoothing": 0.9},
        },
    ),
    "specdecpp_table1.yaml": PublishedSetup(
        arxiv="2405.19715",
        datasets={"alpaca": 2000, "humaneval": 150, "gsm8k": 150},
        sampling={(1.0, 50)},
        max_draft_lens={2, 4, 6, 8, 10, 12, 14, 20},
        policies={"static", "specdecpp"},
        targets={("meta-llama/Llama-2-70b-chat-hf", 2, "float16")},
        thresholds={"specdecpp": {0.1, 0.3, 0.5, 0.7, 0.9}},
        params={"specdecpp": {"length_cap": 20}},
        max_new_tokens=512,
        job_settings={"specdecpp_head": {"w_rej": 6, "depth": 3, "w_acc": 1, "batch_size": 32}},
    ),
    "svip_table1.yaml": PublishedSetup(
        arxiv="2411.18462",
        datasets={"mt_bench": 80, "wmt19": 80, "cnn_dailymail": 80, "dolly": 80, "gsm8k": 80},
        sampling={(0.0, 0)},
        max_draft_lens={5, 40},
        policies={"static", "svip"},
        targets={
            ("EleutherAI/pythia-6.9b", 1, "float16"),
            ("Qwen/Qwen2.5-14B-Instruct", 1, "bfloat16"),
            ("meta-llama/Meta-Llama-3-70B-Instruct", 4, "bfloat16"),
        },
        thresholds={"svip": {0.2, 0.3, 0.4, 0.5}},
        params={"svip": {"length_cap": 40}},
    ),
    "eesd_table1.yaml": PublishedSetup(
        arxiv="2406.03853",
        datasets={"gsm8k": 500, "xsum": 500, "humaneval": 164, "mt_bench": 80},
        sampling={(0.0, 0)},
        max_draft_lens={10},
        policies={"static", "beta_ts", "cali_ts"},
        targets={
            ("meta-llama/Llama-2-70b-hf", 4, "float16"),
            ("meta-llama/Llama-2-13b-hf", 1, "float16"),
        },
        max_new_tokens=512,
        job_settings={
            "eesd_exit": {"generated_fraction": 0.5},
            "cali_ts_predictor": {"max_offset": 10},
        },
    ),
    "adaspec_table1.yaml": PublishedSetup(
        arxiv="2510.19779",
        datasets={"gsm8k": 500, "alpaca": 2000, "mbpp": 500, "cnn_dailymail": 1000, "xsum": 500},
        sampling={(0.0, 0), (1.0, 0)},
        max_draft_lens={3, 5, 7},
        policies={"static"},
        targets={("EleutherAI/pythia-1.4b", 1, "float32"), ("microsoft/phi-2", 1, "float32")},
        job_settings={
            "distillspec": {"divergence": "forward_kl", "lr": 3e-4, "batch_size": 16},
            "adaspec": {
                "divergence": "forward_kl",
                "keep_fraction": 0.4,
                "lr": 3e-4,
                "batch_size": 16,
            },
        },
    ),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_paper_sweep_reproduces_the_published_setup(name: str) -> None:
    path = REPO / "sweeps" / name
    setup = PUBLISHED[name]
    text = path.read_text(encoding="utf-8")
    header = text[: text.index("\nname:")]
    assert all(line.startswith("#") for line in header.splitlines())
    assert f"arXiv {setup.arxiv}" in header
    trials = planned(path).plan.trials
    policy_trials = [t for t in trials if not t.is_baseline]
    assert {(t.prompts.dataset, t.prompts.samples) for t in trials} == set(setup.datasets.items())
    assert {(t.sampling.temperature, t.sampling.top_k) for t in trials} == setup.sampling
    assert {t.setting.max_draft_len for t in policy_trials} == setup.max_draft_lens
    assert {t.setting.policy for t in policy_trials} == setup.policies
    assert {(t.served.target, t.served.tp_size, t.served.dtype) for t in trials} == setup.targets
    for policy, expected in setup.thresholds.items():
        assert thresholds(trials, policy) == expected
    for policy, expected_params in setup.params.items():
        for trial in (t for t in trials if t.setting.policy == policy):
            assert expected_params.items() <= trial.setting.params_dict.items()
    if setup.max_new_tokens is not None:
        assert {t.sampling.max_new_tokens for t in trials} == {setup.max_new_tokens}
    jobs = planned(path).plan.jobs
    for kind, settings in setup.job_settings.items():
        of_kind = [job for job in jobs if job.kind == kind]
        assert of_kind, f"no {kind} job"
        for job in of_kind:
            assert settings.items() <= job.config.items()


def test_adaspec_sweep_distils_each_draft_per_task_for_three_epochs() -> None:
    jobs = planned(REPO / "sweeps" / "adaspec_table1.yaml").plan.jobs
    expected = {
        (kind, base, teacher, task)
        for kind in ("distillspec", "adaspec")
        for base, teacher in (
            ("EleutherAI/pythia-31m", "EleutherAI/pythia-1.4b"),
            ("Salesforce/codegen-350M-mono", "microsoft/phi-2"),
        )
        for task in ("gsm8k", "alpaca", "mbpp", "cnn_dailymail", "xsum")
    }
    assert {(j.kind, j.base, j.teacher, j.dataset) for j in jobs} == expected
    assert {j.epochs for j in jobs} == {3}
    assert {j.split for j in jobs} == {"train"}


def test_cli_plans_table1(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    assert cli_main(["plan", "sweeps/table1.yaml"]) == 0, capsys.readouterr().err
    assert "table1" in capsys.readouterr().out
