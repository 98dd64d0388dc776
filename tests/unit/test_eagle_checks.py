"""Preflight's EAGLE pair checks (orchestrator.run.eagle_checks): a head must fit its target's
width and vocabulary, a head job must train on the pair's target; a tensor-parallel target
serves a head as any other; each problem names the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import LlamaConfig

from orchestrator.run.eagle_checks import eagle_pair_problems, head_fit_problems
from orchestrator.sweep.spec import PairSpec
from workers.eagle.head import EagleConfig

TARGET = LlamaConfig(hidden_size=64, intermediate_size=128, vocab_size=96)


def _head_config(**changed) -> EagleConfig:
    values = dict(
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        num_kv_heads=4,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_positions=256,
        vocab_size=96,
    )
    return EagleConfig(**{**values, **changed})


def _pair(draft: dict, **target) -> PairSpec:
    return PairSpec(
        name="p", target={"model": "zoo:micro/target", **target}, draft={"kind": "eagle", **draft}
    )


def _write_head(path: Path, config: EagleConfig) -> Path:
    path.mkdir()
    text = json.dumps({"kind": "eagle_head", "eagle": config.to_json()})
    (path / "config.json").write_text(text)
    return path


def test_a_head_of_the_targets_shape_fits() -> None:
    assert head_fit_problems("pairs[0].draft.model", _head_config(), TARGET) == []


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size"])
def test_a_head_of_another_width_or_vocabulary_is_named(field: str) -> None:
    head = _head_config(**{field: 128})
    problems = head_fit_problems("pairs[0].draft.model", head, TARGET)
    assert len(problems) == 1
    assert problems[0].startswith(f"pairs[0].draft.model: the EAGLE head's {field} is 128 ")


def test_a_pair_with_a_fitting_head_by_path_has_no_problem(tmp_path: Path) -> None:
    head = _write_head(tmp_path / "head", _head_config())
    pair = _pair({"model": str(head)})
    assert eagle_pair_problems("pairs[0]", pair, head, tmp_path / "target", TARGET) == []


def test_a_directory_holding_no_head_is_named(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    problems = eagle_pair_problems("pairs[1]", _pair({"model": str(model)}), model, model, TARGET)
    assert len(problems) == 1
    assert problems[0].startswith("pairs[1].draft.model: ")
    assert "not an EAGLE head" in problems[0]


def test_a_head_job_must_train_on_the_pairs_target(tmp_path: Path) -> None:
    target = tmp_path / "target"
    pair = _pair({"job": "head"})
    assert eagle_pair_problems("pairs[0]", pair, target, target, TARGET) == []
    problems = eagle_pair_problems("pairs[0]", pair, tmp_path / "other", target, TARGET)
    assert len(problems) == 1
    assert problems[0].startswith("pairs[0].draft.job: job 'head' trains its head on ")


def test_a_tensor_parallel_target_serves_a_head_and_its_checks_still_apply(tmp_path: Path) -> None:
    head = _write_head(tmp_path / "head", _head_config())
    pair = _pair({"model": str(head)}, backend="deepspeed", tp_size=2)
    assert eagle_pair_problems("pairs[0]", pair, head, tmp_path / "target", TARGET) == []
    wide = _write_head(tmp_path / "wide", _head_config(hidden_size=128))
    problems = eagle_pair_problems("pairs[0]", pair, wide, tmp_path / "target", TARGET)
    assert len(problems) == 1 and "hidden_size is 128" in problems[0]
