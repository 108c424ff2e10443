"""The active embedding space: the dimension and model the database holds vectors of.

Every plan that reads or writes vectors checks the embedder against it (`checked_shape_plan`) after
locking the vector tables, so a re-embedding flip in progress is waited for, never half seen.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import EmbeddingMismatchError, embedding_mismatch_reason
from ..core.plans import Plan, Sql

SHAPE_SQL = """
    SELECT (SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim') AS dim,
           (SELECT value FROM memory_archive_settings WHERE key = 'embedding_model') AS model"""


# A re-embedding flip (memory_lib.lifecycle.reembedding) renames the vector columns and changes the settings in one
# transaction holding ACCESS EXCLUSIVE locks on these tables. Taking ACCESS SHARE on them BEFORE reading
# the settings makes a statement wait for a flip in progress and then see its settings and columns
# together. LOCK takes no snapshot, so in a REPEATABLE READ plan the snapshot is taken after it.
# On Citus, LOCK of a distributed table goes to every worker (a round trip to each node on every add
# and search); with citus.enable_ddl_propagation off it stays on the coordinator, where a flip's DDL
# takes its ACCESS EXCLUSIVE lock first, so the wait is the same for clients of the coordinator. On
# one node the setting is an unused placeholder. SET takes no snapshot either.
LOCK_VECTOR_TABLES = Sql(
    """SET LOCAL citus.enable_ddl_propagation = off;
    LOCK TABLE memories, archived_memories, memory_digests, memory_facts IN ACCESS SHARE MODE;
    SET LOCAL citus.enable_ddl_propagation TO DEFAULT""",
    {},
    "rowcount",
)


def checked_shape_plan(dim: int, model: str) -> Plan[dict[str, Any]]:
    """The embedder must match the database's active embedding space: same dimension, and the model
    recorded on first write (or made active by a re-embedding flip). Locks the vector tables first
    (LOCK_VECTOR_TABLES): the rest of the plan's statements see the space that was checked."""
    yield LOCK_VECTOR_TABLES
    row = yield Sql(SHAPE_SQL, {}, "one")
    check_shape(row, dim, model)
    return row


def locked(sql: str) -> str:
    """`sql` (no parameters) after LOCK_VECTOR_TABLES, as one round trip: its row read under the lock."""
    return f"{LOCK_VECTOR_TABLES.query};\n{sql}"


def check_shape(row: dict[str, Any], dim: int, model: str) -> None:
    """checked_shape_plan's check of a row with SHAPE_SQL's columns (dim, model), read under the lock."""
    if row["dim"] is None:
        raise EmbeddingMismatchError("embedding_dim", None, "the schema is not initialized: run migrations")
    if int(row["dim"]) != dim or (row["model"] is not None and row["model"] != model):
        field, value = ("embedder.dim", dim) if int(row["dim"]) != dim else ("embedder.model", model)
        raise EmbeddingMismatchError(
            field, value, embedding_mismatch_reason(row["model"], int(row["dim"]), model, dim)
        )
