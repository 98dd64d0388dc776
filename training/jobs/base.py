"""What every training job shares: its config, its result, its data, its models, its checkpoints.

A job is a function ``run(config: JobConfig, output_dir: Path, progress: bool) -> JobResult``
registered in ``training.jobs.JOB_KINDS``. It reads its text with ``training_texts``, loads its
models with ``load_job_model`` / ``load_job_tokenizer``, trains in ``StepLoop``s (seeded batch
order per epoch, a tqdm bar with epoch and loss, a checkpoint every few steps), and writes its
artifact under ``output_dir / ARTIFACT_DIR`` with ``save_pretrained`` or safetensors. Running it
again with the same ``output_dir`` after a crash resumes from the last checkpoint; running it
after it finished returns the recorded result without training.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedModel

from training.checkpoints import Checkpoints
from training.job_settings import JobConfigError
from workers.json_files import write_json

ARTIFACT_DIR = "artifact"
CHECKPOINT_DIR = "checkpoints"
RESULT_FILE = "result.json"
CHECKPOINT_EVERY_STEPS = 10
JOBS_DIR_ENV = "SPECSWEEP_JOBS_DIR"


def jobs_root() -> Path:
    """Return the directory under which every job writes ``<job id>/`` (artifact, checkpoints).

    ``$SPECSWEEP_JOBS_DIR`` or ``<SpecSweep cache>/jobs``; on a multi-node cluster it must be a
    directory every node mounts.
    """
    if override := os.environ.get(JOBS_DIR_ENV):
        return Path(override).expanduser()
    from training.zoo.cache import default_cache_dir

    return default_cache_dir() / "jobs"


@dataclass(frozen=True)
class JobConfig:
    """Everything one training job needs, independent of how it was asked for.

    ``base`` is the model the job starts from (the draft to distil, or the target an early-exit
    draft is cut from) and ``teacher`` the target it learns from; both are model refs
    (``zoo:<profile>/<model>``, a local directory or a hub id). ``dataset``/``split``/
    ``samples``/``local_path`` select the training text as ``workers.datasets`` does for
    prompts. ``settings`` holds the kind-specific options (a sweep's ``training_jobs[].config``).
    """

    kind: str
    name: str
    base: str
    dataset: str
    teacher: str | None = None
    split: str | None = "train"
    samples: int = 1000
    local_path: str | None = None
    epochs: int = 1
    seed: int = 0
    settings: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> JobConfig:
        """Return the config given as a plain mapping (a ``--config`` file), naming bad keys."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(values) - known)
        if unknown:
            expected = sorted(known)
            raise JobConfigError(f"unknown job config keys {unknown}; expected some of {expected}")
        missing = sorted(k for k in ("kind", "name", "base", "dataset") if k not in values)
        if missing:
            raise JobConfigError(f"job config is missing {missing}")
        return cls(**dict(values))

    def to_json(self) -> dict[str, Any]:
        """Return the config as JSON-ready values (stored with the result)."""
        data = asdict(self)
        data["settings"] = dict(self.settings)
        return data


@dataclass(frozen=True)
class JobResult:
    """What a finished job reports: its artifact, its metrics, how long it took.

    ``artifact_kind`` is ``"draft"`` (a causal LM directory loadable with ``from_pretrained``),
    ``"specdecpp_head"``, ``"cali_ts_predictor"`` or ``"eagle_head"``. ``resumed_from_step`` is
    the optimiser step the last run started from (0 for a fresh run).
    """

    artifact_path: str
    artifact_kind: str
    metrics: dict[str, float]
    seconds: float
    resumed_from_step: int = 0

    def to_json(self) -> dict[str, Any]:
        """Return the result as JSON-ready values."""
        return asdict(self)


def resolve_ref(ref: str, progress: bool = False) -> str:
    """Return a loadable path or hub id for a model ref (zoo refs are built on first use)."""
    if ref.startswith("zoo:"):
        from training.zoo.refs import resolve_model_ref

        return str(resolve_model_ref(ref, progress=progress))
    return ref


def load_job_model(ref: str, progress: bool = False) -> PreTrainedModel:
    """Return the causal LM behind ``ref`` in float32 on CPU, in eval mode (safetensors only)."""
    from workers.lm import load_causal_lm

    return load_causal_lm(resolve_ref(ref, progress))


def load_job_tokenizer(ref: str, progress: bool = False) -> Any:
    """Return the tokenizer saved with the model behind ``ref``."""
    return AutoTokenizer.from_pretrained(resolve_ref(ref, progress))


def job_prompts(config: JobConfig) -> list[Any]:
    """Return the prompts (``workers.datasets.Prompt``) of the job's dataset split, in order.

    Uses the same loaders as the sweep's prompts, on the split the job names (``train`` by
    default, so the built-ins' held-out prompts stay unseen).
    """
    from workers.datasets import DatasetSpec, load_prompts

    spec = DatasetSpec(
        name=config.dataset,
        split=config.split,
        samples=config.samples,
        seed=config.seed,
        local_path=config.local_path,
    )
    return load_prompts(spec)


def training_texts(config: JobConfig) -> list[str]:
    """Return the job's training documents: each prompt followed by its reference answer."""
    return [prompt.text + (prompt.reference or "") for prompt in job_prompts(config)]


def token_blocks(tokenizer: Any, texts: list[str], block_len: int) -> torch.Tensor:
    """Return the texts tokenized, joined with EOS and packed into [n, block_len + 1] blocks."""
    from training.lm_trainer import pack_blocks

    ids: list[int] = []
    eos = tokenizer.eos_token_id
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
    blocks = pack_blocks(ids, block_len + 1)
    if blocks.shape[0] == 0:
        raise JobConfigError(
            f"the training text has {len(ids)} tokens, fewer than one block of {block_len + 1}; "
            "raise the dataset's samples or lower block_len"
        )
    return blocks


# ---------------------------------------------------------------------------------------------
# The resumable step loop
# ---------------------------------------------------------------------------------------------


@dataclass
class StepLoop:
    """A resumable loop of ``epochs`` × ceil(n_items / batch_size) optimiser steps.

    ``batches()`` yields (step, epoch, index tensor) from a permutation seeded by (seed, epoch),
    so a resumed run sees exactly the batches the crashed one would have. ``state_fn`` returns
    what to checkpoint (model and optimiser state dicts); ``restore_fn`` puts it back. Every
    ``checkpoint_every`` steps and at the end of each epoch a checkpoint is written.
    """

    n_items: int
    batch_size: int
    epochs: int
    seed: int
    checkpoints: Checkpoints
    state_fn: Callable[[], dict[str, Any]]
    restore_fn: Callable[[dict[str, Any]], None]
    desc: str = "train"
    progress: bool = True
    checkpoint_every: int = CHECKPOINT_EVERY_STEPS
    start_step: int = field(init=False, default=0)
    _bar: Any = field(init=False, default=None, repr=False)

    @property
    def steps_per_epoch(self) -> int:
        """Return the number of optimiser steps in one epoch (the last batch may be short)."""
        return max(1, math.ceil(self.n_items / self.batch_size))

    @property
    def total_steps(self) -> int:
        """Return the number of optimiser steps over all epochs."""
        return self.steps_per_epoch * self.epochs

    def resume(self) -> int:
        """Restore the newest checkpoint if there is one; return the step to start from."""
        found = self.checkpoints.latest()
        if found is not None:
            step, state = found
            self.restore_fn(state)
            self.start_step = step
        return self.start_step

    def batches(self) -> Iterator[tuple[int, int, torch.Tensor]]:
        """Yield (step, epoch, item indices) from ``start_step`` on, checkpointing as it goes."""
        self._bar = tqdm(
            total=self.total_steps,
            initial=self.start_step,
            desc=self.desc,
            disable=not self.progress,
            leave=False,
        )
        step = 0
        for epoch in range(self.epochs):
            generator = torch.Generator().manual_seed(self.seed * 1000 + epoch)
            order = torch.randperm(self.n_items, generator=generator)
            for start in range(0, self.n_items, self.batch_size):
                if step >= self.start_step:
                    yield step, epoch, order[start : start + self.batch_size]
                    self._bar.update(1)
                    done = step + 1
                    if done % self.checkpoint_every == 0 or done % self.steps_per_epoch == 0:
                        self.checkpoints.save(done, self.state_fn())
                step += 1
        self._bar.close()

    def report(self, epoch: int, loss: float) -> None:
        """Show the epoch and the latest loss on the progress bar."""
        if self._bar is not None:
            self._bar.set_postfix(epoch=f"{epoch + 1}/{self.epochs}", loss=f"{loss:.4f}")


def finished_result(output_dir: Path) -> JobResult | None:
    """Return the recorded result of a job that already finished in ``output_dir``, else None."""
    path = output_dir / RESULT_FILE
    if not path.is_file():
        return None
    return JobResult(**json.loads(path.read_text())["result"])


def write_result(output_dir: Path, config: JobConfig, result: JobResult) -> None:
    """Record ``result`` (and the config that produced it) as the job's finished marker."""
    payload = {"config": config.to_json(), "result": result.to_json()}
    write_json(output_dir / RESULT_FILE, payload, sort_keys=True)


class Stopwatch:
    """Seconds spent in a job across runs: the time before a crash plus this run's."""

    def __init__(self, already: float = 0.0) -> None:
        self.already = already
        self.started = time.perf_counter()

    def seconds(self) -> float:
        """Return the total seconds so far."""
        return self.already + time.perf_counter() - self.started
