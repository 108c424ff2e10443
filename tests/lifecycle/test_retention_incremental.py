"""Retention kept incrementally: after every simulated night (writes, accesses, category changes) the
values as of that night equal the full-rescan algorithm's (a reference written here in Python: every
hot memory scored every night, a streak starting on the first night found at the floor and restarting
on access), and a night computes only the memories whose inputs changed."""

from __future__ import annotations

import math
import random
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from memory_lib.archival import nights
from memory_lib.client import MemoryClient
from memory_lib.core.config import RetentionConfig, Settings
from memory_lib.lifecycle import retention
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.db import MIGRATIONS_DIR, connect, migrate
from memory_lib.storage.store import insert_memories
from testing.citus import citus_urls
from testing.constants import TEST_DIM
from testing.factories import make_memories
from testing.rows import one

TZ = "Europe/Berlin"  # a zone with DST: nights of 23 and 25 hours
NIGHT0 = date(2026, 3, 20)  # the simulation crosses the change to summer time (29 March)
NIGHTS = 14
CATEGORIES = ("episodic", "semantic", "procedural", "core")
# Short half-lives so that memories reach their floors within the simulated fortnight.
CONFIG = RetentionConfig(episodic_half_life_days=2.0, semantic_half_life_days=5.0, core_half_life_days=3.0)


def as_of(night: date) -> datetime:
    return nights.night_as_of(night, TZ)


@dataclass
class Ref:
    floor_since: datetime | None = None


def reference_night(mems: list[dict[str, Any]], state: dict[uuid.UUID, Ref], night_end: datetime) -> dict:
    """The pre-incremental algorithm: score every hot memory created by `night_end`; a streak starts on
    the first night found at the floor and restarts on an access since it began."""
    out = {}
    for m in mems:
        if m["created_at"] > night_end:
            continue
        cat = m["category"]
        half = getattr(CONFIG, f"{cat}_half_life_days")
        floor = getattr(CONFIG, f"{cat}_floor")
        touched = m["last_accessed_at"] or m["created_at"]
        if half is None:
            score = 1.0
        else:
            h = half * (1 + CONFIG.retrieval_boost * math.log(1 + m["access_count"]))
            days = max(0.0, (night_end - touched).total_seconds() / 86400)
            score = min(1.0, max(floor, 0.5 ** min(60.0, days / h)))
        at_floor = score <= floor + CONFIG.floor_tolerance
        ref = state.setdefault(m["id"], Ref())
        if not at_floor:
            ref.floor_since = None
        elif ref.floor_since is None or touched > ref.floor_since:
            ref.floor_since = night_end
        days_at_floor = (
            0 if ref.floor_since is None else round((night_end - ref.floor_since).total_seconds() / 86400) + 1
        )
        out[m["id"]] = (score, at_floor, days_at_floor)
    return out


def _hot(conn) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT id, user_id, category, created_at, last_accessed_at, access_count FROM memories ORDER BY id"
    ).fetchall()


def _stored(conn, night_end: datetime) -> dict:
    return {
        r["memory_id"]: (r["score"], r["at_floor"], r["days_at_floor"])
        for r in retention.scores(conn, night_end)
    }


def _assert_equal(stored: dict, expected: dict, night: date) -> None:
    assert stored.keys() == expected.keys(), night
    for mid, (score, at_floor, days) in expected.items():
        got = stored[mid]
        assert got[0] == pytest.approx(score, abs=1e-9), (night, mid)
        assert (got[1], got[2]) == (at_floor, days), (night, mid, got, expected[mid])


def test_incremental_nights_equal_the_full_rescan_night_after_night(conn):
    rng = random.Random(7)
    users = ("ann", "ben", "cyd")
    start = as_of(NIGHT0 - timedelta(days=1))
    mems = make_memories(90, dim=TEST_DIM, users=users, now=start, age_days=0, seed=3)
    for i, m in enumerate(mems):
        m["category"] = CATEGORIES[i % 4]
        m["created_at"] = start - timedelta(days=rng.uniform(0, 30))
        m["access_count"] = rng.choice((0, 0, 1, 3))
        m["last_accessed_at"] = None
    insert_memories(conn, mems, actor="test")
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings(), actor="test")
    state: dict[uuid.UUID, Ref] = {}
    computed_total = rescan_total = 0
    for k in range(NIGHTS):
        night = NIGHT0 + timedelta(days=k)
        night_end = as_of(night)
        day = night_end - timedelta(hours=20)
        changed: set[uuid.UUID] = set()
        if k:  # the day's work: accesses, new memories, a re-categorized memory
            hot = _hot(conn)
            for user in users:
                used = [m["id"] for m in rng.sample([m for m in hot if m["user_id"] == user], 4)]
                client.record_access(user, used, now=day + timedelta(hours=rng.uniform(0, 12)))
                changed |= set(used)
            new = make_memories(3, dim=TEST_DIM, users=users, now=day, age_days=0, seed=100 + k)
            for m in new:
                m["category"] = rng.choice(CATEGORIES)
                m["access_count"], m["last_accessed_at"] = 0, None
            insert_memories(conn, new, actor="test")
            changed |= {m["id"] for m in new}
            moved = rng.choice(hot)
            conn.execute(
                "UPDATE memories SET category = %s WHERE user_id = %s AND id = %s",
                (
                    "semantic" if moved["category"] != "semantic" else "episodic",
                    moved["user_id"],
                    moved["id"],
                ),
            )
            changed.add(moved["id"])
            # An update that does not touch the inputs marks nothing.
            conn.execute("UPDATE memories SET domain = 'elsewhere' WHERE user_id = 'ann'")
        run = retention.score(conn, night_end, CONFIG, timezone=TZ)
        # The night's work is the changed memories, not the table (the first night: every memory).
        assert run.scored == (len(mems) if k == 0 else len(changed)), night
        computed_total += run.scored
        expected = reference_night(_hot(conn), state, night_end)
        _assert_equal(_stored(conn, night_end), expected, night)
        rescan_total += len(expected)
    # The simulation exercised the streaks: some memories reached their floors, some restarted.
    last = _stored(conn, as_of(NIGHT0 + timedelta(days=NIGHTS - 1)))
    assert sum(1 for v in last.values() if v[2] >= 7) >= 10
    assert sum(1 for v in last.values() if v[1] and v[2] < 7) >= 3
    assert computed_total < rescan_total / 4  # here 297 rows computed against 1,533 rescanned
    # A rescan of everything (what every night did before) changes nothing.
    night_end = as_of(NIGHT0 + timedelta(days=NIGHTS - 1))
    before = _stored(conn, night_end)
    rescanned = retention.rescan(conn, night_end, CONFIG, timezone=TZ)
    assert rescanned.scored == len(before)
    assert _stored(conn, night_end) == before


def test_a_change_of_the_settings_recomputes_every_row_once(conn):
    mems = make_memories(6, dim=TEST_DIM, users=("u1", "u2"), now=as_of(NIGHT0), age_days=40)
    insert_memories(conn, mems, actor="test")
    assert retention.score(conn, as_of(NIGHT0), CONFIG, timezone=TZ).scored == 6
    night = as_of(NIGHT0 + timedelta(days=1))
    assert retention.score(conn, night, CONFIG, timezone=TZ).scored == 0
    slower = CONFIG.model_copy(update={"episodic_half_life_days": 400.0})
    run = retention.score(conn, night, slower, timezone=TZ)
    assert run.settings_changed and run.scored == 6
    for r in retention.scores(conn, night):
        assert r["score"] > 0.9 and not r["at_floor"]  # 40 days at a 400-day half-life
    assert not retention.score(conn, night, slower, timezone=TZ).settings_changed


def test_the_upgrade_keeps_each_streak_at_the_floor(empty_database, tmp_path):
    """A database scored before scores were kept incrementally: the migration keeps the start of
    every streak whose memory has not changed since, and the next night continues the count."""
    old = tmp_path / "sql"
    old.mkdir()
    for f in sorted(Path(str(MIGRATIONS_DIR)).glob("[0-9]*.sql")):
        if int(f.name[:3]) <= 20:
            shutil.copy(f, old / f.name)
    migrate(empty_database, embedding_dim=TEST_DIM, directory=old)
    faded, used = make_memories(2, dim=TEST_DIM, users=("u1",), now=as_of(NIGHT0), age_days=400)
    faded["last_accessed_at"] = used["last_accessed_at"] = None
    faded["access_count"] = used["access_count"] = 0
    c = connect(empty_database)
    try:
        insert_memories(c, [faded, used], actor="test")
        streak = as_of(NIGHT0 - timedelta(days=4))  # five nights at the floor as of NIGHT0
        for m in (faded, used):
            c.execute(
                """INSERT INTO memory_retention (memory_id, user_id, score, floor, at_floor, floor_since,
                       last_touched_at, access_count, scored_as_of)
                   VALUES (%s, 'u1', 0.02, 0.02, true, %s, %s, 0, %s)""",
                (m["id"], streak, m["created_at"], as_of(NIGHT0)),
            )
        # Used after the old night was scored: its streak restarts.
        c.execute(
            "UPDATE memories SET last_accessed_at = %s, access_count = 1 WHERE id = %s",
            (as_of(NIGHT0) + timedelta(hours=3), used["id"]),
        )
    finally:
        c.close()
    assert migrate(empty_database, embedding_dim=TEST_DIM)[0] == "021_nightly_cost"
    c = connect(empty_database)
    try:
        night = as_of(NIGHT0 + timedelta(days=1))
        run = retention.score(c, night, RetentionConfig(), timezone=TZ)
        assert run.scored == 2
        rows = {r["memory_id"]: r for r in retention.scores(c, night)}
        assert rows[faded["id"]]["days_at_floor"] == 6 and rows[faded["id"]]["floor_since"] == streak
        assert rows[used["id"]]["score"] > 0.5 and rows[used["id"]]["days_at_floor"] == 0
    finally:
        c.close()


def test_rows_follow_their_memory_and_never_cross_users(conn):
    """A memory's row is created by its insert, goes with its delete, and carries its user."""
    mems = make_memories(4, dim=TEST_DIM, users=("u1", "u2"), now=as_of(NIGHT0), age_days=3)
    insert_memories(conn, mems, actor="test")
    rows = conn.execute("SELECT memory_id, user_id, pending FROM memory_retention").fetchall()
    assert {(r["memory_id"], r["user_id"], r["pending"]) for r in rows} == {
        (m["id"], m["user_id"], True) for m in mems
    }
    # Refused by the foreign key to its memory; on distributed Postgres a row's user never changes at all.
    refused = psycopg.errors.FeatureNotSupported if citus_urls() else psycopg.errors.ForeignKeyViolation
    with pytest.raises(refused), conn.transaction():
        conn.execute("UPDATE memory_retention SET user_id = 'u2' WHERE memory_id = %s", (mems[0]["id"],))
    conn.execute("DELETE FROM memories WHERE id = %s", (mems[1]["id"],))
    assert one(conn.execute("SELECT count(*) AS n FROM memory_retention"))["n"] == 3


def _waits_on_a_lock(conn, pid: int) -> bool:
    """Whether backend `pid` waits on a lock: here, or on distributed Postgres on a worker (where the
    rows are), which citus_lock_waits shows by the session's global pid."""
    sql = "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = %(pid)s"
    if citus_urls() is not None:
        sql += " UNION ALL SELECT count(*) FROM citus_lock_waits WHERE citus_pid_for_gpid(waiting_gpid) = %(pid)s"
    return any(r["n"] for r in conn.execute(sql, {"pid": pid}).fetchall())


def test_a_use_during_the_night_is_not_lost(conn, db_url):
    """A use committed while the night computes the same memory (its mark waits on the row the night
    is writing): the row stays pending, and the next night computes the new inputs."""
    mem = make_memories(1, dim=TEST_DIM, users=("u1",), now=as_of(NIGHT0), age_days=400)[0]
    mem["last_accessed_at"], mem["access_count"] = None, 0
    insert_memories(conn, [mem], actor="test")
    retention.score(conn, as_of(NIGHT0), CONFIG, timezone=TZ)
    night = as_of(NIGHT0 + timedelta(days=1))
    conn.execute(  # a change the night will compute, so its UPDATE touches the row
        "UPDATE memories SET access_count = 1 WHERE id = %s", (mem["id"],)
    )
    user = connect(db_url, autocommit=False)
    night_conn = connect(db_url)
    try:
        # The use: its trigger holds the retention row until it commits.
        user.execute(
            "UPDATE memories SET last_accessed_at = %s, access_count = 2 WHERE id = %s",
            (night - timedelta(hours=2), mem["id"]),
        )
        done: list[retention.ScoreRun] = []
        worker = threading.Thread(
            target=lambda: done.append(retention.score(night_conn, night, CONFIG, timezone=TZ))
        )
        worker.start()
        deadline = time.monotonic() + 30
        while not _waits_on_a_lock(conn, night_conn.info.backend_pid):
            assert time.monotonic() < deadline, "the night never waited on the use"
            time.sleep(0.05)
        user.commit()
        worker.join(30)
        assert done and done[0].scored == 1
    finally:
        user.close()
        night_conn.close()
    assert one(conn.execute("SELECT pending FROM memory_retention WHERE memory_id = %s", (mem["id"],)))[
        "pending"
    ]
    assert retention.score(conn, night, CONFIG, timezone=TZ).scored == 1
    (row,) = retention.scores(conn, night)
    assert (row["access_count"], row["last_touched_at"]) == (2, night - timedelta(hours=2))
