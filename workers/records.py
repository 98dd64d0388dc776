"""What the engine reports: one record per round and one result per generated sample."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: The policy name of target-only autoregressive decoding (the baseline trial of each group).
BASELINE_POLICY = "ar"


@dataclass(frozen=True)
class SamplingConfig:
    """Decoding settings applied identically to draft and target (temperature 0 = greedy)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 64

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (temperature 0)."""
        return self.temperature <= 0.0


@dataclass(frozen=True)
class RequestSettings:
    """Per-request decoding settings shared by the speculative and the baseline paths."""

    sampling: SamplingConfig
    seed: int = 0
    eos_token_id: int | None = None


def truncate_at_eos(output: list[int], eos_token_id: int | None) -> tuple[list[int], bool]:
    """Cut ``output`` after its first EOS token; return it and whether EOS was found."""
    if eos_token_id is None or eos_token_id not in output:
        return output, False
    return output[: output.index(eos_token_id) + 1], True


@dataclass(frozen=True)
class RoundRecord:
    """One speculative round: tokens drafted and accepted, the bonus flag, and timings.

    ``bonus`` is True when every drafted token was accepted and the target's extra token was
    emitted. ``draft_forwards`` counts draft forward passes (a policy that stops before a
    candidate has paid for its forward), the N_draft of the cost model. ``mean_entropy`` and
    ``min_max_prob`` summarise the policy features of the proposed tokens (None when the policy
    asked for none).
    """

    drafted: int
    accepted: int
    bonus: bool
    draft_forwards: int
    draft_seconds: float
    verify_seconds: float
    mean_entropy: float | None = None
    min_max_prob: float | None = None

    @property
    def emitted(self) -> int:
        """Tokens this round added to the output: the accepted ones plus the target's one."""
        return self.accepted + 1


@dataclass
class GenerationResult:
    """The output of one request: generated ids (prompt excluded), rounds, wall time.

    For target-only autoregressive decoding ``rounds`` holds one record per generated token
    with ``drafted == 0``.

    Times (docs/methods.md, "Prefill and decode"): ``seconds`` is the request's wall time,
    from its start to its last token; ``prefill_seconds`` runs from the start until every
    model has processed the prompt (speculative decoding: the target's and the draft's
    prefills; AR: the target's), ``decode_seconds`` from there to the last token (every round,
    the first included, which also runs the prompt's last token). ``seconds`` = prefill +
    decode exactly (one clock read ends prefill and starts decode). Both are None for results
    stored before they were recorded.

    ``batch_seconds`` (the batched engine only, ``workers.batch_time``) is the request's share
    of its batch's wall time: every instant split evenly among the requests in the batch then,
    so the shares of a batch queue sum to its wall time. None for a request decoded alone, whose
    share is its ``seconds``.
    """

    prompt_ids: list[int]
    output_ids: list[int]
    rounds: list[RoundRecord] = field(default_factory=list)
    seconds: float = 0.0
    stopped_on_eos: bool = False
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    batch_seconds: float | None = None

    @property
    def n_generated(self) -> int:
        """Number of generated tokens."""
        return len(self.output_ids)

    @property
    def n_drafted(self) -> int:
        """Total draft tokens proposed to the target (N_draft)."""
        return sum(r.drafted for r in self.rounds)

    @property
    def n_accepted(self) -> int:
        """Total draft tokens the target accepted."""
        return sum(r.accepted for r in self.rounds)

    @property
    def n_target_calls(self) -> int:
        """Target forward passes after prefill (N_target): one per round."""
        return len(self.rounds)


def result_to_json(result: GenerationResult) -> dict[str, Any]:
    """Return ``result`` as JSON-ready values (the store keeps a shard's results this way)."""
    return {
        "prompt_ids": [int(token) for token in result.prompt_ids],
        "output_ids": [int(token) for token in result.output_ids],
        "rounds": [asdict(record) for record in result.rounds],
        "seconds": result.seconds,
        "stopped_on_eos": result.stopped_on_eos,
        "prefill_seconds": result.prefill_seconds,
        "decode_seconds": result.decode_seconds,
        **({} if result.batch_seconds is None else {"batch_seconds": result.batch_seconds}),
    }


def result_from_json(data: dict[str, Any]) -> GenerationResult:
    """Return the result :func:`result_to_json` wrote."""
    return GenerationResult(
        prompt_ids=list(data["prompt_ids"]),
        output_ids=list(data["output_ids"]),
        rounds=[RoundRecord(**record) for record in data["rounds"]],
        seconds=data["seconds"],
        stopped_on_eos=data["stopped_on_eos"],
        prefill_seconds=data.get("prefill_seconds"),
        decode_seconds=data.get("decode_seconds"),
        batch_seconds=data.get("batch_seconds"),
    )
