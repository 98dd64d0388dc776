"""Which of the target's layers an EAGLE head reads: the last one (EAGLE-1) or several, fused.

A layer index i (0-based, below the target's depth L) names the hidden state after decoder
layer i at each position: transformers' ``hidden_states[i + 1]``, so the last layer's is taken
after the target's final norm (what its LM head reads) and the others are the raw residual
stream. An empty choice is the EAGLE-1 feature (the last layer's alone, no fusion); a fused head
reads two or more layers' states, concatenated in index order.

``eagle3`` picks EAGLE-3's low, middle and high layers as vLLM does by default: the states
entering layers 2, L // 2 and L − 3 (vLLM's ``eagle_aux_hidden_state_layer_ids``, which count
the embeddings as 0), that is after layers 1, L // 2 − 1 and L − 4 here; on a shallow target
they are clamped into 0..L − 1 and repeats dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The shortcut naming EAGLE-3's default low, middle and high layers.
EAGLE3 = "eagle3"
#: The fewest layers a fused head reads (one layer is the EAGLE-1 feature, the default).
MIN_FUSED = 2


def eagle3_layers(depth: int) -> tuple[int, ...]:
    """Return EAGLE-3's low, middle and high layers of a target ``depth`` layers deep, sorted
    (fewer than three on a target too shallow to hold three distinct ones)."""
    entering = (2, depth // 2, depth - 3)
    return tuple(sorted({min(max(j - 1, 0), depth - 1) for j in entering}))


def check_feature_layers(layers: Sequence[int], depth: int | None, field: str) -> tuple[int, ...]:
    """Return ``layers`` sorted; ValueError naming ``field`` unless they are at least
    ``MIN_FUSED`` distinct integers in 0..``depth`` − 1 (no upper bound when ``depth`` is
    None, the target not known yet)."""
    if any(isinstance(i, bool) or not isinstance(i, int) for i in layers):
        raise ValueError(f"{field} must list decoder-layer indices (integers), got {layers!r}")
    chosen = tuple(sorted(layers))
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"{field} must list distinct layers, got {list(layers)}")
    if len(chosen) < MIN_FUSED:
        raise ValueError(
            f"{field} must list at least {MIN_FUSED} layers to fuse, got {list(layers)}; leave "
            "it out for the EAGLE-1 feature (the last layer's)"
        )
    top = "" if depth is None else f" and below the target's {depth} layers"
    if chosen[0] < 0 or (depth is not None and chosen[-1] >= depth):
        raise ValueError(f"{field}: layer indices must be >= 0{top}, got {list(layers)}")
    return chosen


def feature_choice(value: Sequence[int] | str, field: str) -> tuple[int, ...] | str:
    """Return a user's choice checked in form alone (the target's depth not known yet): the
    sorted indices, or ``EAGLE3``; ValueError naming ``field`` otherwise."""
    if isinstance(value, str):
        if value != EAGLE3:
            raise ValueError(f"{field} must list layer indices or be {EAGLE3!r}, got {value!r}")
        return value
    return check_feature_layers(value, None, field)


def resolve_feature_layers(value: Sequence[int] | str, depth: int, field: str) -> tuple[int, ...]:
    """Return the layers of a user's choice (indices or ``EAGLE3``) on a target ``depth``
    layers deep, checked; ValueError naming ``field`` otherwise."""
    layers = eagle3_layers(depth) if feature_choice(value, field) == EAGLE3 else value
    return check_feature_layers(layers, depth, field)
