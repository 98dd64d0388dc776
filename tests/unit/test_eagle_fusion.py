"""EAGLE-3-style fusion of several target layers: the layer choice, the target's layer states on
both model paths, the fused head, its drafter, artifact, loss and job settings, on a tiny Llama."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from support.draft_kinds import PATHS
from support.eagle_heads import untrained_head
from support.tiny_models import VOCAB, build_tiny_pair, prompts
from transformers import LlamaConfig

from orchestrator.run.eagle_checks import head_fit_problems
from policies import make_policy
from training.eagle_training import EagleLossWeights, eagle_loss, sequence_features
from training.job_settings import JobConfigError
from training.jobs import JobConfig, check_job_config
from training.jobs import eagle_head as eagle_job
from training.lm_trainer import torch_threads
from workers.eagle.artifact import HEAD_FILE, load_eagle_head, read_eagle_config, save_eagle_head
from workers.eagle.drafter import EagleDrafter
from workers.eagle.head import EagleConfig
from workers.eagle.layers import (
    check_feature_layers,
    eagle3_layers,
    feature_choice,
    resolve_feature_layers,
)
from workers.eagle.step import EagleStep
from workers.eagle.trace import record_eagle_trace
from workers.engine import autoregressive_generate, speculative_generate
from workers.lm import CachedLM
from workers.proposers import make_proposer
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget, VerifyRequest

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=16)
#: Two of the tiny target's three layers: a middle one (raw residual stream) and the last.
LAYERS = (0, 2)
D = 64


@pytest.fixture(scope="module")
def target():
    """The tiny 3-layer target, under one thread for the module's tests (these tiny products
    run many times slower on threads that spin while another process holds their core)."""
    with torch_threads(1):
        yield build_tiny_pair()[1]


def _states(target, ids: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
    """Return transformers' states after ``layers`` over ``ids`` [n], concatenated [n, k·d]."""
    with torch.no_grad():
        out = target.model(input_ids=ids[None], output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1][0] for i in layers], dim=-1)


def test_eagle3_picks_vllms_low_middle_and_high_layers_clamped_on_shallow_targets():
    assert eagle3_layers(32) == (1, 15, 28)
    assert eagle3_layers(30) == (1, 14, 26)
    assert eagle3_layers(3) == (0, 1)
    assert eagle3_layers(2) == (0, 1)
    assert resolve_feature_layers("eagle3", 30, "f") == (1, 14, 26)


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ([1, 1], "distinct"),
        ([2], "at least 2"),
        ([-1, 1], ">= 0 and below the target's 3 layers"),
        ([0, 3], ">= 0 and below the target's 3 layers"),
        ([0, "1"], "integers"),
        ([0, True], "integers"),
    ],
)
def test_a_bad_layer_choice_is_refused_naming_the_field(layers, message):
    with pytest.raises(ValueError, match=f"^feature_layers.*{message}"):
        check_feature_layers(layers, 3, "feature_layers")


def test_a_layer_choice_is_sorted_and_the_shortcut_named():
    assert check_feature_layers([2, 0], 3, "f") == (0, 2)
    assert feature_choice([5, 1], "f") == (1, 5)
    assert feature_choice("eagle3", "f") == "eagle3"
    with pytest.raises(ValueError, match=r"^f must list layer indices or be 'eagle3'"):
        feature_choice("eagle4", "f")


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("single_step", ["plain", "padded"])
def test_the_target_returns_the_chosen_layers_states_on_both_paths(target, path, single_step):
    lm = CachedLM(target, single_step=single_step, **PATHS[path])
    assert lm.fast_path == (path == "plain_torch")
    local = LocalTarget(lm)
    prompt = prompts(1, seed=3)[0]
    got = local.prefill(prompt, GREEDY, seed=0, want_features=True, feature_layers=LAYERS)
    torch.testing.assert_close(got, _states(target, prompt, LAYERS)[:-1], atol=1e-5, rtol=1e-4)
    greedy_next = int(target(input_ids=prompt[None]).logits[0, -1].argmax())
    start = prompt.numel() - 1
    for block in (torch.tensor([int(prompt[-1]), greedy_next, 5]), prompt[-1:]):
        local.prefill(prompt, GREEDY, seed=0)
        request = VerifyRequest(block, want_features=True, feature_layers=LAYERS)
        request = pickle.loads(pickle.dumps(request))
        assert request.feature_layers == LAYERS
        response = local.verify(request)
        kept = response.n_accepted + 1
        assert response.features.shape == (kept, 2 * D)
        expected = _states(target, torch.cat([prompt, block[1:]]), LAYERS)[start : start + kept]
        torch.testing.assert_close(response.features, expected, atol=1e-5, rtol=1e-4)


def test_fused_step_blocks_equal_the_module_forward(target):
    head = untrained_head(target, feature_layers=LAYERS)
    assert head.layers_fc.weight.shape == (D, 2 * D)
    features, tokens = torch.randn(1, 11, 2 * D), torch.randint(0, VOCAB, (1, 11))
    with torch.no_grad():
        expected = head(features, tokens)[0, 0]
    step = EagleStep(head)
    blocks = ((0, 4), (4, 5), (5, 11))
    got = [step.forward(step.project(features[0, a:b]), tokens[0, a:b]) for a, b in blocks]
    torch.testing.assert_close(torch.cat(got), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_fused_head_keeps_greedy_output_and_its_cache_on_both_paths(target, path):
    head = untrained_head(target, feature_layers=LAYERS, head_vocab=tuple(range(0, VOCAB, 2)))
    local = LocalTarget(CachedLM(target, single_step="plain", **PATHS[path]))
    proposer = make_proposer("eagle", head=head)
    assert proposer.feature_layers == LAYERS
    for index, prompt in enumerate([torch.tensor([7]), *prompts(3, seed=5)]):
        settings = RequestSettings(GREEDY, seed=index)
        reference = autoregressive_generate(local, prompt, settings).output_ids
        result = speculative_generate(proposer, local, make_policy("static", 3), prompt, settings)
        assert result.output_ids == reference, index
        assert result.n_drafted > 0
    sequence = torch.cat([prompt, torch.tensor(result.output_ids)])
    fresh = EagleDrafter(head)
    fresh.begin(sequence, _states(target, sequence, LAYERS)[:-1])
    ours, theirs = proposer.drafter.propose(GREEDY), fresh.propose(GREEDY)
    torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-4, rtol=1e-4)


def test_a_fused_drafter_rejects_rows_of_one_layers_width(target):
    drafter = EagleDrafter(untrained_head(target, feature_layers=LAYERS))
    with pytest.raises(ValueError, match="all but the last prompt token"):
        drafter.begin(torch.tensor([4, 5, 6]), torch.zeros(2, D))
    drafter.begin(torch.tensor([4]), torch.zeros(0, 2 * D))
    assert 0 <= drafter.propose(GREEDY).token < VOCAB


def test_the_fused_layers_round_trip_through_the_artifact(target, tmp_path):
    head = untrained_head(target, feature_layers=LAYERS, head_vocab=(0, 1, 5, 9))
    save_eagle_head(tmp_path, head, {})
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["eagle"]["feature_layers"] == list(LAYERS)
    assert read_eagle_config(tmp_path).feature_layers == LAYERS
    loaded = load_eagle_head(tmp_path, target)
    assert loaded.config == head.config
    features, tokens = torch.randn(1, 5, 2 * D), torch.randint(0, VOCAB, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(loaded(features, tokens), head(features, tokens))
    assert (tmp_path / HEAD_FILE).is_file()
    older = {k: v for k, v in untrained_head(target).config.to_json().items()}
    del older["feature_layers"]  # an artifact saved before fusion existed
    assert EagleConfig.from_json(older).feature_layers == ()


def test_a_fused_head_has_no_regression_term(target):
    tokens = torch.randint(2, VOCAB, (2, 8))
    data = sequence_features(target, tokens, torch.ones_like(tokens, dtype=torch.bool), 2, LAYERS)
    assert data.layers.shape == (2, 8, 2 * D)
    torch.testing.assert_close(data.layers[0], _states(target, tokens[0], LAYERS))
    regression_only = EagleLossWeights(w_feature=1.0, w_token=0.0, noise=0.0)
    fused = untrained_head(target, feature_layers=LAYERS)
    with torch.no_grad():
        assert float(eagle_loss(fused, data, regression_only, None)) == 0.0
        assert float(eagle_loss(untrained_head(target), data, regression_only, None)) > 0.0
        assert float(eagle_loss(fused, data, EagleLossWeights(noise=0.0), None)) > 0.0
    unfused_data = sequence_features(target, tokens, data.valid, 2)
    with pytest.raises(ValueError, match="a fused head needs its layers' states"):
        eagle_loss(fused, unfused_data, regression_only, None)


def _job(**settings) -> JobConfig:
    return JobConfig(
        kind="eagle_head",
        name="e",
        base="zoo:micro/target",
        dataset="builtin:code",
        settings=settings,
    )


def test_the_jobs_feature_layers_setting_is_checked_naming_it():
    assert eagle_job.settings_of(_job(feature_layers=[3, 1])).feature_layers == (1, 3)
    assert eagle_job.settings_of(_job(feature_layers="eagle3")).feature_layers == "eagle3"
    assert eagle_job.settings_of(_job()).feature_layers == ()
    for bad in ([1, 1], [2], [-1, 0], "eagle4", 3):
        with pytest.raises(JobConfigError, match="setting 'feature_layers'"):
            check_job_config(_job(feature_layers=bad))
    with pytest.raises(JobConfigError, match=r"'feature_layers'.*'w_feature'"):
        check_job_config(_job(feature_layers=[0, 1], w_feature=1.0))
    with pytest.raises(JobConfigError, match=r"'feature_layers'.*'w_token'"):
        check_job_config(_job(feature_layers=[0, 1], w_token=0.0))


def test_the_jobs_layers_are_checked_against_the_targets_depth(target):
    settings = eagle_job.settings_of(_job(feature_layers=[0, 3]))
    with pytest.raises(JobConfigError, match=r"setting 'feature_layers'.*below the target's 3"):
        eagle_job.target_layers(settings, target)
    shortcut = eagle_job.settings_of(_job(feature_layers="eagle3"))
    assert eagle_job.target_layers(shortcut, target) == (0, 1)


def test_preflight_names_a_fused_layer_the_target_does_not_have(target):
    config = untrained_head(target, feature_layers=LAYERS).config
    shallow = LlamaConfig(hidden_size=D, vocab_size=VOCAB, num_hidden_layers=2)
    problems = head_fit_problems("pairs[0].draft.model", config, shallow)
    assert problems == [
        "pairs[0].draft.model: the EAGLE head's feature_layers [0, 2] reach past the target's "
        "2 layers; a head fits only the target it was trained for"
    ]
    assert head_fit_problems("pairs[0].draft.model", config, target.config) == []


def test_a_fused_heads_trace_holds_the_chain_of_a_head_begun_at_each_round_start(target):
    head = untrained_head(target, feature_layers=LAYERS)
    local = LocalTarget(CachedLM(target, single_step="plain"))
    prompt = prompts(1, seed=4)[0]
    trace = record_eagle_trace(EagleDrafter(head), local, prompt, max_new_tokens=8, cap=3)
    assert sorted(trace.chains) == list(range(7))
    for start, chain in trace.chains.items():
        prefix = torch.cat([prompt, torch.tensor(trace.target_tokens[:start], dtype=torch.long)])
        drafter = EagleDrafter(head)
        drafter.begin(prefix, local.prefill(prefix, GREEDY, 0, True, LAYERS))
        assert [p.token for p in chain] == [drafter.propose(GREEDY).token for _ in chain], start
