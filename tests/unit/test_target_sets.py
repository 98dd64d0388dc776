"""Which pairs share a target group (pure), and the placement a shared group needs."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.run.placement import unplaceable_message
from orchestrator.sweep.bundles import bundle_totals, groups_held, worker_group_bundles
from orchestrator.sweep.spec import PairSpec
from orchestrator.sweep.target_sets import shared_targets, solo, split_to_fit


def pair(name: str, target: str = "org/target", draft: str = "org/draft", **target_fields: Any):
    """Return a pair of ``target`` (with ``target_fields``) and ``draft``."""
    return PairSpec.model_validate(
        {"name": name, "target": {"model": target, **target_fields}, "draft": {"model": draft}}
    )


def test_pairs_with_identical_targets_share_and_others_keep_their_own() -> None:
    pairs = [
        pair("a", draft="d1"),
        pair("b", target="org/other"),
        pair("c", draft="d2"),
        pair("d", dtype="bfloat16"),
        pair("e", trust_remote_code=True),
        pair("f", backend="deepspeed", tp_size=2),
        pair("g", backend="deepspeed", tp_size=4),
        pair("h", draft="d3"),
    ]
    sets = shared_targets(pairs)
    assert [s.pair_names for s in sets] == [("a", "c", "h"), ("b",), ("d",), ("e",), ("f",), ("g",)]
    assert [s.name for s in sets] == ["a+c+h", "b", "d", "e", "f", "g"]
    assert sets[0].target == pairs[0].target


def test_the_resolved_model_path_decides_not_the_reference() -> None:
    pairs = [pair("a", target="zoo:micro/target"), pair("b", target="/models/target")]
    assert [s.name for s in shared_targets(pairs)] == ["a", "b"]
    same = {"a": "/models/target", "b": "/models/target"}
    assert [s.name for s in shared_targets(pairs, same)] == ["a+b"]
    apart = {"a": "/models/one", "b": "/models/two"}
    assert [s.name for s in shared_targets(pairs, apart)] == ["a", "b"]


def test_a_shared_group_holds_the_target_once_and_one_draft_bundle_per_pair() -> None:
    big = {"backend": "deepspeed", "tp_size": 2, "gpus": 1}
    a = PairSpec.model_validate(
        {"name": "a", "target": {"model": "t", **big}, "draft": {"model": "d1", "gpus": 0.5}}
    )
    b = PairSpec.model_validate(
        {"name": "b", "target": {"model": "t", **big}, "draft": {"model": "d2", "gpus": 0.25}}
    )
    (shared,) = shared_targets([a, b])
    bundles = worker_group_bundles(shared.pairs)
    assert bundles == [
        {"CPU": 1.0, "GPU": 1.0},
        {"CPU": 1.0, "GPU": 1.0},
        {"CPU": 1.0, "GPU": 0.5},
        {"CPU": 1.0, "GPU": 0.25},
    ]
    assert bundle_totals(bundles) == {"CPU": 4.0, "GPU": 2.75}
    assert groups_held(shared.pairs, [{"CPU": 16, "GPU": 8}]) == 2  # 2.75 GPUs count as 3
    assert groups_held(solo(a).pairs, [{"CPU": 16, "GPU": 8}]) == 2  # so do 2.5
    assert groups_held(solo(a).pairs, [{"CPU": 16, "GPU": 9}]) == 3
    message = unplaceable_message(shared.pairs, 5, [{"CPU": 2.0, "GPU": 1.0}])
    assert "pairs 'a', 'b' (sharing one target)" in message
    assert "drafts {CPU: 1, GPU: 0.5} + {CPU: 1, GPU: 0.25} = {CPU: 4, GPU: 2.75}" in message


def test_a_shared_group_no_node_holds_is_cut_into_groups_that_fit() -> None:
    pairs = [pair(name, draft=f"d-{name}") for name in "abcde"] + [pair("z", target="org/z")]
    sets = shared_targets(pairs)
    two_cpus = [{"CPU": 2.0}]
    split = split_to_fit(sets, two_cpus)
    assert [s.name for s in split] == ["a", "b", "c", "d", "e", "z"]
    assert {s.key for s in split[:5]} == {sets[0].key}
    assert all(bundle_totals(worker_group_bundles(s.pairs)) == {"CPU": 2.0} for s in split)
    three = split_to_fit(sets, [{"CPU": 1.0}, {"CPU": 3.0}])
    assert [s.name for s in three] == ["a+b", "c+d", "e", "z"]
    assert split_to_fit(sets, [{"CPU": 6.0}]) == sets
    assert split_to_fit(sets, []) == sets


def test_a_pair_too_large_for_every_node_stays_for_placement_to_report() -> None:
    big = pair("big", backend="deepspeed", tp_size=4)
    assert [s.name for s in split_to_fit(shared_targets([big]), [{"CPU": 2.0}])] == ["big"]


def test_solo_is_the_pair_alone_named_after_it() -> None:
    alone = solo(pair("p"))
    assert (alone.name, alone.pair_names) == ("p", ("p",))


@pytest.mark.parametrize("index", [-1, 2])
def test_draft_index_outside_the_groups_pairs_is_rejected(index: int) -> None:
    from orchestrator.run.placement import draft_actor_options

    with pytest.raises(ValueError, match=r"draft index must be in 0\.\.1"):
        draft_actor_options(None, index, 2)  # type: ignore[arg-type]
