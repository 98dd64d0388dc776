"""The results store: SQLAlchemy models, Alembic migrations, the Store (writer, reader, refresh)."""

from orchestrator.store.db import StoreError, default_url, display_url
from orchestrator.store.query import (
    PrivilegedRoleRefused,
    QueryLimitExceeded,
    QueryLimits,
    reader_role_sql,
)
from orchestrator.store.records import (
    BASELINE_POLICY,
    LeaseHolder,
    QueryResult,
    ShardClaim,
    StoredArtifact,
    StoredCostFit,
    StoredJob,
    StoredRound,
    StoredRun,
    StoredSample,
    StoredShard,
    StoredTraces,
    StoredTrial,
    SweepInfo,
)
from orchestrator.store.results import ShardOutput, Store, open_store, prompt_id
from orchestrator.store.sql_guard import NotAStatement, QueryRefused

__all__ = [
    "BASELINE_POLICY",
    "LeaseHolder",
    "NotAStatement",
    "PrivilegedRoleRefused",
    "QueryLimitExceeded",
    "QueryLimits",
    "QueryRefused",
    "QueryResult",
    "ShardClaim",
    "ShardOutput",
    "Store",
    "StoreError",
    "StoredArtifact",
    "StoredCostFit",
    "StoredJob",
    "StoredRound",
    "StoredRun",
    "StoredSample",
    "StoredShard",
    "StoredTraces",
    "StoredTrial",
    "SweepInfo",
    "default_url",
    "display_url",
    "open_store",
    "prompt_id",
    "reader_role_sql",
]
