"""Train and measure an EAGLE head on a target's teacher-forced features (EAGLE-1's recipe).

Data: token sequences x [N, L] (the job's text continued by the target, or the zoo's teacher
responses), the target's features f [N, L, d] over them (last hidden states after the final
norm, teacher-forced: one forward per sequence), a validity mask [N, L] and the target's greedy
choice at each position (argmax of its logits at f_t: the token after t). ``sequence_features``
computes the last three. A head fusing several target layers (EAGLE-3 style) also reads the
states after those layers (``layers`` [N, L, k·d]) as its input; f stays its token target.

Loss (EAGLE): the head reads pairs (f_t + u, x_{t+1}), u ~ U(−``noise``, ``noise``) per
coordinate, and predicts f̂_{t+1}; loss = ``w_feature`` · SmoothL1(f̂_{t+1}, f_{t+1}) +
``w_token`` · CE(p_{t+1}, q̂_{t+1}), where p is the target's softmax over the head's vocabulary
at f_{t+1} and q̂ the head's at f̂_{t+1}, averaged over valid positions t + 1. A fused head
reads (g_t + u, x_{t+1}), g_t the chosen layers' states, and is trained on the cross-entropy
alone: its f̂ has no regression target, as in EAGLE-3 (``w_feature`` does not apply).

Training-time test (EAGLE-3; ``unroll_steps`` k > 1): from every start t the head also drafts
steps 2..k as it drafts at inference, reading its own f̂ (``EagleHead.forward``'s unrolled
steps: step j reads its step j − 1 prediction with the true token x_{t+j} at position
t + j − 1, and attends to the true pairs up to t and its own chain), and step j's loss (the terms
above, against f_{t+j}) counts ``STEP_DECAY`` ** (j − 1): 1, 0.8, 0.64, … as in EAGLE-3's
training code.

Agreement (``agreement_at_steps``): on held-out greedy text, from each start the head drafts
``steps`` tokens autoregressively in feature space from the true features up to the start
(exactly as ``workers.eagle.drafter`` drafts); step k's agreement is the share of starts whose
k-th draft equals the target's greedy token among those whose first k − 1 did: the greedy
acceptance rate of each draft position.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from training.lm_trainer import TrainConfig, learning_rate
from training.realism import machine_load
from workers.eagle.drafter import EagleDrafter
from workers.eagle.head import EagleHead
from workers.eagle.step import EagleStep
from workers.lm import CachedLM, head_logits, layer_states, restricted_head
from workers.records import RequestSettings, SamplingConfig, truncate_at_eos
from workers.target import LocalTarget, VerifyRequest


@dataclass(frozen=True)
class EagleLossWeights:
    """EAGLE's loss: feature-regression and token cross-entropy weights, input noise, and the
    draft steps each start is trained at (``unroll_steps`` > 1: EAGLE-3's training-time test)."""

    w_feature: float = 1.0
    w_token: float = 0.1
    noise: float = 0.1
    unroll_steps: int = 1


#: Unrolled draft step j + 1's weight in the loss is ``STEP_DECAY ** j`` (EAGLE-3's 0.8).
STEP_DECAY = 0.8


@dataclass(frozen=True)
class EagleStage:
    """A zoo's EAGLE head: its name, optimisation (``training``: steps of ``batch_size``
    sequences), loss, the held-out starts per sequence its card measures agreement from, and
    the batch of the feature extraction.

    Beside the teacher samples the head can read the target's greedy answers to
    ``answer_prompts`` more stdlib function prompts (none of the teacher data's; generated as
    the teacher data is) and ``code_windows`` windows of ``code_window`` tokens of the standard
    library's training source (teacher-forced: no generation, only a forward per window). Its
    card also measures agreement on the target's greedy answers to
    ``agreement_prompts`` prompts of the evaluation dataset (HumanEval), ``agreement_tokens``
    new tokens each. ``head_vocab``: the head's LM head keeps the rows of the tokens with the
    most teacher mass over the head's own training data (teacher samples and answers); None:
    the drafts' vocabulary (``draft_vocab``). ``length_grouped``: batches of sequences of
    similar lengths (``length_grouped_batches``; less padding computed). ``bf16_autocast``: the
    loss's forward and backward under bfloat16 autocast, weights and optimiser in float32
    (docs/lab/zoo-smol-eagle.md: the demo's head the same to 0.01 at equal steps).
    """

    training: TrainConfig
    loss: EagleLossWeights = field(default_factory=EagleLossWeights)
    name: str = "eagle"
    eval_starts: int = 64
    feature_batch: int = 8
    code_windows: int = 0
    code_window: int = 256
    agreement_prompts: int = 16
    agreement_tokens: int = 64
    answer_prompts: int = 0
    head_vocab: int | None = None
    length_grouped: bool = False
    bf16_autocast: bool = False

    def __post_init__(self) -> None:
        if self.answer_prompts < 0:
            raise ValueError("answer_prompts must be >= 0")
        if self.head_vocab is not None and self.head_vocab < 2:
            raise ValueError("head_vocab must be None (the drafts' vocabulary) or >= 2 tokens")
        if self.code_windows < 0 or self.code_window < 2:
            raise ValueError("code_windows must be >= 0 and code_window >= 2 tokens")
        if self.agreement_prompts < 1 or self.agreement_tokens < 4:
            raise ValueError("agreement_prompts must be >= 1 and agreement_tokens >= 4")


@dataclass(frozen=True)
class SequenceFeatures:
    """Teacher-forced data of N sequences: ``tokens`` [N, L], ``features`` [N, L, d],
    ``valid`` [N, L] (bool), ``choices`` [N, L] (the target's argmax after each position);
    ``layers`` [N, L, k·d]: the states after the layers a fused head reads (None: unfused)."""

    tokens: torch.Tensor
    features: torch.Tensor
    valid: torch.Tensor
    choices: torch.Tensor
    layers: torch.Tensor | None = None

    def rows(self, index: torch.Tensor) -> SequenceFeatures:
        """Return the sequences at ``index``."""
        return SequenceFeatures(
            self.tokens[index],
            self.features[index],
            self.valid[index],
            self.choices[index],
            None if self.layers is None else self.layers[index],
        )

    def inputs(self, head: EagleHead) -> torch.Tensor:
        """Return what ``head`` reads at each position: the fused layers' states for a fused
        head (ValueError when the data has none), else ``features``."""
        if not head.config.fused:
            return self.features
        if self.layers is None:
            raise ValueError("a fused head needs its layers' states: sequence_features(layers=)")
        return self.layers

    def trimmed(self) -> SequenceFeatures:
        """Return these sequences cut after the last position valid in any of them: a valid
        position reads nothing after itself (causal), so the padding beyond costs compute
        alone."""
        columns = self.valid.any(0).nonzero()
        width = int(columns[-1]) + 1 if columns.numel() else 1
        if width >= self.tokens.shape[1]:
            return self
        return SequenceFeatures(
            self.tokens[:, :width],
            self.features[:, :width],
            self.valid[:, :width],
            self.choices[:, :width],
            None if self.layers is None else self.layers[:, :width],
        )

    @property
    def n_tokens(self) -> int:
        """Number of valid positions."""
        return int(self.valid.sum())

    def joined(self, other: SequenceFeatures) -> SequenceFeatures:
        """Return these sequences followed by ``other``'s, both right-padded (invalid) to the
        wider of the two lengths."""
        if (self.layers is None) != (other.layers is None):
            raise ValueError("cannot join sequences with and without fused layers' states")
        width = max(self.tokens.shape[1], other.tokens.shape[1])
        parts = [
            torch.cat([_padded(mine, width, fill), _padded(theirs, width, fill)])
            for mine, theirs, fill in (
                (self.tokens, other.tokens, 0),
                (self.features, other.features, 0.0),
                (self.valid, other.valid, False),
                (self.choices, other.choices, 0),
            )
        ]
        layers = None
        if self.layers is not None and other.layers is not None:
            layers = torch.cat([_padded(part, width, 0.0) for part in (self.layers, other.layers)])
        return SequenceFeatures(*parts, layers)


def _padded(values: torch.Tensor, width: int, fill: float | bool) -> torch.Tensor:
    """Return ``values`` [N, L, ...] right-padded with ``fill`` to ``width`` positions."""
    missing = width - values.shape[1]
    if missing <= 0:
        return values
    pad = values.new_full((values.shape[0], missing, *values.shape[2:]), fill)
    return torch.cat([values, pad], dim=1)


@torch.no_grad()
def sequence_features(
    target: PreTrainedModel,
    tokens: torch.Tensor,
    valid: torch.Tensor,
    batch_size: int = 8,
    layers: tuple[int, ...] = (),
) -> SequenceFeatures:
    """Return the target's teacher-forced features and greedy choices over ``tokens`` [N, L],
    and the states after decoder ``layers`` when it names any (a fused head's input)."""
    decoder, head = target.get_decoder(), target.get_output_embeddings()
    restricted = restricted_head(target)
    device = next(target.parameters()).device
    features, choices, chosen = [], [], []
    for start in range(0, tokens.shape[0], batch_size):
        ids = tokens[start : start + batch_size].to(device)
        out = decoder(input_ids=ids, use_cache=False, output_hidden_states=bool(layers))
        hidden = out.last_hidden_state
        features.append(hidden.float().cpu())
        choices.append(head_logits(head, restricted, hidden).argmax(-1).cpu())
        if layers:
            chosen.append(layer_states(out.hidden_states, layers).float().cpu())
    return SequenceFeatures(
        tokens.cpu(),
        torch.cat(features),
        valid.cpu(),
        torch.cat(choices),
        torch.cat(chosen) if layers else None,
    )


def frequent_ids(tokens: torch.Tensor, count: int, vocab_size: int, always: list[int]) -> list[int]:
    """Return the sorted ``count`` most frequent ids of ``tokens`` (ties: lower id first), with
    ``always`` (the tokenizer's specials) among them: a frequency-ranked head vocabulary."""
    counts = torch.bincount(tokens.reshape(-1), minlength=vocab_size).double()
    counts[torch.tensor(always, dtype=torch.long)] = math.inf
    order = torch.argsort(-counts, stable=True)
    return sorted(order[: min(count, vocab_size)].tolist())


def eagle_loss(
    head: EagleHead,
    batch: SequenceFeatures,
    weights: EagleLossWeights,
    generator: torch.Generator | None,
    forward: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """Return EAGLE's loss over a batch of sequences (see the module docstring), summed over
    ``weights.unroll_steps`` unrolled draft steps, step j + 1's weighted ``STEP_DECAY ** j``;
    the batch's padding after its last valid position is not computed (``trimmed``).

    ``forward`` runs the head's forward (``head`` itself by default; its DDP wrapper when
    several ranks share the batch).
    """
    device = head.embed.device
    batch = batch.trimmed()
    inputs = batch.inputs(head)[:, :-1].to(device)
    width, steps = inputs.shape[1], weights.unroll_steps
    if weights.noise > 0:
        draw = torch.rand(inputs.shape, generator=generator, device=inputs.device)
        inputs = inputs + (2 * draw - 1) * weights.noise
    tokens = _shifted(batch.tokens, 0, width + steps - 1, 0).to(device)
    predicted = (forward or head)(inputs, tokens, steps)
    total = predicted.new_zeros(())
    for step in range(steps):
        truth = _shifted(batch.features, step, width, 0.0).to(device)
        mask = _shifted(batch.valid, step, width, False).to(device).float()
        with torch.no_grad():
            target_probs = head.kept_logits(truth).float().softmax(-1)
        log_q = head.kept_logits(predicted[step]).float().log_softmax(-1)
        per_position = weights.w_token * -(target_probs * log_q).sum(-1)
        if not head.config.fused:
            regression = F.smooth_l1_loss(predicted[step], truth, reduction="none").mean(-1)
            per_position = per_position + weights.w_feature * regression
        step_loss = (per_position * mask).sum() / mask.sum().clamp(min=1.0)
        total = total + STEP_DECAY**step * step_loss
    return total


def _shifted(values: torch.Tensor, step: int, width: int, fill: float | bool) -> torch.Tensor:
    """Return ``values[:, 1 + step : 1 + step + width]`` of [N, L, ...] right-padded with
    ``fill`` to ``width`` positions (what unrolled step ``step`` reads or predicts at each
    start t)."""
    return _padded(values[:, 1 + step : 1 + step + width], width, fill)


def batch_generator(seed: int, index: torch.Tensor) -> torch.Generator:
    """Return the noise generator of one batch, seeded by its items (a resumed run draws the
    same noise for the same batch)."""
    key = seed * 1_000_003 + int((index.long() * 7919).sum()) + index.numel()
    return torch.Generator().manual_seed(key % (2**63))


@torch.inference_mode()
def agreement_at_steps(
    head: EagleHead,
    data: SequenceFeatures,
    first_start: int | Sequence[int],
    steps: int = 3,
    max_starts: int = 0,
) -> list[float]:
    """Return the greedy agreement of draft steps 1..``steps`` on ``data`` (module docstring).

    ``first_start`` is each sequence's prompt length P (one for all, or one per sequence): the
    text from P on is the target's greedy output, so starts t run from P − 2 (whose first draft
    is the response's first token) while t + ``steps`` stays valid; ``max_starts`` > 0 caps the
    starts per sequence (evenly spaced).
    """
    step = EagleStep(head)
    agreed, tried = [0] * steps, [0] * steps
    n_rows = data.tokens.shape[0]
    firsts = [first_start] * n_rows if isinstance(first_start, int) else list(first_start)
    for row in range(n_rows):
        tokens, features = data.tokens[row], data.inputs(head)[row]
        choices, valid = data.choices[row], data.valid[row]
        last = int(valid.sum()) - 1
        starts = list(range(max(0, firsts[row] - 2), last - steps + 1))
        if max_starts > 0 and len(starts) > max_starts:
            starts = starts[:: math.ceil(len(starts) / max_starts)]
        step.reset()
        committed = 0
        for t in starts:  # increasing: each start commits the true pairs up to it first
            pairs_in = step.project(features[committed : t + 1])
            predicted = step.forward(pairs_in, tokens[committed + 1 : t + 2])
            committed = t + 1
            _chain(step, predicted[-1], choices[t + 1 :], agreed, tried)
            step.crop(committed)
    return [a / n if n else 0.0 for a, n in zip(agreed, tried, strict=True)]


def _chain(
    step: EagleStep,
    feature: torch.Tensor,
    choices: torch.Tensor,
    agreed: list[int],
    tried: list[int],
) -> None:
    """Draft from the predicted ``feature`` of a start's next position until a token differs
    from the target's ``choices`` (from that position on); count tries and agreements. The
    caller crops the cache back."""
    for k in range(len(agreed)):
        token = int(step.logits(feature[None])[0].argmax())
        tried[k] += 1
        if token != int(choices[k]):
            return
        agreed[k] += 1
        if k + 1 < len(agreed):
            feature = step.forward(feature[None], torch.tensor([token]))[-1]


def train_steps(
    head: EagleHead,
    data: SequenceFeatures,
    config: TrainConfig,
    weights: EagleLossWeights,
    report: Callable[[int, float], None] | None = None,
    length_grouped: bool = False,
    bf16_autocast: bool = False,
) -> list[float]:
    """Train ``head`` for ``config.steps`` Adam steps (warm-up, cosine decay) on batches of
    ``config.batch_size`` sequences (of similar lengths where ``length_grouped``:
    ``length_grouped_batches``; the loss under bfloat16 autocast where ``bf16_autocast``);
    return the losses (the zoo's loop; jobs use their fit)."""
    parameters = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=config.lr)
    losses = []
    head.train()
    lengths = data.valid.sum(1) if length_grouped else None
    device = data.tokens.device.type
    for step, index in enumerate(_batches(data.tokens.shape[0], config, lengths)):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16_autocast):
            loss = eagle_loss(head, data.rows(index), weights, batch_generator(config.seed, index))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if report is not None:
            report(step, losses[-1])
    head.eval()
    return losses


#: Batches per group that ``length_grouped_batches`` sorts by length (HF's megabatch).
GROUPED_BATCHES = 16


def _batches(
    n_items: int, config: TrainConfig, lengths: torch.Tensor | None = None
) -> Iterator[torch.Tensor]:
    """Yield ``config.steps`` batches of item indices from seeded per-epoch permutations
    (grouped by ``lengths`` when given: ``length_grouped_batches``)."""
    generator = torch.Generator().manual_seed(config.seed)
    batches: list[torch.Tensor] = []
    for _ in range(config.steps):
        if not batches:
            order = torch.randperm(n_items, generator=generator)
            batches = _epoch_batches(order, config.batch_size, lengths, generator)
        yield batches.pop(0)


def _epoch_batches(
    order: torch.Tensor,
    batch_size: int,
    lengths: torch.Tensor | None,
    generator: torch.Generator,
) -> list[torch.Tensor]:
    """Return an epoch's full batches of ``order`` (the remainder dropped; all of it as one
    batch when it is smaller than one), grouped by length when ``lengths`` is given."""
    if lengths is None:
        return list(order[: _full_batches(len(order), batch_size)].split(batch_size))
    return length_grouped_batches(order, lengths, batch_size, generator)


def _full_batches(n_items: int, batch_size: int) -> int:
    """Return how many of ``n_items`` fill whole batches (all of them when fewer than one)."""
    return n_items // batch_size * batch_size or n_items


def length_grouped_batches(
    order: torch.Tensor, lengths: torch.Tensor, batch_size: int, generator: torch.Generator
) -> list[torch.Tensor]:
    """Return full batches of the shuffled ``order`` whose items have similar ``lengths``: each
    run of ``GROUPED_BATCHES`` batches is sorted by length and cut into batches, and the batches
    are shuffled (transformers' length-grouped sampler), so a batch's padding, which
    ``eagle_loss`` trims, is small."""
    usable = order[: _full_batches(len(order), batch_size)]
    batches = []
    for group in usable.split(batch_size * GROUPED_BATCHES):
        ranked = group[torch.argsort(lengths[group], descending=True, stable=True)]
        batches.extend(ranked.split(batch_size))
    shuffled = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffled]


@dataclass(frozen=True)
class StepCost:
    """The head's draft step against a target step, median seconds of alternating repeats:
    ``t_head_s`` one pair through ``EagleStep`` plus its LM-head row (prepacked where
    ``prepack``), ``t_target_s`` one ``CachedLM`` token step (its calibrated plan)."""

    t_head_s: float
    t_target_s: float
    cost_ratio: float
    context_len: int
    repeats: int
    threads: int
    prepack: bool
    load_average: float


@torch.inference_mode()
def step_cost(
    target: PreTrainedModel,
    head: EagleHead,
    context_len: int = 128,
    repeats: int = 30,
    prepack: bool = True,
) -> StepCost:
    """Return the head's and the target's one-token step seconds after ``context_len`` cached
    positions, timed in turns (the same machine load for both), and their ratio."""
    lm = CachedLM(target)
    step = EagleStep(head, prepack)
    context = torch.zeros(context_len, dtype=torch.long)
    lm.reset()
    lm.forward(context, last_only=True)
    step.reset()
    step.forward(torch.zeros(context_len, head.config.hidden_size), context)
    one = context[:1]
    feature = torch.zeros(1, head.config.hidden_size)
    head_times, target_times = [], []
    for repeat in range(repeats + 3):
        start = time.perf_counter()
        lm.forward(one)
        middle = time.perf_counter()
        step.logits(step.forward(feature, one))
        end = time.perf_counter()
        lm.crop(context_len)
        step.crop(context_len)
        if repeat >= 3:
            target_times.append(middle - start)
            head_times.append(end - middle)
    t_head, t_target = statistics.median(head_times), statistics.median(target_times)
    return StepCost(
        t_head_s=t_head,
        t_target_s=t_target,
        cost_ratio=t_head / t_target,
        context_len=context_len,
        repeats=repeats,
        threads=torch.get_num_threads(),
        prepack=prepack,
        load_average=machine_load(),
    )


@dataclass(frozen=True)
class StaticAcceptance:
    """Greedy static-K speculation with an EAGLE head at one K over some prompts: drafted and
    accepted tokens, rounds, the acceptance rate (accepted / drafted), tokens per round, and
    whether every output equalled target-only decoding."""

    k: int
    drafted: int
    accepted: int
    rounds: int
    acceptance: float
    tokens_per_round: float
    matches_target: bool


@torch.inference_mode()
def static_acceptance(
    target: PreTrainedModel,
    head: EagleHead,
    prompts: Sequence[torch.Tensor],
    ks: Sequence[int],
    new_tokens: int,
    eos_token_id: int | None = None,
) -> dict[int, StaticAcceptance]:
    """Return the greedy static-K acceptance of ``head`` drafting for ``target`` at each K."""
    local = LocalTarget(CachedLM(target))
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=new_tokens)
    settings = RequestSettings(sampling=greedy, seed=0, eos_token_id=eos_token_id)
    references = [local.generate(prompt, settings).output_ids for prompt in prompts]
    found = {}
    for k in ks:
        counts = [0, 0, 0]
        matches = True
        for prompt, reference in zip(prompts, references, strict=True):
            output = _speculate_greedy(local, EagleDrafter(head), prompt, k, settings, counts)
            matches = matches and output == reference
        drafted, accepted, rounds = counts
        found[k] = StaticAcceptance(
            k=k,
            drafted=drafted,
            accepted=accepted,
            rounds=rounds,
            acceptance=accepted / max(1, drafted),
            tokens_per_round=(accepted + rounds) / max(1, rounds),
            matches_target=matches,
        )
    return found


def _speculate_greedy(
    local: LocalTarget,
    drafter: EagleDrafter,
    prompt: torch.Tensor,
    k: int,
    settings: RequestSettings,
    counts: list[int],
) -> list[int]:
    """Decode ``prompt`` by greedy static-K speculation; add drafted, accepted and rounds to
    ``counts``; return the output (cut at the first EOS, as target-only decoding is)."""
    greedy = settings.sampling
    layers = drafter.feature_layers
    drafter.begin(prompt, local.prefill(prompt, greedy, settings.seed, True, layers))
    pending, output, stopped = prompt[-1:], [], False
    while len(output) < greedy.max_new_tokens and not stopped:
        drafts = [drafter.propose(greedy).token for _ in range(k)]
        block = torch.cat([pending, torch.tensor(drafts, dtype=torch.long)])
        response = local.verify(VerifyRequest(block, want_features=True, feature_layers=layers))
        drafter.accept(response.n_accepted, response.next_token, response.features)
        output += [*drafts[: response.n_accepted], response.next_token]
        for index, added in enumerate((k, response.n_accepted, 1)):
            counts[index] += added
        pending = torch.tensor([response.next_token])
        output, stopped = truncate_at_eos(output[: greedy.max_new_tokens], settings.eos_token_id)
    return output
