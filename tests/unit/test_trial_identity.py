"""Trial ids, cost-fit keys, trace keys, job ids and store columns stay what they were.

The committed result databases (``docs/*.db``) are reused by id, so a refactor of how a trial
is composed must not move any of them. The digests below were computed by the planner before
the trial was composed of typed parts (commit 7a4af2f); each covers, for every trial of the
plan, its id, baseline id, cost-fit key and trials-table values, then the training jobs' rows
and the replay groups' keys.
"""

from __future__ import annotations

import hashlib
import sqlite3
import textwrap
from pathlib import Path

import pytest
from support.paths import REPO

from orchestrator.store.row_values import job_values, trial_values
from orchestrator.sweep.planner import (
    Plan,
    Trial,
    canonical_json,
    fit_group_key,
    plan_sweep,
    replay_groups,
)
from orchestrator.sweep.spec import load_sweep, parse_sweep

#: Every identity-relevant setting the sweep files leave at its default: a target and a draft
#: that run their repository's code, a job-made draft, explicit chat templates, a split,
#: top-k/top-p (and a greedy entry whose top-k must be ignored), seeds, mixed mode (its one
#: live check named, as sweeps written before the default list of checks name it).
VARIED = """\
name: pins
pairs:
  - name: trusted
    target: {model: zoo:micro/target, trust_remote_code: true, dtype: bfloat16}
    draft: {model: zoo:micro/draft-m, trust_remote_code: true}
  - name: made
    target: zoo:micro/target
    draft: {job: kd}
datasets:
  - {name: "builtin:code", samples: 3, max_new_tokens: 12, chat_template: true}
  - {name: "builtin:math", split: test, samples: 2, max_new_tokens: 8, chat_template: false}
  - {name: "builtin:math", samples: 2, max_new_tokens: 8}
temperatures: [0, {temperature: 0.7, top_k: 20, top_p: 0.9}, {temperature: 0, top_k: 5}]
training_jobs:
  - name: kd
    kind: distillspec
    base: zoo:micro/draft-s
    teacher: zoo:micro/target
    dataset: {name: "builtin:code", samples: 4}
policies:
  - name: static
  - name: svip
    grid: {threshold: [0.3, 0.5]}
max_draft_lens: [2, 4]
seeds: [0, 3]
execution: {mode: mixed, live_check: {policy: static}}
"""

#: (sweep file: a name in sweeps/ or a path, trials, digest, first two trial ids, first trace
#: key, first job id).
PINNED = [
    ("docs/lab/data/demo-before-protocol.yaml", 124, "a79422eb70d2b54fddd69847",
     ["4a8b6303403250ec", "c3a7ffcea7c65e52"], "db10de8c5a796ed4", None),
    ("docs/lab/data/kd-demo-before-protocol.yaml", 88, "704c0c622b71175e996ce191",
     ["eadd9187a0695216", "94029467f9f4017f"], "7f605e5bb446799d", "c59bc8680ff01221"),
    ("replay_demo", 436, "0612ad66c1b7f9500f7f8623", ["2ac39381fb1dd629", "ecfb8c0bc35edea9"],
     "536ae82a2ae7187c", None),
    ("gpu_kd_replay", 24, "d57bc2f5775ac8fab6580c2e", ["35c68c473a1ac8a0", "b13956a7b23cdbcf"],
     "9af12cdbb72586e8", "119ea55e02cf57b6"),
    ("adaspec_table1", 880, "f1d898f88e72c88f904876f3", ["30de1b934a79fe2e", "586a64964e2fe18e"],
     None, "1eac3616612b6621"),
    ("eesd_table1", 32, "4cc6d284593ea29e6f92061b", ["d8e6914afa49e79a", "7d7765ab28e9fbc8"],
     None, "b9043e61024e0700"),
    ("specdecpp_table1", 147, "fc6fcac6ce09af8357df2859", ["80f5ddacbb3614c3", "3663ee5b0a8dfabb"],
     None, "6a8b4aeecefc6c64"),
    (None, 180, "ca809320019355ff138723fe", ["bf17d4c9216fa1cd", "0ae4bfec470cc8ef"],
     "32db03d9763a2073", "9202524f7fc53d33"),
]  # fmt: skip


def _digest(plan: Plan) -> str:
    """Return a short hash of every id, key and store value the plan yields.

    The ``draft_kind`` column (revision 0011) came after these pins: it is checked to be
    ``lm`` apart and left out of the hashed values, so the pins still cover everything else.
    """
    rows: list[object] = [
        [t.trial_id, t.baseline_id, fit_group_key(t), _values_before_draft_kinds(t)]
        for t in plan.trials
    ]
    rows.append([job_values(job) for job in plan.jobs])
    rows.append(
        [
            [group.fit_key, group.trace_key, group.cap, [t.trial_id for t in group.trials]]
            for group in replay_groups(plan)
        ]
    )
    return hashlib.sha256(canonical_json(rows).encode()).hexdigest()[:24]


def _values_before_draft_kinds(trial: Trial) -> dict[str, object]:
    """Return ``trial``'s store values without its ``draft_kind`` (asserted ``lm``)."""
    values = trial_values(trial)
    assert values.pop("draft_kind") == values["config"].pop("draft_kind") == "lm"
    return values


def _sweep_file(sweep: str) -> Path:
    """Return a pinned sweep file: ``sweeps/NAME.yaml``, or a path from the repository root
    (a sweep file kept beside the database it ran, e.g. under docs/lab/data/)."""
    return REPO / sweep if "/" in sweep else REPO / "sweeps" / f"{sweep}.yaml"


@pytest.mark.parametrize(("sweep", "n", "digest", "first", "trace", "job"), PINNED)
def test_ids_keys_and_columns_are_unchanged(
    sweep: str | None, n: int, digest: str, first: list[str], trace: str | None, job: str | None
) -> None:
    spec = load_sweep(_sweep_file(sweep)) if sweep else parse_sweep(textwrap.dedent(VARIED))
    plan = plan_sweep(spec)
    groups = replay_groups(plan)
    assert len(plan.trials) == n
    assert [t.trial_id for t in plan.trials[:2]] == first
    assert (groups[0].trace_key if groups else None) == trace
    assert (plan.jobs[0].job_id if plan.jobs else None) == job
    assert _digest(plan) == digest


@pytest.mark.parametrize(
    ("database", "sweep_file"),
    [
        ("docs/demo-results.db", "sweeps/demo.yaml"),
        ("docs/lab/data/demo-before-protocol.db", "docs/lab/data/demo-before-protocol.yaml"),
        ("docs/lab/data/kd-demo-before-protocol.db", "docs/lab/data/kd-demo-before-protocol.yaml"),
    ],
)
def test_the_committed_databases_are_replanned_id_for_id(database: str, sweep_file: str) -> None:
    with sqlite3.connect(REPO / database) as db:
        (sweep,) = db.execute("SELECT name FROM sweeps").fetchone()
        trials = {row[0] for row in db.execute("SELECT trial_id FROM trials")}
        fits = {row[0] for row in db.execute("SELECT group_key FROM cost_fits")}
        traces = {row[0] for row in db.execute("SELECT trace_key FROM traces")}
        jobs = {row[0] for row in db.execute("SELECT job_id FROM training_jobs")}
    plan = plan_sweep(load_sweep(REPO / sweep_file))
    assert sweep == plan.sweep
    assert trials and trials == {t.trial_id for t in plan.trials}
    assert fits and fits <= {fit_group_key(t) for t in plan.trials}
    assert traces and traces <= {group.trace_key for group in replay_groups(plan)}
    assert jobs == {job.job_id for job in plan.jobs}
