"""Forget (right to erasure) against real Postgres and SeaweedFS with versioning on: nothing of the user
remains in any table or object version, tombstones remain, other users are untouched, and a forget
killed mid-run is completed by running it again."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.consolidation.digests import ExtractiveDigestBuilder
from memory_lib.consolidation.facts import RuleFactExtractor
from memory_lib.consolidation.monthly import consolidate_month
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig
from memory_lib.core.plans import RunPlan, run_plan
from memory_lib.lifecycle.forget import (
    erased_tables,
    forget_steps,
    remaining,
    retained_tables,
    user_id_tables,
)
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage import packs
from memory_lib.storage.db import connect
from memory_lib.storage.object_versions import list_versions
from memory_lib.storage.objectstore import S3ObjectStore, StoredObject
from testing.constants import TEST_DIM
from testing.factories import archival_services, archive_cleanly, make_client
from testing.rows import one

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)
RETRIEVAL = RetrievalConfig(near_duplicate_threshold=1.0)


def _tier(client: MemoryClient, user_id: str, memory_id: uuid.UUID) -> str | None:
    """The tier of a memory as the client reads it (None: the client finds no such memory)."""
    record = client.get(user_id, memory_id)
    return record.tier if record is not None else None


def _all_versions(store: S3ObjectStore) -> set[tuple[str, str | None]]:
    return {(v.key, v.version_id) for v in list_versions(store, "")}


def _user_state(conn, user: str) -> dict:
    """Every row of the user in every table with a user_id, as text: equal before and after = untouched."""
    out = {}
    for table in user_id_tables(conn):
        rows = conn.execute(
            f"SELECT t::text AS r FROM {table} t WHERE user_id = %s ORDER BY 1", (user,)
        ).fetchall()
        out[table] = [r["r"] for r in rows]
    return out


def _consolidate(conn, *months: datetime) -> None:
    for month in months:
        consolidate_month(
            conn,
            month.date().replace(day=1),
            builder=ExtractiveDigestBuilder(),
            extractor=RuleFactExtractor(),
            embedder=HashingEmbedder(TEST_DIM),
        )


def _derived(conn, user: str, memory_id: uuid.UUID) -> dict[str, int]:
    """Rows of consolidation that cite the memory."""
    q = {
        "memory_digests": "%s = ANY(source_memory_ids)",
        "memory_facts": "%s = ANY(source_memory_ids)",
        "key_moments": "memory_id = %s",
    }
    return {
        t: one(conn.execute(f"SELECT count(*) AS n FROM {t} WHERE user_id = %s AND {w}", (user, memory_id)))[
            "n"
        ]
        for t, w in q.items()
    }


def _seed(conn, store) -> dict[str, list[uuid.UUID]]:
    """u1: hot, archived, restored (archived twice: two versions of its backup), superseded, digested;
    u2: alike."""
    client = make_client(conn, store, retrieval=RETRIEVAL)
    ids: dict[str, list[uuid.UUID]] = {}
    for user in ("u1", "u2"):
        old = [
            client.add(
                user, f"{user} old note {i}: locker code is in drawer {i}", importance=0.1, now=OLD
            ).memory_id
            for i in range(4)
        ]
        hot = client.add(user, f"{user} prefers a cortado in the morning", importance=0.9, now=NOW).memory_id
        newer = client.update(user, hot, f"{user} prefers a flat white in the morning", now=NOW)
        assert newer.outcome == "superseded" and newer.previous_id == hot
        ids[user] = [*old, hot, newer.memory_id]
    archive_cleanly(conn, store, as_of=NOW)  # the old notes and the superseded cortado go to the archive
    for user in ("u1", "u2"):
        assert _tier(client, user, ids[user][0]) == "archived"
        assert client.restore(user, original_id=ids[user][0], now=NOW).restored
    # The restored note again, once the criteria counted from its restore select it: a second backup version.
    archive_cleanly(conn, store, as_of=NOW + timedelta(days=91))
    _consolidate(conn, OLD, NOW)  # monthly digests (and facts) of both users' months
    for user in ("u1", "u2"):
        assert _derived(conn, user, ids[user][0])["memory_digests"] == 1
    return ids


def test_forget_user_leaves_nothing_in_tables_or_object_versions(conn, versioned_store):
    store = versioned_store
    ids = _seed(conn, store)
    client = make_client(conn, store, retrieval=RETRIEVAL)
    u1_keys = {store.key_for(i) for i in ids["u1"]}
    before_versions = _all_versions(store)
    assert len([v for v in before_versions if v[0] == store.key_for(ids["u1"][0])]) == 2  # archived twice
    assert {k for k, _ in before_versions} & u1_keys
    u2_before = _user_state(conn, "u2")
    u2_versions = {v for v in before_versions if v[0] not in u1_keys}
    assert (
        one(
            conn.execute("SELECT count(*) AS n FROM memory_events WHERE user_id = 'u1' AND details ? 'added'")
        )["n"]
        > 0
    )  # the supersede event carries words of the text

    result = client.forget_user("u1", now=NOW)

    assert set(result.memory_ids) == set(ids["u1"])
    assert result.object_versions_deleted >= len([v for v in before_versions if v[0] in u1_keys])
    left = remaining(conn, store, "u1")
    assert left.clean, left
    assert left.uncovered_tables == ()
    after_versions = _all_versions(store)
    assert not {k for k, _ in after_versions} & u1_keys  # no version, no delete marker
    assert after_versions == u2_versions  # u2's backups, every version, untouched
    assert _user_state(conn, "u2") == u2_before
    for table in erased_tables():
        assert one(conn.execute(f"SELECT count(*) AS n FROM {table} WHERE user_id = 'u1'"))["n"] == 0
    tombstones = conn.execute(
        "SELECT memory_id, actor, details FROM memory_events WHERE user_id = 'u1' AND event_type = 'forgotten'"
    ).fetchall()
    assert {t["memory_id"] for t in tombstones} == set(ids["u1"])
    hot_tomb = next(t for t in tombstones if t["memory_id"] == ids["u1"][-1])["details"]
    expected_sha = hashlib.sha256(b"u1 prefers a flat white in the morning").hexdigest()
    assert hot_tomb["content_sha256"] == expected_sha and hot_tomb["tiers"] == ["hot"]
    assert all(t["actor"] == "test" for t in tombstones)
    text = json.dumps(
        [dict(r) for r in conn.execute("SELECT details FROM memory_events WHERE user_id = 'u1'").fetchall()]
    )
    for word in ("cortado", "flat", "white", "locker", "drawer"):
        assert word not in text
    redactions = conn.execute(
        "SELECT count(*) AS n FROM memory_events WHERE user_id = 'u1' AND event_type = 'redacted'"
    )
    assert one(redactions)["n"] == len(ids["u1"])
    # history still answers, with content-free events ending in the tombstone
    events = client.history("u1", ids["u1"][0])
    assert [e.event_type for e in events][-2:] == ["redacted", "forgotten"]
    assert client.get("u1", ids["u1"][-1]) is None and client.list("u1").items == []
    assert client.list("u2").items  # u2 still has memories
    request = conn.execute("SELECT * FROM forget_requests WHERE id = %s", (result.request_id,)).fetchone()
    assert request["status"] == "done" and request["completed_at"] is not None

    again = client.forget_user("u1", now=NOW)  # idempotent: nothing more to delete, no new tombstone
    assert again.already_forgotten and again.request_id == result.request_id
    assert again.rows_deleted == {} and again.object_versions_deleted == 0
    assert one(
        conn.execute(
            "SELECT count(*) AS n FROM memory_events WHERE user_id = 'u1' AND event_type = 'forgotten'"
        )
    )["n"] == len(ids["u1"])


def test_the_audit_log_stays_append_only_outside_the_redaction_path(conn, local_store):
    client = make_client(conn, local_store, retrieval=RETRIEVAL)
    mid = client.add("u1", "likes green tea", now=NOW).memory_id
    for sql in (
        "UPDATE memory_events SET details = '{}'",
        "DELETE FROM memory_events",
        "TRUNCATE memory_events",
    ):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute(sql)
    # The session setting alone allows nothing but the exact redaction
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"), conn.transaction():
        conn.execute("SELECT set_config('memory_archive.redacting', %s, true)", (str(uuid.uuid4()),))
        conn.execute("UPDATE memory_events SET details = '{\"x\": 1}' WHERE memory_id = %s", (mid,))
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"), conn.transaction():
        conn.execute("SELECT set_config('memory_archive.redacting', %s, true)", (str(uuid.uuid4()),))
        conn.execute("UPDATE memory_events SET actor = 'someone' WHERE memory_id = %s", (mid,))
    assert client.history("u1", mid)[0].details == {"category": "episodic"}


def test_every_table_with_a_user_id_is_covered_by_forget(conn):
    """The hook for new tables (digests, facts, ...): one with a user_id that forget does not know fails here."""
    tables = set(user_id_tables(conn))
    assert {"memories", "archived_memories", "memory_events", "archival_attempts"} <= tables
    covered = set(erased_tables()) | set(retained_tables())
    assert tables - covered == set(), (
        "add the table to memory_lib.lifecycle.forget's erased or retained tables"
    )
    assert covered - tables == set()


def test_forget_one_memory_takes_its_superseded_versions_and_nothing_else(conn, object_store):
    client = make_client(conn, object_store, retrieval=RETRIEVAL)
    first = client.add("u1", "drives a red bicycle", now=OLD).memory_id
    second = client.update("u1", first, "drives a blue bicycle", now=OLD).memory_id
    third = client.update("u1", second, "drives a green bicycle", now=NOW).memory_id
    keep = client.add("u1", "works as a nurse", importance=0.1, now=OLD).memory_id
    other = client.add("u2", "drives a red bicycle", now=OLD).memory_id
    archive_cleanly(conn, object_store, as_of=NOW)  # the superseded versions and `keep` are archived
    assert _tier(client, "u1", first) == "archived" and _tier(client, "u1", keep) == "archived"
    _consolidate(conn, OLD, NOW)
    # superseded versions are left out of digests; the live one and the archived note are in
    assert (
        _derived(conn, "u1", third)["memory_digests"] == 1
        and _derived(conn, "u1", keep)["memory_digests"] == 1
    )
    u2_digests = conn.execute("SELECT d::text FROM memory_digests d WHERE user_id = 'u2'").fetchall()
    with pytest.raises(Exception, match="no memory"):
        client.delete("u2", third)  # another user's id is not found, and nothing is deleted
    assert client.get("u1", third) is not None

    result = client.delete("u1", third)

    assert set(result.memory_ids) == {first, second, third}
    for mid in (first, second, third):
        assert client.get("u1", mid) is None
        assert not [k for k in object_store.list() if str(mid) in k]
    assert _tier(client, "u1", keep) == "archived" and client.get("u2", other) is not None
    for mid in (first, second, third):  # no digest, fact or key moment cites it any more
        assert _derived(conn, "u1", mid) == {"memory_digests": 0, "memory_facts": 0, "key_moments": 0}
    assert conn.execute("SELECT d::text FROM memory_digests d WHERE user_id = 'u2'").fetchall() == u2_digests
    assert object_store.list() and any(str(keep) in k for k in object_store.list())
    assert client.delete("u1", third).already_forgotten
    assert client.forget("u1", first).already_forgotten


def test_forget_user_twice_the_second_finds_nothing_left(conn, local_store):
    client = make_client(conn, local_store, retrieval=RETRIEVAL)
    ids = [
        client.add("u1", f"u1 note {i} about the garden", importance=0.1, now=OLD).memory_id for i in range(3)
    ]
    archive_cleanly(conn, local_store, as_of=NOW)
    first = client.forget_user("u1")
    assert set(first.memory_ids) == set(ids) and not first.already_forgotten

    again = client.forget_user("u1")

    assert again.already_forgotten and again.request_id == first.request_id
    assert again.memory_ids == () and again.rows_deleted == {} and again.object_versions_deleted == 0
    requests = conn.execute("SELECT count(*) AS n FROM forget_requests WHERE user_id = 'u1'").fetchone()
    assert requests["n"] == 1
    # Memories written after the forget are a new forget's business.
    later = client.add("u1", "u1 starts over with a new note", now=NOW).memory_id
    third = client.forget_user("u1")
    assert not third.already_forgotten and third.memory_ids == (later,)


class _PausedPuts(S3ObjectStore):
    """The same bucket, but every put waits for `go` once it has said `entered`."""

    def __init__(self, store: S3ObjectStore):
        super().__init__(store.client, store.bucket, prefix=store.prefix)
        self.entered, self.go = threading.Event(), threading.Event()

    def put(self, key: str, data: bytes, sha256: str) -> StoredObject:
        self.entered.set()
        assert self.go.wait(120), "the test never let the put go"
        return super().put(key, data, sha256)


def _in_thread(fn, out: dict, name: str) -> threading.Thread:
    def run():
        try:
            out[name] = fn()
        except BaseException as exc:  # re-raised by the test
            out[name] = exc

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def test_forget_user_cannot_be_outrun_by_a_backup_in_flight(db_url, versioned_store):
    """The night's backup step has read u1's rows and its put is paused: forget_user waits for it, and
    when it says done nothing of u1 is left in any table or object version."""
    store = versioned_store
    with connect(db_url) as conn:
        client = make_client(conn, store, retrieval=RETRIEVAL)
        for user in ("u1", "u2"):
            for i in range(4):
                client.add(user, f"{user} note {i}: the spare key is under pot {i}", importance=0.1, now=OLD)
    paused = _PausedPuts(store)
    out: dict = {}

    def night():
        with connect(db_url) as c:
            services = archival_services(paused)
            return run_batch(c, services, ArchivalCriteria(), batch_key="race", as_of=NOW, actor="test")

    def forget():
        with connect(db_url) as c:
            return make_client(c, store, retrieval=RETRIEVAL).forget_user("u1")

    archiving = _in_thread(night, out, "night")
    try:
        assert paused.entered.wait(120), "the backup step never put"
        forgetting = _in_thread(forget, out, "forget")
        forgetting.join(3)
        assert forgetting.is_alive(), (
            f"forget returned while a backup of u1 was in flight: {out.get('forget')}"
        )
    finally:
        paused.go.set()
        archiving.join(300)
    forgetting.join(300)
    for name in ("night", "forget"):
        if isinstance(out.get(name), BaseException):
            raise out[name]
    assert not out["forget"].already_forgotten and len(out["forget"].memory_ids) == 4
    with connect(db_url) as conn:
        assert remaining(conn, store, "u1").clean
        assert not list_versions(store, packs.owner_prefix(store, "u1"))
        archived = conn.execute("SELECT count(*) AS n FROM archived_memories WHERE user_id = 'u2'").fetchone()
        assert archived is not None
        assert archived["n"] == 4  # the other user's night went on


def test_a_backup_puts_nothing_of_a_user_being_forgotten(db_url, versioned_store):
    """A forget that recorded its request and then died: the night's backup step leaves that user's
    memories out (not failed: the gate passes) and writes no object for them; the forget, run again,
    finishes."""
    store = versioned_store
    with connect(db_url) as conn:
        client = make_client(conn, store, retrieval=RETRIEVAL)
        for user in ("u1", "u2"):
            for i in range(3):
                client.add(user, f"{user} note {i}: the bike lock code is {i}{i}{i}", importance=0.1, now=OLD)
        steps = forget_steps(store, "u1", None, actor="died")
        first = next(steps)
        assert isinstance(first, RunPlan)
        run_plan(conn, first.plan)  # the request is recorded; the process dies here
        steps.close()
        assert (
            one(conn.execute("SELECT status FROM forget_requests WHERE user_id = 'u1'"))["status"]
            == "pending"
        )

        services = archival_services(store)
        report = run_batch(conn, services, ArchivalCriteria(), batch_key="night", as_of=NOW, actor="test")

        assert report.gate_passed and report.status.failed == 0
        assert not list_versions(store, packs.owner_prefix(store, "u1"))
        hot = conn.execute("SELECT count(*) AS n FROM memories WHERE user_id = 'u1'").fetchone()
        assert hot is not None
        assert hot["n"] == 3  # left hot for the forget: no archive row, no attempt
        assert not conn.execute("SELECT 1 FROM archival_attempts WHERE user_id = 'u1'").fetchall()
        assert not conn.execute("SELECT 1 FROM archived_memories WHERE user_id = 'u1'").fetchall()
        assert one(conn.execute("SELECT count(*) AS n FROM archived_memories WHERE user_id = 'u2'"))["n"] == 3

        result = client.forget_user("u1")

        assert result.resumed and len(result.memory_ids) == 3
        assert remaining(conn, store, "u1").clean


_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from memory_lib.storage.db import connect
    from memory_lib.lifecycle.forget import forget_steps
    from memory_lib.storage.objectstore import S3ObjectStore
    from memory_lib.core.plans import RunPlan, run_plan
    from testing.seaweedfs import S3Endpoint

    url, endpoint, key, secret, bucket, kill_after = sys.argv[1:7]
    store = S3ObjectStore(S3Endpoint(endpoint, key, secret).client(), bucket, prefix="test")
    conn = connect(url)
    steps = forget_steps(store, "u1", None, actor="killed-run")
    step, n = next(steps), 0
    while True:
        result = run_plan(conn, step.plan) if isinstance(step, RunPlan) else step.fn()
        n += 1
        if n == int(kill_after):
            os.kill(os.getpid(), signal.SIGKILL)
        step = steps.send(result)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("kill_after,status", [(7, "pending"), (9, "rows_deleted")])
def test_a_killed_forget_user_is_completed_by_running_it_again(
    db_url, seaweed, versioned_store, kill_after, status
):
    """Killed after its objects are deleted but before its rows (step 7: the purge, after the request,
    the bucket's listing, the unrecorded packs' plan and read, the manifest and the pack plan), or after
    its rows but before the final sweep (step 9): the next forget_user resumes the same request and
    completes it."""
    store = versioned_store
    with connect(db_url) as conn:
        ids = _seed(conn, store)
        u2_before = _user_state(conn, "u2")
    env = os.environ | {"PYTHONPATH": os.getcwd()}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _KILLER,
            db_url,
            seaweed.endpoint_url,
            seaweed.access_key,
            seaweed.secret_key,
            store.bucket,
            str(kill_after),
        ],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    with connect(db_url) as conn:
        request = conn.execute("SELECT * FROM forget_requests WHERE user_id = 'u1'").fetchone()
        assert request is not None
        assert request["status"] == status
        hot_rows = one(conn.execute("SELECT count(*) AS n FROM memories WHERE user_id = 'u1'"))["n"]
        assert (hot_rows > 0) == (status == "pending")  # killed before or after the rows
        assert not {k for k, _ in _all_versions(store)} & {store.key_for(i) for i in ids["u1"]}
        assert not remaining(conn, store, "u1").clean or status == "rows_deleted"

        result = make_client(conn, store, retrieval=RETRIEVAL).forget_user("u1")

        assert result.resumed and result.request_id == request["id"]
        assert remaining(conn, store, "u1").clean
        assert one(conn.execute("SELECT count(*) AS n FROM forget_requests WHERE user_id = 'u1'"))["n"] == 1
        tombstones = conn.execute(
            "SELECT memory_id FROM memory_events WHERE user_id = 'u1' AND event_type = 'forgotten'"
        ).fetchall()
        assert sorted(t["memory_id"] for t in tombstones) == sorted(ids["u1"])  # once each
        assert _user_state(conn, "u2") == u2_before


# --------------------------------------------------------------------------- the Dagster job


def _job_resources(db_url, seaweed, bucket):
    from dagster_aws.s3 import S3Resource

    from memory_assets.resources import DatabaseResource, ObjectStoreResource

    s3 = S3Resource(
        endpoint_url=seaweed.endpoint_url,
        region_name=seaweed.region,
        aws_access_key_id=seaweed.access_key,
        aws_secret_access_key=seaweed.secret_key,
    )
    return {
        "database": DatabaseResource(database_url=db_url),
        "object_store": ObjectStoreResource(kind="s3", bucket=bucket, prefix="test", s3=s3),
    }


def _verify_metadata(run) -> dict:
    import dagster as dg

    for event in run.all_events:
        if event.event_type == dg.DagsterEventType.STEP_FAILURE and event.step_key == "verify_user_forgotten":
            return {k: v.value for k, v in event.event_specific_data.user_failure_data.metadata.items()}
        if event.event_type == dg.DagsterEventType.STEP_OUTPUT and event.step_key == "verify_user_forgotten":
            return {k: v.value for k, v in event.event_specific_data.metadata.items()}
    raise AssertionError("verify_user_forgotten did not run")


def test_forget_user_job_erases_and_verifies(db_url, seaweed, versioned_store):
    from memory_assets.defs.privacy.jobs import forget_user

    store = versioned_store
    with connect(db_url) as conn:
        ids = _seed(conn, store)
    config = {"ops": {"forget_user_memories": {"config": {"user_id": "u1", "operator": "dpo"}}}}
    run = forget_user.execute_in_process(
        run_config=config, resources=_job_resources(db_url, seaweed, store.bucket)
    )
    assert run.success
    assert _verify_metadata(run)["object_versions_left"] == 0
    with connect(db_url) as conn:
        assert remaining(conn, store, "u1").clean
        actors = conn.execute(
            "SELECT DISTINCT actor FROM memory_events WHERE event_type = 'forgotten'"
        ).fetchall()
        assert [a["actor"] for a in actors] == ["dpo"]
        assert not {k for k, _ in _all_versions(store)} & {store.key_for(i) for i in ids["u1"]}

    # A table with a user_id that forget does not know (a future digests table): the check fails the run.
    with connect(db_url) as conn:
        conn.execute("CREATE TABLE user_digests (user_id text NOT NULL, digest text NOT NULL)")
        conn.execute("INSERT INTO user_digests VALUES ('u2', 'a digest of u2''s week')")
    config["ops"]["forget_user_memories"]["config"]["user_id"] = "u2"
    failed = forget_user.execute_in_process(
        run_config=config, resources=_job_resources(db_url, seaweed, store.bucket), raise_on_error=False
    )
    assert not failed.success
    meta = _verify_metadata(failed)
    assert "user_digests" in meta["tables_unknown_to_forget"] and "user_digests | 1" in meta["rows_left"]
