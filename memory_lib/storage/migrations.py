"""Schema migrations: the numbered SQL files, applied once each, and the read-only schema check.

The numbered migrations ship inside the package (memory_lib/sql, package data read through
importlib.resources); in a source checkout memory_lib/sql is a symlink to the top-level sql/ folder.
Each applied migration is recorded in schema_migrations with the checksum of its SQL without comments
(storage.sql_text): a comment may be corrected after the migration shipped, a changed statement is refused.
sql/schema.sql in the same folder is the generated picture of the result (storage.schema_dump), not a
migration.
"""

from __future__ import annotations

import importlib.resources
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from ..core.errors import MissingExtensionError, SchemaError
from ..core.rows import Conn, Row
from .first_shipped_comments import as_first_shipped
from .sql_text import full_text_checksum, sql_checksum, sql_statements

log = logging.getLogger(__name__)


def shipped_migrations() -> Traversable:
    """The migrations shipped in the package; in a checkout whose symlink memory_lib/sql was not
    materialized (git on Windows without symlinks), the top-level sql/ folder."""
    shipped = importlib.resources.files("memory_lib") / "sql"
    if shipped.is_dir():
        return shipped
    return Path(__file__).resolve().parents[2] / "sql"


MIGRATIONS_DIR = shipped_migrations()
_MIGRATION_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
SCHEMA_DUMP_NAME = "schema.sql"  # the generated schema, read by people, never applied
# Any constant works; it serializes concurrent migrators on one database.
_MIGRATION_LOCK_ID = 0x6D656D61


@dataclass(frozen=True)
class Migration:
    """One numbered migration, rendered for an embedding dim. `first_shipped` is its rendered text with
    the comments it first shipped with (storage.first_shipped_comments), when those differ from today's."""

    version: int
    name: str
    sql: str
    first_shipped: str | None = None

    @property
    def checksum(self) -> str:
        """What schema_migrations records: the SQL without comments (storage.sql_text)."""
        return sql_checksum(self.sql)

    @property
    def whole_text_checksum(self) -> str:
        """What the runner recorded before its checksums left comments out: sha256 of the whole text as
        first shipped. A database holding it is re-recorded with `checksum` once."""
        return full_text_checksum(self.sql if self.first_shipped is None else self.first_shipped)


def _render(text: str, embedding_dim: int) -> str:
    return text.replace("{{EMBEDDING_DIM}}", str(int(embedding_dim)))


def load_migrations(directory: Traversable | Path | None = None, *, embedding_dim: int) -> list[Migration]:
    directory = shipped_migrations() if directory is None else directory
    if not directory.is_dir():
        raise SchemaError(
            f"migrations folder {directory} is missing: this memory-archive installation is broken"
        )
    found: list[Migration] = []
    files = (p for p in directory.iterdir() if p.name.endswith(".sql") and p.name != SCHEMA_DUMP_NAME)
    for path in sorted(files, key=lambda p: p.name):
        m = _MIGRATION_NAME.match(path.name)
        if not m:
            raise SchemaError(f"migration file name {path.name!r} is not NNN_lower_snake.sql")
        version, text = int(m.group(1)), path.read_text(encoding="utf-8")
        first = as_first_shipped(version, text)
        found.append(
            Migration(
                version,
                path.name.removesuffix(".sql"),
                _render(text, embedding_dim),
                None if first == text else _render(first, embedding_dim),
            )
        )
    if not found:
        raise SchemaError(f"no migrations in {directory}: this memory-archive installation is broken")
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise SchemaError(f"two migrations share a number in {directory}: {versions}")
    return found


def migrate(
    url: str,
    *,
    embedding_dim: int,
    directory: Traversable | Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Apply pending migrations, each in its own transaction; returns the names applied. `progress`
    is called with (migrations checked, total) after each one (a progress bar's hook).

    Re-running is a no-op. A migration that fails rolls back whole, leaving no half-applied schema.
    """
    migrations = load_migrations(directory, embedding_dim=embedding_dim)
    applied_now: list[str] = []
    applying = ["(setup)"]  # the migration whose statements the server is answering
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        conn.add_notice_handler(lambda diag: _relay_server_message(applying[0], diag))
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_ID,))
            present = _prepare_extensions(conn, migrations)  # before anything is written
            # Only when missing: even CREATE TABLE IF NOT EXISTS needs CREATE on the schema.
            if not _table_exists(conn, "schema_migrations"):
                try:
                    conn.execute(
                        """CREATE TABLE schema_migrations (
                               version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                               applied_at timestamptz NOT NULL DEFAULT now())"""
                    )
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise _privilege_error(conn, "creating table schema_migrations", exc) from exc
        for done, mig in enumerate(migrations, 1):
            if progress is not None and done > 1:
                progress(done - 1, len(migrations))
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_ID,))
                row = conn.execute(
                    "SELECT name, checksum FROM schema_migrations WHERE version = %s", (mig.version,)
                ).fetchone()
                if row is not None:
                    if row["checksum"] != mig.checksum:
                        if row["checksum"] != mig.whole_text_checksum:
                            _raise_changed(conn, mig, embedding_dim)
                        _record_checksum(conn, mig)
                    continue
                log.info("applying migration %s", mig.name)
                applying[0] = mig.name
                # What distributed Postgres (Citus) needs to apply a migration to a distributed schema:
                # triggers on distributed tables (each of ours touches only its row's user, as Citus asks),
                # and one connection per worker, so that a function created after a change of a
                # distributed table reaches the workers in the same transaction. Placeholder settings,
                # without effect, where Citus is not installed.
                conn.execute("SET LOCAL citus.enable_unsafe_triggers = on")
                conn.execute("SET LOCAL citus.multi_shard_modify_mode = 'sequential'")
                try:
                    # One statement at a time: Citus forwards a trigger's DDL to the shards as the text sent.
                    for statement in sql_statements(_without_present_extensions(mig.sql, present)):
                        conn.execute(statement)
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise _privilege_error(conn, f"migration {mig.name}", exc) from exc
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
    if progress is not None:
        progress(len(migrations), len(migrations))
    return applied_now


def _relay_server_message(migration: str, diag: psycopg.errors.Diagnostic) -> None:
    """Log a NOTICE or WARNING the server sent while migrating: Citus says there what it did not
    distribute (a view left on the coordinator, for one); a WARNING is logged as one."""
    severity = diag.severity_nonlocalized or diag.severity or "NOTICE"
    text = " ".join(
        part
        for part in (
            diag.message_primary,
            diag.message_detail,
            diag.message_hint and f"({diag.message_hint})",
        )
        if part
    )
    level = logging.WARNING if severity == "WARNING" else logging.INFO
    log.log(level, "migration %s: server %s: %s", migration, severity, text)


def _one(cur: psycopg.Cursor[Row]) -> Row:
    """The row of a query that always returns exactly one (a SELECT without FROM)."""
    row = cur.fetchone()
    assert row is not None  # a SELECT without FROM or WHERE always returns one row
    return row


def _table_exists(conn: Conn, table: str) -> bool:
    """Whether `table` exists (to_regclass: no error, and no privilege on the table needed)."""
    return bool(_one(conn.execute("SELECT to_regclass(%s) IS NOT NULL AS ok", (table,)))["ok"])


def _privilege_error(conn: Conn, step: str, exc: psycopg.Error) -> SchemaError:
    # conn.info, not a query: the failed transaction answers none
    reason = exc.diag.message_primary or " ".join(str(exc).split())
    return SchemaError(
        f'{step} needs a privilege role "{conn.info.user}" lacks in database "{conn.info.dbname}" '
        f"({reason}): run `memory-archive migrate` as the role that owns the schema, the one the application "
        f'connects as; or grant "{conn.info.user}" CREATE on the database and on schema public (the DBA '
        "steps in docs/how-to/postgres.md)"
    )


_CREATE_EXTENSION = re.compile(
    r'^[ \t]*CREATE[ \t]+EXTENSION[ \t]+(?:IF[ \t]+NOT[ \t]+EXISTS[ \t]+)?"?([a-z_][a-z0-9_]*)"?[^;]*;',
    re.IGNORECASE | re.MULTILINE,
)


def _prepare_extensions(conn: Conn, migrations: list[Migration]) -> set[str]:
    """Make sure every extension the pending migrations create exists, before anything is written; returns
    the extensions installed in the database.

    An extension already installed is left alone (a role that may not create extensions migrates a database
    where the DBA created them). A missing one is created here, in the caller's transaction; when the server
    does not offer it or the role may not create it, MissingExtensionError says what to ask the DBA for."""
    applied: set[int] = set()
    if _table_exists(conn, "schema_migrations"):
        applied = {r["version"] for r in conn.execute("SELECT version FROM schema_migrations")}
    needed: list[str] = []
    for mig in migrations:
        if mig.version not in applied:
            needed += [e.lower() for e in _CREATE_EXTENSION.findall(mig.sql) if e.lower() not in needed]
    present = {r["extname"] for r in conn.execute("SELECT extname FROM pg_extension")}
    missing = [e for e in needed if e not in present]
    if not missing:
        return present
    who = _one(conn.execute("SELECT current_user AS role, current_database() AS db"))
    available = {
        r["name"]
        for r in conn.execute("SELECT name FROM pg_available_extensions WHERE name = ANY(%s)", (missing,))
    }
    for ext in missing:
        if ext not in available:
            raise MissingExtensionError(ext, who["db"], who["role"], available=False)
    for ext in missing:
        try:
            conn.execute(f'CREATE EXTENSION IF NOT EXISTS "{ext}"')
        except psycopg.errors.InsufficientPrivilege as exc:
            raise MissingExtensionError(ext, who["db"], who["role"], available=True) from exc
        present.add(ext)
    return present


def _without_present_extensions(sql: str, present: set[str]) -> str:
    """`sql` without its CREATE EXTENSION statements for extensions already installed: on some Postgres
    versions even CREATE EXTENSION IF NOT EXISTS needs the privilege to create the extension."""

    def skip(m: re.Match[str]) -> str:
        return f"-- extension {m.group(1)} is installed" if m.group(1).lower() in present else m.group(0)

    return _CREATE_EXTENSION.sub(skip, sql)


def _raise_changed(conn: Conn, mig: Migration, embedding_dim: int) -> None:
    stored = conn.execute("SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'").fetchone()
    if stored is not None and int(stored["value"]) != embedding_dim:
        raise SchemaError(
            f"embedding_dim={embedding_dim} does not match this database, created with "
            f"embedding_dim={stored['value']}: use the same setting or a new database"
        )
    raise SchemaError(
        f"migration {mig.name} changed after it was applied: its SQL (comments aside) differs from the SQL "
        "recorded in schema_migrations; put the file back as it shipped and make the change a new migration"
    )


def _record_checksum(conn: Conn, mig: Migration) -> None:
    """Replace a whole-text checksum (the runner before checksums left comments out) by `mig.checksum`."""
    conn.execute("UPDATE schema_migrations SET checksum = %s WHERE version = %s", (mig.checksum, mig.version))
    log.info("migration %s: checksum recorded again, over its SQL without comments", mig.name)


def stored_embedding_dim(conn: Conn) -> int:
    row = conn.execute("SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'").fetchone()
    if row is None:
        raise SchemaError("memory_archive_settings has no embedding_dim: run `memory-archive migrate`")
    return int(row["value"])


_CORE_TABLES = ("memories", "archived_memories", "memory_events", "memory_archive_settings")


def check_schema(url: str, *, embedding_dim: int | None = None) -> int:
    """The database's embedding dim, after checking its schema read-only: every shipped migration
    applied and none unknown, pgvector and the core tables present, and (when given) `embedding_dim`
    equal to the dim the database was created with. Any gap raises one SchemaError."""
    expected = {m.version: m.name for m in load_migrations(embedding_dim=embedding_dim or 1)}
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        where = f"database {conninfo_to_dict(url).get('dbname') or '(default)'!r}"
        if not _table_exists(conn, "schema_migrations"):
            raise SchemaError(f"{where} has no memory-archive schema: run `memory-archive migrate`")
        applied = {
            r["version"]: r["name"] for r in conn.execute("SELECT version, name FROM schema_migrations")
        }
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
            if not _table_exists(conn, table):
                raise SchemaError(
                    f"{where} lacks table {table}: the schema is damaged; run `memory-archive migrate`"
                )
        stored = stored_embedding_dim(conn)
    if embedding_dim is not None and stored != embedding_dim:
        raise SchemaError(
            f"{where} was created with embedding_dim={stored}, settings have embedding.dim={embedding_dim}: "
            f"set MEMORY_ARCHIVE_EMBEDDING_DIM={stored} (with the embedder that made its vectors) or use another database"
        )
    return stored


def rerender_migration_checksums(conn: Conn, embedding_dim: int) -> int:
    """Record the applied migrations' checksums as rendered for `embedding_dim`: after a re-embedding
    flip to another dimension (memory_lib.lifecycle) the schema is the one `embedding_dim` would have
    created, and `migrate` must see it so. Only migrations whose recorded checksum matches their
    rendering for the current embedding_dim setting (either form: without comments, or the whole text
    an earlier runner recorded) are rewritten; a changed migration stays detected.
    Runs in the caller's transaction; returns the rows rewritten."""
    current = stored_embedding_dim(conn)
    old = {m.version: {m.checksum, m.whole_text_checksum} for m in load_migrations(embedding_dim=current)}
    new = {m.version: m.checksum for m in load_migrations(embedding_dim=embedding_dim)}
    changed = 0
    for row in conn.execute("SELECT version, checksum FROM schema_migrations").fetchall():
        v = row["version"]
        if v in new and row["checksum"] in old.get(v, ()) and new[v] != row["checksum"]:
            conn.execute("UPDATE schema_migrations SET checksum = %s WHERE version = %s", (new[v], v))
            changed += 1
    return changed
