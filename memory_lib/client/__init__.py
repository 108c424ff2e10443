"""The library API agents use: `MemoryClient` (sync) and `AsyncMemoryClient` (asyncio).

Both take a connection or a pool, an Embedder and an ObjectStore. Every method's body is written once, as
a flow (memory_lib.core.plans) in `flows`; AsyncMemoryClient (`async_client`, hand-written) drives it with
`drive_async`, MemoryClient (`sync_client`, generated from it by tools/async_to_sync.py) with `drive`, so
they return the same results. Every method takes the user_id first and never reads or writes another
user's rows.

    with MemoryClient.from_settings() as memory:
        memory.add("u1", "Prefers a cortado in the morning", tags=["coffee"])
        hits = memory.search("u1", "what coffee does the user like?")

A single psycopg Connection serves one thread at a time; pass a pool (`connection_pool(url)`)
to share a client between threads or tasks.
"""

from ..lifecycle.forget import ForgetResult
from ..lifecycle.promotion import Expansion, RestoreOutcome
from ..retrieval.types import SearchFilters, SearchHit, SearchResult
from ..write.memory_api import MemoryEvent, MemoryPage, MemoryRecord, UpdateResult
from ..write.write_path import AddResult
from .async_client import AsyncMemoryClient
from .flows import DEFAULT_ACTOR, SearchOptions
from .pools import async_connection_pool, connection_pool
from .sync_client import MemoryClient

__all__ = [
    "AddResult",
    "ForgetResult",
    "MemoryEvent",
    "MemoryPage",
    "MemoryRecord",
    "UpdateResult",
    "AsyncMemoryClient",
    "DEFAULT_ACTOR",
    "Expansion",
    "MemoryClient",
    "RestoreOutcome",
    "SearchFilters",
    "SearchHit",
    "SearchOptions",
    "SearchResult",
    "async_connection_pool",
    "connection_pool",
]
