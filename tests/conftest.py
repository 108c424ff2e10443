"""Real components for the whole session: one embedded Postgres, one SeaweedFS, one fake LLM server.

Each test that needs a database gets a fresh one, cloned from a migrated template (fast, and
tests cannot see each other's rows).
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings as hypothesis_settings
from psycopg.conninfo import make_conninfo

from memory_lib.storage.db import EmbeddedPostgres, connect, migrate_database
from testing.constants import TEST_DIM, TEST_USER_PARTITIONS
from testing.fake_llm import FakeLLMServer

# CI replays a fixed set of examples (a run there must be reproducible); locally, hypothesis keeps
# exploring new ones and remembers failures in .hypothesis/.
hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

# The Dagster definitions load once per process, before any test database exists, and take their first
# night from the database unless it is set: the tests' fixed histories (2026) need a fixed start.
os.environ.setdefault("MEMORY_ARCHIVE_PARTITION_START", "2025-01-01")


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data")
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


class DatabaseFactory:
    """Fresh databases cloned from one migrated template per embedding dimension."""

    def __init__(self, server_url: str):
        self.server_url = server_url
        self._templates: dict[int, str] = {}
        self._counter = itertools.count()
        self.created: list[str] = []

    def url(self, dbname: str) -> str:
        return make_conninfo(self.server_url, dbname=dbname)

    def _admin(self, sql: str) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(sql)

    def new(self, dim: int = TEST_DIM) -> str:
        if dim not in self._templates:
            template = f"tmpl_dim_{dim}"
            self._admin(f"DROP DATABASE IF EXISTS {template}")
            self._admin(f"CREATE DATABASE {template}")
            migrate_database(self.url(template), dim, user_partitions=TEST_USER_PARTITIONS)
            self._templates[dim] = template
        name = f"t_{next(self._counter)}_{uuid.uuid4().hex[:8]}"
        self._admin(f"CREATE DATABASE {name} TEMPLATE {self._templates[dim]}")
        self.created.append(name)
        return self.url(name)

    def new_empty(self, prefix: str = "empty") -> str:
        """An empty database (no migration applied): for migration, packaging and Dagster storage tests."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self._admin(f"CREATE DATABASE {name}")
        self.created.append(name)
        return self.url(name)

    def drop(self, url: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def databases(pg_server: str) -> DatabaseFactory:
    return DatabaseFactory(pg_server)


@pytest.fixture
def db_url(databases: DatabaseFactory) -> Iterator[str]:
    url = databases.new()
    yield url
    databases.drop(url)


@pytest.fixture
def empty_database(databases: DatabaseFactory) -> Iterator[str]:
    url = databases.new_empty()
    yield url
    databases.drop(url)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    c = connect(db_url)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def make_conn(databases: DatabaseFactory) -> Iterator[Callable[..., psycopg.Connection]]:
    """Connections to fresh databases of a given embedding dimension."""
    opened: list[tuple[psycopg.Connection, str]] = []

    def make(dim: int = TEST_DIM) -> psycopg.Connection:
        url = databases.new(dim)
        c = connect(url)
        opened.append((c, url))
        return c

    yield make
    for c, url in opened:
        c.close()
        databases.drop(url)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory):
    from testing.seaweedfs import run_seaweedfs

    with run_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as endpoint:
        yield endpoint


@pytest.fixture
def local_store(tmp_path: Path):
    from memory_lib.storage.objectstore import LocalObjectStore

    return LocalObjectStore(tmp_path / "objects", prefix="test")


@pytest.fixture
def s3_store(seaweed):
    from memory_lib.storage.objectstore import S3ObjectStore

    bucket = f"b-{uuid.uuid4().hex[:12]}"
    seaweed.create_bucket(bucket)
    return S3ObjectStore(seaweed.client(), bucket, prefix="test")


@pytest.fixture
def versioned_store(seaweed):
    """An S3 store on a fresh SeaweedFS bucket with versioning Enabled (what erasure and recovery need)."""
    from memory_lib.storage.objectstore import S3ObjectStore

    bucket = f"v-{uuid.uuid4().hex[:12]}"
    seaweed.create_bucket(bucket)
    client = seaweed.client()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    assert client.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    return S3ObjectStore(client, bucket, prefix="test")


@pytest.fixture(params=["local", "s3"])
def object_store(request: pytest.FixtureRequest):
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture(scope="module")
def fake_llm_server() -> Iterator[FakeLLMServer]:
    """A local HTTP server speaking the Anthropic and OpenAI APIs to the real SDKs."""
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def fake_llm(fake_llm_server: FakeLLMServer) -> FakeLLMServer:
    fake_llm_server.reset()
    return fake_llm_server


@pytest.fixture
def llm_keys(monkeypatch: pytest.MonkeyPatch) -> str:
    """The fake server's API key as ANTHROPIC_API_KEY and OPENAI_API_KEY, for code that reads them from the
    environment (the Dagster summarizer resource); pair it with `fake_llm`."""
    from testing.fake_llm import FAKE_API_KEY

    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_API_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_API_KEY)
    return FAKE_API_KEY


@pytest.fixture
def history(conn: psycopg.Connection) -> list[uuid.UUID]:
    """The Slow Path tests' small deterministic history (testing.dagster_helpers) in `conn`'s database."""
    from testing.dagster_helpers import load_history

    return load_history(conn, TEST_DIM)


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


@pytest.fixture(autouse=True)
def _fresh_boto3_default_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3.client() uses one default session, which keeps the credentials it first resolved: each test
    resolves its own (a test that ran earlier with other AWS variables must not decide them)."""
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
