"""The EAGLE head, its stepper, drafter and loaders, and the target's features, on a tiny Llama."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from safetensors.torch import save_file
from support.tiny_models import VOCAB, build_tiny_pair, prompts

from training.eagle_training import (
    frequent_ids,
)
from training.job_settings import JobConfigError
from training.jobs import JobConfig, check_job_config
from training.jobs import eagle_head as eagle_job
from training.lm_trainer import torch_threads
from workers.eagle.artifact import (
    load_eagle_head,
    read_eagle_config,
    save_eagle_head,
)
from workers.eagle.drafter import EagleDrafter
from workers.eagle.head import EagleConfig, EagleHead, TargetParts
from workers.eagle.step import EagleStep
from workers.lm import CachedLM
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget, VerifyRequest

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=16)
VARIANTS = [
    {},
    {"head_vocab": tuple(range(0, VOCAB, 3))},
    {"layernorms": True, "target_norm": False, "fusion_bias": True},
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread: these tiny products run many times slower on threads that spin while
    another process holds their core."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def target():
    return build_tiny_pair()[1]


def _head(target, seed: int = 0, **variant) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(EagleConfig.for_target(target, **variant), TargetParts.of(target))
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return head.eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_step_blocks_equal_the_module_forward(target, variant):
    head = _head(target, **variant)
    features, tokens = torch.randn(1, 11, 64), torch.randint(0, VOCAB, (1, 11))
    with torch.no_grad():
        expected = head(features, tokens)[0, 0]
    step = EagleStep(head)
    blocks = ((0, 4), (4, 5), (5, 11))
    got = torch.cat([step.forward(features[0, a:b], tokens[0, a:b]) for a, b in blocks])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    logits = step.logits(got)
    assert logits.shape == (11, VOCAB)
    if head.kept is not None:
        outside = torch.ones(VOCAB, dtype=torch.bool)
        outside[head.kept] = False
        assert bool((logits[:, outside].softmax(-1) == 0).all() | (logits[:, outside] < -1e8).all())
        assert set(logits.argmax(-1).tolist()) <= set(head.kept.tolist())


def test_verify_returns_the_features_of_the_kept_positions(target):
    local = LocalTarget(CachedLM(target, single_step="plain"))
    prompt = prompts(1, seed=3)[0]
    prompt_features = local.prefill(prompt, GREEDY, seed=0, want_features=True)
    full = target.model(input_ids=prompt[None]).last_hidden_state[0]
    torch.testing.assert_close(prompt_features, full[:-1], atol=1e-5, rtol=1e-4)
    greedy_next = int(target(input_ids=prompt[None]).logits[0, -1].argmax())
    block = torch.cat([prompt[-1:], torch.tensor([greedy_next, 5, 7])])
    request = pickle.loads(pickle.dumps(VerifyRequest(block, want_features=True)))
    assert request.want_features
    response = local.verify(request)
    sequence = torch.cat([prompt, block[1:]])
    full = target.model(input_ids=sequence[None]).last_hidden_state[0]
    kept = response.n_accepted + 1
    assert response.features.shape == (kept, 64)
    start = prompt.numel() - 1
    torch.testing.assert_close(response.features, full[start : start + kept], atol=1e-5, rtol=1e-4)
    assert local.verify(VerifyRequest(torch.tensor([3]))).features is None


def _speculate(target, head, prompt, k: int) -> list[int]:
    """Greedy speculative decoding with the drafter; also check after every round that the
    drafter's next proposal equals a fresh drafter's begun on the whole prefix."""
    local = LocalTarget(CachedLM(target, single_step="plain"))
    drafter = EagleDrafter(head)
    drafter.begin(prompt, local.prefill(prompt, GREEDY, seed=0, want_features=True))
    pending, output = prompt[-1:], []
    while len(output) < GREEDY.max_new_tokens:
        drafts = [drafter.propose(GREEDY).token for _ in range(k)]
        block = torch.cat([pending, torch.tensor(drafts)])
        response = local.verify(VerifyRequest(block, want_features=True))
        drafter.accept(response.n_accepted, response.next_token, response.features)
        output += [*drafts[: response.n_accepted], response.next_token]
        pending = torch.tensor([response.next_token])
        sequence = torch.cat([prompt, torch.tensor(output)])
        fresh = EagleDrafter(head)
        with torch.no_grad():
            fresh.begin(sequence, target.model(input_ids=sequence[None]).last_hidden_state[0, :-1])
        ours, theirs = drafter.propose(GREEDY), fresh.propose(GREEDY)
        torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-4, rtol=1e-4)
        drafter.drafted.pop()
        drafter.step.crop(drafter.cached_len)
        drafter._feature = ours.feature  # the proposal is undone: its step-1 feature is kept
    return output[: GREEDY.max_new_tokens]


@pytest.mark.parametrize("k", [1, 3])
def test_drafter_rolls_back_to_true_features_and_keeps_greedy_output(target, k):
    head = _head(target, head_vocab=tuple(range(0, VOCAB, 2)))
    prompt = prompts(1, seed=5)[0]
    output = _speculate(target, head, prompt, k)
    local = LocalTarget(CachedLM(target, single_step="plain"))
    reference = local.generate(prompt, RequestSettings(sampling=GREEDY, seed=0))
    assert output == reference.output_ids


def test_drafter_rejects_wrong_feature_rows(target):
    drafter = EagleDrafter(_head(target))
    prompt = torch.tensor([4, 5, 6])
    with pytest.raises(ValueError, match="all but the last prompt token"):
        drafter.begin(prompt, torch.zeros(3, 64))
    drafter.begin(prompt, torch.zeros(2, 64))
    drafter.propose(GREEDY)
    with pytest.raises(ValueError, match="2 kept positions"):
        drafter.accept(1, 9, torch.zeros(1, 64))
    one_token = EagleDrafter(_head(target))
    one_token.begin(torch.tensor([4]), torch.zeros(0, 64))
    assert 0 <= one_token.propose(GREEDY).token < VOCAB


def test_own_artifact_round_trip(target, tmp_path):
    head = _head(target, head_vocab=(0, 1, 5, 9))
    save_eagle_head(tmp_path, head, {"metrics": {"agreement_step1": 0.5}})
    loaded = load_eagle_head(tmp_path, target)
    assert loaded.config == head.config
    features, tokens = torch.randn(1, 5, 64), torch.randint(0, VOCAB, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(loaded(features, tokens), head(features, tokens))


def test_read_eagle_config_reads_either_layout_and_names_a_directory_that_is_no_head(
    target, tmp_path
):
    head = _head(target, head_vocab=(0, 1, 5, 9))
    save_eagle_head(tmp_path / "own", head, {})
    assert read_eagle_config(tmp_path / "own") == head.config
    published = _head(target, target_norm=False)
    _write_speculators(tmp_path / "spec", published, old_names=False)
    assert read_eagle_config(tmp_path / "spec") == published.config
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"config\.json has kind None.*not an EAGLE head"):
        read_eagle_config(tmp_path / "model")


def _write_speculators(path, head: EagleHead, old_names: bool, model_type: str = "eagle") -> None:
    """Write ``head`` as speculators publishes an EAGLE head: config.json with the layer's
    Llama config (defaults left out) and speculators_config, weights without the verifier's."""
    path.mkdir()
    layer = head.config.layer_config().to_diff_dict()
    config = {
        "architectures": ["EagleSpeculator", "LlamaDecoderLayer"],
        "speculators_model_type": model_type,
        "transformer_layer_architecture": "LlamaDecoderLayer",
        "transformer_layer_config": layer,
        "layernorms": head.config.layernorms,
        "fusion_bias": head.config.fusion_bias,
        "speculators_config": {
            "algorithm": "eagle",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
            "verifier": {"name_or_path": "tiny-target", "architectures": ["LlamaForCausalLM"]},
        },
    }
    (path / "config.json").write_text(json.dumps(config))
    weights = {}
    for name, value in head.state_dict().items():
        if old_names and name.startswith("fusion_fc."):
            name = "fc." + name.removeprefix("fusion_fc.")
        weights[name] = value.contiguous()
    weights["lm_head.weight"] = head.head_rows.contiguous()
    save_file(weights, str(path / "model.safetensors"))


@pytest.mark.parametrize("layernorms", [False, True])
def test_speculators_checkpoint_loads_by_path(target, tmp_path, layernorms):
    head = _head(target, target_norm=False, layernorms=layernorms, fusion_bias=layernorms)
    _write_speculators(tmp_path / "spec", head, old_names=not layernorms)
    loaded = load_eagle_head(tmp_path / "spec", target)
    assert loaded.config == head.config
    features, tokens = torch.randn(1, 6, 64), torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(loaded(features, tokens), head(features, tokens))
    drafter = EagleDrafter(loaded)
    drafter.begin(torch.tensor([3, 4, 5]), torch.randn(2, 64))
    assert 0 <= drafter.propose(GREEDY).token < VOCAB


def test_speculators_loader_names_what_does_not_fit(target, tmp_path):
    head = _head(target, target_norm=False)
    _write_speculators(tmp_path / "medusa", head, old_names=False, model_type="medusa")
    with pytest.raises(ValueError, match="'medusa' is not supported; only 'eagle'"):
        load_eagle_head(tmp_path / "medusa", target)
    other = build_tiny_pair(vocab=VOCAB + 4)[1]
    _write_speculators(tmp_path / "other", _head(other, target_norm=False), old_names=False)
    with pytest.raises(ValueError, match="vocabulary"):
        load_eagle_head(tmp_path / "other", target)


def test_frequent_ids_rank_by_count_and_keep_specials():
    tokens = torch.tensor([5, 5, 5, 7, 7, 2, 9])
    assert frequent_ids(tokens, 3, 12, always=[1]) == [1, 5, 7]


def test_job_settings_are_checked():
    base = {"kind": "eagle_head", "name": "e", "base": "zoo:micro/target"}
    base["dataset"] = "builtin:code"
    check_job_config(JobConfig(**base, settings={"head_vocab": 512, "noise": 0.2}))
    with pytest.raises(JobConfigError, match="unknown settings"):
        check_job_config(JobConfig(**base, settings={"depth": 2}))
    with pytest.raises(JobConfigError, match="same model"):
        check_job_config(JobConfig(**base, teacher="zoo:micro/draft-s"))
    with pytest.raises(JobConfigError, match="cannot both be 0"):
        check_job_config(JobConfig(**base, settings={"w_feature": 0.0, "w_token": 0}))
    with pytest.raises(JobConfigError, match="setting 'unroll_steps' must be >= 1, got 0"):
        check_job_config(JobConfig(**base, settings={"unroll_steps": 0}))
    unrolled = eagle_job.settings_of(JobConfig(**base, settings={"unroll_steps": 3}))
    assert unrolled.loss.unroll_steps == 3
