"""The store's API: :class:`Store` (writer, reader and refresh in one handle) and open_store.

Every method runs in one transaction; see :mod:`orchestrator.store.writer` for how recording
stays idempotent.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from orchestrator.store.db import check_readable, default_url, make_engine, upgrade_to_head
from orchestrator.store.reader import StoreReader
from orchestrator.store.refresh import StoreRefresh
from orchestrator.store.row_values import prompt_id
from orchestrator.store.writer import ShardOutput, StoreWriter

__all__ = ["ShardOutput", "Store", "open_store", "prompt_id"]

_MIGRATION_LOCK = threading.Lock()


def open_store(url: str | None = None, read_only: bool = False) -> Store:
    """Open the results store at ``url`` (default ``$SPECSWEEP_DB`` or ``sqlite:///results.db``).

    Writers migrate the schema to the newest revision first; readers never write and fail with
    StoreError when the database is missing or not migrated.
    """
    engine = make_engine(url or default_url(), read_only=read_only)
    try:
        if read_only:
            check_readable(engine)
        else:
            with _MIGRATION_LOCK:
                upgrade_to_head(engine)
    except Exception:
        engine.dispose()
        raise
    return Store(engine=engine, read_only=read_only)


@dataclass
class Store(StoreWriter, StoreReader, StoreRefresh):
    """A handle on the results database; open it with :func:`open_store`."""
