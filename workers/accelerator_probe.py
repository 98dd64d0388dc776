"""Keep DeepSpeed's accelerator probe quiet on machines without CUDA.

DeepSpeed picks its accelerator on first import; on a CPU-only machine its auto-detection ends
with a WARNING line ("Setting accelerator to CPU. If you have GPU or other accelerator, we were
unable to detect it."). It is imported there by accelerate whenever transformers saves a model
(the zoo build) and by DeepSpeed-sharded targets. Naming the CPU up front through
``DS_ACCELERATOR`` selects the same accelerator without the warning; a user's own
``DS_ACCELERATOR`` is left alone, and machines with CUDA still auto-detect it.
"""

from __future__ import annotations

import os

import torch

DS_ACCELERATOR_ENV = "DS_ACCELERATOR"


def name_cpu_accelerator_when_no_cuda() -> None:
    """Set ``$DS_ACCELERATOR=cpu`` when CUDA is unavailable and the user has not set it."""
    if DS_ACCELERATOR_ENV not in os.environ and not torch.cuda.is_available():
        os.environ[DS_ACCELERATOR_ENV] = "cpu"
