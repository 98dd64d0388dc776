"""The eagle_head job on the micro target: it learns, its artifact loads and drafts, it resumes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from support.eagle_heads import greedy_continuations, untrained_head
from support.tiny_models import build_tiny_pair

from policies import make_policy
from training.eagle_training import (
    EagleLossWeights,
    SequenceFeatures,
    agreement_at_steps,
    sequence_features,
    train_steps,
)
from training.job_settings import JobConfigError
from training.jobs import JobConfig, run_job
from training.jobs import eagle_head as eagle_job
from training.jobs.base import RESULT_FILE
from training.jobs.head_data import DATA_FILE
from training.lm_trainer import TrainConfig, torch_threads
from training.zoo.cache import ZooManifest
from workers.eagle.artifact import HEAD_FILE, load_eagle_head
from workers.eagle.drafter import EagleDrafter
from workers.eagle.layers import eagle3_layers
from workers.engine import speculative_generate
from workers.lm import CachedLM, load_causal_lm
from workers.proposers import make_proposer
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget, VerifyRequest

torch.set_num_threads(1)

SETTINGS: dict[str, Any] = {
    "prompt_tokens": 16,
    "response_tokens": 32,
    "lr": 0.005,
    "eval_fraction": 0.25,
    "head_vocab": 256,
}
CRASH_AT_STEP = 15


def _config(zoo: ZooManifest) -> JobConfig:
    return JobConfig(
        kind="eagle_head",
        name="test-eagle",
        base=str(zoo.model_path("target")),
        dataset="builtin:code",
        samples=48,
        epochs=4,
        settings=SETTINGS,
    )


@pytest.fixture(scope="module")
def eagle_run(micro_zoo, tmp_path_factory):
    """The job run once, uninterrupted: (config, output folder, result)."""
    config = _config(micro_zoo)
    output = tmp_path_factory.mktemp("eagle")
    return config, output, run_job(config, output, progress=False)


def test_head_learns_the_targets_greedy_text(eagle_run, micro_zoo):
    config, output, result = eagle_run
    assert result.artifact_kind == "eagle_head"
    assert result.metrics["train_loss_end"] < result.metrics["train_loss_start"]
    target = load_causal_lm(micro_zoo.model_path("target"))
    saved = load_file(str(output / DATA_FILE))
    data = SequenceFeatures(saved["tokens"], saved["features"], saved["valid"], saved["choices"])
    settings = eagle_job.settings_of(config)
    untrained = eagle_job.make_head(target, data, settings, saved["specials"].tolist())
    before = agreement_at_steps(untrained, data, SETTINGS["prompt_tokens"], steps=1)[0]
    assert result.metrics["agreement_step1"] >= 0.5
    assert result.metrics["agreement_step1"] > before + 0.3


def test_loaded_head_drafts_losslessly_for_the_target(eagle_run, micro_zoo):
    _, output_dir, result = eagle_run
    target = load_causal_lm(micro_zoo.model_path("target"))
    head = load_eagle_head(result.artifact_path, target)
    assert head.config.head_vocab is not None and len(head.config.head_vocab) == 256
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=24)
    local = LocalTarget(CachedLM(target, single_step="plain"))
    prompt = load_file(str(output_dir / DATA_FILE))["tokens"][0, : SETTINGS["prompt_tokens"]]
    reference = local.generate(prompt, RequestSettings(sampling=greedy, seed=0)).output_ids
    drafter = EagleDrafter(head)
    drafter.begin(prompt, local.prefill(prompt, greedy, seed=0, want_features=True))
    pending, output, accepted = prompt[-1:], [], 0
    while len(output) < greedy.max_new_tokens:
        drafts = [drafter.propose(greedy).token for _ in range(3)]
        block = torch.cat([pending, torch.tensor(drafts)])
        response = local.verify(VerifyRequest(block, want_features=True))
        drafter.accept(response.n_accepted, response.next_token, response.features)
        output += [*drafts[: response.n_accepted], response.next_token]
        accepted += response.n_accepted
        pending = torch.tensor([response.next_token])
    assert output[: greedy.max_new_tokens] == reference
    assert accepted > 0


@pytest.mark.parametrize("policy", ["static", "max_confidence"])
def test_the_eagle_draft_kind_runs_the_jobs_head_in_the_engine(eagle_run, micro_zoo, policy):
    """The job's artifact through ``make_proposer`` and ``speculative_generate``: greedy output
    is the target's (static K: with drafts accepted); sampling runs with the head's q."""
    _, output_dir, result = eagle_run
    target = load_causal_lm(micro_zoo.model_path("target"))
    local = LocalTarget(CachedLM(target, single_step="plain"))
    proposer = make_proposer("eagle", head_path=result.artifact_path, target_model=target)
    prompt = load_file(str(output_dir / DATA_FILE))["tokens"][1, : SETTINGS["prompt_tokens"]]
    greedy = RequestSettings(sampling=SamplingConfig(temperature=0.0, max_new_tokens=24))
    reference = local.generate(prompt, greedy).output_ids
    spec = speculative_generate(proposer, local, make_policy(policy, 4), prompt, greedy)
    assert spec.output_ids == reference
    if policy == "static":  # the confidence policy may stop every round: the head is unsure
        assert spec.n_accepted > 0
    sampled = RequestSettings(sampling=SamplingConfig(temperature=0.8, max_new_tokens=24), seed=3)
    result = speculative_generate(proposer, local, make_policy(policy, 4), prompt, sampled)
    assert len(result.output_ids) == 24
    assert result.n_drafted > 0 or policy != "static"


def test_job_resumes_after_a_crash_to_the_same_weights(eagle_run, tmp_path):
    config, _, uninterrupted = eagle_run
    calls = {"n": 0}
    original = eagle_job.eagle_loss

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > CRASH_AT_STEP:
            raise RuntimeError("simulated crash")
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(eagle_job, "eagle_loss", crashing)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_job(config, tmp_path, progress=False)
    assert not (tmp_path / RESULT_FILE).exists()
    resumed = run_job(config, tmp_path, progress=False)
    assert resumed.resumed_from_step == 15  # the end of epoch 3 (5 steps each)
    expected = load_file(str(Path(uninterrupted.artifact_path) / HEAD_FILE))
    actual = load_file(str(Path(resumed.artifact_path) / HEAD_FILE))
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


def test_head_learns_the_targets_greedy_continuations() -> None:
    """The planted pattern: the tiny target's own greedy continuations of random prompts.
    Trained on 48 of them, the head's held-out step-1 agreement far exceeds an untrained
    head's. (About five CPU-seconds of training, so it is here rather than in the unit tier.)"""
    target = build_tiny_pair()[1]
    with torch_threads(1):
        tokens = greedy_continuations(target, 60, seed=11)
        data = sequence_features(target, tokens, torch.ones_like(tokens, dtype=torch.bool))
        train, held_out = data.rows(torch.arange(48)), data.rows(torch.arange(48, 60))
        head = untrained_head(target, seed=1)
        before = agreement_at_steps(head, held_out, first_start=3, steps=2)
        config = TrainConfig(steps=150, batch_size=8, lr=3e-3, warmup_steps=10, seed=0)
        losses = train_steps(head, train, config, EagleLossWeights(noise=0.05))
        after = agreement_at_steps(head, held_out, first_start=3, steps=2)
    assert losses[-1] < losses[0]
    assert after[0] >= 0.6 and after[0] > before[0] + 0.3, (before, after)


def test_a_fused_head_learns_the_targets_greedy_continuations() -> None:
    """The planted pattern again, for a head fusing the tiny target's first two layers (not
    its last): trained on the cross-entropy alone, as EAGLE-3 is, its held-out step-1 agreement
    far exceeds an untrained fused head's."""
    target = build_tiny_pair()[1]
    layers = (0, 1)
    with torch_threads(1):
        tokens = greedy_continuations(target, 60, seed=11)
        valid = torch.ones_like(tokens, dtype=torch.bool)
        data = sequence_features(target, tokens, valid, layers=layers)
        train, held_out = data.rows(torch.arange(48)), data.rows(torch.arange(48, 60))
        head = untrained_head(target, seed=1, feature_layers=layers)
        before = agreement_at_steps(head, held_out, first_start=3, steps=2)
        config = TrainConfig(steps=150, batch_size=8, lr=3e-3, warmup_steps=10, seed=0)
        weights = EagleLossWeights(w_feature=0.0, w_token=1.0, noise=0.05)
        losses = train_steps(head, train, config, weights)
        after = agreement_at_steps(head, held_out, first_start=3, steps=2)
    assert losses[-1] < losses[0]
    assert after[0] >= 0.6 and after[0] > before[0] + 0.3, (before, after)


FUSED_SETTINGS: dict[str, Any] = {**SETTINGS, "feature_layers": "eagle3"}


@pytest.fixture(scope="module")
def fused_run(micro_zoo, tmp_path_factory):
    """The job run once with ``feature_layers: eagle3`` (the micro target's 3 layers: 0, 1),
    for more epochs than the EAGLE-1 run: its ``layers_fc`` starts from random weights (after 4
    epochs its step-1 agreement was 0.02, after 12 about 0.8)."""
    config = dataclasses.replace(
        _config(micro_zoo), name="fused", epochs=12, settings=FUSED_SETTINGS
    )
    output = tmp_path_factory.mktemp("fused")
    return config, output, run_job(config, output, progress=False)


def test_a_fused_job_learns_and_its_artifact_records_the_layers(fused_run, micro_zoo):
    config, output, result = fused_run
    target = load_causal_lm(micro_zoo.model_path("target"))
    head = load_eagle_head(result.artifact_path, target)
    assert head.config.feature_layers == eagle3_layers(target.config.num_hidden_layers) == (0, 1)
    saved = load_file(str(output / DATA_FILE))
    assert saved["layers"].shape[-1] == 2 * target.config.hidden_size
    data = SequenceFeatures(
        saved["tokens"], saved["features"], saved["valid"], saved["choices"], saved["layers"]
    )
    settings = eagle_job.settings_of(config)
    untrained = eagle_job.make_head(target, data, settings, saved["specials"].tolist())
    before = agreement_at_steps(untrained, data, SETTINGS["prompt_tokens"], steps=1)[0]
    assert result.metrics["train_loss_end"] < result.metrics["train_loss_start"]
    assert result.metrics["agreement_step1"] >= 0.5
    assert result.metrics["agreement_step1"] > before + 0.3


@pytest.mark.parametrize("fast", [True, False])
def test_a_fused_jobs_head_drafts_losslessly_on_both_model_paths(fused_run, micro_zoo, fast):
    """The fused artifact through the ``eagle`` draft kind, as a sweep loads it: greedy output
    is the target's with drafts accepted, on the plain-torch and the transformers path."""
    _, output_dir, result = fused_run
    target = load_causal_lm(micro_zoo.model_path("target"))
    lm = CachedLM(target, fast=fast, single_step="plain")
    assert lm.fast_path == fast
    local = LocalTarget(lm)
    proposer = make_proposer("eagle", head_path=result.artifact_path, target_model=target)
    prompt = load_file(str(output_dir / DATA_FILE))["tokens"][1, : SETTINGS["prompt_tokens"]]
    greedy = RequestSettings(sampling=SamplingConfig(temperature=0.0, max_new_tokens=24))
    reference = local.generate(prompt, greedy).output_ids
    spec = speculative_generate(proposer, local, make_policy("static", 4), prompt, greedy)
    assert spec.output_ids == reference
    assert spec.n_accepted > 0


def test_a_layer_past_the_targets_depth_is_refused_before_any_data(micro_zoo, tmp_path):
    depth = load_causal_lm(micro_zoo.model_path("target")).config.num_hidden_layers
    config = dataclasses.replace(
        _config(micro_zoo), settings={**SETTINGS, "feature_layers": [0, depth]}
    )
    with pytest.raises(JobConfigError, match=rf"setting 'feature_layers'.*target's {depth} layers"):
        run_job(config, tmp_path, progress=False)
    assert not (tmp_path / DATA_FILE).exists()
