"""Liveness of the one archival pipeline: failures are retried by the next night and then released,
a killed CLI strands nothing, a frozen object store fails within the deadline, a commit that fails
is a failed run, the pause stops the CLI, and statuses match the schema."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from memory_lib.archival import archive, claims, nights
from memory_lib.archival.claims import attempt_counts, released_memories
from memory_lib.archival.integrity import sweep_orphans
from memory_lib.archival.pipeline import run_batch
from memory_lib.cli import main
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.statuses import ArchiveReason, AttemptStatus, PauseAction
from memory_lib.lifecycle import pause
from memory_lib.llm.summarize import AnthropicSummarizer, SummarizationError
from memory_lib.storage.db import connect
from memory_lib.storage.objectstore import LocalObjectStore, S3ObjectStore, s3_client
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories
from testing.fake_llm import FAKE_API_KEY
from testing.rows import one

ROOT = Path(__file__).resolve().parents[2]
MARK = "POISONED-MEMORY"


def _counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return dict(
        one(
            conn.execute(
                """SELECT (SELECT count(*) FROM memories) AS hot, (SELECT count(*) FROM archived_memories) AS archived,
                      (SELECT count(*) FROM memories m JOIN archived_memories a ON a.user_id = m.user_id AND a.original_id = m.id) AS both_tiers,
                      (SELECT count(*) FROM archival_attempts WHERE status = ANY(%s)) AS open""",
                (["claimed", "summarized", "embedded", "backed_up"],),
            )
        )
    )


# --------------------------------------------------------------------------- retried, then released


def test_failed_memories_are_retried_by_the_next_nights_then_released(conn, local_store, fake_llm):
    memories = make_memories(100, dim=TEST_DIM, age_days=400)
    for m in memories[:3]:  # 3% fail persistently: under the 5% gate, so each night commits the rest
        m["content"] = f"{MARK} {m['content']}"
    insert_memories(conn, memories, actor="test")
    fake_llm.fail_when_contains = MARK
    fake_llm.fail_status = 400  # not retryable: each night is one try per memory
    summarizer = AnthropicSummarizer(FAKE_API_KEY, base_url=fake_llm.base_url, max_retries=0)
    services = archival_services(local_store, summarizer=summarizer)
    criteria = ArchivalCriteria(max_attempts=3)
    first = date(2026, 6, 1)

    report = nights.run_night(conn, services, criteria, first, "UTC")
    assert report.ok and report.archived == 97 and report.status.failed == 3
    assert attempt_counts(conn) | {"awaiting_takeover": None} == {
        "open": 3,
        "failed": 3,
        "awaiting_takeover": None,
        "released": 0,
    }
    assert attempt_counts(conn)["awaiting_takeover"] == 3  # the night is finished: next night retries them

    # Each later night also has 97 new eligible memories: the retried 3 stay under the 5% gate.
    for night in (2, 3):
        insert_memories(conn, make_memories(97, dim=TEST_DIM, age_days=400, seed=night), actor="test")
        report = nights.run_night(conn, services, criteria, first + timedelta(days=night - 1), "UTC")
        assert report.claim is not None
        assert report.ok, report.problem
        assert report.claim.taken_over == 3 and report.claim.claimed == 100
        assert report.archived == 97 and report.status.failed == 3
    assert attempt_counts(conn) == {"open": 0, "failed": 0, "awaiting_takeover": 0, "released": 3}
    released = released_memories(conn)
    assert {r["memory_id"] for r in released} == {m["id"] for m in memories[:3]}
    assert all(r["attempts"] == 3 and "HTTP 400" in r["error"] for r in released)

    # Released memories stay hot and are not claimed again; nothing else is left.
    fourth = nights.run_night(conn, services, criteria, first + timedelta(days=3), "UTC")
    assert fourth.claim is not None
    assert fourth.claim.claimed == 0
    assert _counts(conn) == {"hot": 3, "archived": 97 * 3, "both_tiers": 0, "open": 0}
    # ...until the memory changes: then it gets another chance.
    conn.execute(
        "UPDATE memories SET importance_score = 0.05, updated_at = now() WHERE id = ANY(%s)",
        ([memories[0]["id"], memories[1]["id"]],),
    )
    fake_llm.fail_when_contains = None
    fifth = nights.run_night(conn, services, criteria, first + timedelta(days=4), "UTC")
    assert fifth.claim is not None
    assert fifth.claim.claimed == 2 and fifth.archived == 2


def test_stats_shows_open_failed_and_released(cli_env, conn, capsys):
    memories = make_memories(10, dim=TEST_DIM, age_days=400, now=datetime.now(UTC))
    insert_memories(conn, memories, actor="test")
    claims.claim_batch(conn, "night-x", ArchivalCriteria(), datetime.now(UTC))
    conn.execute(
        """UPDATE archival_attempts SET error = 'boom', failed_step = 'summarize', attempts = 3,
                  status = 'released', released_at = now()
           WHERE memory_id = %s""",
        (memories[0]["id"],),
    )
    assert main(["stats"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["attempts"]["open"] == 9 and out["attempts"]["released"] == 1
    assert out["released"][0]["error"] == "boom"


# --------------------------------------------------------------------------- SIGKILL of the CLI


def _cli_env(db_url: str, root: Path, llm_url: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("MEMORY_ARCHIVE_", "ANTHROPIC", "OPENAI"))
    }
    env.update(
        {
            "DATABASE_URL": db_url,
            "MEMORY_ARCHIVE_EMBEDDING_DIM": str(TEST_DIM),
            "MEMORY_ARCHIVE_EMBEDDER": "hashing",
            "MEMORY_ARCHIVE_SUMMARIZER": "anthropic",
            "MEMORY_ARCHIVE_LLM_BASE_URL": llm_url,
            "ANTHROPIC_API_KEY": FAKE_API_KEY,
            "MEMORY_ARCHIVE_LOCAL_ROOT": str(root),
            # Templated memories (testing.factories) whose first sentences differ by one number do
            # not tell them apart: the retrievability probe runs without a floor (tests/archival/test_post_commit.py).
            "MEMORY_ARCHIVE_RETRIEVAL__RETRIEVABILITY_FLOOR": "0",
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


@pytest.mark.slow
def test_sigkill_of_the_cli_with_its_default_batch_key_strands_nothing(databases, fake_llm, tmp_path):
    fake_llm.delay_seconds = 0.01  # ~1-2 s of summaries for 300 memories: kills land in every step
    rng = random.Random(7)
    taken_over: list[int] = []
    for trial in range(3):
        url = databases.new()
        with connect(url) as c:
            insert_memories(
                c,
                make_memories(300, dim=TEST_DIM, age_days=400, now=datetime.now(UTC), seed=trial),
                actor="test",
            )
        root = tmp_path / f"objects-{trial}"
        env = _cli_env(url, root, fake_llm.base_url)
        cmd = [sys.executable, "-m", "memory_lib.cli", "archive"]
        child = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with connect(
            url
        ) as c:  # kill at a random point after the claim: summarizing, backing up or committing
            deadline = time.monotonic() + 60
            while one(c.execute("SELECT count(*) AS n FROM archival_attempts"))["n"] == 0:
                assert child.poll() is None and time.monotonic() < deadline, "the CLI never claimed"
                time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 3.0))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        with connect(url) as c:
            stranded = _counts(c)["open"]
        rerun = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr
        out = json.loads(rerun.stdout.strip().splitlines()[-1])
        assert out["taken_over"] == stranded, (out, stranded)  # the dead run's claims, checkpoints kept
        taken_over.append(stranded)
        with connect(url) as c:
            counts = _counts(c)
            assert counts == {"hot": 0, "archived": 300, "both_tiers": 0, "open": 0}, (
                trial,
                counts,
                rerun.stdout,
            )
            store = LocalObjectStore(root, prefix="memory-archive")
            sweep = sweep_orphans(c, store)
            objects = c.execute("SELECT count(DISTINCT (user_id, backup_object)) AS n FROM archived_memories")
            assert sweep.listed == one(objects)["n"] > 0 and sweep.orphans == []  # lone backups and packs
        databases.drop(url)
    assert sum(taken_over) > 0  # at least one kill left claimed work behind for the re-run


def test_a_dead_holder_is_taken_over_at_once_and_a_live_one_is_not(conn, local_store):
    insert_memories(conn, make_memories(20, dim=TEST_DIM, age_days=400), actor="test")
    criteria = ArchivalCriteria(batch_size=10)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    claims.claim_batch(
        conn, "adhoc-alive", criteria, NOW, holder=claims.Holder.this_process("cli", track_pid=True)
    )
    claims.claim_batch(
        conn, "adhoc-dead", criteria, NOW, holder=claims.Holder("cli", socket.gethostname(), dead.pid)
    )
    third = claims.claim_batch(conn, "adhoc-next", criteria, NOW)
    assert third.taken_over == 10 and third.claimed == 10
    held = conn.execute(
        "SELECT batch_key, count(*) AS n FROM archival_attempts GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert {r["batch_key"]: r["n"] for r in held} == {"adhoc-alive": 10, "adhoc-next": 10}
    # An expired lease is taken over too.
    conn.execute(
        "UPDATE archival_batches SET lease_expires_at = now() - interval '1 s' WHERE batch_key = 'adhoc-alive'"
    )
    assert claims.claim_batch(conn, "adhoc-last", criteria, NOW).taken_over == 10


# --------------------------------------------------------------------------- deadlines


class FrozenEndpoint:
    """A TCP server that accepts connections and never answers: a hung S3 endpoint."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.held.append(conn)
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        for c in self.held:
            c.close()
        self.sock.close()


def test_a_frozen_object_store_fails_the_batch_within_the_deadline(conn, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-access")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    memories = make_memories(40, dim=TEST_DIM, age_days=400)
    insert_memories(conn, memories, actor="test")
    frozen = FrozenEndpoint()
    try:
        client = s3_client(frozen.url, "us-east-1", connect_timeout=1, read_timeout=1, max_attempts=1)
        store = S3ObjectStore(client, "frozen", prefix="t")
        services = archival_services(store)
        criteria = ArchivalCriteria(step_deadline_seconds=4, lease_seconds=60)
        started = time.monotonic()
        report = run_batch(conn, services, criteria, batch_key="frozen-1", as_of=NOW, actor="test", workers=4)
        elapsed = time.monotonic() - started
    finally:
        frozen.close()
    assert elapsed < 30, elapsed
    assert not report.ok and not report.gate_passed
    assert report.status.failed_by_step.get("backup") == 40
    assert _counts(conn)["hot"] == 40 and _counts(conn)["archived"] == 0
    assert pause.pause_status(conn).paused


def test_run_parallel_gives_up_at_the_deadline():
    def slow(x: int) -> int:
        time.sleep(5 if x == 2 else 0)
        return x

    started = time.monotonic()
    out = list(archive.run_parallel(slow, [1, 2, 3], 2, deadline=time.monotonic() + 0.5))
    assert time.monotonic() - started < 2
    assert out[0] == (1, 1) and out[2] == (3, 3)
    assert type(out[1][1]).__name__ == "DeadlineExceeded"


# --------------------------------------------------------------------------- success means archived


@pytest.fixture
def cli_objects(cli_env, tmp_path):
    """The CLI's environment with 30 eligible memories; returns the local object store's folder."""
    with connect(cli_env) as c:
        insert_memories(c, make_memories(30, dim=TEST_DIM, age_days=400, now=datetime.now(UTC)), actor="test")
    return tmp_path / "objects"


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_object_store_killed_during_commit_fails_the_cli(cli_objects, db_url, monkeypatch, capsys):
    real_commit = archive.commit_batch

    def store_dies_then_commit(*args, **kwargs):
        shutil.rmtree(cli_objects)  # every backup object is gone when the commit verifies them
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(archive, "commit_batch", store_dies_then_commit)
    assert main(["archive"]) == 1
    out = _last_json(capsys)
    assert out["archived"] == 0 and out["failed"] == 30 and not out["ok"]
    assert "failed" in out["problem"] and "verify: 30" in out["problem"]
    with connect(db_url) as c:
        assert _counts(c)["hot"] == 30 and pause.pause_status(c).paused


def test_the_pause_stops_the_cli(cli_objects, db_url, capsys):
    with connect(db_url) as c:
        pause.set_pause(c, reason="operator investigating", actor="test")
    assert main(["archive"]) == 3
    assert "operator investigating" in capsys.readouterr().err
    with connect(db_url) as c:
        assert one(c.execute("SELECT count(*) AS n FROM archival_attempts"))["n"] == 0
        assert _counts(c)["hot"] == 30


def test_restore_all_pauses_archival(cli_objects, db_url, capsys):
    assert main(["archive"]) == 0
    assert _last_json(capsys)["archived"] == 30
    assert main(["restore", "--all"]) == 0
    out = _last_json(capsys)
    assert out["restored"] == 30 and out["archival_paused"]
    assert main(["archive"]) == 3  # the next run does not re-archive what was just restored
    assert main(["pause", "clear", "--reason", "rollback done"]) == 0


def test_sweep_reports_and_removes_orphans(conn, local_store):
    memories = make_memories(3, dim=TEST_DIM, age_days=400)
    insert_memories(conn, memories, actor="test")
    stray = local_store.key_for(memories[0]["id"])
    local_store.put(stray, b"{}", __import__("hashlib").sha256(b"{}").hexdigest())
    report = sweep_orphans(conn, local_store)
    assert report.orphans == [stray] and report.removed == []
    report = sweep_orphans(conn, local_store, remove=True)
    assert report.removed == [stray] and list(local_store.list("memories/")) == []


def test_sweep_removes_a_dead_runs_pack_only_when_its_batch_has_no_open_attempts(conn, local_store):
    """A pack's members are only known by reading it: its batch (in its key) decides. A pack of a batch
    with open attempts is kept (its run will write it again); one of a finished batch is removed."""
    insert_memories(conn, make_memories(3, dim=TEST_DIM, age_days=400), actor="test")
    claims.claim_batch(conn, "night-open", ArchivalCriteria(), NOW)
    strays = []
    for batch in ("night-open", "night-done"):
        data = f'{{"batch": "{batch}"}}\n'.encode()
        key = f"{local_store.prefix}/packs/{batch}/{hashlib.sha256(data).hexdigest()}.jsonl"
        local_store.put(key, data, hashlib.sha256(data).hexdigest())
        strays.append(key)
    report = sweep_orphans(conn, local_store, remove=True)
    assert sorted(report.orphans) == sorted(strays) and report.removed == [strays[1]]
    assert "open attempts" in report.kept[strays[0]] and list(local_store.list("packs/")) == [strays[0]]


# --------------------------------------------------------------------------- provider answers


def test_html_with_status_200_is_retried_then_a_clear_error(fake_llm):
    from memory_lib.llm.summarize import SummaryInput

    summarizer = AnthropicSummarizer(
        FAKE_API_KEY, base_url=fake_llm.base_url, max_retries=2, retry_wait_max=0.01
    )
    item = SummaryInput("Omar paid 120 euros for electricity in May 2024.", NOW)
    fake_llm.html_responses = 2
    assert "Omar" in summarizer.summarize(item).text or summarizer.summarize(item).text
    fake_llm.html_responses = 10
    with pytest.raises(SummarizationError, match=r"anthropic answered HTTP 200 with text/html.*not JSON"):
        summarizer.summarize(item)
    assert fake_llm.count("/v1/messages") >= 6


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("Omar\x00 paid", "NUL"),
        ("Omar paid \ud800", "not valid Unicode"),
        ("I'm sorry, but I can't help with that.", "declined"),
        ("zxqv blorp frimble wug", "unrelated"),
    ],
)
def test_a_poisoned_summary_fails_that_memory_only(conn, local_store, fake_llm, answer, expected):
    memories = make_memories(40, dim=TEST_DIM, age_days=400)
    insert_memories(conn, memories, actor="test")
    summarizer = AnthropicSummarizer(FAKE_API_KEY, base_url=fake_llm.base_url, max_retries=0)
    services = archival_services(local_store, summarizer=summarizer)
    fake_llm.summary_override = answer
    report = run_batch(conn, services, ArchivalCriteria(), batch_key="poison", as_of=NOW, actor="test")
    assert report.status.failed_by_step == {"summarize": 40}
    errors = {r["error"] for r in conn.execute("SELECT error FROM archival_attempts").fetchall()}
    assert all(expected in e for e in errors), errors
    assert _counts(conn)["hot"] == 40
    # The same night re-run with a healthy model archives everything: nothing was poisoned for good.
    pause.clear_pause(conn, reason="model fixed", actor="test")
    fake_llm.summary_override = None
    again = run_batch(conn, services, ArchivalCriteria(), batch_key="poison", as_of=NOW, actor="test")
    assert again.ok and again.status.archived == 40


def test_memories_that_open_like_a_refusal_are_archived_by_the_default_summarizer(conn, local_store):
    """People write "I'm sorry you had a bad birthday" and "I can't make it on Friday": their extractive
    summaries keep those words, which the memory itself says, so they are not a model declining."""
    texts = [
        "I'm sorry you had a bad birthday, let's celebrate again at the lake house.",
        "I can't make it to the dentist on Friday, so I moved it to 14 June.",
        "Unfortunately, I lost the receipt for the blue kayak paddle.",
    ]
    memories = make_memories(len(texts), dim=TEST_DIM, age_days=400)
    for m, text in zip(memories, texts, strict=True):
        m["content"] = text
    insert_memories(conn, memories, actor="test")
    report = run_batch(
        conn, archival_services(local_store), ArchivalCriteria(), batch_key="sorry", as_of=NOW, actor="test"
    )
    assert report.ok and report.status.archived == len(texts) and report.status.failed == 0
    assert _counts(conn)["hot"] == 0


# --------------------------------------------------------------------------- vocabularies


def _check_values(conn: psycopg.Connection[Any], table: str, column: str) -> set[str]:
    rows = conn.execute(
        """SELECT pg_get_constraintdef(c.oid) AS def FROM pg_constraint c
           WHERE c.conrelid = %s::regclass AND c.contype = 'c'""",
        (table,),
    ).fetchall()
    import re

    for r in rows:
        if f"({column} = ANY" in r["def"] or f"{column} = ANY" in r["def"]:
            return set(re.findall(r"'([a-z_]+)'::text", r["def"]))
    raise AssertionError(f"no CHECK constraint on {table}.{column}")


def test_status_enums_match_the_sql_constraints(conn):
    assert _check_values(conn, "archival_attempts", "status") == {s.value for s in AttemptStatus}
    assert _check_values(conn, "archival_pause_events", "action") == {a.value for a in PauseAction}
    for table in ("archival_attempts", "archived_memories"):
        assert _check_values(conn, table, "archive_reason") == {r.value for r in ArchiveReason}
