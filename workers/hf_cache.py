"""The keyword a transformers model takes its KV cache by, across transformers releases.

transformers 5.24 renamed the ``past_key_values`` argument and output field to ``cache`` and
warns (a FutureWarning per call site) on the old name, which it removes in 5.40; releases before
5.24 know only ``past_key_values``. Every call that hands a model a cache goes through
:func:`cache_kwargs` and every read of a returned cache through :func:`returned_cache`, so the
project runs warning-free on both.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

from torch import nn


@cache
def _takes_cache_keyword(forward_type: type) -> bool:
    """Whether ``forward_type.forward`` has a ``cache`` parameter (transformers ≥ 5.24)."""
    return "cache" in inspect.signature(forward_type.forward).parameters


def cache_keyword(model: nn.Module) -> str:
    """Return the name ``model``'s forward (and ``generate``) take a KV cache by."""
    return "cache" if _takes_cache_keyword(type(model)) else "past_key_values"


def cache_kwargs(model: nn.Module, kv_cache: Any) -> dict[str, Any]:
    """Return ``{name: kv_cache}`` for a call of ``model`` or its ``generate``."""
    return {cache_keyword(model): kv_cache}


def returned_cache(model: nn.Module, output: Any) -> Any:
    """Return the KV cache in ``output``, a forward result of ``model``."""
    return output[cache_keyword(model)]
