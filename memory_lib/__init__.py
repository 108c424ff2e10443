"""memory-archive: lifecycle management for AI-agent memory tables in Postgres + pgvector.

Plain Python; never imports dagster, so agent code can use it on its own. The public API is what this
module exports::

    from memory_lib import MemoryClient, Settings

    with MemoryClient.from_settings(Settings.from_env()) as memory:
        memory.add("user-42", "Prefers a cortado in the morning", tags=["coffee"])
        for hit in memory.search("user-42", "coffee in the morning"):
            print(hit.labeled_text)

Every other module is internal (memory_lib/README.md names the packages and their layers); the few an
operator may want on purpose (the archival pipeline, consolidation, the CLI) are documented as advanced.
"""

from .client import (
    AsyncMemoryClient,
    MemoryClient,
    async_connection_pool,
    connection_pool,
)
from .core import errors
from .core.config import (
    ArchivalCriteria,
    ContextBudget,
    EmbeddingConfig,
    LLMConfig,
    ObjectStoreConfig,
    RetrievalConfig,
    Settings,
    WriteConfig,
)
from .core.errors import (
    ConfigError,
    EmbeddingMismatchError,
    IntegrityError,
    InvalidInputError,
    MemoryArchiveError,
    NotFoundError,
    SchemaError,
)
from .core.models import NewMemory
from .lifecycle.forget import ForgetResult
from .lifecycle.promotion import Expansion, RestoreOutcome
from .llm.embedding import Embedder, HashingEmbedder, OpenAIEmbedder, embedder_from_settings
from .retrieval.consolidated import ConsolidatedHit, SourceExpansion
from .retrieval.context import AssembledContext
from .retrieval.types import HitScores, Provenance, SearchFilters, SearchHit, SearchResult
from .storage.db import migrate
from .storage.objectstore import LocalObjectStore, ObjectStore, S3ObjectStore, object_store_from_settings
from .write.memory_api import MemoryEvent, MemoryPage, MemoryRecord, UpdateResult
from .write.write_path import AddResult

__version__ = "0.1.0"

__all__ = [
    "AddResult",
    "ArchivalCriteria",
    "AssembledContext",
    "AsyncMemoryClient",
    "ConfigError",
    "ConsolidatedHit",
    "ContextBudget",
    "Embedder",
    "EmbeddingConfig",
    "EmbeddingMismatchError",
    "Expansion",
    "ForgetResult",
    "HashingEmbedder",
    "HitScores",
    "IntegrityError",
    "InvalidInputError",
    "LLMConfig",
    "LocalObjectStore",
    "MemoryArchiveError",
    "MemoryClient",
    "MemoryEvent",
    "MemoryPage",
    "MemoryRecord",
    "NewMemory",
    "NotFoundError",
    "ObjectStore",
    "ObjectStoreConfig",
    "OpenAIEmbedder",
    "Provenance",
    "RestoreOutcome",
    "RetrievalConfig",
    "S3ObjectStore",
    "SchemaError",
    "SearchFilters",
    "SearchHit",
    "SearchResult",
    "Settings",
    "SourceExpansion",
    "UpdateResult",
    "WriteConfig",
    "__version__",
    "async_connection_pool",
    "connection_pool",
    "embedder_from_settings",
    "errors",
    "migrate",
    "object_store_from_settings",
]
