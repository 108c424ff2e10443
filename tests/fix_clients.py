"""The client fixtures: the environment of a `memory-archive` command on the test's database."""

from __future__ import annotations

from pathlib import Path

import pytest

from testing.constants import TEST_DIM


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, db_url: str, tmp_path: Path) -> str:
    """The environment of a `memory-archive` command on this test's database: offline summarizer and
    embedder, a local object store under tmp_path/objects, no API keys. Returns the database URL."""
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDING_DIM", str(TEST_DIM))
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDER", "hashing")
    monkeypatch.setenv("MEMORY_ARCHIVE_SUMMARIZER", "extractive")
    monkeypatch.setenv("MEMORY_ARCHIVE_LOCAL_ROOT", str(tmp_path / "objects"))
    for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    return db_url
