"""Forget leaves no byte of the user in any object version, recorded by a row or not, and serializes
with the nightly commit of the same user. Real Postgres, SeaweedFS with versioning on, a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from memory_lib.archival.archive import backup_batch, commit_batch, embed_batch, summarize_batch
from memory_lib.archival.claims import claim_batch
from memory_lib.cli import main
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.models import BackupObject, sha256_hex
from memory_lib.lifecycle.forget import forget_user, remaining
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer
from memory_lib.storage import packs
from memory_lib.storage.db import connect
from memory_lib.storage.object_versions import list_versions, read_version
from memory_lib.storage.objectstore import S3ObjectStore
from memory_lib.storage.store import fetch_memories, insert_memories
from testing.backups import ARCHIVE_REFS_SQL
from testing.citus import citus_urls
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories
from testing.rows import one

USERS = tuple(f"user-{c}" for c in "abcdefgh")
CRITERIA = ArchivalCriteria()


def _bytes_of_every_version(store: S3ObjectStore) -> dict[str, bytes]:
    return {
        f"{v.key}@{v.version_id}": read_version(store, v)
        for v in list_versions(store, "")
        if not v.delete_marker
    }


def _holders(store: S3ObjectStore, user: str) -> list[str]:
    """Every object version holding a backup document of `user`."""
    needle = f'"user_id":"{user}"'.encode()
    return sorted(k for k, data in _bytes_of_every_version(store).items() if needle in data)


def _counts(conn: psycopg.Connection[Any], user: str) -> tuple[int, int]:
    row = conn.execute(
        """SELECT (SELECT count(*) FROM memories WHERE user_id = %(u)s) AS hot,
                  (SELECT count(*) FROM archived_memories WHERE user_id = %(u)s) AS archived""",
        {"u": user},
    ).fetchone()
    assert row is not None
    return row["hot"], row["archived"]


# The real command, its S3 puts wrapped: after the first pack is stored, every put sleeps until the kill.
_CLI_CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from memory_lib.storage import objectstore
    from memory_lib.cli import main
    inner = objectstore.S3ObjectStore.put
    lock, first = threading.Lock(), []
    def put(self, key, data, sha):
        out = inner(self, key, data, sha)
        if key.endswith(".jsonl"):
            with lock:  # puts run in threads: one line, for the first pack stored
                if not first:
                    first.append(key)
                    sys.stdout.write(f"PUT {key}\\n")
                    sys.stdout.flush()
            time.sleep(300)
        return out
    objectstore.S3ObjectStore.put = put
    sys.exit(main(["archive", "--batch-key", "night-1"]))
    """
)


def _cli_env(db_url: str, seaweed, store: S3ObjectStore) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    return env | {
        "PYTHONPATH": os.getcwd(),
        "DATABASE_URL": db_url,
        "MEMORY_ARCHIVE_EMBEDDING_DIM": str(TEST_DIM),
        "MEMORY_ARCHIVE_EMBEDDER": "hashing",
        "MEMORY_ARCHIVE_SUMMARIZER": "extractive",
        "MEMORY_ARCHIVE_OBJECT_STORE": "s3",
        "MEMORY_ARCHIVE_BUCKET": store.bucket,
        "MEMORY_ARCHIVE_PREFIX": "test",
        "MEMORY_ARCHIVE_S3_ENDPOINT_URL": seaweed.endpoint_url,
        "AWS_REGION": seaweed.region,
        "AWS_ACCESS_KEY_ID": seaweed.access_key,
        "AWS_SECRET_ACCESS_KEY": seaweed.secret_key,
    }


@pytest.mark.slow
def test_forget_after_a_killed_pack_write_leaves_no_byte_of_the_user(
    db_url, seaweed, versioned_store, monkeypatch
):
    store = versioned_store
    conn = connect(db_url)
    now = datetime.now(UTC)
    insert_memories(conn, make_memories(400, dim=TEST_DIM, users=USERS, age_days=400, now=now), actor="test")
    env = _cli_env(db_url, seaweed, store)
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI_CHILD],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline().decode()  # type: ignore[union-attr]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert line.startswith("PUT "), proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL
    written = line.split()[1]
    # The dead run's pack: no row records it, it holds 50 memories of one user.
    assert not conn.execute("SELECT 1 FROM archival_attempts WHERE backup_key IS NOT NULL").fetchall()
    (victim,) = [u for u in USERS if packs.owner_tag(u) == packs.owner_of(store, written)]
    assert written.startswith(packs.owner_prefix(store, victim))
    deadline = time.monotonic() + 20  # SeaweedFS may list a version a moment after its PUT returned
    while not any(k.startswith(written + "@") for k in _holders(store, victim)):
        assert time.monotonic() < deadline, f"{written} never listed"
        time.sleep(0.2)
    assert not remaining(conn, store, victim).clean  # the bucket is checked, not only the manifest

    result = forget_user(conn, store, victim, actor="test")

    assert result.object_versions_deleted >= 1
    assert _holders(store, victim) == []  # no byte of the user in any version of any object
    assert remaining(conn, store, victim).clean
    others_before = {u: _counts(conn, u) for u in USERS if u != victim}
    assert all(hot == 50 for hot, _ in others_before.values())

    # The next run takes the dead batch over and archives everyone else exactly once.
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["archive", "--batch-key", "night-1"]) == 0
    for u in others_before:
        hot, archived = _counts(conn, u)
        assert hot + archived == 50 and archived > 0
    assert _counts(conn, victim) == (0, 0) and _holders(store, victim) == []

    # Orphans of other users left by the dead run: sweep --remove purges every version, not a marker.
    assert main(["sweep", "--remove"]) == 0
    recorded = {store.key_from_ref(r["storage_ref"]) for r in conn.execute(ARCHIVE_REFS_SQL).fetchall()}
    assert {v.key for v in list_versions(store, packs.packs_prefix(store))} == recorded
    conn.close()


def test_forget_finds_an_unrecorded_pack_of_the_old_layout_under_a_delete_marker(conn, versioned_store):
    """A pack written before owner tags (no tag in its key), recorded by no row, its current version a
    delete marker (a `sweep --remove` of the old kind): forget reads it, sees whose it is, purges it."""
    store = versioned_store
    history = make_memories(20, dim=TEST_DIM, users=("alice", "bob"))
    insert_memories(conn, history, actor="test")
    originals = fetch_memories(conn, [m["id"] for m in history])
    by_user: dict[str, list[packs.Member]] = {}
    for m in history:
        data = BackupObject.from_row(
            originals[m["id"]], archived_at=NOW, archive_reason="age_decay"
        ).to_json_bytes()
        by_user.setdefault(m["user_id"], []).append(packs.Member(m["id"], data, sha256_hex(data)))
    legacy = {}
    for user, members in by_user.items():
        unit = packs._pack(store, "night-0", members, user)
        key = f"{packs.packs_prefix(store)}night-0/{unit.sha256}{packs.SUFFIX}"  # the old layout
        store.put(key, unit.data, unit.sha256)
        store.delete(key)  # only a delete marker on top: the bytes stay in a noncurrent version
        legacy[user] = key
    assert (
        packs.owner_of(store, legacy["alice"]) is None and packs.batch_of(store, legacy["alice"]) == "night-0"
    )
    assert not remaining(conn, store, "alice").clean

    forget_user(conn, store, "alice", actor="test")

    assert _holders(store, "alice") == [] and remaining(conn, store, "alice").clean
    assert [v for v in list_versions(store, legacy["bob"]) if not v.delete_marker]  # bob's is not alice's


def _through_backup(conn: psycopg.Connection[Any], store: S3ObjectStore, batch: str) -> None:
    claim_batch(conn, batch, CRITERIA, NOW)
    summarize_batch(conn, batch, ExtractiveSummarizer(), CRITERIA)
    embed_batch(conn, batch, HashingEmbedder(TEST_DIM), CRITERIA)
    backup_batch(conn, batch, store, CRITERIA)


def _wait_for_lock(conn: psycopg.Connection[Any], pid: int, what: str, timeout: float = 30.0) -> str:
    """Wait until backend `pid` waits on a lock; returns the lock type it waits on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            """SELECT l.locktype FROM pg_locks l WHERE l.pid = %s AND NOT l.granted LIMIT 1""", (pid,)
        ).fetchone()
        if row is not None:
            return row["locktype"]
        # On distributed Postgres a row lock is waited for on the worker that holds the row.
        if (
            citus_urls() is not None
            and conn.execute(
                "SELECT 1 FROM citus_lock_waits WHERE citus_pid_for_gpid(waiting_gpid) = %s", (pid,)
            ).fetchone()
        ):
            return "on a worker"
        time.sleep(0.05)
    raise AssertionError(f"{what} never waited on a lock")


def test_forget_and_the_nightly_commit_of_the_same_user_serialize(db_url, versioned_store):
    """The commit is paused at its row lock (another transaction holds one of the user's rows); a
    forget of that user starts meanwhile. With one lock order the forget waits for the commit's user
    lock, then erases what it committed: no deadlock, nothing of the user left, the request done."""
    store = versioned_store
    setup = connect(db_url)
    history = make_memories(40, dim=TEST_DIM, users=("alice", "bob"))
    insert_memories(setup, history, actor="test")
    _through_backup(setup, store, "night-1")
    alice = sorted(m["id"] for m in history if m["user_id"] == "alice")
    holder, committer, forgetter = connect(db_url), connect(db_url), connect(db_url)
    holder.execute("BEGIN")
    holder.execute(
        "SELECT id FROM memories WHERE user_id = 'alice' AND id = %s FOR UPDATE", (alice[-1],)
    )  # the last row it locks
    errors: list[BaseException] = []

    def run(fn) -> threading.Thread:
        def target() -> None:
            try:
                fn()
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=target)
        t.start()
        return t

    commit = run(lambda: commit_batch(committer, "night-1", store, CRITERIA, actor="night", chunk_size=100))
    _wait_for_lock(setup, committer.info.backend_pid, "the commit")
    forget = run(lambda: forget_user(forgetter, store, "alice", actor="test"))
    waited = _wait_for_lock(setup, forgetter.info.backend_pid, "the forget")
    holder.execute("ROLLBACK")
    commit.join(60)
    forget.join(120)
    assert not commit.is_alive() and not forget.is_alive()
    assert errors == []
    assert waited == "advisory"  # the forget waited for the commit's user lock, not for a row
    assert _counts(setup, "alice") == (0, 0)
    assert remaining(setup, store, "alice").clean and _holders(store, "alice") == []
    status = one(setup.execute("SELECT status FROM forget_requests WHERE user_id = 'alice'"))["status"]
    assert status == "done"
    assert _counts(setup, "bob") == (0, 20)  # bob's memories archived, untouched by the forget
    for c in (holder, committer, forgetter, setup):
        c.close()


def test_a_forget_that_wins_leaves_the_commit_nothing_to_write(conn, versioned_store):
    store = versioned_store
    history = make_memories(40, dim=TEST_DIM, users=("alice", "bob"))
    insert_memories(conn, history, actor="test")
    _through_backup(conn, store, "night-1")

    forget_user(conn, store, "alice", actor="test")
    commit_batch(conn, "night-1", store, CRITERIA, actor="night")

    assert _counts(conn, "alice") == (0, 0) and remaining(conn, store, "alice").clean
    assert _counts(conn, "bob") == (0, 20)


# --------------------------------------------------------------------------- the verify -> commit race


def _archive_with_a_loss_at_commit(conn, store, monkeypatch, *, overwrite: bool):
    """Archive a batch; between commit's verification and its transaction, one backup object is deleted
    (or overwritten with other bytes): the original is gone, the row names an object that is not there."""
    from memory_lib.archival import archive
    from memory_lib.archival.pipeline import run_batch

    inner = archive._commit_chunk
    lost: list[str] = []

    def commit_chunk(conn_, batch_key, chunk, actor, result, **kwargs):
        if not lost:
            key = chunk[0]["backup_key"]
            if overwrite:
                store.put(key, b"not the backup\n", sha256_hex(b"not the backup\n"))
            else:
                store.delete(key)
            lost.append(key)
        return inner(conn_, batch_key, chunk, actor, result, **kwargs)

    monkeypatch.setattr(archive, "_commit_chunk", commit_chunk)
    insert_memories(conn, make_memories(40, dim=TEST_DIM, users=("alice", "bob")), actor="test")
    services = archival_services(store)
    report = run_batch(conn, services, CRITERIA, batch_key="night-1", as_of=NOW, actor="test")
    return report, lost[0]


@pytest.mark.parametrize("overwrite", [False, True], ids=["deleted", "overwritten"])
def test_the_nightly_audit_puts_back_a_backup_lost_after_verification(
    conn, versioned_store, monkeypatch, overwrite
):
    from memory_lib.archival.integrity import recorded_audit

    store = versioned_store
    report, key = _archive_with_a_loss_at_commit(conn, store, monkeypatch, overwrite=overwrite)
    rows = conn.execute(ARCHIVE_REFS_SQL).fetchall()
    hit = [r for r in rows if store.key_from_ref(r["storage_ref"]) == key]
    assert len(rows) == 40 and hit
    audit = recorded_audit(conn, "night-1")
    assert audit is not None and audit.passed and report.ok
    assert sorted(audit.committed.recovered) == sorted(r["storage_ref"] for r in hit)
    for r in rows:  # every archived memory's backup is there, byte-exact
        assert sha256_hex(store.read_ref(r["storage_ref"], r["backup_sha256"])) == r["backup_sha256"]


@pytest.mark.parametrize("overwrite", [False, True], ids=["deleted", "overwritten"])
def test_without_versioning_a_backup_lost_before_commit_keeps_its_memories_hot(
    conn, s3_store, monkeypatch, overwrite
):
    """No version to put back: commit checks the backup again under its locks, so the memories whose
    object went are not archived (they stay hot, the failure recorded at 'verify') and no archive row
    names the lost object; the audit finds every committed backup in place."""
    from memory_lib.archival.archive import batch_status
    from memory_lib.archival.integrity import recorded_audit

    report, key = _archive_with_a_loss_at_commit(conn, s3_store, monkeypatch, overwrite=overwrite)
    rows = conn.execute(ARCHIVE_REFS_SQL).fetchall()
    assert rows and not [r for r in rows if s3_store.key_from_ref(r["storage_ref"]) == key]
    hot = conn.execute(
        "SELECT memory_id FROM archival_attempts WHERE backup_key = %s AND status = 'embedded'", (key,)
    ).fetchall()
    assert len(rows) + len(hot) == 40
    assert one(conn.execute("SELECT count(*) AS n FROM memories"))["n"] == len(hot)
    assert batch_status(conn, "night-1").failed_by_step == {"verify": len(hot)}
    audit = recorded_audit(conn, "night-1")
    assert audit is not None and audit.passed and audit.committed.recovered == []
    assert not report.ok  # a whole pack failed: the gate holds the night (its error rate)
    for r in rows:
        assert sha256_hex(s3_store.read_ref(r["storage_ref"], r["backup_sha256"])) == r["backup_sha256"]
