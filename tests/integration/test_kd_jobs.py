"""DistillSpec, AdaSPEC and EESD early-exit draft jobs: training, artifacts, resume, settings."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.early_exit import exit_init_layer
from training.jobs import JobConfig, JobConfigError, adaspec, distillspec, run_job
from training.jobs.adaspec import adaspec_loss, adaspec_token_mask, kept_count
from training.jobs.draft_common import DATA_DIR, kd_texts, mix_counts
from training.losses import distillation_loss
from training.zoo.cache import ZooManifest

torch.set_num_threads(1)

#: Small, fast settings: 8 steps of 4 blocks of 32 tokens, a checkpoint every 3 steps.
FAST: dict[str, Any] = {
    "batch_size": 4,
    "block_len": 32,
    "prompt_tokens": 16,
    "eval_blocks": 8,
    "lr": 3e-3,
    "max_steps": 8,
    "checkpoint_every": 3,
    "device": "cpu",
}


def job(
    zoo: ZooManifest, kind: str, settings: dict[str, Any] | None = None, **fields: Any
) -> JobConfig:
    """Return a small job on builtin:code: draft-xs distilled from the micro target."""
    values: dict[str, Any] = {
        "kind": kind,
        "name": f"test-{kind}",
        "base": str(zoo.model_path("draft-xs")),
        "teacher": str(zoo.model_path("target")),
        "dataset": "builtin:code",
        "samples": 12,
        "settings": {**FAST, **(settings or {})},
    }
    return JobConfig(**{**values, **fields})


def artifact_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Return the saved weights of an artifact directory."""
    return load_file(str(Path(path) / "model.safetensors"))


def assert_loads_and_decodes(path: str | Path) -> AutoModelForCausalLM:
    """Load an artifact with the Auto classes, greedy-decode 5 tokens, return the model."""
    model = AutoModelForCausalLM.from_pretrained(str(path))
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    ids = tokenizer("def add(a, b):", return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 5)
    return model


def greedy_fraction(teacher: torch.nn.Module, rows: torch.Tensor, start: int) -> float:
    """Return how often rows[:, j] is the teacher's argmax after rows[:, :j], for j >= start."""
    with torch.no_grad():
        predicted = teacher(input_ids=rows[:, :-1]).logits.argmax(-1)
    return (predicted[:, start - 1 :] == rows[:, start:]).float().mean().item()


# ---------------------------------------------------------------------------------------------
# DistillSpec
# ---------------------------------------------------------------------------------------------


def test_distillspec_trains_a_loadable_draft(micro_zoo: ZooManifest, tmp_path: Path) -> None:
    result = run_job(job(micro_zoo, "distillspec"), tmp_path, progress=False)
    metrics = result.metrics
    assert result.artifact_kind == "draft"
    assert result.resumed_from_step == 0
    assert metrics["steps"] == 8
    assert metrics["tokens_seen"] == 8 * 4 * 32
    assert metrics["heldout_kl"] < metrics["initial_heldout_kl"]
    assert metrics["train_loss"] > 0.0
    assert 0.0 <= metrics["heldout_agreement"] <= 1.0
    assert_loads_and_decodes(result.artifact_path)
    card = json.loads((Path(result.artifact_path) / "model_card.json").read_text())
    assert card["kind"] == "distillspec"
    assert card["settings"]["divergence"] == "forward_kl"
    assert card["metrics"]["heldout_kl"] == metrics["heldout_kl"]
    base = artifact_tensors(micro_zoo.model_path("draft-xs"))
    trained = artifact_tensors(result.artifact_path)
    assert not torch.equal(
        base["model.layers.0.mlp.up_proj.weight"], trained["model.layers.0.mlp.up_proj.weight"]
    )


def test_distillspec_target_data_is_the_teachers_greedy_output(
    micro_zoo: ZooManifest, tmp_path: Path
) -> None:
    result = run_job(
        job(micro_zoo, "distillspec", {"data": "target"}), tmp_path / "target", progress=False
    )
    run_job(job(micro_zoo, "distillspec", {"max_steps": 1}), tmp_path / "dataset", progress=False)
    teacher = AutoModelForCausalLM.from_pretrained(str(micro_zoo.model_path("target")))
    generated = torch.load(tmp_path / "target" / DATA_DIR / "train_blocks.pt", weights_only=True)
    corpus = torch.load(tmp_path / "dataset" / DATA_DIR / "train_blocks.pt", weights_only=True)
    assert generated.shape == (12, 33)
    assert greedy_fraction(teacher, generated, FAST["prompt_tokens"]) > 0.99
    assert greedy_fraction(teacher, corpus, FAST["prompt_tokens"]) < 0.9
    assert result.metrics["heldout_kl"] < result.metrics["initial_heldout_kl"]


def test_sampled_target_data_is_seeded_and_not_the_greedy_output(
    micro_zoo: ZooManifest, tmp_path: Path
) -> None:
    sampled = {"data": "target", "sample_temperature": 1.0, "max_steps": 1}
    blocks = {}
    for name, settings, seed in (
        ("greedy", {"data": "target", "max_steps": 1}, 0),
        ("sampled", sampled, 0),
        ("again", sampled, 0),
        ("other_seed", sampled, 1),
    ):
        run_job(job(micro_zoo, "distillspec", settings, seed=seed), tmp_path / name, False)
        blocks[name] = torch.load(tmp_path / name / DATA_DIR / "train_blocks.pt", weights_only=True)
    teacher = AutoModelForCausalLM.from_pretrained(str(micro_zoo.model_path("target")))
    start = FAST["prompt_tokens"]
    assert blocks["sampled"].shape == blocks["greedy"].shape == (12, 33)
    assert torch.equal(blocks["sampled"], blocks["again"])
    assert not torch.equal(blocks["sampled"], blocks["other_seed"])
    # Prompts are the same rows of the dataset; only the continuations differ.
    assert torch.equal(blocks["sampled"][:, :start], blocks["greedy"][:, :start])
    assert greedy_fraction(teacher, blocks["greedy"], start) > 0.99
    assert greedy_fraction(teacher, blocks["sampled"], start) < 0.95


def test_divergence_setting_reaches_the_loss(micro_zoo: ZooManifest, tmp_path: Path) -> None:
    teacher = AutoModelForCausalLM.from_pretrained(str(micro_zoo.model_path("target")))
    draft = AutoModelForCausalLM.from_pretrained(str(micro_zoo.model_path("draft-xs")))
    first: dict[str, float] = {}
    for kind in ("forward_kl", "reverse_kl", "tvd"):
        directory = tmp_path / kind
        config = job(micro_zoo, "distillspec", {"divergence": kind, "max_steps": 2})
        first[kind] = run_job(config, directory, progress=False).metrics["train_loss_first"]
        blocks = torch.load(directory / DATA_DIR / "train_blocks.pt", weights_only=True)
        order = torch.randperm(blocks.shape[0], generator=torch.Generator().manual_seed(0))
        inputs = blocks[order[: FAST["batch_size"]], :-1]
        with torch.no_grad():
            expected = distillation_loss(
                kind, teacher(input_ids=inputs).logits, draft(input_ids=inputs).logits
            )
        assert first[kind] == pytest.approx(expected.item(), rel=1e-4)
    assert len({round(value, 6) for value in first.values()}) == 3
    assert 0.0 < first["tvd"] < 1.0


# ---------------------------------------------------------------------------------------------
# AdaSPEC
# ---------------------------------------------------------------------------------------------


def test_kept_count_rounds_half_up_and_keeps_one() -> None:
    assert kept_count(10, 0.4) == 4
    assert kept_count(10, 0.25) == 3
    assert kept_count(10, 0.7) == 7
    assert kept_count(3, 0.1) == 1
    assert kept_count(5, 1.0) == 5
    assert kept_count(0, 0.4) == 0


def test_adaspec_filter_keeps_the_largest_deltas() -> None:
    delta = torch.tensor([[0.5, -1.0, 2.0, 0.1, 3.0], [1.5, 0.0, -0.2, 2.5, 0.3]])
    mask = adaspec_token_mask(delta, 0.4)
    expected = torch.tensor([[0, 0, 1, 0, 1], [1, 0, 0, 1, 0]], dtype=torch.bool)
    assert torch.equal(mask, expected)
    valid = torch.ones_like(delta, dtype=torch.bool)
    valid[0, 4] = False
    valid[1, 1] = False
    masked = adaspec_token_mask(delta, 0.4, valid)
    # 8 valid tokens, round(3.2) = 3 kept: 2.5, 2.0, 1.5 (3.0 is masked out)
    expected_masked = torch.tensor([[0, 0, 1, 0, 0], [1, 0, 0, 1, 0]], dtype=torch.bool)
    assert torch.equal(masked, expected_masked)


def test_adaspec_loss_is_the_kept_sum_over_k_times_tokens() -> None:
    delta = torch.tensor([[0.5, -1.0, 2.0, 0.1, 3.0], [1.5, 0.0, -0.2, 2.5, 0.3]])
    per_token = torch.arange(1.0, 11.0).view(2, 5)
    # kept: delta 3.0, 2.5, 2.0, 1.5 at per-token values 5, 9, 3, 6
    assert adaspec_loss(per_token, delta, 0.4).item() == pytest.approx((5 + 9 + 3 + 6) / 4.0)
    assert adaspec_loss(per_token, delta, 1.0).item() == pytest.approx(55 / 10)


def test_adaspec_trains_reference_and_draft(micro_zoo: ZooManifest, tmp_path: Path) -> None:
    result = run_job(job(micro_zoo, "adaspec"), tmp_path, progress=False)
    metrics = result.metrics
    assert metrics["heldout_kl"] < metrics["initial_heldout_kl"]
    assert metrics["reference_heldout_kl"] < metrics["initial_heldout_kl"]
    assert 0.0 <= metrics["reference_heldout_agreement"] <= 1.0
    assert metrics["steps"] == metrics["reference_steps"] == 8
    card = json.loads((Path(result.artifact_path) / "model_card.json").read_text())
    assert card["lr_draft"] == pytest.approx(FAST["lr"] * 0.4)
    assert_loads_and_decodes(result.artifact_path)
    reference = assert_loads_and_decodes(tmp_path / "reference")
    drafted = artifact_tensors(result.artifact_path)
    key = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(reference.state_dict()[key], drafted[key])


def draft_with_vocab(zoo: ZooManifest, directory: Path) -> tuple[Path, list[int]]:
    """Copy the micro draft-xs to ``directory`` with a ``draft_vocab`` (every third id) in its
    config, as the smol zoo's drafts carry; return the copy and the ids."""
    shutil.copytree(zoo.model_path("draft-xs"), directory)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    kept = list(range(0, config["vocab_size"], 3))
    config_path.write_text(json.dumps({**config, "draft_vocab": kept}))
    return directory, kept


@pytest.mark.parametrize("kind", ["distillspec", "adaspec"])
def test_a_draft_vocab_survives_kd_training(
    micro_zoo: ZooManifest, tmp_path: Path, kind: str
) -> None:
    """KD trains the full head of a draft with a ``draft_vocab`` and its artifact keeps the ids,
    so the trained draft decodes over the same restricted head as its starting draft."""
    base, kept = draft_with_vocab(micro_zoo, tmp_path / "base")
    config = job(micro_zoo, kind, base=str(base))
    result = run_job(config, tmp_path / "job", progress=False)
    saved = json.loads((Path(result.artifact_path) / "config.json").read_text())
    assert saved["draft_vocab"] == kept
    assert AutoModelForCausalLM.from_pretrained(result.artifact_path).config.draft_vocab == kept
    assert result.metrics["heldout_kl"] < result.metrics["initial_heldout_kl"]
    if kind == "adaspec":
        reference = json.loads((tmp_path / "job" / "reference" / "config.json").read_text())
        assert reference["draft_vocab"] == kept


# ---------------------------------------------------------------------------------------------
# Resume after a crash
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "module", "loss_name"),
    [("distillspec", distillspec, "distillation_loss"), ("adaspec", adaspec, "adaspec_loss")],
)
def test_crashed_job_resumes_to_the_uninterrupted_weights(
    micro_zoo: ZooManifest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    module: Any,
    loss_name: str,
) -> None:
    config = job(micro_zoo, kind)
    clean = run_job(config, tmp_path / "clean", progress=False)
    crash_on_call = 6
    calls = {"n": 0}
    original = getattr(module, loss_name)

    def crashing(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == crash_on_call:
            raise RuntimeError("simulated crash")
        return original(*args, **kwargs)

    monkeypatch.setattr(module, loss_name, crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_job(config, tmp_path / "crashed", progress=False)
    assert not (tmp_path / "crashed" / "artifact").exists()
    monkeypatch.setattr(module, loss_name, original)
    resumed = run_job(config, tmp_path / "crashed", progress=False)
    assert 0 < resumed.resumed_from_step < crash_on_call
    expected = artifact_tensors(clean.artifact_path)
    actual = artifact_tensors(resumed.artifact_path)
    assert expected.keys() == actual.keys()
    for key, value in expected.items():
        assert torch.equal(value, actual[key]), key
    assert resumed.metrics["train_loss"] == pytest.approx(clean.metrics["train_loss"], abs=1e-6)


# ---------------------------------------------------------------------------------------------
# EESD early exit
# ---------------------------------------------------------------------------------------------


def test_exit_init_layer_skips_function_preserving_layers() -> None:
    card = {"trained_layers": [0, 1], "added_layers": [2, 3]}
    index, note = exit_init_layer(4, card, [False, False, True, True])
    assert index == 1
    assert "enlargement" in note
    assert exit_init_layer(4, None, [False, False, True, True])[0] == 1
    assert exit_init_layer(4, None, [False] * 4)[0] == 3
    assert exit_init_layer(4, {"trained_layers": [0, 1, 2, 3]}, [False] * 4)[0] == 3


def eesd_job(zoo: ZooManifest, base: str, settings: dict[str, Any] | None = None) -> JobConfig:
    """Return a small early-exit job on ``base`` (its own teacher)."""
    config = job(zoo, "eesd_exit", {"generated_fraction": 0.5, **(settings or {})})
    return JobConfig(**{**config.to_json(), "base": base, "teacher": None})


def assert_frozen_part_is_the_targets(draft: dict[str, torch.Tensor], target: Path, n: int) -> None:
    """Assert the draft's embeddings and first ``n`` layers equal the target's exactly."""
    weights = artifact_tensors(target)
    frozen = [k for k in draft if k.startswith("model.embed_tokens.")]
    for layer in range(n):
        frozen += [k for k in draft if k.startswith(f"model.layers.{layer}.")]
    assert frozen
    for key in frozen:
        assert torch.equal(draft[key], weights[key]), key


def test_eesd_exit_on_the_zoo_target_starts_from_its_last_trained_layer(
    micro_zoo: ZooManifest, tmp_path: Path
) -> None:
    target = micro_zoo.model_path("target")
    result = run_job(eesd_job(micro_zoo, str(target)), tmp_path, progress=False)
    model = assert_loads_and_decodes(result.artifact_path)
    assert model.config.num_hidden_layers == 2
    assert result.metrics["exit_layers"] == 1
    assert result.metrics["init_layer"] == 1
    card = json.loads((Path(result.artifact_path) / "model_card.json").read_text())
    assert "function-preserving" in card["init_note"]
    draft = artifact_tensors(result.artifact_path)
    assert_frozen_part_is_the_targets(draft, target, 1)
    # layer 2 of the micro target is a zero layer: layers 0-1 alone compute the target
    assert result.metrics["initial_heldout_agreement"] > 0.999
    assert result.metrics["initial_heldout_kl"] < 1e-4


def test_eesd_exit_distillation_brings_the_draft_closer(
    micro_zoo: ZooManifest, tmp_path: Path
) -> None:
    zoo_target = AutoModelForCausalLM.from_pretrained(str(micro_zoo.model_path("target")))
    deeper = copy.deepcopy(zoo_target)
    # a real (non-zero) last layer: a copy of layer 0, so the exit draft starts without layer 1
    deeper.model.layers[2].load_state_dict(zoo_target.model.layers[0].state_dict())
    target = tmp_path / "deeper-target"
    deeper.save_pretrained(str(target))
    AutoTokenizer.from_pretrained(str(micro_zoo.model_path("target"))).save_pretrained(str(target))
    result = run_job(
        eesd_job(micro_zoo, str(target), {"exit_layers": 1}), tmp_path / "job", progress=False
    )
    metrics = result.metrics
    assert metrics["init_layer"] == 2
    assert metrics["initial_heldout_kl"] > 1e-3
    assert metrics["heldout_kl"] < metrics["initial_heldout_kl"]
    draft = artifact_tensors(result.artifact_path)
    assert_frozen_part_is_the_targets(draft, target, 1)
    assert not torch.equal(
        draft["model.layers.1.mlp.up_proj.weight"],
        artifact_tensors(target)["model.layers.2.mlp.up_proj.weight"],
    )
    assert_loads_and_decodes(result.artifact_path)


# ---------------------------------------------------------------------------------------------
# Data mixing and bad settings
# ---------------------------------------------------------------------------------------------


def test_hub_datasets_hold_out_a_tail_slice(tmp_path: Path) -> None:
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i + 1}"} for i in range(20)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    config = JobConfig(
        kind="distillspec",
        name="hub",
        base="unused",
        dataset="gsm8k",
        samples=20,
        local_path=str(path),
    )
    texts = kd_texts(config, with_prompts=True)
    assert len(texts.train) == len(texts.prompts) == 18
    assert texts.heldout == [
        "Question: What is 18 + 1?\nAnswer:19",
        "Question: What is 19 + 1?\nAnswer:20",
    ]
    assert texts.prompts[0] == "Question: What is 0 + 1?\nAnswer:"
    assert not set(texts.heldout) & set(texts.train)


def test_mix_counts() -> None:
    assert mix_counts(10, 100, 0.5) == (10, 10)
    assert mix_counts(100, 10, 0.5) == (10, 10)
    assert mix_counts(100, 30, 0.25) == (10, 30)
    assert mix_counts(7, 30, 0.0) == (0, 30)
    assert mix_counts(7, 30, 1.0) == (7, 0)


@pytest.mark.parametrize(
    ("kind", "settings", "key"),
    [
        ("distillspec", {"learning_rate": 1e-3}, "learning_rate"),
        ("distillspec", {"lr": "fast"}, "lr"),
        ("distillspec", {"divergence": "js"}, "divergence"),
        ("distillspec", {"max_steps": 2.5}, "max_steps"),
        ("distillspec", {"data": "target", "sample_temperature": -0.5}, "sample_temperature"),
        ("distillspec", {"data": "target", "sample_temperature": "hot"}, "sample_temperature"),
        ("distillspec", {"sample_temperature": 1.0}, "sample_temperature"),
        ("distillspec", {"workers": 0}, "workers"),
        ("adaspec", {"keep_fraction": "most"}, "keep_fraction"),
        ("adaspec", {"keep_fraction": 1.5}, "keep_fraction"),
        ("adaspec", {"exit_layers": 1}, "exit_layers"),
        ("eesd_exit", {"divergence": "tvd"}, "divergence"),
        ("eesd_exit", {"exit_layers": True}, "exit_layers"),
        ("eesd_exit", {"generated_fraction": 2}, "generated_fraction"),
    ],
)
def test_bad_settings_name_the_key(
    micro_zoo: ZooManifest, tmp_path: Path, kind: str, settings: dict[str, Any], key: str
) -> None:
    config = JobConfig(
        kind=kind,
        name="bad",
        base=str(micro_zoo.model_path("draft-xs")),
        teacher=str(micro_zoo.model_path("target")),
        dataset="builtin:code",
        settings=settings,
    )
    with pytest.raises(JobConfigError, match=key):
        run_job(config, tmp_path, progress=False)
