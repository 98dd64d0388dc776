"""Alembic environment: migrate the connection the store passes in, or ``-x url=...`` by hand.

SQLite DDL runs in the store's explicit transaction (``transactional_ddl``); on PostgreSQL a
transaction-scoped advisory lock serialises writers migrating the same database at once.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from orchestrator.store.db import default_url, make_engine
from orchestrator.store.models import Base

MIGRATION_LOCK_KEY = 0x5350_5357  # "SPSW"


def run_migrations(connection: Connection) -> None:
    """Run the pending migrations on ``connection`` in one transaction."""
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        transactional_ddl=True,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
        context.run_migrations()


def main() -> None:
    """Migrate the store's connection if given, else the ``-x url=`` (or default) database."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or default_url()
    engine = make_engine(url)
    with engine.connect() as own_connection:
        run_migrations(own_connection)
        own_connection.commit()
    engine.dispose()


main()
