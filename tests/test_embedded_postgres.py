"""The embedded server: started when needed, stopped when its last holder leaves, even after a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
HOLD = textwrap.dedent(
    """
    import sys, time
    from memory_lib.db import EmbeddedPostgres
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
    return subprocess.Popen([sys.executable, "-c", HOLD, str(pgdata), mode], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, start_new_session=True)  # fmt: skip


def test_server_stops_after_a_killed_holder(tmp_path):
    pgdata = tmp_path / "pg"
    holder = _run(pgdata, "hang")
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
    from memory_lib.config import Settings
    from memory_lib.errors import SchemaError

    state = tmp_path / "state"
    monkeypatch.delenv("DATABASE_URL", raising=False)
    for name, value in {"MEMORY_ARCHIVE_STATE_DIR": str(state), "MEMORY_ARCHIVE_EMBEDDED_DB": "memory_shared",
                        "MEMORY_ARCHIVE_EMBEDDING_DIM": "24", "MEMORY_ARCHIVE_EMBEDDER": "hashing"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)

    with pytest.raises(SchemaError, match="no embedded database in .*run `memory-archive migrate`"):
        MemoryClient.from_settings(Settings.from_env())
    assert not state.exists()  # the client initialized nothing

    assert main(["migrate"]) == 0
    assert '"applied": ["001_' in capsys.readouterr().out
    with MemoryClient.from_settings(Settings.from_env()) as memory:
        memory.add("alice", "Prefers a cortado in the morning")
        with memory._conn.connection() as conn:  # the client's pool
            assert conn.execute("SELECT current_database() AS d").fetchone()["d"] == "memory_shared"
    with dg.build_resources({"database": DatabaseResource()}) as built, built.database.connect() as conn:
        assert conn.execute("SELECT current_database() AS d").fetchone()["d"] == "memory_shared"
        assert conn.execute("SELECT content FROM memories").fetchone()["content"] == "Prefers a cortado in the morning"

    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDED_DB", "memory_other")
    with pytest.raises(SchemaError, match="database 'memory_other' does not exist .*run `memory-archive migrate`"):
        MemoryClient.from_settings(Settings.from_env())
