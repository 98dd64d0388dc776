"""The ``ngram`` draft kind: prompt lookup over the prompt and the output so far.

At the start of a round the last n tokens of the sequence, n from ``n_max`` down to ``n_min``,
are looked up among earlier positions (the most recent occurrence, ending within the last
``window`` tokens when a window is set); the tokens that followed that occurrence are proposed
one by one, up to the end of the sequence. No match: nothing is proposed and the round is a
plain target step. The index maps every n-gram of the emitted sequence to the position where
it last ended and grows incrementally as tokens are emitted (emitted tokens never change, so
a rejection needs no rollback).

A proposal is deterministic: its distribution is a point mass (entropy 0, max probability 1).
The policy feature it adds is ``match_length``: how many tokens before the proposal agree with
the sequence's end, counted back from the match up to ``MATCH_LENGTH_CAP``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from workers.proposers.base import COMMON_FEATURES, Candidate
from workers.records import SamplingConfig

#: How far back ``match_length`` counts agreeing tokens.
MATCH_LENGTH_CAP = 64


@dataclass(frozen=True)
class NgramSettings:
    """The lookup's n range and window (``window`` None: the whole sequence)."""

    n_max: int = 3
    n_min: int = 1
    window: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.n_min <= self.n_max:
            raise ValueError(
                f"ngram draft: need 1 <= n_min <= n_max, got n_min={self.n_min}, n_max={self.n_max}"
            )
        if self.window is not None and self.window < 1:
            raise ValueError(f"ngram draft: window must be >= 1 or unset, got {self.window}")


@dataclass(frozen=True)
class Lookup:
    """A match: the proposals are ``sequence[start:end]``; ``match_length`` as above."""

    start: int
    end: int
    match_length: int


class NgramIndex:
    """The most recent end position of every n-gram (n_min..n_max) of a growing sequence."""

    def __init__(self, settings: NgramSettings) -> None:
        self.settings = settings
        self._last_end: dict[tuple[int, ...], int] = {}
        self._indexed = 0

    def extend(self, sequence: list[int], upto: int) -> None:
        """Index the n-grams ending at positions before ``upto``."""
        low, high = self.settings.n_min, self.settings.n_max
        for end in range(self._indexed, upto):
            for n in range(low, min(high, end + 1) + 1):
                self._last_end[tuple(sequence[end - n + 1 : end + 1])] = end
        self._indexed = max(self._indexed, upto)

    def lookup(self, sequence: list[int]) -> Lookup | None:
        """Return the match of ``sequence``'s last n tokens (longest n first), or None."""
        length = len(sequence)
        self.extend(sequence, length - 1)
        oldest = 0 if self.settings.window is None else length - 1 - self.settings.window
        for n in range(min(self.settings.n_max, length), self.settings.n_min - 1, -1):
            end = self._last_end.get(tuple(sequence[length - n :]))
            if end is not None and end >= oldest:
                return Lookup(end + 1, length, _agreeing(sequence, end, length - 1))
        return None


def _agreeing(sequence: list[int], earlier: int, later: int) -> int:
    """Return how many tokens agree going back from ``earlier`` and ``later`` together."""
    count = 0
    while count < MATCH_LENGTH_CAP and earlier - count >= 0:
        if sequence[earlier - count] != sequence[later - count]:
            break
        count += 1
    return count


@dataclass
class _Round:
    """The current round's source of proposals."""

    sequence: list[int]
    position: int
    end: int
    match_length: int


class NgramProposer:
    """Propose the continuation of the sequence's most recent n-gram match (module docstring)."""

    kind: ClassVar[str] = "ngram"
    features: ClassVar[frozenset[str]] = COMMON_FEATURES | {"match_length"}
    wants_target_features: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    step_cost: ClassVar[int] = 0

    def __init__(self, settings: NgramSettings | None = None) -> None:
        self.settings = settings or NgramSettings()
        self.index = NgramIndex(self.settings)
        self._round: _Round | None = None

    def begin(self, prompt: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """Start a request: an empty index (it is filled from the sequence on lookup;
        ``features`` unused)."""
        self.index = NgramIndex(self.settings)
        self._round = None

    def first(
        self,
        sequence: list[int],
        sampling: SamplingConfig,
        generator: torch.Generator,
        wanted: frozenset[str],
    ) -> Candidate | None:
        """Look the sequence's end up; propose the token after the match, or None."""
        found = self.index.lookup(sequence)
        if found is None:
            self._round = None
            return None
        self._round = _Round(sequence, found.start, found.end, found.match_length)
        return self._candidate(wanted)

    def next(
        self,
        previous: Candidate,
        sampling: SamplingConfig,
        generator: torch.Generator,
        wanted: frozenset[str],
    ) -> Candidate | None:
        """Propose the next token of the matched continuation, or None at its end."""
        if self._round is None:
            return None
        self._round.position += 1
        return self._candidate(wanted)

    def rollback(self, length: int) -> None:
        """Nothing to drop: only emitted tokens are indexed."""

    def observe(self, n_accepted: int, next_token: int, features: torch.Tensor | None) -> None:
        """Nothing to take: the next lookup reads the emitted sequence."""

    def _candidate(self, wanted: frozenset[str]) -> Candidate | None:
        """Return the point-mass candidate at the round's position, or None past its end."""
        current = self._round
        if current is None or current.position >= current.end:
            return None
        token = torch.tensor([current.sequence[current.position]], dtype=torch.long)
        shows = "entropy" in wanted or "max_prob" in wanted
        return Candidate(
            token,
            point_mass=True,
            entropy=0.0 if shows else None,
            max_prob=1.0 if shows else None,
            match_length=current.match_length,
        )
