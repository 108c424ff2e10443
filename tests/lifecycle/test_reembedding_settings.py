"""A client's dual write during a re-embedding builds the secondary embedder from the client's own
settings: an OpenAI secondary reaches the base URL the client was given, not the environment's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memory_lib.client import MemoryClient
from memory_lib.core.config import EmbeddingConfig, Settings
from memory_lib.lifecycle import reembedding
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.db import connect
from testing.constants import TEST_DIM

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
TARGET = "text-embedding-3-small"


# A re-embedding changes the schema (columns, the dimension, the migrations' checksums).
pytestmark = pytest.mark.schema_changing


def test_an_explicit_embedding_base_url_is_the_one_the_dual_write_uses(
    db_url, local_store, fake_llm, llm_keys, monkeypatch
):
    # The environment names a port nothing listens on: an embedder built from it cannot fill a row.
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDING_BASE_URL", "http://127.0.0.1:9/v1")
    conn = connect(db_url)
    settings = Settings(embedding=EmbeddingConfig(base_url=fake_llm.openai_base_url, openai_api_key=llm_keys))

    def client() -> MemoryClient:
        embedder = HashingEmbedder(TEST_DIM)
        return MemoryClient(
            conn, embedder=embedder, object_store=local_store, settings=settings, actor="test"
        )

    client().add("u1", "Takes the early train.", now=NOW)  # records the active embedding model
    reembedding.start(conn, TARGET, 96, actor="test")
    before = fake_llm.count("/v1/embeddings")
    added = client().add("u1", "Waters the fern every Sunday.", now=NOW)  # a new client sees the migration
    row = conn.execute(
        "SELECT embedding_model_next, embedding_next FROM memories WHERE id = %s", (added.memory_id,)
    ).fetchone()
    assert row is not None
    assert row["embedding_model_next"] == TARGET
    assert row["embedding_next"].to_numpy().shape == (96,)
    assert fake_llm.count("/v1/embeddings") == before + 1
    assert reembedding.pending(conn, "hot") == 1  # only the memory written before the start
    conn.close()
