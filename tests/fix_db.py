"""The database fixtures: one embedded Postgres per session; each test that needs a database gets a
fresh one, cloned from a migrated template (fast, and tests cannot see each other's rows).

With TEST_CITUS_ADMIN_URL and TEST_CITUS_URL set (`make test`'s Citus pass), every test database is a
distributed one on that cluster instead (testing.citus), emptied between tests."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from memory_lib.core.rows import Conn
from memory_lib.storage.db import EmbeddedPostgres, connect, migrate_database
from testing.citus import CitusDatabases, citus_urls
from testing.constants import TEST_DIM, TEST_USER_PARTITIONS


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

    def new(self, dim: int = TEST_DIM, *, shared: bool = True) -> str:
        """A fresh database. `shared=False`: the test changes the schema, so its database is never
        handed to another test (every database here is fresh anyway; a Citus one is reused)."""
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


class CitusDatabaseFactory(DatabaseFactory):
    """The same interface on a Citus cluster: distributed databases, reused and emptied between tests."""

    def __init__(self, admin_url: str, app_url: str):
        super().__init__(admin_url)
        self.cluster = CitusDatabases(admin_url, app_url)
        self._dims: dict[str, int] = {}

    def new(self, dim: int = TEST_DIM, *, shared: bool = True) -> str:
        if not shared:  # never reused: dropped with the session's (drop_all)
            return self.cluster.create(dim)
        url = self.cluster.new(dim)
        self._dims[url] = dim
        return url

    def new_empty(self, prefix: str = "empty") -> str:
        pytest.skip(
            "needs a database with no schema; the Citus pass's databases are migrated and distributed"
        )

    def drop(self, url: str) -> None:
        if url in self._dims:
            self.cluster.release(url, self._dims.pop(url))


@pytest.fixture(scope="session")
def databases(request: pytest.FixtureRequest) -> Iterator[DatabaseFactory]:
    urls = citus_urls()
    if urls is None:
        yield DatabaseFactory(request.getfixturevalue("pg_server"))
        return
    factory = CitusDatabaseFactory(*urls)
    try:
        yield factory
    finally:
        factory.cluster.drop_all()


@pytest.fixture
def db_url(databases: DatabaseFactory, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh migrated database; a test marked `schema_changing` gets one no other test will use."""
    url = databases.new(shared=request.node.get_closest_marker("schema_changing") is None)
    yield url
    databases.drop(url)


@pytest.fixture
def empty_database(databases: DatabaseFactory) -> Iterator[str]:
    url = databases.new_empty()
    yield url
    databases.drop(url)


@pytest.fixture
def conn(db_url: str) -> Iterator[Conn]:
    c = connect(db_url)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def make_conn(databases: DatabaseFactory) -> Iterator[Callable[..., Conn]]:
    """Connections to fresh databases of a given embedding dimension."""
    opened: list[tuple[Conn, str]] = []

    def make(dim: int = TEST_DIM) -> Conn:
        url = databases.new(dim)
        c = connect(url)
        opened.append((c, url))
        return c

    yield make
    for c, url in opened:
        c.close()
        databases.drop(url)


@pytest.fixture
def history(conn: Conn) -> list[uuid.UUID]:
    """The Slow Path tests' small deterministic history (testing.dagster_helpers) in `conn`'s database."""
    from testing.dagster_helpers import load_history

    return load_history(conn, TEST_DIM)
