"""Postgres: the configured server or an embedded one, and connections to it.

One way to reach a database, for the library clients, the CLI and Dagster alike: `open_database`
resolves it from Settings (DATABASE_URL, else the embedded server under the state dir, database
MEMORY_ARCHIVE_EMBEDDED_DB). Only `prepare_database` (memory-archive migrate, the Dagster resource,
the demo) creates anything or runs DDL; clients use `open_ready_database`, which checks the schema
version and raises SchemaError ("run `memory-archive migrate`") without a lock or a DDL statement.

The embedded server lives in storage.embedded and the migrations in storage.migrations; their public
names stay importable from here.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
from pgvector.psycopg import register_vector
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from pydantic import SecretStr

from ..core.config import Settings
from ..core.errors import DatabaseConnectionError, SchemaError
from ..core.rows import Conn
from . import partitioning
from .embedded import (
    EMBEDDED_ENGINES,
    EMBEDDED_START_ATTEMPTS,
    EMBEDDED_START_BACKOFF_SECONDS,
    EMBEDDED_START_WAIT_SECONDS,
    EmbeddedPostgres,
    embedded_pgdata_state,
    pid_alive,
)
from .migrations import (
    MIGRATIONS_DIR,
    Migration,
    check_schema,
    load_migrations,
    migrate,
    rerender_migration_checksums,
    shipped_migrations,
    stored_embedding_dim,
)

__all__ = [
    "EMBEDDED_ENGINES",
    "EMBEDDED_START_ATTEMPTS",
    "EMBEDDED_START_BACKOFF_SECONDS",
    "EMBEDDED_START_WAIT_SECONDS",
    "MIGRATIONS_DIR",
    "DATABASE_REFUSED",
    "Database",
    "EmbeddedPostgres",
    "Migration",
    "check_schema",
    "connect",
    "database_target",
    "describe_database",
    "embedded_pgdata_state",
    "ensure_database",
    "load_migrations",
    "migrate",
    "migrate_database",
    "naming_the_database",
    "open_database",
    "open_ready_database",
    "pid_alive",
    "prepare_database",
    "reachable_url",
    "rerender_migration_checksums",
    "shipped_migrations",
    "stored_embedding_dim",
]

log = logging.getLogger(__name__)


@dataclass
class Database:
    """Where to connect. Owns the embedded server when it started one."""

    url: str
    embedded: EmbeddedPostgres | None = None

    def connect(self, *, autocommit: bool = True, register: bool = True) -> Conn:
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
    return make_conninfo(
        host=socket_dir, port=port, user="postgres", dbname=settings.embedded_database or "postgres"
    )


_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def ensure_database(server_url: str, name: str, *, create: bool = True) -> str:
    """The URL of database `name` on the server of `server_url`, created when missing if `create`."""
    if not _DB_NAME.match(name):
        raise SchemaError(
            f"embedded database name {name!r} must be a lowercase identifier ([a-z_][a-z0-9_]*)"
        )
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


def connect(url: str | SecretStr, *, autocommit: bool = True, register: bool = True) -> Conn:
    """A psycopg 3 connection returning dict rows, with pgvector types registered. `url` is a
    `postgresql://` URL or libpq string, or `Settings.database_url` itself (a SecretStr).

    Autocommit by default: memory_lib opens every transaction explicitly with `conn.transaction()`,
    so no statement is left inside an implicit transaction that nobody commits.
    """
    if isinstance(url, SecretStr):
        url = url.get_secret_value()
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


# The first statement of a transaction that writes a reference table (a batch, the settings) after, or
# beside, writes of distributed tables: Citus then uses one connection per worker, where parallel
# connections would make it refuse the reference table's write. A placeholder setting on one Postgres.
ONE_CONNECTION_PER_WORKER = "SET LOCAL citus.multi_shard_modify_mode = 'sequential'"


def migrate_database(
    url: str,
    default_dim: int,
    *,
    user_partitions: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Apply pending migrations; an initialized database keeps the embedding dim it was created with
    (`default_dim` only sizes a new database's vectors). Then, when `user_partitions` is set, bring
    memories and archived_memories to that many hash partitions by user_id (storage.partitioning).
    Returns the migrations applied and the tables converted. `progress`: migrations.migrate's."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'"
            ).fetchone()
    except psycopg.errors.UndefinedTable:
        row = None
    dim = int(row[0]) if row else default_dim
    if dim != default_dim:
        log.info("database keeps embedding_dim=%s it was created with (settings say %s)", dim, default_dim)
    applied = migrate(url, embedding_dim=dim, progress=progress)
    if user_partitions is not None:
        dict_conn = connect(url)
        try:
            applied += [str(layout) for layout in partitioning.ensure(dict_conn, user_partitions)]
        finally:
            dict_conn.close()
    return applied


def prepare_database(settings: Settings, *, embedding_dim: int | None = None) -> Database:
    """Open the database of `settings`, creating the embedded server/database when missing, and apply
    pending migrations (a new database gets `embedding_dim`, default settings.embedding.dim; an
    existing one keeps its dim). For `memory-archive migrate`, the Dagster resource and the demo."""
    db = open_database(settings, create=True)
    try:
        with naming_the_database(settings):
            migrate_database(
                db.url, embedding_dim or settings.embedding.dim, user_partitions=settings.user_partitions
            )
    except BaseException:
        db.close()
        raise
    return db


def open_ready_database(settings: Settings) -> Database:
    """Open the database of `settings` for a library client: no DDL, no migration lock, nothing created.
    Raises SchemaError (run `memory-archive migrate`) unless every shipped migration is applied and
    the database was created with settings.embedding.dim, and DatabaseConnectionError (naming
    DATABASE_URL's host, port and dbname) when its server cannot be connected to."""
    db = open_database(settings, create=False)
    try:
        with naming_the_database(settings):
            check_schema(db.url, embedding_dim=settings.embedding.dim)
    except BaseException:
        db.close()
        raise
    return db


# Postgres refusing the connection's settings (not an outage): wrong role, password, database or pg_hba rule.
DATABASE_REFUSED = re.compile(
    r'password authentication failed|role "[^"]*" does not exist|database "[^"]*" does not exist|no pg_hba\.conf entry'
)
_TARGET_KEYS = ("host", "port", "dbname")


def database_target(url: str) -> dict[str, str]:
    """The host, port and dbname a connection URL names (those it gives; never the password)."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return {}
    return {k: str(info[k]) for k in _TARGET_KEYS if info.get(k)}


def describe_database(settings: Settings) -> str:
    """Which database `settings` name, in words for an error: the setting and where it points."""
    if settings.database_url is None:
        return f"the embedded server in {settings.embedded_pg_dir} (under MEMORY_ARCHIVE_STATE_DIR)"
    target = database_target(settings.database_url.get_secret_value())
    where = " ".join(f"{k}={target.get(k, '(libpq default)')}" for k in _TARGET_KEYS)
    return f"DATABASE_URL ({where})"


@contextlib.contextmanager
def naming_the_database(settings: Settings) -> Iterator[None]:
    """A failed connection to DATABASE_URL's server becomes DatabaseConnectionError naming the setting
    and its host, port and dbname (never the password), refused or unreachable. A server error with
    its own SQLSTATE (a lock timeout, a cancelled query) is not a failed connection and passes as it is."""
    try:
        yield
    except psycopg.OperationalError as exc:
        if settings.database_url is None or type(exc) is not psycopg.OperationalError:
            raise
        url = settings.database_url.get_secret_value()
        cause = " ".join(str(exc).split())
        password = str(conninfo_to_dict(url).get("password") or "")
        # libpq never quotes the password; masked all the same, when long enough to tell from other words.
        if len(password) >= 4:
            cause = cause.replace(password, "***")
        refused = bool(DATABASE_REFUSED.search(cause))
        where = describe_database(settings)
        message = (
            f"the database of {where} refused these settings"
            if refused
            else f"cannot reach the database of {where}"
        )
        raise DatabaseConnectionError(
            f"{message}: {cause[:300]}", setting="DATABASE_URL", target=database_target(url), refused=refused
        ) from exc
