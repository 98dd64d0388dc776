"""The engine and transactions every part of the store (writer, reader, refresh) runs on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Self

from sqlalchemy import Engine
from sqlalchemy.orm import Session


@dataclass
class StoreBase:
    """The database handle the store's writer, reader and refresh share."""

    engine: Engine
    read_only: bool = False
    #: The ``runs`` row of the sweep run in progress; trials recorded through this handle
    #: point to it (set by :meth:`~orchestrator.store.writer.StoreWriter.record_run`).
    run_id: int | None = None

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """Yield a session inside one transaction, committed on success."""
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session
