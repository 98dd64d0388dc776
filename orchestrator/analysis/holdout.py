"""Tuning apart from testing: dev and test prompts, and a best setting chosen on one and
measured on the other (pure; docs/methods.md, "Dev and test prompts").

A dataset entry's ``holdout`` (``orchestrator.sweep.spec.HoldoutSpec``) splits its prompt
positions (a trial's sample indices) by a seeded permutation into disjoint dev and test sets.
Trials still run every prompt: the split is analysis only, so it changes no trial id. Wherever a
best setting per policy is reported, :func:`best_setting` picks the candidate trial with the
largest speedup over its AR baseline on the dev prompts and reports that trial's speedup, with
its paired 95% interval, on the test prompts. Without a split it picks and measures on the same
prompts, and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from orchestrator.analysis.metrics import ratio
from orchestrator.analysis.pairing import (
    Comparison,
    SampleSpeed,
    decode_speeds,
    pair_samples,
    paired_ratio,
)
from orchestrator.sweep.spec import DatasetEntry, SweepSpec

#: The speed a best setting is chosen and measured by: decode-only where every sample has its
#: decode seconds (the headline), else end to end.
DECODE, END_TO_END = "decode", "e2e"


@dataclass(frozen=True)
class PromptSplit:
    """Disjoint dev and test prompt positions (sample indices), each sorted."""

    dev: tuple[int, ...]
    test: tuple[int, ...]


@dataclass(frozen=True)
class BestSetting:
    """A best setting: the chosen trial, its speedup on the dev prompts it was chosen on, and
    its paired speedup on the test prompts (``test.ratio`` None below two prompts).

    ``held_out`` is False when no split was configured: chosen and measured on the same
    prompts. ``measure`` is :data:`DECODE` or :data:`END_TO_END`.
    """

    trial_id: str
    dev_speedup: float | None
    test_speedup: float | None
    test: Comparison
    n_dev: int
    n_test: int
    held_out: bool
    measure: str

    def cell(self) -> str:
        """Return the short table cell of :meth:`note`: "dev 3, test 3" or "same 6"."""
        if not self.held_out:
            return f"same {self.n_test}"
        return f"dev {self.n_dev}, test {self.n_test}"

    def note(self) -> str:
        """Return how the setting was chosen, e.g. "chosen on 3 dev prompts, measured on 3 test
        prompts" (or "best chosen and measured on the same 6 prompts")."""
        speed = "decode-only" if self.measure == DECODE else "end-to-end"
        if not self.held_out:
            return f"best chosen and measured on the same {self.n_test} prompts ({speed})"
        return (
            f"chosen on {self.n_dev} dev prompts, measured on {self.n_test} test prompts ({speed})"
        )


def split_prompts(n_prompts: int, dev_fraction: float, seed: int) -> PromptSplit:
    """Return the dev and test positions of ``n_prompts`` prompts: a permutation seeded by
    ``seed``, its first round(n · dev_fraction) positions dev (at least one on each side when
    there are two prompts or more), the rest test."""
    if n_prompts < 2:
        raise ValueError(f"a dev/test split needs at least 2 prompts, got {n_prompts}")
    order = np.random.default_rng(seed).permutation(n_prompts)
    n_dev = min(max(round(n_prompts * dev_fraction), 1), n_prompts - 1)
    return PromptSplit(
        dev=tuple(sorted(int(i) for i in order[:n_dev])),
        test=tuple(sorted(int(i) for i in order[n_dev:])),
    )


def _subset(samples: Sequence[SampleSpeed], positions: set[int]) -> list[SampleSpeed]:
    """Return the samples at these prompt positions."""
    return [sample for sample in samples if sample.sample_index in positions]


def pooled_speedup(samples: Sequence[SampleSpeed], baseline: Sequence[SampleSpeed]) -> float | None:
    """Return the speedup on the prompts both measured: the ratio of the two tokens/s, each
    summed over those prompts (None when none is shared or a side took no time)."""
    pairs = pair_samples(samples, baseline)
    mine = ratio(sum(a.tokens for a, _ in pairs), sum(a.seconds for a, _ in pairs))
    theirs = ratio(sum(b.tokens for _, b in pairs), sum(b.seconds for _, b in pairs))
    return None if mine is None or not theirs else mine / theirs


def headline_measure(speeds: Sequence[Sequence[SampleSpeed]]) -> str:
    """Return :data:`DECODE` when every sample of every list has decode seconds, else
    :data:`END_TO_END`."""
    return DECODE if all(decode_speeds(s) is not None for s in speeds) else END_TO_END


@dataclass(frozen=True)
class Candidate:
    """A trial that may be a best setting: its samples and its AR baseline's samples."""

    samples: Sequence[SampleSpeed]
    baseline: Sequence[SampleSpeed]


def best_setting(
    candidates: Mapping[str, Candidate], split: PromptSplit | None
) -> BestSetting | None:
    """Return the candidate trial (by id) with the best speedup over its baseline on the dev
    prompts, measured on the test prompts (both every prompt without ``split``); None when no
    candidate has a dev speedup. Speeds are decode-only when every sample has decode seconds,
    else end to end; ties go to the smallest trial id."""
    measure = headline_measure([s for c in candidates.values() for s in (c.samples, c.baseline)])
    everything = {s.sample_index for c in candidates.values() for s in c.samples}
    dev = set(split.dev) if split else everything
    test = set(split.test) if split else everything
    on_dev = {
        trial_id: pooled_speedup(*_on(candidate, measure, dev))
        for trial_id, candidate in candidates.items()
    }
    ranked = sorted((-value, trial_id) for trial_id, value in on_dev.items() if value is not None)
    if not ranked:
        return None
    chosen = ranked[0][1]
    mine, theirs = _on(candidates[chosen], measure, test)
    return BestSetting(
        trial_id=chosen,
        dev_speedup=on_dev[chosen],
        test_speedup=pooled_speedup(mine, theirs),
        test=paired_ratio(mine, theirs),
        n_dev=len(pair_samples(*_on(candidates[chosen], measure, dev))),
        n_test=len(pair_samples(mine, theirs)),
        held_out=split is not None,
        measure=measure,
    )


def _on(
    candidate: Candidate, measure: str, positions: set[int]
) -> tuple[list[SampleSpeed], list[SampleSpeed]]:
    """Return the candidate's and its baseline's samples at ``positions``, timed by
    ``measure``."""
    return (
        _subset(_timed(candidate.samples, measure), positions),
        _subset(_timed(candidate.baseline, measure), positions),
    )


def _timed(samples: Sequence[SampleSpeed], measure: str) -> list[SampleSpeed]:
    """Return ``samples`` timed by ``measure``'s seconds (decode-only or end to end)."""
    decode = decode_speeds(samples) if measure == DECODE else None
    return list(samples) if decode is None else decode


#: What identifies a trial's dataset entry: dataset, split, samples, max new tokens.
DatasetKey = tuple[str, str | None, int, int]


class OnDataset(Protocol):
    """What names a trial's dataset entry (a stored trial or a planned one)."""

    dataset: str
    split: str | None
    samples: int
    max_new_tokens: int


def dataset_key(row: OnDataset) -> DatasetKey:
    """Return the dataset entry key of a trial."""
    return (row.dataset, row.split, row.samples, row.max_new_tokens)


@dataclass(frozen=True)
class SweepSamples:
    """What best settings are chosen from: every trial's samples (id → samples, baselines
    included) and the sweep's dev/test splits (:func:`holdout_splits`)."""

    samples: Mapping[str, Sequence[SampleSpeed]]
    splits: Mapping[DatasetKey, PromptSplit]


def holdout_splits(spec: SweepSpec) -> dict[DatasetKey, PromptSplit]:
    """Return the dev/test split of each dataset entry of ``spec`` that configures one."""
    return entry_splits(spec.datasets)


def entry_splits(entries: Iterable[DatasetEntry]) -> dict[DatasetKey, PromptSplit]:
    """Return the dev/test split of each of these dataset entries that configures one."""
    return {
        (entry.name, entry.split, entry.samples, entry.max_new_tokens): split_prompts(
            entry.samples, entry.holdout.dev_fraction, entry.holdout.seed
        )
        for entry in entries
        if entry.holdout is not None
    }


def stored_splits(specs: Iterable[Mapping[str, Any]]) -> dict[DatasetKey, PromptSplit]:
    """Return the dev/test splits of stored sweep specs (``Store.sweep_specs``' values).

    Only the dataset entries are read, each validated on its own, so a spec stored by an older
    version still gives its splits (an entry that no longer validates has none).
    """
    entries = []
    for spec in specs:
        for data in spec.get("datasets", []):
            try:
                entries.append(DatasetEntry.model_validate(data))
            except ValueError:
                continue
    return entry_splits(entries)
