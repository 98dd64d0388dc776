"""Which weight layout each forward size runs on, and whether one-token steps are padded (pure).

On CPU in float32 the plain-torch Llama path holds every projection twice: the model's own
weight ("unpacked", multiplied by MKL) and a oneDNN-packed copy ("packed",
``workers.llama_fast.PackedLinear``); asked for, the unpacked forward also runs compiled
("compiled", ``workers.compiled_step``: the same bits as "unpacked", in other glue). Which is
faster depends on the block size and the machine: on one 2-core VM SmolLM2's one-token step
took 33.7 ms packed against 26.5 ms unpacked, while a four-token block took 32.4 ms packed
against 36.3 ms unpacked. ``CachedLM`` times its layouts at the block sizes
``CALIBRATION_SIZES`` when a model loads and ``choose_step_plan`` turns those times into a
``StepPlan``: a layout per block size and whether a one-token step runs as a
two-token block. The AR baseline (one-token steps) and speculation (draft steps, verification
blocks) then each run on their fastest layout, so no speedup over AR comes from a slow baseline.

What mixing layouts costs in exactness. Only the packed product computes a row bit for bit alike
in any block (the unpacked product runs one row as a matrix-vector product and a block as a
matrix product, whose roundings differ), and the two layouts round differently from each other
(about 1e-6 in SmolLM2-sized logits). A plan that is packed at every size therefore keeps
speculative greedy output bit for bit equal to target-only greedy decoding; a plan that takes
the unpacked or compiled layout anywhere keeps it equal up to float rounding, as the unpacked
path, GPUs and half precision always have: a greedy near-tie (two top logits within rounding)
may be decided differently by a one-token step and by a verified block. Speculation stays
lossless in distribution either way (every target row is a correct evaluation of the target),
but the packed layout is left only for a clear gain (``LAYOUT_MIN_GAIN``), and one plan holds
for every forward of a model in a process and, in a sweep, for every replica of that model on a
node (``orchestrator.run.step_choices``), so AR and every policy of a sweep decode with the same
kernels at each block size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

#: A weight layout: oneDNN-packed copies, the model's own ("unpacked") weights, or the unpacked
#: weights through a compiled graph (``workers.compiled_step``; bit-equal to "unpacked").
Layout = Literal["packed", "unpacked", "compiled"]
LAYOUTS: tuple[Layout, ...] = ("packed", "unpacked", "compiled")
#: Block sizes timed at load; a larger block takes the layout of the largest of these below it.
CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8)
#: A one-token step is padded only when a two-token block is at least this fraction faster. A
#: padded step computes the same values in other kernels (last-bit differences, enough in
#: bfloat16 to change a greedy output), so a choice that near-equal timings could flip from one
#: process to the next is not taken (on an H100 the two took 22.7 and 26.1 ms, near enough for
#: a busy host to reverse them).
PAD_MIN_GAIN = 0.10
#: A block size leaves the packed layout only when another one is at least this fraction
#: faster: the packed layout is the one whose rows do not depend on the block (see above).
LAYOUT_MIN_GAIN = 0.05


@dataclass(frozen=True)
class StepPlan:
    """How a model runs a forward of n tokens.

    ``layouts`` are (size, layout) pairs by increasing size, the first of size 1: a forward of
    n tokens uses the layout of the largest size ≤ n. ``padded``: a one-token step runs as a
    two-token block (the token twice, the second position cropped off), on size 2's layout.
    """

    layouts: tuple[tuple[int, Layout], ...] = ((1, "packed"),)
    padded: bool = False

    def __post_init__(self) -> None:
        sizes = [size for size, _ in self.layouts]
        if not sizes or sizes[0] != 1 or sizes != sorted(set(sizes)):
            raise ValueError(f"StepPlan.layouts must start at size 1 and increase: {self.layouts}")
        unknown = {layout for _, layout in self.layouts} - set(LAYOUTS)
        if unknown:
            raise ValueError(f"StepPlan.layouts names unknown layouts {sorted(unknown)}")

    def layout(self, n: int) -> Layout:
        """Return the layout a forward of ``n`` tokens runs on."""
        return next(layout for size, layout in reversed(self.layouts) if size <= n)

    @classmethod
    def uniform(cls, layout: Layout, padded: bool = False) -> StepPlan:
        """Return the plan running every size on ``layout``."""
        return cls(((1, layout),), padded)


def prefers_padding(one_token_s: float, two_tokens_s: float) -> bool:
    """Return whether a two-token block is enough faster than a one-token step to pad steps."""
    return two_tokens_s < one_token_s * (1 - PAD_MIN_GAIN)


def choose_layout(seconds: Mapping[Layout, float]) -> Layout:
    """Return the layout to run a block size on, given each available layout's seconds for it:
    "packed" unless the faster of the others ("unpacked" and "compiled" compute the same bits,
    so the faster of them is taken freely) is at least ``LAYOUT_MIN_GAIN`` faster."""
    others = {layout: s for layout, s in seconds.items() if layout != "packed"}
    if not others:
        return "packed"
    fastest = min(others, key=others.__getitem__)
    if "packed" not in seconds or others[fastest] < seconds["packed"] * (1 - LAYOUT_MIN_GAIN):
        return fastest
    return "packed"


def choose_step_plan(seconds: Mapping[Layout, Mapping[int, float]]) -> StepPlan:
    """Return the plan for the fastest seconds of each available layout at each block size.

    Every layout must have been timed at the same sizes, 1 among them; sizes whose layout does
    not change are merged. One-token steps are padded when the two-token block on its chosen
    layout beats the chosen one-token step by ``PAD_MIN_GAIN`` (size 2 must then be timed).
    """
    sizes = sorted({size for times in seconds.values() for size in times})
    if not seconds or 1 not in sizes or any(sorted(t) != sizes for t in seconds.values()):
        raise ValueError("every layout must be timed at the same block sizes, 1 among them")
    chosen = {n: choose_layout({lay: times[n] for lay, times in seconds.items()}) for n in sizes}
    layouts: list[tuple[int, Layout]] = []
    for n in sizes:
        if not layouts or layouts[-1][1] != chosen[n]:
            layouts.append((n, chosen[n]))
    padded = 2 in chosen and prefers_padding(seconds[chosen[1]][1], seconds[chosen[2]][2])
    return StepPlan(tuple(layouts), padded)
