"""Kill the archival process with SIGKILL at different points, run it again: every memory exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.models import BackupObject, sha256_hex
from memory_lib.storage.store import insert_memories
from testing.backups import ARCHIVE_REFS_SQL, ARCHIVE_ROWS_SQL, object_refs
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories

# SIGKILLs and daemons: minutes each; `pytest -m "not slow"` is the quick inner loop.
pytestmark = pytest.mark.slow

N = 300
USERS = tuple(
    f"user{i:02d}" for i in range(30)
)  # 10 memories each: one backup pack per user (memory_lib.storage.packs)

# The child archives with a pause at one point: a put that sleeps, or a commit held by a DB trigger.
CHILD = textwrap.dedent(
    """
    import sys, time
    from memory_lib.archival.pipeline import run_batch
    from memory_lib.core.config import ArchivalCriteria
    from memory_lib.storage.db import connect
    from memory_lib.storage.objectstore import LocalObjectStore
    from testing.factories import NOW, archival_services
    url, root, dim, slow_put_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = LocalObjectStore(__import__("pathlib").Path(root), prefix="crash")
    puts = 0
    inner_put = store.put
    def put(key, data, sha):
        global puts
        out = inner_put(key, data, sha)
        puts += 1
        if puts == slow_put_after:
            print("PAUSED", flush=True)
            time.sleep(60)
        return out
    store.put = put
    conn = connect(url)
    print("STARTED", flush=True)
    run_batch(conn, archival_services(store, dim), ArchivalCriteria(), batch_key="night", as_of=NOW, actor="child",
                  workers=1, io_workers=1)
    print("DONE", flush=True)
    """
)


def _run_child_and_kill(db_url: str, root: Path, slow_put_after: int, wait_for: str, ready=None) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, db_url, str(root), str(TEST_DIM), str(slow_put_after)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if wait_for in line:
                break
            assert time.monotonic() < deadline, "child never reached the kill point"
        while ready is not None and not ready():
            assert time.monotonic() < deadline, "child never reached the kill point"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _check_invariants(conn, store, ids) -> None:
    hot = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
    archived = {r["original_id"]: r for r in conn.execute(ARCHIVE_ROWS_SQL).fetchall()}
    assert hot.isdisjoint(archived)
    assert hot | set(archived) == set(ids)
    for original_id, row in archived.items():
        data = store.read_ref(row["storage_ref"], row["backup_sha256"])  # a lone object or a pack member
        assert sha256_hex(data) == row["backup_sha256"]
        assert BackupObject.from_json_bytes(data).original_id == original_id


@pytest.mark.parametrize(
    "kill_point",
    ["during_backup", "during_commit"],
)
def test_killed_archival_resumes_exactly_once(db_url, conn, tmp_path, kill_point):
    ids = insert_memories(conn, make_memories(N, dim=TEST_DIM, users=USERS), actor="test")
    root = tmp_path / "objects"
    if kill_point == "during_backup":
        _run_child_and_kill(db_url, root, slow_put_after=len(USERS) // 2, wait_for="PAUSED")  # half the packs
    else:
        # Hold the commit transaction open inside Postgres, then kill the client mid-transaction.
        conn.execute(
            """CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$;
               CREATE TRIGGER slow_commit AFTER INSERT ON archived_memories
               FOR EACH STATEMENT EXECUTE FUNCTION slow_commit();"""
        )
        # Postgres notices a vanished client during a running statement only with this check enabled.
        conn.execute(
            """DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET client_connection_check_interval = 100',
                                          current_database()); END $$"""
        )

        def in_commit() -> bool:
            return (
                conn.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'").fetchone()
                is not None
            )

        _run_child_and_kill(db_url, root, slow_put_after=0, wait_for="STARTED", ready=in_commit)
        deadline = time.monotonic() + 30
        while in_commit():  # the server aborts the dead client's transaction by itself
            assert time.monotonic() < deadline, "Postgres kept the dead client's transaction"
            time.sleep(0.05)
        conn.execute("DROP TRIGGER slow_commit ON archived_memories")

    from memory_lib.storage.objectstore import LocalObjectStore

    store = LocalObjectStore(root, prefix="crash")
    _check_invariants(conn, store, ids)
    mid = conn.execute("SELECT status, count(*) AS n FROM archival_attempts GROUP BY 1").fetchall()
    assert sum(r["n"] for r in mid) == N  # the batch was claimed before the kill
    assert not any(r["status"] == "archived" for r in mid if kill_point == "during_commit")

    report = run_batch(
        conn,
        archival_services(store, TEST_DIM),
        ArchivalCriteria(),
        batch_key="night",
        as_of=NOW,
        actor="test",
    )
    assert report.status.archived == N and report.status.failed == 0
    _check_invariants(conn, store, ids)
    archived = [r["storage_ref"] for r in conn.execute(ARCHIVE_REFS_SQL).fetchall()]
    assert {store.ref_for(k) for k in store.list()} == object_refs(store, archived) and len(archived) == N
    assert not list(root.rglob("*.tmp*"))  # no half-written files left behind
