"""One rank of the tensor-parallel test: shard the target, decode, save what the test checks.

Run as ``python tests/support/tp_worker.py RANK WORLD_SIZE PORT WORKDIR`` by
``test_tensor_parallel``.
``WORKDIR`` holds ``target/`` and ``draft/`` (save_pretrained) and ``inputs.pt`` (prompts and
settings); this rank writes ``rank{RANK}.pt``. Every rank makes the same calls in the same
order, as the Ray target group does.
"""

from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

import torch

from policies import make_policy
from workers.engine import RequestSettings, autoregressive_generate, speculative_generate
from workers.lm import CachedLM, load_causal_lm
from workers.model_spec import ModelSpec, RankSpec
from workers.records import SamplingConfig
from workers.tensor_parallel import (
    TensorParallelTarget,
    init_tp_group,
    leave_tp_group,
    shard_with_autotp,
    use_process_group_allreduce_on_cpu,
)


def run_rank(rank: int, world_size: int, port: int, workdir: Path) -> dict:
    """Build this rank's sharded target, run every check's decoding, return the results."""
    inputs = torch.load(workdir / "inputs.pt", weights_only=True)
    prompts = inputs["prompts"]
    greedy = SamplingConfig(max_new_tokens=int(inputs["max_new_tokens"]))
    sampled = SamplingConfig(
        temperature=float(inputs["temperature"]), max_new_tokens=int(inputs["max_new_tokens"])
    )
    max_draft_len = int(inputs["max_draft_len"])
    model = ModelSpec(path=str(workdir / "target"))
    place = RankSpec(rank=rank, world_size=world_size, master_addr="127.0.0.1", master_port=port)
    target = TensorParallelTarget(model, place, tp_grain_size=int(inputs["tp_grain_size"]))
    whole = load_causal_lm(model.path)
    default_grain = CachedLM(shard_with_autotp(whole, world_size, torch.float32))
    draft = CachedLM(load_causal_lm(workdir / "draft"))
    layer = target.lm.model.model.layers[0]
    results = {
        "backend_again": init_tp_group(rank, world_size, "127.0.0.1", port),
        "wrong_shape_refused": _refuses_other_shape(rank, world_size, port),
        "fallback_applied": use_process_group_allreduce_on_cpu(),
        "shm_kernel_loaded": _shm_kernel_loaded(),
        "q_proj": layer.self_attn.q_proj.weight.detach().clone(),
        "down_proj": layer.mlp.down_proj.weight.detach().clone(),
        "lm_head": target.lm.head.head.weight.detach().clone(),
        "logits": [target.lm.full_logits(prompt) for prompt in prompts],
        "default_grain_lm_head": default_grain.head.head.weight.detach().clone(),
        "default_grain_logits": [default_grain.full_logits(prompt) for prompt in prompts],
        "greedy_ar": [],
        "greedy_spec": [],
        "greedy_spec_rounds": [],
        "sampled_spec": [],
    }
    for index, prompt in enumerate(prompts):
        ar = autoregressive_generate(target, prompt, RequestSettings(greedy, seed=index))
        spec = speculative_generate(
            draft,
            target,
            make_policy("static", max_draft_len),
            prompt,
            RequestSettings(greedy, seed=index),
        )
        sampled_spec = speculative_generate(
            draft,
            target,
            make_policy("static", max_draft_len),
            prompt,
            RequestSettings(sampled, seed=index),
        )
        results["greedy_ar"].append(ar.output_ids)
        results["greedy_spec"].append(spec.output_ids)
        results["greedy_spec_rounds"].append([(r.drafted, r.accepted) for r in spec.rounds])
        results["sampled_spec"].append(sampled_spec.output_ids)
    layers = tuple(inputs["feature_layers"])
    results["layer_states"] = [target.prefill(p, greedy, 0, True, layers) for p in prompts]
    return results


def _refuses_other_shape(rank: int, world_size: int, port: int) -> bool:
    """Return True when joining again as a different rank raises instead of passing silently."""
    try:
        init_tp_group((rank + 1) % world_size, world_size, "127.0.0.1", port)
    except RuntimeError:
        return True
    return False


def _shm_kernel_loaded() -> bool:
    """Return True when DeepSpeed's shared-memory all-reduce kernel is loaded in this process."""
    import deepspeed.comm.comm as ds_comm

    registered = hasattr(torch.ops, "deepspeed") and hasattr(
        torch.ops.deepspeed, "inference_all_reduce_"
    )
    return registered or getattr(ds_comm.cdb, "shm_comm_op", None) is not None


if __name__ == "__main__":
    # A rank that aborts (SIGABRT from a C++ terminate, as once in CI) prints every thread's
    # Python stack to its log, which the test shows.
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)
    rank_arg, world_size_arg, port_arg, workdir_arg = sys.argv[1:5]
    rank_results = run_rank(int(rank_arg), int(world_size_arg), int(port_arg), Path(workdir_arg))
    torch.save(rank_results, Path(workdir_arg) / f"rank{rank_arg}.pt")
    leave_tp_group()
