"""The KV-cache keyword shim: the name the installed transformers takes, and no warning."""

from __future__ import annotations

import inspect
import warnings

import torch
from support.tiny_models import tiny_config
from transformers import DynamicCache, LlamaForCausalLM

from workers.hf_cache import cache_keyword, cache_kwargs, returned_cache


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_config(layers=1)).eval()


def test_keyword_is_a_forward_parameter() -> None:
    model = _tiny_llama()
    assert cache_keyword(model) in inspect.signature(type(model).forward).parameters


def test_cached_steps_equal_a_full_forward_without_warnings() -> None:
    model = _tiny_llama()
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            full = model(input_ids=ids).logits[0, -1]
            out = model(input_ids=ids[:, :3], use_cache=True)
            cache = returned_cache(model, out)
            assert isinstance(cache, DynamicCache) and cache.get_seq_length() == 3
            out = model(input_ids=ids[:, 3:], use_cache=True, **cache_kwargs(model, cache))
    torch.testing.assert_close(out.logits[0, -1], full, rtol=1e-5, atol=1e-5)
    assert cache.get_seq_length() == 5
