"""Two pairs with the same target in one sweep, on real Ray and the micro zoo.

The pairs ``s`` and ``xs`` name the same target (``zoo:micro/target``) with different drafts
(``draft-s``, ``draft-xs``), so they share one worker group per replica. A test-only
:class:`Births` actor counts each TargetWorker and DraftWorker the runner creates (the
runner's actor classes are swapped for subclasses that report from ``__init__``).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from ray import cloudpickle

from orchestrator.run import replica as replica_module
from orchestrator.run.runner import RunOptions, execute_plan
from orchestrator.store import open_store
from orchestrator.sweep.planner import plan_sweep, replay_groups
from orchestrator.sweep.spec import parse_sweep
from workers.actors import DraftWorker, TargetWorker

pytestmark = pytest.mark.ray

BIRTHS = "specsweep-test-births"
SAMPLES = 4
REPLICAS = 2


def sweep_text(mode: str = "live") -> str:
    """Return a greedy sweep of two pairs sharing the micro target, 4 prompts in shards of 1."""
    target = {"model": "zoo:micro/target"}
    sweep = {
        "name": f"shared-{mode}",
        "pairs": [
            {"name": "s", "target": target, "draft": {"model": "zoo:micro/draft-s"}},
            {"name": "xs", "target": target, "draft": {"model": "zoo:micro/draft-xs"}},
        ],
        "datasets": [{"name": "builtin:code", "samples": SAMPLES, "max_new_tokens": 12}],
        "temperatures": [0.0],
        "policies": [{"name": "static"}, {"name": "svip", "grid": {"threshold": [2.2]}}],
        "max_draft_lens": [4],
        "execution": {
            "retries": 1,
            "warmup_samples": 0,
            "shard_prompts": 1,
            "replicas": REPLICAS,
            "mode": mode,
        },
    }
    return yaml.safe_dump(sweep, sort_keys=False)


@ray.remote(num_cpus=0)
class Births:
    """Counts the worker actors created: targets by model path, drafts by draft path."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def born(self, role: str, path: str) -> None:
        """Record one actor of ``role`` loading ``path``."""
        self.seen.append((role, path))

    def all(self) -> list[tuple[str, str]]:
        """Return every creation recorded, in order."""
        return list(self.seen)


class CountedTarget(TargetWorker.__ray_actor_class__):  # type: ignore[name-defined,misc]
    """The target actor, reporting its creation."""

    def __init__(self, model: Any, rank: Any = None) -> None:
        ray.get(ray.get_actor(BIRTHS).born.remote("target", model.path))
        super().__init__(model, rank)


class CountedDraft(DraftWorker.__ray_actor_class__):  # type: ignore[name-defined,misc]
    """The draft actor, reporting its creation."""

    def __init__(self, model: Any, target_ranks: list) -> None:
        ray.get(ray.get_actor(BIRTHS).born.remote("draft", model.path if model else ""))
        super().__init__(model, target_ranks)


@pytest.fixture(scope="module")
def ray_six() -> Iterator[None]:
    """A local Ray instance with room for two shared groups (a target and two drafts each)."""
    ray.init(num_cpus=6, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


@pytest.fixture
def counted(ray_six: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Swap the runner's actor classes for the counting ones; yield the counter."""
    births = Births.options(name=BIRTHS).remote()
    monkeypatch.setattr(replica_module, "TargetWorker", ray.remote(CountedTarget))
    monkeypatch.setattr(replica_module, "DraftWorker", ray.remote(CountedDraft))
    yield births
    ray.kill(births)


@pytest.fixture
def zoo_env(micro_zoo: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point zoo references at the session's micro zoo."""
    monkeypatch.setenv("SPECSWEEP_CACHE", str(micro_zoo.root.parent.parent))
    return micro_zoo


def _run(mode: str, tmp_path: Path) -> tuple[Any, Any, Any]:
    spec = parse_sweep(sweep_text(mode), f"shared-{mode}.yaml")
    plan = plan_sweep(spec)
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    store.register_sweep(spec, plan)
    summary = execute_plan(spec, plan, store, RunOptions(progress=False))
    return plan, store, summary


def _check_outputs_and_births(plan: Any, store: Any, births: list[tuple[str, str]]) -> None:
    """Every trial stored with the AR baseline's greedy ids; one target per replica."""
    outputs = {
        t.trial_id: [s.output_ids for s in store.sample_outputs(t.trial_id)] for t in plan.trials
    }
    assert {t.pair for t in plan.trials} == {"s", "xs"}
    baselines = {t.pair: outputs[t.trial_id] for t in plan.trials if t.is_baseline}
    assert baselines["s"] == baselines["xs"]  # one target: the same greedy text
    for trial in plan.trials:
        (row,) = store.trial_rows([trial.trial_id])
        assert row.status == "done", row.error
        assert len(outputs[trial.trial_id]) == SAMPLES
        assert outputs[trial.trial_id] == baselines[trial.pair], trial.setting.policy
    roles = Counter(role for role, _ in births)
    assert roles["target"] == REPLICAS  # the target loads once per replica, not once per pair
    assert len({path for role, path in births if role == "target"}) == 1
    drafts = Counter(Path(path).name for role, path in births if role == "draft")
    assert set(drafts) == {"draft-s", "draft-xs"}
    assert all(count <= REPLICAS for count in drafts.values())  # at most one a pair a replica


@pytest.mark.slow
def test_two_pairs_sharing_a_target_load_it_once_per_replica_and_match_the_baseline(
    zoo_env: Any, counted: Any, tmp_path: Path
) -> None:
    plan, store, summary = _run("live", tmp_path)
    assert (summary.ran, summary.failed) == (len(plan.trials), 0), summary.failures
    _check_outputs_and_births(plan, store, ray.get(counted.all.remote()))
    shards = store.trial_shards([t.trial_id for t in plan.trials])
    assert len(shards) == len(plan.trials) * SAMPLES
    store.close()


@pytest.mark.slow
def test_replay_units_of_pairs_sharing_a_target_run_on_their_own_drafts(
    zoo_env: Any, counted: Any, tmp_path: Path
) -> None:
    plan, store, summary = _run("replay", tmp_path)
    assert (summary.ran, summary.failed) == (len(plan.trials), 0), summary.failures
    assert summary.traces_recorded == 2  # one trace group per pair, each by its own draft
    _check_outputs_and_births(plan, store, ray.get(counted.all.remote()))
    groups = {group.trials[0].pair: group for group in replay_groups(plan)}
    traces = {pair: store.traces(group.trace_key).traces for pair, group in groups.items()}
    assert traces["s"] != traces["xs"]  # each recorded by its pair's draft, not one of them
    store.close()
