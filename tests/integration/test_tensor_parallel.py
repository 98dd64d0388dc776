"""The DeepSpeed AutoTP target: 2 real gloo ranks on CPU against the unsharded model.

The ranks run ``tests/support/tp_worker.py`` as subprocesses (with a deadline, so a hang fails),
with CUDA hidden and without ``DS_ACCELERATOR``/``LOCAL_SIZE``, so the module's own CPU setup is
what is tested; the unsharded reference runs here from the same saved checkpoint. About 30-40 s
on 2 busy cores, almost all of it importing torch, transformers and DeepSpeed in each rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.paths import REPO as REPO_ROOT
from support.tiny_models import build_tiny_pair, prompts
from torch import nn

from policies import make_policy
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import CachedLM, load_causal_lm
from workers.model_spec import free_port
from workers.records import SamplingConfig
from workers.target import LocalTarget
from workers.tensor_parallel import (
    DEEPSPEED_LAUNCH_ENV,
    RowsToSequenceHead,
    agreed_single_step,
    wait_for_ranks,
)

WORLD_SIZE = 2
MAX_NEW_TOKENS = 24
MAX_DRAFT_LEN = 4
TEMPERATURE = 0.8
TP_GRAIN_SIZE = 16
DEADLINE_S = 300
#: The layers whose states the ranks return at prefill, as to an EAGLE head fusing them.
FEATURE_LAYERS = [0, 2]
torch.set_num_threads(1)


def _run_ranks(workdir: Path) -> list[dict]:
    """Run every rank as its own process; fail with their logs on error or past the deadline."""
    env = {key: value for key, value in os.environ.items() if key not in DEEPSPEED_LAUNCH_ENV}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
    )
    port = free_port("127.0.0.1")
    logs = [(workdir / f"rank{rank}.log").open("w") for rank in range(WORLD_SIZE)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(REPO_ROOT / "tests" / "support" / "tp_worker.py"),
                str(rank),
                str(WORLD_SIZE),
                str(port),
                str(workdir),
            ],
            env=env,
            stdout=logs[rank],
            stderr=subprocess.STDOUT,
        )
        for rank in range(WORLD_SIZE)
    ]
    try:
        codes = wait_for_ranks(procs, DEADLINE_S)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    if codes != [0] * WORLD_SIZE:
        tails = "\n".join(
            f"--- rank {rank} ---\n{(workdir / f'rank{rank}.log').read_text()[-3000:]}"
            for rank in range(WORLD_SIZE)
        )
        pytest.fail(f"tensor-parallel ranks ended with {codes} (None: still running)\n{tails}")
    return [torch.load(workdir / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD_SIZE)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with the tiny pair saved as checkpoints and the prompts and settings."""
    path = tmp_path_factory.mktemp("tp")
    draft, target = build_tiny_pair(seed=0)
    target.save_pretrained(path / "target")
    draft.save_pretrained(path / "draft")
    torch.save(
        {
            "prompts": prompts(6, seed=3),
            "max_new_tokens": MAX_NEW_TOKENS,
            "max_draft_len": MAX_DRAFT_LEN,
            "temperature": TEMPERATURE,
            "tp_grain_size": TP_GRAIN_SIZE,
            "feature_layers": FEATURE_LAYERS,
        },
        path / "inputs.pt",
    )
    return path


@pytest.fixture(scope="module")
def ranks(workdir: Path) -> list[dict]:
    """What each of the two ranks computed."""
    return _run_ranks(workdir)


@pytest.fixture(scope="module")
def unsharded(workdir: Path) -> dict:
    """The same computations with the whole target in this process (the reference)."""
    inputs = torch.load(workdir / "inputs.pt", weights_only=True)
    whole = load_causal_lm(workdir / "target")
    target = LocalTarget(CachedLM(whole))
    draft = CachedLM(load_causal_lm(workdir / "draft"))
    greedy = SamplingConfig(max_new_tokens=MAX_NEW_TOKENS)
    sampled = SamplingConfig(temperature=TEMPERATURE, max_new_tokens=MAX_NEW_TOKENS)
    reference: dict = {"model": whole, "logits": [], "greedy": [], "sampled_spec": []}
    for index, prompt in enumerate(inputs["prompts"]):
        reference["logits"].append(target.lm.full_logits(prompt))
        reference["greedy"].append(
            autoregressive_generate(target, prompt, RequestSettings(greedy, seed=index)).output_ids
        )
        sampled_spec = speculative_generate(
            draft,
            target,
            make_policy("static", MAX_DRAFT_LEN),
            prompt,
            RequestSettings(sampled, seed=index),
        )
        reference["sampled_spec"].append(sampled_spec.output_ids)
    return reference


def test_ranks_hold_complementary_halves_of_the_weights(ranks, unsharded):
    layer = unsharded["model"].model.layers[0]
    q_proj, down_proj = layer.self_attn.q_proj.weight, layer.mlp.down_proj.weight
    lm_head = unsharded["model"].lm_head.weight
    assert ranks[0]["q_proj"].shape == (q_proj.shape[0] // 2, q_proj.shape[1])
    assert torch.equal(torch.cat([r["q_proj"] for r in ranks], dim=0), q_proj)
    assert ranks[0]["down_proj"].shape == (down_proj.shape[0], down_proj.shape[1] // 2)
    assert torch.equal(torch.cat([r["down_proj"] for r in ranks], dim=1), down_proj)
    assert ranks[0]["lm_head"].shape == (lm_head.shape[0], lm_head.shape[1] // 2)
    assert torch.equal(torch.cat([r["lm_head"] for r in ranks], dim=1), lm_head)


def test_default_grain_tiles_the_lm_head_in_blocks_of_64(ranks, unsharded):
    lm_head = unsharded["model"].lm_head.weight
    widths = [r["default_grain_lm_head"].shape[1] for r in ranks]
    assert widths == [64, 0]
    assert torch.equal(torch.cat([r["default_grain_lm_head"] for r in ranks], dim=1), lm_head)


def test_group_setup_is_idempotent_and_uses_process_group_allreduce(ranks):
    for result in ranks:
        assert result["backend_again"] == "gloo"
        assert result["wrong_shape_refused"]
        assert result["fallback_applied"]
        assert not result["shm_kernel_loaded"]


def test_sharded_logits_equal_unsharded_on_every_rank(ranks, unsharded):
    for result in ranks:
        for sharded, whole in zip(result["logits"], unsharded["logits"], strict=True):
            assert sharded.shape == whole.shape
            torch.testing.assert_close(sharded, whole, atol=1e-4, rtol=0)
    for first, second in zip(ranks[0]["logits"], ranks[1]["logits"], strict=True):
        assert torch.equal(first, second)


def test_default_grain_logits_equal_unsharded_on_every_rank(ranks, unsharded):
    for result in ranks:
        for sharded, whole in zip(result["default_grain_logits"], unsharded["logits"], strict=True):
            torch.testing.assert_close(sharded, whole, atol=1e-4, rtol=0)


def test_sharded_greedy_decoding_equals_unsharded(ranks, unsharded):
    for result in ranks:
        assert result["greedy_ar"] == unsharded["greedy"]
    assert all(len(ids) == MAX_NEW_TOKENS for ids in unsharded["greedy"])


def test_speculative_with_sharded_target_equals_target_only_greedy(ranks, unsharded):
    for result in ranks:
        assert result["greedy_spec"] == unsharded["greedy"]
    rounds = [pair for request in ranks[0]["greedy_spec_rounds"] for pair in request]
    assert sum(drafted for drafted, _ in rounds) > 0
    assert sum(accepted for _, accepted in rounds) > 0
    assert len(rounds) < len(ranks[0]["greedy_spec_rounds"]) * MAX_NEW_TOKENS


def test_sampled_speculative_is_identical_across_ranks_and_to_unsharded(ranks, unsharded):
    assert ranks[0]["sampled_spec"] == ranks[1]["sampled_spec"]
    assert ranks[0]["sampled_spec"] == unsharded["sampled_spec"]


class _SequenceOnlyHead(nn.Module):
    """Like DeepSpeed's LmHeadLinearAllreduce: slices its input as [batch, seq, hidden]."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return hidden @ weight.T, indexing three dimensions as the DeepSpeed head does."""
        return hidden[:, :, : self.weight.shape[1]] @ self.weight.T


def test_every_rank_returns_the_chosen_layers_states_of_the_unsharded_model(
    ranks, unsharded, workdir
):
    """What an EAGLE head fusing layers would be sent: the states after those layers, whole
    (the sharded forward all-reduces them), at every processed prompt token."""
    inputs = torch.load(workdir / "inputs.pt", weights_only=True)
    for index, prompt in enumerate(inputs["prompts"]):
        with torch.no_grad():
            out = unsharded["model"].model(input_ids=prompt[None], output_hidden_states=True)
        states = torch.cat([out.hidden_states[i + 1][0, :-1] for i in FEATURE_LAYERS], dim=-1)
        for result in ranks:
            torch.testing.assert_close(result["layer_states"][index], states, atol=1e-5, rtol=1e-4)


def test_rows_to_sequence_head_feeds_rows_to_a_sequence_only_head():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(5, 8, generator=generator)
    rows = torch.randn(3, 8, generator=generator)
    with pytest.raises(IndexError):
        _SequenceOnlyHead(weight)(rows)
    wrapped = RowsToSequenceHead(_SequenceOnlyHead(weight))
    expected = torch.stack([torch.mv(weight, row) for row in rows])
    torch.testing.assert_close(wrapped(rows), expected)
    sequence = rows.unsqueeze(0)
    torch.testing.assert_close(wrapped(sequence), expected.unsqueeze(0))


def test_a_forced_step_choice_is_taken_without_timing_or_collectives():
    _, target = build_tiny_pair()
    for forced, padded in (("padded", True), ("plain", False)):
        lm = agreed_single_step(CachedLM(target, single_step="plain"), forced)
        assert lm.pad_single_step is padded and lm.calibration is None
