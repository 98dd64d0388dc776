"""The plain-torch Llama path computes what the transformers forward computes.

Checked against the transformers decoder on the same weights: prefill, single steps, blocks,
rollback, buffer growth, grouped-query attention; models that do not qualify keep the
transformers path and still decode; the fused weights share the modules' memory.
"""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import build_tiny_pair, prompts, tiny_config
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import workers.llama_fast as llama_fast
import workers.lm
from policies import make_policy
from training.zoo.cache import ZooManifest
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import CachedLM, avoid_cudnn_attention, load_causal_lm
from workers.records import SamplingConfig
from workers.step_plan import CALIBRATION_SIZES, StepPlan, choose_step_plan
from workers.target import LocalTarget

torch.set_num_threads(1)


def _reference_hidden(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    """Return the transformers decoder's last hidden states of ``ids`` from scratch."""
    with torch.inference_mode():
        out = model.get_decoder()(input_ids=torch.tensor([ids]), use_cache=False)
    return out.last_hidden_state[0]


def test_steps_blocks_and_rollback_match_the_transformers_forward(monkeypatch) -> None:
    monkeypatch.setattr(llama_fast, "INITIAL_CAPACITY", 8)
    _, target = build_tiny_pair(seed=3)
    fast = llama_fast.LlamaFastDecoder(target)
    generator = torch.Generator().manual_seed(0)
    sequence = torch.randint(2, 90, (5,), generator=generator).tolist()
    with torch.inference_mode():
        fast.forward(torch.tensor(sequence))
        for step in range(12):
            block = torch.randint(2, 90, (1 + step % 4,), generator=generator).tolist()
            hidden = fast.forward(torch.tensor(block))
            sequence += block
            expected = _reference_hidden(target, sequence)[-len(block) :]
            torch.testing.assert_close(hidden, expected, atol=1e-5, rtol=0)
            if step % 3 == 2:
                sequence = sequence[:-2]
                fast.crop(len(sequence))
    assert fast.capacity >= 16 > 8, "the buffers grew past their initial size"
    assert fast.length == len(sequence)
    reference = _reference_hidden(target, sequence)
    fast.reset()
    with torch.inference_mode():
        replayed = fast.forward(torch.tensor(sequence))
    torch.testing.assert_close(replayed, reference, atol=1e-5, rtol=0)
    for n in (1, 2, 4):
        fast.crop(len(sequence) - n)
        with torch.inference_mode():
            tail = fast.forward(torch.tensor(sequence[-n:]))
        torch.testing.assert_close(tail, reference[-n:], atol=1e-5, rtol=0)


def test_cached_lm_fast_and_transformers_paths_give_the_same_logits() -> None:
    _, target = build_tiny_pair(seed=1)
    fast, slow = CachedLM(target), CachedLM(target, fast=False)
    assert fast.fast_path and not slow.fast_path
    prompt = prompts(1, seed=4)[0]
    for lm in (fast, slow):
        lm.forward(prompt)
    for block in ([5, 6, 7], [8], [9, 10]):
        a = fast.forward(torch.tensor(block)).logits
        b = slow.forward(torch.tensor(block)).logits
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        fast.crop(fast.cached_len - 1)
        slow.crop(slow.cached_len - 1)
        assert fast.cached_len == slow.cached_len


def test_speculative_rounds_are_identical_on_both_paths() -> None:
    draft, target = build_tiny_pair(seed=2)
    settings = RequestSettings(sampling=SamplingConfig(max_new_tokens=24))
    for prompt in prompts(6, seed=5):
        results = []
        for fast in (True, False):
            draft_lm = CachedLM(draft, fast=fast)
            target_side = LocalTarget(CachedLM(target, fast=fast))
            results.append(
                speculative_generate(
                    draft_lm, target_side, make_policy("svip", 4), prompt, settings
                )
            )
        fast_result, slow_result = results
        assert fast_result.output_ids == slow_result.output_ids
        assert [(r.drafted, r.accepted) for r in fast_result.rounds] == [
            (r.drafted, r.accepted) for r in slow_result.rounds
        ]


def test_fused_weights_share_the_modules_memory_and_keep_their_forward() -> None:
    _, target = build_tiny_pair(seed=0)
    ids = [3, 4, 5, 6, 7]
    before = _reference_hidden(target, ids)
    parameters = sum(p.numel() for p in target.parameters())
    fast = llama_fast.LlamaFastDecoder(target)
    attention = target.model.layers[0].self_attn
    fused = fast.layers[0].qkv.weight
    assert attention.q_proj.weight.data_ptr() == fused.data_ptr()
    shared = fused.untyped_storage().data_ptr()
    assert attention.k_proj.weight.untyped_storage().data_ptr() == shared
    assert sum(p.numel() for p in target.parameters()) == parameters
    torch.testing.assert_close(_reference_hidden(target, ids), before, atol=0, rtol=0)


def test_models_outside_the_fast_path_keep_the_transformers_forward() -> None:
    biased = LlamaForCausalLM(LlamaConfig(**{**tiny_config(1).to_dict(), "attention_bias": True}))
    assert "bias" in llama_fast.unsupported_reason(biased)
    qwen = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).eval()
    assert "qwen2" in llama_fast.unsupported_reason(qwen)
    with pytest.raises(ValueError, match="does not apply"):
        llama_fast.LlamaFastDecoder(qwen)
    lm = CachedLM(qwen)
    assert not lm.fast_path
    prompt = prompts(1, seed=1)[0]
    result = autoregressive_generate(
        LocalTarget(lm), prompt, RequestSettings(sampling=SamplingConfig(max_new_tokens=6))
    )
    assert len(result.output_ids) == 6


@pytest.mark.parametrize("rows", [1, 2, 5, 17])
def test_block_linear_is_the_linear_map_and_returns_a_contiguous_block(rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(48, 32, generator=generator)
    x = torch.randn(32, rows, generator=generator).t()
    out = llama_fast.block_linear(x, weight)
    assert out.shape == (rows, 48) and out.is_contiguous()
    expected = (x.double() @ weight.double().t()).float()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packed_linear_is_the_linear_map_and_rows_do_not_depend_on_the_block(dtype) -> None:
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(96, 40, generator=generator, dtype=dtype)
    x = torch.randn(9, 40, generator=generator, dtype=dtype)
    product = llama_fast.PackedLinear(weight)
    packs = dtype == torch.float32 and torch.backends.mkldnn.is_available()
    assert (product.packed is not None) == packs
    one_by_one = torch.cat([product(x[i : i + 1]) for i in range(9)])
    torch.testing.assert_close(one_by_one, (x.double() @ weight.double().t()).to(dtype))
    for rows in range(2, 10):
        block = product(x[:rows])
        assert block.shape == (rows, 96) and block.is_contiguous()
        if packs:
            torch.testing.assert_close(block, one_by_one[:rows], atol=0, rtol=0)


def test_the_fast_path_prepacks_every_projection_and_the_head_on_cpu() -> None:
    draft, target = build_tiny_pair(seed=0)
    for model in (draft, target):
        lm = CachedLM(model, single_step="plain")
        layers = lm.fast_decoder.layers
        products = [lm.head_product] + [
            getattr(layer, name) for layer in layers for name in ("qkv", "out", "gate_up", "down")
        ]
        assert all(p.packed is not None for p in products) == torch.backends.mkldnn.is_available()
        head = model.get_output_embeddings().weight
        assert lm.head_product.weight.data_ptr() == head.data_ptr()


def test_a_biased_lm_head_keeps_the_transformers_forward() -> None:
    _, target = build_tiny_pair(seed=3)
    head = target.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    target.set_output_embeddings(biased)
    assert "LM head" in llama_fast.unsupported_reason(target)
    assert not CachedLM(target).fast_path


@pytest.mark.parametrize("fast", [True, False])
def test_a_padded_one_token_step_equals_the_plain_step(fast: bool) -> None:
    """A one-token step run as a two-token block (the token twice, the second position
    cropped) gives the plain step's logits and hidden state and leaves the same cache, on both
    model paths; target-only and speculative decoding give the same tokens either way."""
    _, target = build_tiny_pair()
    plain = CachedLM(target, fast=fast, single_step="plain")
    padded = CachedLM(target, fast=fast, single_step="padded")
    prompt = prompts(1, seed=3)[0]
    for lm in (plain, padded):
        lm.reset()
        lm.forward(prompt[:-1], last_only=True)
    for token in [*prompt[-1:].tolist(), 5, 9, 17]:
        a, b = (lm.forward(torch.tensor([token])) for lm in (plain, padded))
        torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(b.hidden, a.hidden, atol=1e-5, rtol=0)
        assert b.logits.shape == a.logits.shape and plain.cached_len == padded.cached_len
    block = torch.tensor([3, 4, 5])
    torch.testing.assert_close(padded.forward(block).logits, plain.forward(block).logits)
    settings = RequestSettings(SamplingConfig(max_new_tokens=16))
    outputs = [
        autoregressive_generate(LocalTarget(lm), prompt, settings).output_ids
        for lm in (plain, padded)
    ]
    assert outputs[0] == outputs[1]
    draft, _ = build_tiny_pair()
    result = speculative_generate(
        CachedLM(draft, single_step="padded"),
        LocalTarget(padded),
        make_policy("static", 3),
        prompt,
        settings,
    )
    assert result.output_ids == outputs[0]


def test_calibration_times_both_layouts_at_every_size_and_leaves_the_cache_empty() -> None:
    _, target = build_tiny_pair()
    lm = CachedLM(target)
    calibration = lm.calibration
    assert calibration is not None
    assert set(calibration.seconds) == {"packed", "unpacked"}
    for times in calibration.seconds.values():
        assert sorted(times) == list(CALIBRATION_SIZES) and all(t > 0 for t in times.values())
    assert calibration.plan == choose_step_plan(calibration.seconds) == lm.plan
    assert calibration.one_token_s == calibration.seconds[lm.plan.layout(1)][1]
    assert calibration.two_tokens_s == calibration.seconds[lm.plan.layout(2)][2]
    assert lm.pad_single_step == calibration.padded == lm.plan.padded
    assert lm.cached_len == 0
    assert CachedLM(target, single_step="plain").calibration is None
    assert set(CachedLM(target, prepack=False).calibration.seconds) == {"unpacked"}
    assert set(CachedLM(target, fast=False).calibration.seconds) == {"unpacked"}


def _record_layouts(lm: CachedLM) -> list[tuple[int, bool]]:
    """Make ``lm``'s fast decoder log (tokens, packed) for every forward; return the log."""
    log: list[tuple[int, bool]] = []
    forward = lm.fast_decoder.forward

    def logged(ids: torch.Tensor, packed: bool = True) -> torch.Tensor:
        log.append((ids.numel(), packed))
        return forward(ids, packed)

    lm.fast_decoder.forward = logged
    return log


@pytest.mark.parametrize("padded", [False, True])
def test_each_forward_runs_on_its_sizes_layout(padded: bool) -> None:
    _, target = build_tiny_pair(seed=4)
    plan = StepPlan(((1, "unpacked"), (3, "packed"), (6, "unpacked")), padded)
    lm = CachedLM(target, single_step=plan)
    assert lm.plan == plan and lm.calibration is None
    log = _record_layouts(lm)
    for n in (5, 1, 2, 3, 4, 6, 9, 1):
        lm.forward(torch.arange(2, 2 + n))
    one = (2, False) if padded else (1, False)  # a padded step runs on size 2's layout
    expected = [(5, True), one, (2, False), (3, True), (4, True), (6, False), (9, False), one]
    assert log == expected


def test_a_layout_computes_what_a_model_with_only_that_layout_computes() -> None:
    """Bit for bit: the unpacked layout of a packed model is the unpacked model's product."""
    _, target = build_tiny_pair(seed=5)
    mixed = CachedLM(target, single_step=StepPlan(((1, "unpacked"), (2, "packed"))))
    packed = CachedLM(target, single_step=StepPlan.uniform("packed"))
    unpacked = CachedLM(target, prepack=False, single_step="plain")
    prompt = prompts(1, seed=6)[0]
    for lm in (mixed, packed, unpacked):
        lm.forward(prompt[:1])  # a one-token prefix: mixed and unpacked share their cache
    steps = [lm.forward(prompt[1:2]).logits for lm in (mixed, unpacked)]
    assert torch.equal(steps[0], steps[1])
    for lm in (mixed, packed):
        lm.reset()
        lm.forward(prompt)
    blocks = [lm.forward(torch.tensor([3, 4, 5])).logits for lm in (mixed, packed)]
    assert torch.equal(blocks[0], blocks[1])


PLANS = [
    StepPlan.uniform("packed"),
    StepPlan.uniform("unpacked"),
    StepPlan(((1, "unpacked"), (3, "packed"))),
    StepPlan(((1, "packed"), (2, "unpacked")), padded=True),
    "auto",
]


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_every_plan_decodes_greedily_as_the_transformers_forward(
    micro_zoo: ZooManifest, plan
) -> None:
    """On the micro zoo: target-only and static-K greedy decoding with any step plan give the
    tokens of target-only greedy decoding through the transformers forward."""
    target = load_causal_lm(micro_zoo.model_path("target"))
    draft = load_causal_lm(micro_zoo.model_path("draft-s"))
    reference_target = LocalTarget(CachedLM(target, fast=False, single_step="plain"))
    lm = CachedLM(target, single_step=plan)
    draft_lm = CachedLM(draft, single_step=plan)
    assert lm.fast_path and draft_lm.fast_path
    settings = RequestSettings(SamplingConfig(max_new_tokens=24))
    for prompt in prompts(4, seed=8, vocab=200):
        reference = autoregressive_generate(reference_target, prompt, settings).output_ids
        ours = autoregressive_generate(LocalTarget(lm), prompt, settings).output_ids
        assert ours == reference
        for k in (1, 3, 7):
            result = speculative_generate(
                draft_lm, LocalTarget(lm), make_policy("static", k), prompt, settings
            )
            assert result.output_ids == reference, f"static K={k} under {plan}"


def test_cuda_models_take_cudnn_out_of_attention_and_cpu_models_leave_it(monkeypatch) -> None:
    before = torch.backends.cuda.cudnn_sdp_enabled()
    asked: list[torch.device] = []
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        _, target = build_tiny_pair()
        with monkeypatch.context() as patch:
            patch.setattr(workers.lm, "avoid_cudnn_attention", asked.append)
            CachedLM(target)
        assert asked == [torch.device("cpu")]  # every CachedLM hands over its model's device
        CachedLM(target)
        avoid_cudnn_attention("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        avoid_cudnn_attention(torch.device("cuda", 0))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
