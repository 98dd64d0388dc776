"""Sweep-file validation: accepted files, and every problem reported at its file line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pydantic
import pytest
from support.paths import REPO

from orchestrator.sweep.planner import plan_sweep
from orchestrator.sweep.spec import (
    SweepError,
    SweepSpec,
    check_local_paths,
    coerce_param_value,
    load_sweep,
    parse_sweep,
)
from orchestrator.sweep.yaml_lines import load_yaml_with_lines

MINIMAL = """\
name: tiny
pairs:
  - name: demo
    target: zoo:micro/target
    draft: zoo:micro/draft-s
datasets:
  - {name: "builtin:code", samples: 4, max_new_tokens: 16}
temperatures: [0]
policies:
  - name: static
max_draft_lens: [4]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _problems(tmp_path: Path, text: str) -> list[str]:
    path = _write(tmp_path, text)
    with pytest.raises(SweepError) as caught:
        load_sweep(path)
    return [problem.removeprefix(f"{path}:") for problem in caught.value.problems]


def _has_prefix(problems: list[str], prefix: str) -> bool:
    return any(problem.startswith(prefix) for problem in problems)


def test_minimal_sweep_gets_defaults_and_shorthands(tmp_path: Path) -> None:
    spec = load_sweep(_write(tmp_path, MINIMAL))
    pair = spec.pairs[0]
    assert pair.target.model == "zoo:micro/target"
    assert (pair.target.backend, pair.target.tp_size, pair.target.dtype) == ("hf", 1, "float32")
    assert pair.draft.model == "zoo:micro/draft-s" and pair.draft.job is None
    assert spec.temperatures[0].temperature == 0.0
    assert (spec.temperatures[0].top_k, spec.temperatures[0].top_p) == (0, 1.0)
    assert spec.seeds == (0,)
    assert spec.execution.retries == 2
    assert spec.execution.record_rounds is True
    assert spec.execution.warmup_seconds is None


def test_spec_is_frozen(tmp_path: Path) -> None:
    spec = load_sweep(_write(tmp_path, MINIMAL))
    with pytest.raises(pydantic.ValidationError):
        spec.name = "other"  # type: ignore[misc]


def test_dataset_names_are_canonicalised(tmp_path: Path) -> None:
    text = MINIMAL.replace('{name: "builtin:code", samples: 4, max_new_tokens: 16}', "openai/gsm8k")
    spec = load_sweep(_write(tmp_path, text))
    assert spec.datasets[0].name == "gsm8k"


def test_demo_sweep_is_valid() -> None:
    spec = load_sweep(REPO / "sweeps" / "demo.yaml")
    assert {policy.name for policy in spec.policies} == {
        "static",
        "max_confidence",
        "adaedl",
        "svip",
        "hf_heuristic",
        "beta_ts",
        "cali_ts",
        "specdecpp",
        "ngram_match",
        "oracle",
    }
    assert spec.max_draft_lens == (1, 2, 3, 4)
    assert [d.kind for d in spec.pairs[0].draft_entries] == ["lm", "eagle", "ngram"]
    assert [t.temperature for t in spec.temperatures] == [0.0, 0.7]
    assert {pair.target.model for pair in spec.pairs} == {"zoo:smol/target"}
    assert {d.name for d in spec.datasets} == {"humaneval", "builtin:math"}


def test_field_errors_name_file_line_and_path(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """\
        name: tiny
        pairs:
          - name: demo
            target:
              model: zoo:micro/target
              dtype: fp8
            draft: zoo:micro/draft-s
        datasets:
          - {name: "builtin:code", samples: 2000000}
        temperatures: [0]
        policies:
          - name: static
        max_draft_lens: [4, 500]
        """,
    )
    assert _has_prefix(problems, "6: pairs[0].target.dtype: ")
    assert _has_prefix(problems, "9: datasets[0].samples: ")
    assert _has_prefix(problems, "13: max_draft_lens[1]: ")
    assert len(problems) == 3


def test_missing_field_points_at_parent_mapping(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """\
        name: tiny
        pairs:
          - name: demo
            target:
              backend: hf
            draft: zoo:micro/draft-s
        datasets: ["builtin:code"]
        temperatures: [0]
        policies: [{name: static}]
        max_draft_lens: [4]
        """,
    )
    assert problems == ["4: pairs[0].target.model: Field required"]


def test_missing_top_level_field_and_unknown_key(tmp_path: Path) -> None:
    text = MINIMAL.replace("max_draft_lens: [4]\n", "max_draft_len: [4]\n")
    problems = _problems(tmp_path, text)
    assert "1: max_draft_lens: Field required" in problems
    assert "11: max_draft_len: Extra inputs are not permitted" in problems


def test_policy_problems(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """\
        name: tiny
        pairs: [{name: demo, target: zoo:micro/target, draft: zoo:micro/draft-s}]
        datasets: ["builtin:code"]
        temperatures: [0]
        policies:
          - name: adaedl
            grid:
              threshold: [0.2, -0.1]
              gama: [0.3]
              gamma: []
          - name: warp_drive
          - name: svip
            params: {threshold: 0.3, length_cap: "long"}
          - name: cali_ts
            params: {sigma_model: 0.0}
          - name: specdecpp
        max_draft_lens: [4]
        """,
    )
    assert "8: policies[0].grid.threshold[1]: must be ≥ 0 (got -0.1)" in problems
    assert any(
        p.startswith("9: policies[0].grid.gama[0]: unknown parameter 'gama'") for p in problems
    )
    assert "10: policies[0].grid.gamma: a grid list must not be empty" in problems
    assert _has_prefix(problems, "11: policies[1].name: unknown policy 'warp_drive'")
    assert "13: policies[2].params.length_cap: must be an integer (got 'long')" in problems
    assert any(p.startswith("15: policies[3].params: ") and "sigma" in p for p in problems)
    assert _has_prefix(problems, "16: policies[4]: needs a trained artifact")
    assert len(problems) == 7


def test_coerce_param_value() -> None:
    assert coerce_param_value(0.5, 1) == 1.0 and isinstance(coerce_param_value(0.5, 1), float)
    assert coerce_param_value(5, 3.0) == 3 and isinstance(coerce_param_value(5, 3.0), int)
    assert coerce_param_value(None, -2.5) == -2.5
    assert coerce_param_value(False, True) is True
    for default, value in [(5, 2.5), (0.5, True), (False, 1), (0.5, -0.1), (0.5, float("inf"))]:
        with pytest.raises(ValueError):
            coerce_param_value(default, value)


def test_hf_backend_is_one_actor(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "    target: zoo:micro/target\n", "    target: {model: zoo:micro/target, tp_size: 2}\n"
    )
    problems = _problems(tmp_path, text)
    assert problems == [
        "4: pairs[0].target.tp_size: backend 'hf' runs one actor: tp_size must be 1"
    ]


def test_cross_reference_problems(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """\
        name: tiny
        pairs:
          - name: a
            target: zoo:micro/target
            draft: {job: kd}
          - name: a
            target: zoo:micro/target
            draft: {job: head}
          - name: b
            target: zoo:micro/target
            draft: {job: missing}
        datasets: ["builtin:code"]
        temperatures: [0]
        policies:
          - {name: specdecpp, job: kd}
          - {name: static, job: head}
        max_draft_lens: [4]
        training_jobs:
          - {name: kd, kind: distillspec, base: zoo:micro/draft-s, teacher: zoo:micro/target,
             dataset: "builtin:code"}
          - {name: head, kind: specdecpp_head, base: zoo:micro/draft-s, teacher: zoo:micro/target,
             dataset: "builtin:code"}
        """,
    )
    assert "6: pairs[1].name: duplicate name 'a'" in problems
    assert any(
        p.startswith("8: pairs[1].draft.job: job 'head' is a specdecpp_head job") for p in problems
    )
    assert any(
        p.startswith("11: pairs[2].draft.job: no training job named 'missing'") for p in problems
    )
    assert _has_prefix(problems, "15: policies[0].job: job 'kd' is a distillspec job")
    assert "16: policies[1].job: this policy loads no trained artifact" in problems
    assert len(problems) == 5


def test_draft_needs_exactly_one_source_and_teacher_is_required(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """\
        name: tiny
        pairs:
          - name: a
            target: zoo:micro/target
            draft: {model: zoo:micro/draft-s, job: kd}
        datasets: ["builtin:code"]
        temperatures: [0]
        policies: [{name: static}]
        max_draft_lens: [4]
        training_jobs:
          - name: kd
            kind: adaspec
            base: zoo:micro/draft-s
            dataset: "builtin:code"
        """,
    )
    assert "5: pairs[0].draft: give exactly one of 'model' or 'job'" in problems
    assert "11: training_jobs[0].teacher: kind 'adaspec' needs a teacher model" in problems


def test_absurd_sizes_are_rejected(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        """\
        name: tiny
        pairs:
          - name: a
            target: {model: zoo:micro/target, backend: deepspeed, tp_size: 65, gpus: 1.5}
            draft: {model: zoo:micro/draft-s, gpus: 0.25}
        datasets:
          - {name: gsm8k, max_new_tokens: 100001}
        temperatures: [{temperature: 0.7, top_p: 0}]
        policies: [{name: static}]
        max_draft_lens: [4]
        seeds: [-1]
        execution: {retries: -1, warmup_seconds: -2}
        """,
    )
    paths = [": ".join(p.split(": ")[:2]) for p in problems]
    assert paths == [
        "4: pairs[0].target.tp_size",
        "7: datasets[0].max_new_tokens",
        "8: temperatures[0].top_p",
        "11: seeds[0]",
        "12: execution.retries",
        "12: execution.warmup_seconds",
    ]


def test_empty_lists_are_rejected(tmp_path: Path) -> None:
    problems = _problems(tmp_path, MINIMAL.replace("temperatures: [0]", "temperatures: []"))
    assert problems == ["8: temperatures: must list at least one entry"]


def test_zoo_reference_needs_a_name(tmp_path: Path) -> None:
    problems = _problems(tmp_path, MINIMAL.replace("draft: zoo:micro/draft-s", 'draft: "zoo:"'))
    assert problems == [
        "5: pairs[0].draft.model: a zoo reference needs a name, e.g. 'zoo:smol/target'"
    ]


def test_grid_size_limit(tmp_path: Path) -> None:
    thresholds = ", ".join(str(i / 1000) for i in range(1000))
    text = MINIMAL.replace(
        "  - name: static\n", f"  - {{name: svip, grid: {{threshold: [{thresholds}]}}}}\n"
    )
    text = text.replace(
        "max_draft_lens: [4]", f"max_draft_lens: [{', '.join(map(str, range(1, 129)))}]"
    )
    problems = _problems(tmp_path, text)
    assert problems == ["1: (root): the grid expands to 128000 trials (limit 100000)"]


def test_yaml_syntax_error_reports_its_line(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "name: tiny\npairs:\n  - name: [unclosed\n")
    assert len(problems) == 1
    assert problems[0].startswith("4: (yaml): ")
    assert problems[0].endswith("(while parsing a flow sequence at line 3)")


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    problems = _problems(tmp_path, MINIMAL + "name: again\n")
    assert problems == ["12: (yaml): duplicate key 'name'"]


def _alias_bomb(levels: int = 9, width: int = 10) -> str:
    """Return a billion-laughs file: each level lists ``width`` aliases of the one before."""
    lines = ["l0: &l0 [" + ", ".join(["x"] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return MINIMAL + "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_at_the_alias_line(tmp_path: Path) -> None:
    problems = _problems(tmp_path, _alias_bomb())
    assert len(problems) == 1, problems
    line = int(problems[0].split(":")[0])
    # Line 12 + k defines l<k> as copies of l<k-1>; the aliases start on line 13.
    assert 13 <= line <= 20, problems
    assert f"*l{line - 13}" in problems[0] and "aliases expand" in problems[0], problems


def test_recursive_alias_is_refused_at_its_line(tmp_path: Path) -> None:
    problems = _problems(tmp_path, MINIMAL + "extra: &x [1, *x]\n")
    assert len(problems) == 1 and problems[0].startswith("12: (yaml): alias *x"), problems
    assert "recursive" in problems[0]
    nested = _problems(tmp_path, MINIMAL + "extra: &x\n  inner:\n    - *x\n")
    assert len(nested) == 1 and nested[0].startswith("14: (yaml): alias *x"), nested


def test_small_aliases_still_expand(tmp_path: Path) -> None:
    spec = load_sweep(
        _write(
            tmp_path,
            """\
            name: tiny
            pairs:
              - {name: a, target: &t {model: zoo:micro/target}, draft: zoo:micro/draft-s}
              - {name: b, target: *t, draft: zoo:micro/draft-xs}
            datasets: [&code "builtin:code"]
            temperatures: [0]
            policies: [{name: static}]
            max_draft_lens: [4]
            """,
        )
    )
    assert [pair.target.model for pair in spec.pairs] == ["zoo:micro/target"] * 2


def test_deep_nesting_is_refused_at_its_line(tmp_path: Path) -> None:
    problems = _problems(tmp_path, MINIMAL + "extra: " + "[" * 100 + "]" * 100 + "\n")
    assert problems == ["12: (yaml): lists and mappings nest deeper than 64 levels"]


def test_target_and_draft_each_trust_remote_code_on_their_own(tmp_path: Path) -> None:
    def sweep(role: str | None) -> SweepSpec:
        text = MINIMAL
        if role is not None:
            ref = f"zoo:micro/{role if role == 'target' else 'draft-s'}"
            text = text.replace(
                f"{role}: {ref}\n", f"{role}: {{model: {ref}, trust_remote_code: true}}\n"
            )
        return load_sweep(_write(tmp_path, text))

    specs = [sweep(None), sweep("target"), sweep("draft")]
    flags = [
        (s.pairs[0].target.trust_remote_code, s.pairs[0].draft.trust_remote_code) for s in specs
    ]
    assert flags == [(False, False), (True, False), (False, True)]
    ids = [{trial.trial_id for trial in plan_sweep(s).trials} for s in specs]
    assert ids[0].isdisjoint(ids[1]) and ids[0].isdisjoint(ids[2]) and ids[1].isdisjoint(ids[2])


def test_non_mapping_file_and_unreadable_path(tmp_path: Path) -> None:
    assert _problems(tmp_path, "- just\n- a list\n") == [
        "1: (root): a sweep file must be a YAML mapping"
    ]
    with pytest.raises(SweepError, match="cannot read"):
        load_sweep(tmp_path / "absent.yaml")


def test_line_map_of_nested_nodes() -> None:
    located = load_yaml_with_lines("a:\n  b:\n    - x\n    - {c: 1}\nd: 2\n")
    assert located.lines[("a",)] == 1
    assert located.lines[("a", "b")] == 2
    assert located.lines[("a", "b", 1)] == 4
    assert located.lines[("a", "b", 1, "c")] == 4
    assert located.lines[("d",)] == 5
    assert located.line_of(("a", "b", 1, "missing")) == 4
    assert located.line_of(("a", "UnionTag", "b")) == 2


def test_check_local_paths(tmp_path: Path) -> None:
    existing = tmp_path / "model"
    existing.mkdir()
    text = f"""\
    name: tiny
    pairs:
      - name: a
        target: {existing}
        draft: ./no/such/draft
      - name: b
        target: some-org/some-model
        draft: zoo:micro/draft-s
    datasets:
      - {{name: gsm8k, local_path: {tmp_path / "missing.jsonl"}}}
    temperatures: [0]
    policies: [{{name: static}}]
    max_draft_lens: [4]
    """
    spec = parse_sweep(textwrap.dedent(text))
    problems = check_local_paths(spec)
    assert problems == [
        "pairs[0].draft.model: local path './no/such/draft' does not exist",
        f"datasets[0].local_path: '{tmp_path / 'missing.jsonl'}' does not exist",
    ]


def test_model_validate_without_file_still_validates() -> None:
    with pytest.raises(pydantic.ValidationError, match="unknown policy"):
        SweepSpec.model_validate(
            {
                "name": "x",
                "pairs": [{"name": "a", "target": "zoo:t", "draft": "zoo:d"}],
                "datasets": ["builtin:math"],
                "temperatures": [0],
                "policies": [{"name": "nope"}],
                "max_draft_lens": [1],
            }
        )


JOB_CHAIN = (
    MINIMAL
    + """\
training_jobs:
  - {name: a, kind: distillspec, base: "job:b", teacher: zoo:micro/target, dataset: "builtin:code"}
  - {name: b, kind: distillspec, base: "job:a", teacher: zoo:micro/target, dataset: "builtin:code"}
  - {name: c, kind: specdecpp_head, base: "job:nope", teacher: zoo:micro/target,
     dataset: "builtin:code"}
  - {name: d, kind: cali_ts_predictor, base: "job:c", teacher: zoo:micro/target,
     dataset: "builtin:code"}
"""
)


def test_job_bases_must_name_a_draft_job_without_cycles(tmp_path: Path) -> None:
    problems = _problems(tmp_path, JOB_CHAIN)
    assert _has_prefix(problems, "13: training_jobs[0].base: cycle: a -> b -> a")
    assert _has_prefix(problems, "14: training_jobs[1].base: cycle: b -> a -> b")
    assert _has_prefix(problems, "15: training_jobs[2].base: no training job named 'nope'")
    assert _has_prefix(problems, "17: training_jobs[3].base: job 'c' is a specdecpp_head job")


def test_policy_pairs_must_name_pairs(tmp_path: Path) -> None:
    text = MINIMAL.replace("  - name: static\n", "  - {name: static, pairs: [demo, other]}\n")
    problems = _problems(tmp_path, text)
    assert _has_prefix(problems, "10: policies[0].pairs[1]: no pair named 'other'")


def test_job_settings_are_checked_by_the_jobs_own_parser(tmp_path: Path) -> None:
    text = MINIMAL + (
        "training_jobs:\n"
        "  - {name: a, kind: adaspec, base: zoo:micro/draft-xs, teacher: zoo:micro/target,\n"
        '     dataset: "builtin:code", config: {k: 0.4}}\n'
    )
    problems = _problems(tmp_path, text)
    assert _has_prefix(problems, "14: training_jobs[0].config: adaspec: unknown settings ['k']")
