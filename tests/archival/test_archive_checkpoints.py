"""Checkpoints written in sets, chunked commits and the row-version shortcut keep every invariant:
one bad row fails only its memory, a crash between commit chunks leaves every memory exactly once,
and a memory changed after its backup is never archived from the old copy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytest

from memory_lib.archival import archive, steps
from memory_lib.archival.archive import (
    backup_batch,
    batch_status,
    commit_batch,
    embed_batch,
    summarize_batch,
)
from memory_lib.archival.claims import claim_batch
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories
from testing.rows import one

N = 30
MARK = "MARKED-FOR-NAN"
CRITERIA = ArchivalCriteria(max_error_rate=1.0)


@dataclass
class NaNEmbedder:
    """The real hashing embedder, except a NaN vector (which Postgres refuses) for marked texts."""

    inner: HashingEmbedder

    kind: Literal["lexical"] = "lexical"

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.array(self.inner.embed(texts), dtype=np.float32)
        for i, t in enumerate(texts):
            if MARK in t:
                out[i, 3] = np.nan
        return out


def _insert(conn, n: int = N) -> list:
    from memory_lib.storage.store import insert_memories

    memories = make_memories(n, dim=TEST_DIM)
    insert_memories(conn, memories, actor="test")
    return memories


def _statuses(conn) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) AS n FROM archival_attempts GROUP BY 1").fetchall()
    return {r["status"]: r["n"] for r in rows}


def _assert_exactly_once(conn, total: int) -> None:
    row = conn.execute(
        """SELECT (SELECT count(*) FROM memories) AS hot, (SELECT count(*) FROM archived_memories) AS archived,
                  (SELECT count(*) FROM memories m
                   JOIN archived_memories a ON a.user_id = m.user_id AND a.original_id = m.id) AS both_tiers,
                  (SELECT count(*) FROM memory_events WHERE event_type = 'archived') AS events,
                  (SELECT count(DISTINCT memory_id) FROM memory_events WHERE event_type = 'archived') AS distinct_events
        """
    ).fetchone()
    assert row["hot"] + row["archived"] == total and row["both_tiers"] == 0
    assert row["events"] == row["distinct_events"] == row["archived"]


def test_a_refused_vector_fails_its_memory_only_in_a_set_of_checkpoints(conn, monkeypatch):
    """The NaN vector's set is rejected whole by Postgres; it is written again row by row."""
    monkeypatch.setattr(steps, "CHECKPOINT_CHUNK", 7)  # several sets, the bad row inside one
    memories = _insert(conn)
    marked = memories[12]["id"]
    conn.execute("UPDATE memories SET content = %s || content WHERE id = %s", (MARK + " ", marked))
    claim_batch(conn, "night", CRITERIA, NOW)
    summarize_batch(conn, "night", ExtractiveSummarizer(), CRITERIA)
    result = embed_batch(conn, "night", NaNEmbedder(HashingEmbedder(dim=TEST_DIM)), CRITERIA)
    assert (result.processed, result.succeeded, result.failed) == (N, N - 1, 1)
    assert _statuses(conn) == {"embedded": N - 1, "summarized": 1}
    bad = conn.execute(
        "SELECT status, failed_step, error, attempts FROM archival_attempts WHERE memory_id = %s", (marked,)
    ).fetchone()
    assert bad["failed_step"] == "embed" and bad["attempts"] == 1 and "NaN not allowed" in bad["error"]
    vectors = one(
        conn.execute(
            "SELECT count(*) AS n FROM archival_attempts WHERE summary_embedding IS NOT NULL AND status = 'embedded'"
        )
    )["n"]
    assert vectors == N - 1


def test_a_checkpoint_the_database_refuses_fails_that_memory_and_keeps_the_rest(
    conn, local_store, monkeypatch, test_trigger
):
    """A backup checkpoint refused for one memory (a trigger raising a data exception): the other
    backups of its set and of the other sets are recorded, that memory stays to be backed up again."""
    monkeypatch.setattr(steps, "CHECKPOINT_CHUNK", 4)
    memories = _insert(conn)
    marked = memories[5]["id"]
    test_trigger(
        "refuse_marked",
        "archival_attempts",
        "BEFORE UPDATE",
        f"""BEGIN IF NEW.memory_id = '{marked}' AND NEW.status = 'backed_up' THEN
                RAISE EXCEPTION 'refused checkpoint' USING ERRCODE = 'data_exception'; END IF;
            RETURN NEW; END""",
    )
    claim_batch(conn, "night", CRITERIA, NOW)
    summarize_batch(conn, "night", ExtractiveSummarizer(), CRITERIA)
    embed_batch(conn, "night", HashingEmbedder(dim=TEST_DIM), CRITERIA)
    result = backup_batch(conn, "night", local_store, CRITERIA)
    assert (result.processed, result.succeeded, result.failed) == (N, N - 1, 1)
    assert _statuses(conn) == {"backed_up": N - 1, "embedded": 1}
    recorded = one(
        conn.execute(
            "SELECT count(*) AS n FROM archival_attempts WHERE backup_sha256 IS NOT NULL AND backup_row_xmin IS NOT NULL"
        )
    )["n"]
    assert recorded == N - 1
    assert batch_status(conn, "night").failed_by_step == {"backup": 1}


class Crash(BaseException):
    """The process dying: not an Exception, so nothing in the pipeline catches it."""


def test_a_crash_between_commit_chunks_leaves_every_memory_exactly_once(conn, local_store, monkeypatch):
    _insert(conn)
    svc = archival_services(local_store)
    claim_batch(conn, "night", CRITERIA, NOW)
    summarize_batch(conn, "night", svc.summarizer, CRITERIA)
    embed_batch(conn, "night", svc.embedder, CRITERIA)
    backup_batch(conn, "night", local_store, CRITERIA)
    real_chunk = archive._commit_chunk
    calls = []

    def dies_at_third_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise Crash
        return real_chunk(*args, **kwargs)

    monkeypatch.setattr(archive, "_commit_chunk", dies_at_third_chunk)
    with pytest.raises(Crash):
        commit_batch(conn, "night", local_store, CRITERIA, actor="test", chunk_size=10)
    assert _statuses(conn) == {"archived": 20, "backed_up": N - 20}
    _assert_exactly_once(conn, N)
    monkeypatch.setattr(archive, "_commit_chunk", real_chunk)

    report = run_batch(conn, svc, CRITERIA, batch_key="night", as_of=NOW, actor="test")
    assert report.ok and report.status.archived == N
    assert one(conn.execute("SELECT count(*) AS n FROM memories"))["n"] == 0
    _assert_exactly_once(conn, N)


def test_an_update_after_backup_is_caught_whether_or_not_it_changes_the_backup(conn, local_store):
    """Any UPDATE gives the row a new version: commit serializes it again and compares the sha256. An
    update outside the backed-up fields (access count) still archives; an edit of the content does not."""
    memories = _insert(conn, 6)
    touched, edited = memories[0]["id"], memories[1]["id"]
    claim_batch(conn, "night", CRITERIA, NOW)
    summarize_batch(conn, "night", ExtractiveSummarizer(), CRITERIA)
    embed_batch(conn, "night", HashingEmbedder(dim=TEST_DIM), CRITERIA)
    backup_batch(conn, "night", local_store, CRITERIA)
    conn.execute("UPDATE memories SET access_count = access_count + 1 WHERE id = %s", (touched,))
    conn.execute("UPDATE memories SET content = content || ' (edited)' WHERE id = %s", (edited,))
    result = commit_batch(conn, "night", local_store, CRITERIA, actor="test")
    assert result.succeeded == 5
    assert [r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()] == [edited]
    assert (
        one(conn.execute("SELECT status FROM archival_attempts WHERE memory_id = %s", (edited,)))["status"]
        == "embedded"
    )
    # Backed up again from the edited row, then archived with the edit.
    backup_batch(conn, "night", local_store, CRITERIA)
    commit_batch(conn, "night", local_store, CRITERIA, actor="test")
    from memory_lib.core.models import BackupObject

    doc = BackupObject.from_json_bytes(local_store.get(local_store.key_for(edited)))
    assert doc.content.endswith(" (edited)")
    _assert_exactly_once(conn, 6)


def test_bulk_restore_reads_ahead_but_restores_only_verified_backups(conn, local_store):
    """restore_archives reads backups ahead in threads: a tampered one still fails its memory only
    (nothing of it written), the others are restored exactly as they were."""
    from memory_lib.lifecycle.restore import restore_archives

    memories = _insert(conn, 12)
    svc = archival_services(local_store)
    assert run_batch(conn, svc, CRITERIA, batch_key="night", as_of=NOW, actor="test").status.archived == 12
    tampered = memories[4]["id"]
    path = local_store.root / local_store.key_for(tampered)
    path.write_bytes(path.read_bytes().replace(b'"content":"', b'"content":"X', 1))
    report = restore_archives(
        conn, local_store, actor="test", all_archives=True, pause_archival=False, chunk_size=5, read_workers=4
    )
    assert (report.restored, report.failed) == (11, 1)
    hot = {r["id"]: r for r in conn.execute("SELECT id, content FROM memories").fetchall()}
    assert tampered not in hot and len(hot) == 11
    assert all(hot[m["id"]]["content"] == m["content"] for m in memories if m["id"] != tampered)
    assert (
        one(conn.execute("SELECT count(*) AS n FROM archived_memories WHERE original_id = %s", (tampered,)))[
            "n"
        ]
        == 1
    )


def test_bulk_restore_commits_in_groups_and_a_crash_loses_only_the_open_group(conn, local_store, monkeypatch):
    """restore_archives commits every `commit_every` restores together: a crash inside a group leaves
    that group's memories archived (nothing half-restored), and a re-run restores each exactly once."""
    from memory_lib.lifecycle import restore as restore_mod

    memories = _insert(conn, 12)
    svc = archival_services(local_store)
    assert run_batch(conn, svc, CRITERIA, batch_key="night", as_of=NOW, actor="test").status.archived == 12
    real, calls = restore_mod.restore_many_rows_plan, []

    def crash_in_2nd_group(*args, **kwargs):
        calls.append(1)
        yield from real(*args, **kwargs)
        if len(calls) == 2:
            raise RuntimeError("killed")  # the group's statements ran; killed before its commit

    monkeypatch.setattr(restore_mod, "restore_many_rows_plan", crash_in_2nd_group)
    with pytest.raises(RuntimeError, match="killed"):
        restore_mod.restore_archives(
            conn, local_store, actor="test", all_archives=True, pause_archival=False, commit_every=5
        )
    assert conn.info.transaction_status == 0  # idle: the open group was rolled back, not left open
    assert one(conn.execute("SELECT count(*) AS n FROM memories"))["n"] == 5  # the first group only
    monkeypatch.setattr(restore_mod, "restore_many_rows_plan", real)
    again = restore_mod.restore_archives(
        conn, local_store, actor="test", all_archives=True, pause_archival=False, commit_every=5
    )
    assert (again.restored, again.failed) == (7, 0)
    row = conn.execute(
        """SELECT (SELECT count(*) FROM memories) AS hot, (SELECT count(*) FROM archived_memories) AS archived,
                  (SELECT count(*) FROM memory_events WHERE event_type = 'restored') AS events,
                  (SELECT count(DISTINCT memory_id) FROM memory_events WHERE event_type = 'restored') AS distinct_events"""
    ).fetchone()
    assert (row["hot"], row["archived"], row["events"], row["distinct_events"]) == (12, 0, 12, 12)
    hot = {r["id"]: r["content"] for r in conn.execute("SELECT id, content FROM memories").fetchall()}
    assert hot == {m["id"]: m["content"] for m in memories}


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_bulk_restore_commit_every_is_validated(conn, local_store, bad):
    from memory_lib.core.errors import InvalidInputError
    from memory_lib.lifecycle.restore import restore_archives

    with pytest.raises(InvalidInputError, match="commit_every"):
        restore_archives(
            conn, local_store, actor="test", all_archives=True, pause_archival=False, commit_every=bad
        )
