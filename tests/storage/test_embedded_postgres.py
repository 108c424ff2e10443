"""The embedded server: started when needed, stopped when its last holder leaves, even after a SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import IO, cast

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from testing.rows import one

ROOT = Path(__file__).resolve().parents[2]
HOLD = textwrap.dedent(
    """
    import sys, time
    from memory_lib.storage.db import EmbeddedPostgres
    pg = EmbeddedPostgres(__import__("pathlib").Path(sys.argv[1]))
    print(pg.start(), flush=True)
    if sys.argv[2] == "hang":
        time.sleep(600)
    pg.stop()
    """
)


def _postmaster_pid(pgdata: Path) -> int | None:
    pidfile = pgdata / "postmaster.pid"
    return int(pidfile.read_text().split()[0]) if pidfile.exists() else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _run(pgdata: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLD, str(pgdata), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )


@pytest.mark.slow
def test_server_stops_after_a_killed_holder(tmp_path):
    pgdata = tmp_path / "pg"
    holder = _run(pgdata, "hang")
    assert holder.stdout is not None
    url = holder.stdout.readline().strip()
    with psycopg.connect(url) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
    pid = _postmaster_pid(pgdata)
    assert _alive(pid)
    os.killpg(holder.pid, signal.SIGKILL)  # no cleanup runs: its pid stays in the holder list
    holder.wait()
    assert holder.pid in json.loads((pgdata / ".handle_pids.json").read_text())

    # A later process reuses the server, prunes the dead holder, and stops the server when done.
    second = _run(pgdata, "exit")
    assert second.stdout is not None
    assert second.stdout.readline().strip() == url
    assert second.wait(timeout=60) == 0
    deadline = time.monotonic() + 30
    while _alive(pid):
        assert time.monotonic() < deadline, "embedded Postgres still running after its last holder left"
        time.sleep(0.1)


def test_library_cli_and_dagster_reach_the_same_embedded_database(tmp_path, monkeypatch, capsys):
    """MEMORY_ARCHIVE_STATE_DIR + MEMORY_ARCHIVE_EMBEDDED_DB name one database for all three; a client
    never creates the server or the database (it says to run migrate), `memory-archive migrate` does."""
    import dagster as dg
    import pytest

    from memory_assets.resources import DatabaseResource
    from memory_lib.cli import main
    from memory_lib.client import MemoryClient
    from memory_lib.core.config import Settings
    from memory_lib.core.errors import SchemaError

    state = tmp_path / "state"
    monkeypatch.delenv("DATABASE_URL", raising=False)
    for name, value in {
        "MEMORY_ARCHIVE_STATE_DIR": str(state),
        "MEMORY_ARCHIVE_EMBEDDED_DB": "memory_shared",
        "MEMORY_ARCHIVE_EMBEDDING_DIM": "24",
        "MEMORY_ARCHIVE_EMBEDDER": "hashing",
    }.items():
        monkeypatch.setenv(name, value)

    with pytest.raises(SchemaError, match="no embedded database in .*run `memory-archive migrate`"):
        MemoryClient.from_settings(Settings.from_env())
    assert not state.exists()  # the client initialized nothing

    assert main(["migrate"]) == 0
    assert '"applied": ["001_' in capsys.readouterr().out
    with MemoryClient.from_settings(Settings.from_env()) as memory:
        memory.add("alice", "Prefers a cortado in the morning")
        assert isinstance(memory._conn, ConnectionPool)
        with memory._conn.connection() as conn:  # the client's pool
            assert one(conn.execute("SELECT current_database() AS d"))["d"] == "memory_shared"
    with dg.build_resources({"database": DatabaseResource()}) as built, built.database.connect() as conn:
        assert one(conn.execute("SELECT current_database() AS d"))["d"] == "memory_shared"
        assert (
            one(conn.execute("SELECT content FROM memories"))["content"] == "Prefers a cortado in the morning"
        )

    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDED_DB", "memory_other")
    with pytest.raises(
        SchemaError, match="database 'memory_other' does not exist .*run `memory-archive migrate`"
    ):
        MemoryClient.from_settings(Settings.from_env())


# --------------------------------------------------------------------------- starts under load, or says why

SERVE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memory_lib.storage.db import EmbeddedPostgres
    pg = EmbeddedPostgres(Path(sys.argv[1]))
    print(pg.start(), flush=True)
    sys.stdin.readline()
    pg.stop()
    """
)


def _stop_leftover(pgdata: Path) -> None:
    """Stop a server a failed test left behind (SIGINT to its postmaster: a fast shutdown)."""
    pid = _postmaster_pid(pgdata)
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGINT)


def _wait_stopped(pids: list[int | None], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, "an embedded Postgres still runs after its holder stopped it"
        time.sleep(0.1)


@pytest.mark.slow
def test_servers_started_at_once_in_several_processes_all_come_up(tmp_path):
    dirs = [tmp_path / f"pg{i}" for i in range(3)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SERVE, str(d)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            start_new_session=True,
        )
        for d in dirs
    ]
    try:
        urls = [cast(IO[str], p.stdout).readline().strip() for p in procs]  # stdout=PIPE: never None
        assert all(urls), "an embedded Postgres did not start (its process's stderr says why)"
        for url in urls:
            with psycopg.connect(url) as c:
                assert c.execute("SELECT 1").fetchone() == (1,)
        pids = [_postmaster_pid(d) for d in dirs]
        assert len(set(pids)) == 3 and all(_alive(p) for p in pids)
    finally:
        for p in procs:
            cast(IO[str], p.stdin).close()  # each holder stops its server and exits
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=120))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                codes.append(p.wait())
        for d in dirs:
            _stop_leftover(d)
    assert codes == [0, 0, 0]
    _wait_stopped(pids)


def test_servers_started_at_once_in_threads_all_come_up(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from memory_lib.storage.db import EmbeddedPostgres

    servers = [EmbeddedPostgres(tmp_path / f"pg{i}") for i in range(3)]
    try:
        with ThreadPoolExecutor(3) as pool:
            urls = list(pool.map(EmbeddedPostgres.start, servers))
        for url in urls:
            with psycopg.connect(url) as c:
                assert c.execute("SELECT 1").fetchone() == (1,)
        pids = [_postmaster_pid(s.pgdata) for s in servers]
        assert len(set(pids)) == 3
    finally:
        for s in servers:
            s.stop()
            _stop_leftover(s.pgdata)
    _wait_stopped(pids)


def test_a_failed_attempt_is_retried_with_a_longer_pg_ctl_wait(tmp_path, monkeypatch):
    from memory_lib.storage import embedded

    calls: list[list[str]] = []
    real = embedded._run_pg_ctl

    def flaky(args: list[str], **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise embedded._StartFailed(
                "pg_ctl start", code=1, stdout="waiting for server to start", stderr="simulated"
            )
        return real(args, **kwargs)

    monkeypatch.setattr(embedded, "_run_pg_ctl", flaky)
    server = embedded.EmbeddedPostgres(tmp_path / "pg", backoff_seconds=0.05)
    try:
        with psycopg.connect(server.start()) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)
    finally:
        pid = _postmaster_pid(server.pgdata)
        server.stop()
        _stop_leftover(server.pgdata)
    _wait_stopped([pid])
    assert len(calls) == 2 and calls[1][calls[1].index("-t") + 1] == str(embedded.EMBEDDED_START_WAIT_SECONDS)


def test_a_start_that_fails_says_why_with_pg_ctl_output_and_the_data_dir_state(tmp_path):
    """A bad postgresql.conf line, then a server log that cannot be created: the wheel alone raised a
    FileNotFoundError from reading that log in the second case, hiding pg_ctl's error."""
    from memory_lib.core.errors import EmbeddedServerError
    from memory_lib.storage.db import EmbeddedPostgres

    pgdata = tmp_path / "pg"
    first = EmbeddedPostgres(pgdata)
    first.start()  # initdb
    pid = _postmaster_pid(pgdata)
    first.stop()
    _wait_stopped([pid])
    conf = pgdata / "postgresql.conf"
    good = conf.read_text()

    conf.write_text(good + "\nthis line is not a setting\n")
    with pytest.raises(EmbeddedServerError) as bad_conf:
        EmbeddedPostgres(pgdata, attempts=2, backoff_seconds=0.05).start()
    message = str(bad_conf.value)
    assert f"embedded Postgres in {pgdata.resolve()} did not start after 2 attempts" in message
    assert "attempt 1, 2: pg_ctl start exited 1; stdout: 'waiting for server to start" in message
    assert "stderr: 'pg_ctl: could not start server" in message
    assert re.search(
        r"PG_VERSION \d+; no postmaster\.pid \(no server running\); server log .*, last \d+ lines", message
    )
    assert 'syntax error in file "' in message and "postgresql.conf" in message

    conf.write_text(good)
    (pgdata / "log").unlink()
    (pgdata / "log").symlink_to(tmp_path / "no-such-dir" / "log")
    with pytest.raises(EmbeddedServerError) as no_log:
        EmbeddedPostgres(pgdata, attempts=2, backoff_seconds=0.05).start()
    message = str(no_log.value)
    assert "cannot create" in message and "pg_ctl: could not start server" in message
    assert "no server log at" in message and "FileNotFoundError" not in message
    assert no_log.value.__cause__ is None and no_log.value.__context__ is None
    assert not (pgdata / "postmaster.pid").exists()
