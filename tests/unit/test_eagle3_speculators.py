"""speculators' EAGLE-3 checkpoints: written here in that layout with random weights, loaded by
path, and checked against an independent transcription of speculators' EAGLE-3 forward (the
decoder layer over [norm(embedding), hidden_norm(h)], its own norm and draft-vocabulary LM head
mapped to target ids by d2t, step i > 1 fed the layer's own previous output)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from support.draft_kinds import PATHS
from support.tiny_models import LAYER_STD, VOCAB, prompts, tiny_config
from transformers import LlamaForCausalLM

from orchestrator.run.eagle_checks import head_fit_problems
from policies import make_policy
from training.lm_trainer import torch_threads
from workers.eagle.artifact import load_eagle_head, read_eagle_config
from workers.eagle.drafter import EagleDrafter
from workers.eagle.layers import eagle3_layers
from workers.eagle.step import EagleStep
from workers.engine import autoregressive_generate, speculative_generate
from workers.lm import CachedLM
from workers.proposers import make_proposer
from workers.records import RequestSettings, SamplingConfig
from workers.target import LocalTarget

D, HEADS, KV_HEADS, HEAD_DIM, INTER, EPS, THETA = 64, 4, 2, 16, 128, 1e-6, 10000.0
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=16)
#: vLLM's aux layer ids (the state entering layers 1, 2, 3): this project's layers 0, 1, 2.
AUX_IDS = [1, 2, 3]
DEPTH = 5
#: The draft vocabulary: every other target id (row i is target id 2i).
DRAFT_IDS = torch.arange(0, VOCAB, 2)


@pytest.fixture(scope="module")
def target():
    """A 5-layer tiny Llama (the three aux layers lie below its last), one thread."""
    torch.manual_seed(3)
    model = LlamaForCausalLM(tiny_config(DEPTH)).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.6)
        for layer in model.model.layers:
            for linear in (layer.self_attn.o_proj, layer.mlp.down_proj, layer.mlp.up_proj):
                linear.weight.normal_(0.0, LAYER_STD)
    with torch_threads(1):
        yield model


def _weights(seed: int, fc_bias: bool, own_embed: bool, layer_prefix: str) -> dict:
    """Return an EAGLE-3 head's tensors under speculators' names (random, seeded)."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape, std=0.1):
        return torch.randn(*shape, generator=generator) * std

    def norm():
        return 1.0 + rand(D)

    layer = {
        "input_layernorm.weight": norm(),
        "hidden_norm.weight": norm(),
        "post_attention_layernorm.weight": norm(),
        "self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, 2 * D),
        "self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, 2 * D),
        "self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, 2 * D),
        "self_attn.o_proj.weight": rand(D, HEADS * HEAD_DIM),
        "mlp.gate_proj.weight": rand(INTER, D),
        "mlp.up_proj.weight": rand(INTER, D),
        "mlp.down_proj.weight": rand(D, INTER),
    }
    weights = {f"{layer_prefix}{name}": value for name, value in layer.items()}
    weights["fc.weight"] = rand(D, 3 * D)
    if fc_bias:
        weights["fc.bias"] = rand(D)
    weights["norm.weight"] = norm()
    weights["lm_head.weight"] = rand(len(DRAFT_IDS), D, std=1.0)
    weights["d2t"] = DRAFT_IDS - torch.arange(len(DRAFT_IDS))
    weights["t2d"] = torch.zeros(VOCAB, dtype=torch.bool).index_fill(0, DRAFT_IDS, True)
    weights["verifier_lm_head.weight"] = rand(len(DRAFT_IDS), D)
    if own_embed:
        weights["embed_tokens.weight"] = rand(VOCAB, D, std=1.0)
    return weights


def _write(path, weights: dict, **config_fields) -> None:
    """Write an EAGLE-3 checkpoint as speculators does: config.json and model.safetensors."""
    path.mkdir()
    layer = tiny_config(1).to_diff_dict()
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": len(DRAFT_IDS),
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": AUX_IDS,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "tiny-target", "architectures": ["LlamaForCausalLM"]},
        },
        **config_fields,
    }
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"))


def _rms(x, weight):
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def _rotary(x, positions):
    inv_freq = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
    angles = positions[:, None].float() * inv_freq[None]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = HEAD_DIM // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _reference_layer(w: dict, prefix: str, hidden, embedded, norm_before_residual: bool):
    """speculators' EAGLE-3 first layer over n positions, causal, positions 0..n-1."""
    n = hidden.shape[0]
    normed = _rms(hidden, w[f"{prefix}hidden_norm.weight"])
    residual = normed if norm_before_residual else hidden
    x = torch.cat([_rms(embedded, w[f"{prefix}input_layernorm.weight"]), normed], -1)
    q = (x @ w[f"{prefix}self_attn.q_proj.weight"].T).view(n, HEADS, HEAD_DIM).transpose(0, 1)
    k = (x @ w[f"{prefix}self_attn.k_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM).transpose(0, 1)
    v = (x @ w[f"{prefix}self_attn.v_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM).transpose(0, 1)
    positions = torch.arange(n)
    q, k = _rotary(q, positions), _rotary(k, positions)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 0), v.repeat_interleave(HEADS // KV_HEADS, 0)
    scores = q @ k.transpose(1, 2) / HEAD_DIM**0.5
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, HEADS * HEAD_DIM)
    out = residual + attended @ w[f"{prefix}self_attn.o_proj.weight"].T
    mlp_in = _rms(out, w[f"{prefix}post_attention_layernorm.weight"])
    gate = F.silu(mlp_in @ w[f"{prefix}mlp.gate_proj.weight"].T)
    return (
        out
        + (gate * (mlp_in @ w[f"{prefix}mlp.up_proj.weight"].T))
        @ w[f"{prefix}mlp.down_proj.weight"].T
    )


def _reference_drafts(w, prefix, embed, features, tokens, steps, norm_before_residual):
    """Greedy drafts (target ids) and their target-vocabulary probabilities: the pairs
    (fc(features[t]), tokens[t]) teacher-forced, then ``steps`` steps each fed the layer's
    previous output and its drafted token."""
    hidden = features @ w["fc.weight"].T + w.get("fc.bias", torch.zeros(D))
    ids = tokens.clone()
    drafts, probs = [], []
    for _ in range(steps):
        out = _reference_layer(w, prefix, hidden, embed[ids], norm_before_residual)
        logits = _rms(out[-1], w["norm.weight"]) @ w["lm_head.weight"].T
        full = torch.zeros(VOCAB).index_copy(0, DRAFT_IDS, logits.softmax(-1))
        token = int(DRAFT_IDS[int(logits.argmax())])
        drafts.append(token)
        probs.append(full)
        hidden = torch.cat([hidden, out[-1:]])
        ids = torch.cat([ids, torch.tensor([token])])
    return drafts, torch.stack(probs)


CASES = [
    {"fc_bias": False, "own_embed": False, "layer_prefix": "layers.0.", "before": False},
    {"fc_bias": True, "own_embed": True, "layer_prefix": "layers.0.", "before": True},
    {"fc_bias": False, "own_embed": True, "layer_prefix": "midlayer.", "before": False},
]


@pytest.mark.parametrize("case", CASES)
def test_an_eagle3_checkpoint_drafts_what_speculators_forward_drafts(target, tmp_path, case):
    weights = _weights(1, case["fc_bias"], case["own_embed"], case["layer_prefix"])
    _write(tmp_path / "e3", weights, norm_before_residual=case["before"])
    head = load_eagle_head(tmp_path / "e3", target)
    assert head.config.eagle3_layer and head.config.feature_layers == (0, 1, 2)
    assert head.config.head_vocab == tuple(DRAFT_IDS.tolist())
    embed = weights.get("embed_tokens.weight", target.model.embed_tokens.weight.detach())
    prompt = torch.randint(2, VOCAB, (9,), generator=torch.Generator().manual_seed(4))
    features = torch.randn(8, 3 * D, generator=torch.Generator().manual_seed(5))
    expected, expected_probs = _reference_drafts(
        weights, case["layer_prefix"], embed, features, prompt[1:], 4, case["before"]
    )
    drafter = EagleDrafter(head)
    drafter.begin(prompt, features)
    proposals = [drafter.propose(GREEDY) for _ in range(4)]
    assert [p.token for p in proposals] == expected
    got = torch.stack([p.logits.softmax(-1) for p in proposals])
    torch.testing.assert_close(got, expected_probs, atol=1e-5, rtol=1e-4)
    outside = torch.ones(VOCAB, dtype=torch.bool).index_fill(0, DRAFT_IDS, False)
    assert float(got[:, outside].max()) == 0.0


def test_an_eagle3_heads_step_blocks_equal_its_module_forward(target, tmp_path):
    _write(tmp_path / "e3", _weights(2, True, False, "layers.0."))
    head = load_eagle_head(tmp_path / "e3", target)
    features, tokens = torch.randn(1, 10, 3 * D), torch.randint(0, VOCAB, (1, 11))
    with torch.no_grad():
        expected = head(features, tokens, steps=2)
    step = EagleStep(head)
    first = torch.cat(
        [step.forward(step.project(features[0, a:b]), tokens[0, a:b]) for a, b in ((0, 3), (3, 10))]
    )
    torch.testing.assert_close(first, expected[0, 0], atol=1e-5, rtol=1e-4)
    step.crop(4)  # step 2 from start t = 3: the layer's own output at 3 with x_{t+2}
    second = step.forward(first[3:4], tokens[0, 4:5])
    torch.testing.assert_close(second[0], expected[1, 0, 3], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_an_eagle3_head_keeps_greedy_output_on_both_paths(target, tmp_path, path):
    _write(tmp_path / "e3", _weights(3, False, False, "layers.0."))
    head = load_eagle_head(tmp_path / "e3", target)
    local = LocalTarget(CachedLM(target, single_step="plain", **PATHS[path]))
    proposer = make_proposer("eagle", head=head)
    assert proposer.feature_layers == (0, 1, 2)
    for index, prompt in enumerate(prompts(3, seed=7)):
        settings = RequestSettings(GREEDY, seed=index)
        reference = autoregressive_generate(local, prompt, settings).output_ids
        result = speculative_generate(proposer, local, make_policy("static", 3), prompt, settings)
        assert result.output_ids == reference, index
        assert result.n_drafted > 0


def test_the_default_aux_layers_need_the_targets_depth(tmp_path):
    _write(tmp_path / "e3", _weights(4, False, False, "layers.0."))
    config = json.loads((tmp_path / "e3" / "config.json").read_text())
    del config["eagle_aux_hidden_state_layer_ids"]
    (tmp_path / "e3" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="default layers depend on the target's depth"):
        read_eagle_config(tmp_path / "e3")
    assert read_eagle_config(tmp_path / "e3", 32).feature_layers == eagle3_layers(32)
    assert eagle3_layers(32) == (1, 15, 28)


def test_the_eagle3_loader_names_what_it_does_not_read(target, tmp_path):
    two_layers = _weights(5, False, False, "layers.0.")
    two_layers["layers.1.mlp.up_proj.weight"] = torch.zeros(INTER, D)
    _write(tmp_path / "two", two_layers)
    with pytest.raises(ValueError, match=r"decoder layers \['0', '1'\]; only heads of one"):
        load_eagle_head(tmp_path / "two", target)
    _write(tmp_path / "normed", _weights(5, False, False, "layers.0."), norm_before_fc=True)
    with pytest.raises(ValueError, match="norm_before_fc"):
        load_eagle_head(tmp_path / "normed", target)
    _write(
        tmp_path / "embeds",
        _weights(5, False, False, "layers.0."),
        **{"eagle_aux_hidden_state_layer_ids": [0, 2, 3]},
    )
    with pytest.raises(ValueError, match="0, the embeddings, is not served"):
        load_eagle_head(tmp_path / "embeds", target)
    short = _weights(5, False, False, "layers.0.")
    short["fc.weight"] = short["fc.weight"][:, : 2 * D]
    _write(tmp_path / "short", short)
    with pytest.raises(ValueError, match="do not match the config"):
        load_eagle_head(tmp_path / "short", target)


def test_preflight_checks_an_eagle3_heads_layers_against_the_target(tmp_path):
    _write(tmp_path / "e3", _weights(6, False, False, "layers.0."))
    config = read_eagle_config(tmp_path / "e3", DEPTH)
    assert head_fit_problems("pairs[0].draft.model", config, tiny_config(DEPTH)) == []
    problems = head_fit_problems("pairs[0].draft.model", config, tiny_config(2))
    assert any("feature_layers [0, 1, 2] reach past the target's 2 layers" in p for p in problems)
