"""Bulk restore by groups: a group's memories move in multi-row statements, yet one bad member never
loses or blocks the others, is reported under its original_id and stays archived; the rest come back
byte-exact, each exactly once, with one audit event each."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from memory_lib.archival import integrity
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.locks import USER_LOCK_SQL, USERS_LOCK_SQL
from memory_lib.lifecycle import restore as restore_mod
from memory_lib.storage.db import connect
from memory_lib.storage.store import MEMORY_COLUMNS, insert_memories
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories
from tests.storage.test_distribution_keys import (
    per_user_tables,
    statement_log,  # noqa: F401 (a fixture, got by name)
)

N = 12


def _archived(conn, store) -> tuple[list[dict], dict]:
    """N memories of two users, archived; returns them and their exact hot rows from before."""
    memories = make_memories(N, dim=TEST_DIM, users=("alice", "bob"))
    insert_memories(conn, memories, actor="test")
    before = integrity.exact_rows(conn, [m["id"] for m in memories])
    svc = archival_services(store)
    criteria = ArchivalCriteria(max_error_rate=1.0)
    assert run_batch(conn, svc, criteria, batch_key="night", as_of=NOW, actor="test").status.archived == N
    return memories, before


def _tamper(store, memory_id) -> None:
    path = store.root / store.key_for(memory_id)
    path.write_bytes(path.read_bytes().replace(b'"content":"', b'"content":"X', 1))


def _spy_single_restores(monkeypatch) -> list:
    calls: list = []
    real = restore_mod.restore_archive

    def spy(*args, **kwargs):
        calls.append(kwargs["original_id"])
        return real(*args, **kwargs)

    monkeypatch.setattr(restore_mod, "restore_archive", spy)
    return calls


def _assert_restored_exactly(conn, memories, before, bad: set) -> int:
    """Every member but `bad` restored byte-exact with one event of its own user; `bad` still archived.
    Returns how many memories are in both tiers."""
    good = [m["id"] for m in memories if m["id"] not in bad]
    assert integrity.exact_rows(conn, good) == {k: before[k] for k in good}  # byte-exact, to the vector
    row = conn.execute(
        """SELECT (SELECT count(*) FROM archived_memories) AS archived,
                  (SELECT array_agg(original_id) FROM archived_memories) AS still,
                  (SELECT count(*) FROM memories m JOIN archived_memories a
                     ON a.original_id = m.id AND a.user_id = m.user_id) AS both_tiers,
                  (SELECT count(*) FROM memory_events WHERE event_type = 'restored') AS events,
                  (SELECT count(DISTINCT (memory_id, user_id, details ->> 'archive_id')) FROM memory_events
                   WHERE event_type = 'restored') AS distinct_events"""
    ).fetchone()
    assert row["archived"] == len(bad) and set(row["still"] or []) == bad
    assert (row["events"], row["distinct_events"]) == (len(good), len(good))
    owners = {
        r["memory_id"]: r["user_id"]
        for r in conn.execute("SELECT memory_id, user_id FROM memory_events WHERE event_type = 'restored'")
    }
    assert owners == {m["id"]: m["user_id"] for m in memories if m["id"] not in bad}
    return row["both_tiers"]


def test_a_bad_backup_in_a_group_fails_alone_and_the_group_stays_one_multi_row_restore(
    conn, local_store, monkeypatch
):
    memories, before = _archived(conn, local_store)
    tampered = memories[4]["id"]
    _tamper(local_store, tampered)
    singles = _spy_single_restores(monkeypatch)
    report = restore_mod.restore_archives(
        conn, local_store, actor="test", all_archives=True, pause_archival=False, commit_every=50
    )
    assert (report.requested, report.restored, report.failed, report.not_found) == (N, N - 1, 1, 0)
    assert len(report.errors) == 1 and f"original_id={tampered}" in report.errors[0]
    assert "IntegrityError" in report.errors[0]
    assert singles == []  # verified one by one, written together: no retry needed
    assert _assert_restored_exactly(conn, memories, before, {tampered}) == 0


def test_a_member_whose_write_fails_is_retried_alone_and_the_others_are_restored(
    conn, local_store, monkeypatch, request
):
    """A hot row already holding one member's (id, user_id) makes the group's multi-row INSERT fail:
    the group is rolled back and each member retried in its own savepoint; the bad one is reported and
    stays archived, its hot row untouched; every other member (a bad backup aside) comes back."""
    memories, before = _archived(conn, local_store)
    clash, tampered = memories[7], memories[2]["id"]
    _tamper(local_store, tampered)
    # The library refuses an archived memory's id on add: plant a hot row under another id, copy it under this one.
    planted = dict(clash, id=uuid.uuid4(), content="planted while archived")
    insert_memories(conn, [planted], actor="test")
    columns = MEMORY_COLUMNS.replace("id, user_id,", "user_id,", 1)
    conn.execute(
        f"INSERT INTO memories (id, {columns}) SELECT %s, {columns} FROM memories WHERE id = %s",
        (clash["id"], planted["id"]),
    )
    singles = _spy_single_restores(monkeypatch)
    statements = request.getfixturevalue("statement_log")  # every statement text sent from here on
    report = restore_mod.restore_archives(
        conn, local_store, actor="test", original_ids=[m["id"] for m in memories], pause_archival=False
    )
    assert statements.lacking_user_id(per_user_tables(conn)) == []  # the group's and the retries'
    assert (report.requested, report.restored, report.failed) == (N, N - 2, 2)
    # The clash's group (a group holds one user's memories), one memory at a time; other users' groups
    # moved whole.
    assert sorted(singles) == sorted(m["id"] for m in memories if m["user_id"] == clash["user_id"])
    errors = " | ".join(report.errors)
    assert f"original_id={clash['id']}: UniqueViolation" in errors
    assert f"original_id={tampered}: IntegrityError" in errors
    assert (
        conn.execute("SELECT content FROM memories WHERE id = %s", (clash["id"],)).fetchone()["content"]
        == "planted while archived"
    )
    assert _assert_restored_exactly(conn, memories, before, {clash["id"], tampered}) == 1  # the planted row

    # Fixed and re-run: only what is still archived moves; the rest is counted as already hot.
    conn.execute("DELETE FROM memories WHERE id = %s", (clash["id"],))
    again = restore_mod.restore_archives(
        conn, local_store, actor="test", original_ids=[m["id"] for m in memories], pause_archival=False
    )
    assert (again.restored, again.already_hot, again.failed) == (1, N - 2, 1)
    assert _assert_restored_exactly(conn, memories, before, {tampered}) == 0


def test_a_group_takes_the_users_write_locks(conn, db_url):
    """The group's one-statement user locks (the statement restore runs) are the write locks every writer
    takes (core.locks)."""
    other = connect(db_url)
    try:
        with conn.transaction():
            conn.execute(USERS_LOCK_SQL, {"users": ["alice", "bob"]})
            other.execute("SET lock_timeout = '200ms'")
            for user in ("alice", "bob"):
                with pytest.raises(psycopg.errors.LockNotAvailable), other.transaction():
                    other.execute(USER_LOCK_SQL, {"user_id": user})
            with other.transaction():
                other.execute(USER_LOCK_SQL, {"user_id": "carol"})  # another user's is free
    finally:
        other.close()
