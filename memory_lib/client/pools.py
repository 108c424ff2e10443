"""Connection pools configured like memory_lib.storage.db.connect (autocommit, dict rows, pgvector), and
the blocking opens AsyncMemoryClient runs in a worker thread (their sync names are what MemoryClient calls)."""

from __future__ import annotations

import asyncio
from typing import Any

from pgvector.psycopg import register_vector, register_vector_async
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ..core.config import Settings
from ..storage.db import Database, check_schema, open_ready_database


def connection_pool(url: str, *, min_size: int = 1, max_size: int = 4, **kwargs: Any) -> ConnectionPool:
    """A pool of connections configured like memory_lib.storage.db.connect (autocommit, dict rows, pgvector).

    The schema is checked first: on a database that was never migrated the pool would otherwise retry
    registering the missing `vector` type until its timeout; this raises SchemaError at once instead.
    """
    check_schema(url)
    return ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        open=True,
        configure=register_vector,
        kwargs={"autocommit": True, "row_factory": dict_row},
        **kwargs,
    )


def async_connection_pool(
    url: str, *, min_size: int = 1, max_size: int = 4, **kwargs: Any
) -> AsyncConnectionPool:
    """The async twin of `connection_pool`; open it with `await pool.open()` (or `async with`)."""
    return AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        open=False,
        configure=register_vector_async,
        kwargs={"autocommit": True, "row_factory": dict_row},
        **kwargs,
    )


def open_pool(url: str) -> ConnectionPool:
    """An open pool to `url`, its schema checked first (SchemaError on a database never migrated)."""
    return connection_pool(url)


async def open_pool_async(url: str) -> AsyncConnectionPool:
    """open_pool on asyncio: the schema check in a worker thread, then the pool opened."""
    await asyncio.to_thread(check_schema, url)
    pool = async_connection_pool(url)
    await pool.open(wait=True)
    return pool


async def open_ready_database_async(settings: Settings) -> Database:
    """memory_lib.storage.db.open_ready_database in a worker thread."""
    return await asyncio.to_thread(open_ready_database, settings)
