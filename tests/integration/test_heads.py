"""SpecDec++ acceptance head and Cali-TS predictor: data and labels, training jobs, loaders, and
their use by the engine (lossless output, the trained callables actually consulted)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from policies import CaliTSPolicy, DraftStep
from training.jobs import JobConfig, JobConfigError, run_job
from training.jobs import cali_ts_predictor as cali_job
from training.jobs import specdecpp_head as head_job
from training.jobs.base import RESULT_FILE
from training.jobs.head_data import (
    acceptance_labels,
    binary_kl,
    forward_states,
    prompt_batch,
    response_mask,
    weighted_bce,
)
from training.zoo.cache import ZooManifest
from workers.datasets import DatasetSpec, load_prompts
from workers.engine import RequestSettings, speculative_generate
from workers.heads import (
    AcceptanceHead,
    load_acceptance_head,
    load_cali_predictor,
    load_runtime_inputs,
)
from workers.lm import CachedLM, load_causal_lm
from workers.records import SamplingConfig
from workers.target import LocalTarget
from workers.trial import TrialRequest, run_trial

torch.set_num_threads(1)

DRAFT = "draft-xs"
HEAD_SETTINGS = {
    "prompt_tokens": 16,
    "response_tokens": 32,
    "temperature": 0.0,
    "lr": 1e-2,
    "w_rej": 1.0,
    "eval_fraction": 0.25,
}
CRASH_AT_STEP = 25


def _job_config(zoo: ZooManifest, kind: str, settings: dict[str, Any]) -> JobConfig:
    """Return a small job on the micro pair (draft-xs drafting for the micro target)."""
    return JobConfig(
        kind=kind,
        name=f"test-{kind}",
        base=str(zoo.model_path(DRAFT)),
        teacher=str(zoo.model_path("target")),
        dataset="builtin:code",
        samples=48,
        epochs=3,
        settings=settings,
    )


def _run_capturing(
    config: JobConfig, output_dir: Path, module_of: Any
) -> tuple[Any, torch.nn.Module]:
    """Run the job and return (its result, the module it trained)."""
    captured: list[torch.nn.Module] = []
    original = module_of.seeded_module

    def capture(seed, make):
        captured.append(original(seed, make))
        return captured[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module_of, "seeded_module", capture)
        result = run_job(config, output_dir, progress=False)
    return result, captured[0]


@pytest.fixture(scope="module")
def head_run(micro_zoo, tmp_path_factory):
    """The SpecDec++ head job run once, uninterrupted: (config, result, trained module)."""
    config = _job_config(micro_zoo, "specdecpp_head", HEAD_SETTINGS)
    result, module = _run_capturing(config, tmp_path_factory.mktemp("head"), head_job)
    return config, result, module


@pytest.fixture(scope="module")
def cali_run(micro_zoo, tmp_path_factory):
    """The Cali-TS predictor job run once: (result, trained module)."""
    config = _job_config(
        micro_zoo,
        "cali_ts_predictor",
        {"prompt_tokens": 16, "response_tokens": 32, "lr": 3e-3, "eval_fraction": 0.25},
    )
    return _run_capturing(config, tmp_path_factory.mktemp("cali"), cali_job)


@pytest.fixture(scope="module")
def micro_models(micro_zoo):
    """(draft, target) causal LMs of the micro pair, fp32 on CPU."""
    return (
        load_causal_lm(micro_zoo.model_path(DRAFT)),
        load_causal_lm(micro_zoo.model_path("target")),
    )


@pytest.fixture(scope="module")
def micro_prompts(micro_zoo) -> list[list[int]]:
    """Six 16-token prompts from held-out code text."""
    tokenizer = _tokenizer(micro_zoo)
    texts = [p.text for p in load_prompts(DatasetSpec("builtin:code", split="heldout", samples=12))]
    return prompt_batch(tokenizer, texts, 16)[:6].tolist()


def _tokenizer(zoo: ZooManifest):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(zoo.model_path("target"))


# ---------------------------------------------------------------------------------------------
# Pure pieces: the head's shape, labels, mixing, losses
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_acceptance_head_is_a_depth_plus_one_layer_resnet(depth):
    head = AcceptanceHead(hidden_size=8, depth=depth)
    linears = [m for m in head.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == depth + 1
    assert head.output.out_features == 1
    x = torch.randn(5, 8)
    expected = x
    for block in head.blocks:
        expected = expected + torch.nn.functional.silu(block(expected))
    expected = head.output(expected).squeeze(-1)
    torch.testing.assert_close(head(x), expected)


def test_labels_and_mixing_match_a_hand_computation():
    target_probs = torch.tensor([[0.25, 0.5, 0.25], [0.3, 0.3, 0.4], [0.1, 0.1, 0.8]])
    draft_probs = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.6, 0.2], [0.1, 0.1, 0.8]])
    response = torch.tensor([7, 8, 9])
    draft_tokens = torch.tensor([0, 1, 2])
    draft_mask = torch.tensor([True, False, True])
    mixed, labels = head_job.label_block(
        target_probs, draft_probs, response, draft_tokens, draft_mask
    )
    assert mixed.tolist() == [0, 8, 2]
    torch.testing.assert_close(labels, torch.tensor([0.25 / 0.5, 0.3 / 0.6, 1.0]))
    # p(y) > q(y) is capped at 1.
    assert acceptance_labels(target_probs[:1], draft_probs[:1], torch.tensor([1])).item() == 1.0

    generator = torch.Generator().manual_seed(0)
    mask = head_job.mix_mask((200, 100), 0.15, generator)
    assert abs(mask.float().mean().item() - 0.85) < 0.01
    assert bool(head_job.mix_mask((4, 4), 0.0, generator).all())


def test_response_mask_keeps_tokens_up_to_the_first_eos():
    response = torch.tensor([[5, 1, 6, 1], [5, 6, 7, 8]])
    assert response_mask(response, 1).tolist() == [
        [True, True, False, False],
        [True, True, True, True],
    ]


def test_binary_losses_match_their_formulas():
    labels = torch.tensor([0.8, 0.0, 1.0])
    logits = torch.tensor([0.5, -1.0, 2.0])
    s = torch.sigmoid(logits)
    kl = (
        0.8 * torch.log(0.8 / s[0])
        + 0.2 * torch.log(0.2 / (1 - s[0]))
        + torch.log(1 / (1 - s[1]))
        + torch.log(1 / s[2])
    ) / 3
    torch.testing.assert_close(binary_kl(labels, logits), kl)
    weighted = -(2.0 * labels * torch.log(s) + 6.0 * (1 - labels) * torch.log(1 - s)).mean()
    torch.testing.assert_close(weighted_bce(labels, logits, 2.0, 6.0), weighted)


def test_greedy_unmixed_examples_are_the_drafts_argmax_continuation(micro_models, micro_prompts):
    draft, target = micro_models
    sequences = torch.tensor(micro_prompts)[:3]
    prompt_len = 8
    examples = head_job.specdecpp_examples(
        target,
        draft,
        sequences,
        prompt_len,
        SamplingConfig(),
        mix_ratio=0.0,
        generator=torch.Generator().manual_seed(0),
        eos_token_id=None,
    )
    _, target_logits = forward_states(target, sequences)
    _, draft_logits = forward_states(draft, sequences)
    rows = slice(prompt_len - 1, sequences.shape[1] - 1)
    draft_tokens = draft_logits[:, rows].argmax(-1)
    agree = (draft_tokens == target_logits[:, rows].argmax(-1)).float()
    mixed = torch.cat([sequences[:, :prompt_len], draft_tokens], dim=1)
    hidden, _ = forward_states(draft, mixed)
    assert examples["labels"].tolist() == agree.flatten().tolist()
    # Y_k sits at index prompt_len + k of the mixed sequence; e_k, the state there, has read it.
    torch.testing.assert_close(examples["features"], hidden[:, prompt_len:].flatten(0, 1))
    assert examples["row"].tolist() == torch.arange(3).repeat_interleave(8).tolist()


PLANTED_VOCAB = 8


class _OneHotDecoder(torch.nn.Module):
    """A "decoder" whose last-layer state at each index is the one-hot of the token read there."""

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> SimpleNamespace:
        return SimpleNamespace(last_hidden_state=F.one_hot(input_ids, PLANTED_VOCAB).float())


class _PlantedLM(torch.nn.Module):
    """A context-free LM over PLANTED_VOCAB tokens: its next-token logits are ``bias`` whatever
    it read, and its state after reading token t is one-hot(t)."""

    def __init__(self, bias: torch.Tensor) -> None:
        super().__init__()
        self.decoder = _OneHotDecoder()
        self.lm_head = torch.nn.Linear(PLANTED_VOCAB, PLANTED_VOCAB)
        with torch.no_grad():
            self.lm_head.weight.zero_()
            self.lm_head.bias.copy_(bias)
        self.config = SimpleNamespace()

    def get_decoder(self) -> torch.nn.Module:
        return self.decoder

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head


def test_each_label_is_paired_with_the_state_that_has_read_its_token():
    # SpecDec++ Eq. (3.1): the head reads e_k, the draft's final embedding of the judged token
    # Y_k itself. Planted: the draft is uniform over 8 tokens and its state after token t is
    # one-hot(t); the target puts all its mass on even tokens, so Y_k is accepted (label 1) iff
    # Y_k is even. Only the state that has read Y_k can tell; the state before it cannot.
    draft = _PlantedLM(torch.zeros(PLANTED_VOCAB))
    target = _PlantedLM(torch.tensor([0.0, -1e4] * (PLANTED_VOCAB // 2)))
    generator = torch.Generator().manual_seed(0)
    sequences = torch.randint(0, PLANTED_VOCAB, (6, 40), generator=generator)
    examples = head_job.specdecpp_examples(
        target,
        draft,
        sequences,
        8,
        SamplingConfig(temperature=1.0),
        mix_ratio=0.15,
        generator=generator,
        eos_token_id=None,
    )
    labels, features = examples["labels"], examples["features"]
    assert 100 < labels.numel() < 6 * 32  # mixed: some positions hold the target's token
    assert 0.2 < float(labels.mean()) < 0.8
    judged = features.argmax(-1)
    assert labels.tolist() == (judged % 2 == 0).float().tolist()
    # and a head trained on these pairs learns the rule
    head = AcceptanceHead(PLANTED_VOCAB, depth=0)
    optimizer = torch.optim.Adam(head.parameters(), lr=0.1)
    for _ in range(200):
        optimizer.zero_grad()
        weighted_bce(labels, head(features), 1.0, 1.0).backward()
        optimizer.step()
    predicted = torch.sigmoid(head(features)).detach()
    assert ((predicted > 0.5).float() == labels).all()


def test_settings_errors_name_the_setting(micro_zoo, tmp_path):
    cases = [
        ({"mix_ratio": 1.5}, "mix_ratio"),
        ({"w_rej": "six"}, "w_rej"),
        ({"depth": -1}, "depth"),
        ({"projection": 3}, "projection"),
    ]
    for settings, name in cases:
        config = _job_config(micro_zoo, "specdecpp_head", settings)
        with pytest.raises(JobConfigError, match=name):
            run_job(config, tmp_path / name, progress=False)
    with pytest.raises(JobConfigError, match="max_offset"):
        run_job(
            _job_config(micro_zoo, "cali_ts_predictor", {"max_offset": 0}),
            tmp_path / "cali",
            progress=False,
        )


# ---------------------------------------------------------------------------------------------
# The SpecDec++ head job, its loader, the engine with it
# ---------------------------------------------------------------------------------------------


def test_head_job_learns_and_the_loaded_head_matches_the_trained_one(head_run):
    _, result, module = head_run
    metrics = result.metrics
    assert result.artifact_kind == "specdecpp_head"
    assert metrics["train_loss_end"] < metrics["train_loss_start"]
    assert metrics["eval_kl"] < metrics["const_kl"]
    assert 0.0 < metrics["base_rate"] < 1.0
    config = json.loads((Path(result.artifact_path) / "config.json").read_text())
    assert config["kind"] == "specdecpp_head" and config["depth"] == 3
    head = load_acceptance_head(result.artifact_path)
    hiddens = torch.randn(6, config["hidden_size"])
    with torch.no_grad():
        expected = module(hiddens)
    loaded = torch.tensor([head(h) for h in hiddens])
    torch.testing.assert_close(loaded, expected)


def _trial_outputs(
    micro_models, prompts: list[list[int]], policy: str, runtime_inputs: dict[str, Any]
) -> list[Any]:
    """Decode ``prompts`` greedily with ``policy`` on the micro pair."""
    draft, target = micro_models
    request = TrialRequest(
        prompts=prompts,
        sampling=SamplingConfig(max_new_tokens=32),
        policy=policy,
        max_draft_len=8,
        runtime_inputs=runtime_inputs,
    )
    return run_trial(CachedLM(draft), LocalTarget(CachedLM(target)), request)


class _Counting:
    """Wraps a trained callable; counts its calls and those given a target hidden state."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0
        self.calls_with_target = 0

    def __call__(self, value: Any) -> float:
        self.calls += 1
        self.calls_with_target += getattr(value, "target_hidden", None) is not None
        return self.inner(value)


def test_specdecpp_trial_with_the_trained_head_is_lossless_and_consults_it(
    head_run, micro_models, micro_prompts
):
    _, result, _ = head_run
    inputs = load_runtime_inputs("specdecpp", result.artifact_path)
    counting = _Counting(inputs["head"])
    baseline = _trial_outputs(micro_models, micro_prompts, "ar", {})
    speculative = _trial_outputs(micro_models, micro_prompts, "specdecpp", {"head": counting})
    assert [r.output_ids for r in speculative] == [r.output_ids for r in baseline]
    assert counting.calls >= sum(len(r.rounds) for r in speculative)
    assert sum(r.n_drafted for r in speculative) > 0


def test_head_job_resumes_after_a_crash_to_the_same_weights(head_run, tmp_path):
    config, uninterrupted, _ = head_run
    calls = {"n": 0}
    original = head_job.weighted_bce

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > CRASH_AT_STEP:
            raise RuntimeError("simulated crash")
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(head_job, "weighted_bce", crashing)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_job(config, tmp_path, progress=False)
    assert not (tmp_path / RESULT_FILE).exists()
    resumed = run_job(config, tmp_path, progress=False)
    assert resumed.resumed_from_step == 20
    assert resumed.metrics["train_steps"] == uninterrupted.metrics["train_steps"]
    expected = load_file(str(Path(uninterrupted.artifact_path) / "head.safetensors"))
    actual = load_file(str(Path(resumed.artifact_path) / "head.safetensors"))
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


# ---------------------------------------------------------------------------------------------
# The Cali-TS predictor job, its positions, its loader, the engine with it
# ---------------------------------------------------------------------------------------------


def test_cali_job_learns_and_the_loaded_predictor_matches_the_trained_one(cali_run):
    result, module = cali_run
    metrics = result.metrics
    assert result.artifact_kind == "cali_ts_predictor"
    assert metrics["train_loss_end"] < metrics["train_loss_start"]
    assert metrics["eval_kl"] < metrics["const_kl"]
    config = json.loads((Path(result.artifact_path) / "config.json").read_text())
    assert config["max_offset"] == 10
    assert config["projection_dim"] == config["target_hidden_size"]
    predictor = load_cali_predictor(result.artifact_path)
    for index in (1, 4, 10, 15):
        target_hidden = torch.randn(config["target_hidden_size"])
        hidden = torch.randn(config["draft_hidden_size"])
        step = DraftStep(index=index, position=0, hidden=hidden, target_hidden=target_hidden)
        with torch.no_grad():
            logit = module(target_hidden, hidden, torch.tensor(min(index, 10)))
        assert predictor(step) == pytest.approx(float(torch.sigmoid(logit)), abs=1e-6)
    first_round = DraftStep(index=1, position=0, hidden=torch.randn(config["draft_hidden_size"]))
    assert predictor(first_round) == pytest.approx(config["base_rate"])


class _Recording:
    """A Cali-TS predictor stand-in that records the steps it is shown and says 0.95."""

    def __init__(self) -> None:
        self.steps: list[DraftStep] = []

    def __call__(self, step: DraftStep) -> float:
        self.steps.append(step)
        return 0.95


def test_cali_pairs_are_the_states_the_engine_shows_the_predictor(micro_models, micro_prompts):
    draft_model, target_model = micro_models
    draft, target = CachedLM(draft_model), LocalTarget(CachedLM(target_model))
    checked = 0
    for seed, prompt in enumerate(micro_prompts[:3]):
        recorder = _Recording()
        policy = CaliTSPolicy(max_draft_len=6, predictor=recorder)
        prompt_ids = torch.tensor(prompt)
        result = speculative_generate(
            draft, target, policy, prompt_ids, RequestSettings(SamplingConfig(), seed=seed)
        )
        sequence = torch.tensor([*prompt, *result.output_ids])[None]
        states = cali_job.cali_states(
            target_model,
            draft_model,
            sequence,
            len(prompt),
            SamplingConfig(),
            torch.Generator(),
            eos_token_id=None,
        )
        round_at, generated = {}, 0
        for record in result.rounds:
            round_at[generated] = record
            generated += record.emitted
        for step in recorder.steps:
            record = round_at[step.position - step.index + 1]
            if step.target_hidden is None or step.index > record.accepted + 1:
                continue
            candidate = len(prompt) + step.position
            t, d = cali_job.engine_positions(candidate, step.index)
            first = len(prompt) - 1
            torch.testing.assert_close(
                step.target_hidden, states["target_states"][0, t - first], atol=1e-4, rtol=1e-4
            )
            torch.testing.assert_close(
                step.hidden, states["draft_states"][0, d - first], atol=1e-4, rtol=1e-4
            )
            if step.index <= record.drafted:
                accepted = step.index <= record.accepted
                assert states["labels"][0, d - first].item() == float(accepted)
            checked += 1
    assert checked > 10


def test_cali_trial_with_the_trained_predictor_is_lossless_and_consults_it(
    cali_run, micro_models, micro_prompts
):
    result, _ = cali_run
    inputs = load_runtime_inputs("cali_ts", result.artifact_path)
    counting = _Counting(inputs["predictor"])
    baseline = _trial_outputs(micro_models, micro_prompts, "ar", {})
    speculative = _trial_outputs(micro_models, micro_prompts, "cali_ts", {"predictor": counting})
    assert [r.output_ids for r in speculative] == [r.output_ids for r in baseline]
    assert counting.calls >= sum(len(r.rounds) for r in speculative) - len(micro_prompts)
    assert counting.calls_with_target > 0
    assert sum(r.n_drafted for r in speculative) > 0


def test_runtime_inputs_check_the_policy_and_the_artifact_kind(head_run, cali_run):
    _, head_result, _ = head_run
    cali_result, _ = cali_run
    with pytest.raises(ValueError, match="cali_ts_predictor"):
        load_runtime_inputs("specdecpp", cali_result.artifact_path)
    with pytest.raises(ValueError, match="specdecpp_head"):
        load_runtime_inputs("cali_ts", head_result.artifact_path)
    with pytest.raises(ValueError, match="static"):
        load_runtime_inputs("static", head_result.artifact_path)
