"""Backup packs (memory_lib.storage.packs): a user's memories of one batch share one object, each member still
read, verified, restored and forgotten on its own. Real Postgres, local directory and SeaweedFS."""

from __future__ import annotations

from collections import Counter
from typing import cast

import pytest

from memory_lib.archival import integrity
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig
from memory_lib.core.errors import IntegrityError, InvalidInputError
from memory_lib.core.models import BackupObject, sha256_hex, to_float32
from memory_lib.lifecycle.forget import forget_memory, forget_steps, forget_user, remaining, run_forget
from memory_lib.lifecycle.restore import restore_archives
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer
from memory_lib.storage import packs
from memory_lib.storage.object_versions import list_versions
from memory_lib.storage.packs import backup_sql
from memory_lib.storage.store import fetch_memories, insert_memories
from testing.backups import bucket_bytes
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories

CRITERIA = ArchivalCriteria()
PER_USER = CRITERIA.pack_min_members + 2


def _archive(conn, store, memories) -> None:
    insert_memories(conn, memories, actor="test")
    services = archival_services(store)
    report = run_batch(conn, services, CRITERIA, batch_key="night-1", as_of=NOW, actor="test")
    assert report.ok and report.archived == len(memories), report.problem


def _history(n_packed_users: int = 2, singles: int = 3) -> list[dict]:
    """PER_USER memories for each packed user, and `singles` for carol (below the pack threshold)."""
    users = tuple(f"user{i}" for i in range(n_packed_users))
    many = make_memories(PER_USER * n_packed_users, dim=TEST_DIM, users=users)
    few = make_memories(singles, dim=TEST_DIM, users=("carol",), seed=7)
    return many + few


def _rows(conn, user: str | None = None) -> list[dict]:
    return conn.execute(
        f"""SELECT a.original_id, a.user_id, {backup_sql("a")}, a.backup_size_bytes
            FROM archived_memories a WHERE %(u)s::text IS NULL OR a.user_id = %(u)s ORDER BY a.original_id""",
        {"u": user},
    ).fetchall()


def _objects(store) -> list[str]:
    return sorted(store.list(""))


def test_a_users_memories_share_one_pack_and_each_restores_byte_exact(conn, object_store):
    history = _history()
    _archive(conn, object_store, history)
    rows = _rows(conn)
    packed = [r for r in rows if r["user_id"] != "carol"]
    assert all("#bytes=" in r["storage_ref"] for r in packed)
    assert all("#bytes=" not in r["storage_ref"] for r in rows if r["user_id"] == "carol")
    keys = {object_store.key_from_ref(r["storage_ref"]) for r in packed}
    assert len(keys) == 2 and all(packs.is_pack_key(k) for k in keys)
    assert len(_objects(object_store)) == 2 + 3  # two packs, carol's three memories one object each
    for key in keys:  # a pack holds one user's memories only
        owners = {r["user_id"] for r in packed if object_store.key_from_ref(r["storage_ref"]) == key}
        assert len(owners) == 1
    # Each member alone: its bytes are its standalone canonical document.
    for r in rows:
        data = object_store.read_ref(r["storage_ref"], r["backup_sha256"])
        assert sha256_hex(data) == r["backup_sha256"] and len(data) == r["backup_size_bytes"]
        doc = BackupObject.from_json_bytes(data)
        assert doc.original_id == r["original_id"] and doc.user_id == r["user_id"]
        assert doc.to_json_bytes() == data
    # Restored: every field as it was, the embedding bit for bit.
    report = restore_archives(conn, object_store, actor="test", all_archives=True, pause_archival=False)
    assert report.restored == len(history) and report.failed == 0
    for m in history:
        row = conn.execute(
            "SELECT content, embedding, user_id FROM memories WHERE id = %s", (m["id"],)
        ).fetchone()
        assert row["content"] == m["content"] and row["user_id"] == m["user_id"]
        assert to_float32(row["embedding"]).tobytes() == to_float32(m["embedding"]).tobytes()


def test_a_pack_costs_its_requests_once_for_all_of_its_members_on_s3(conn, s3_store):
    """PUT and the fidelity GET per pack; commit and the audit HEAD it (the server's checksum of the pack
    is the sha256 its name carries, so every member is intact); the retrievability probe's ranged GET of
    each sampled member; and no LIST: the batch's first backup step has no dead run's packs to look for."""
    sent: Counter[str] = Counter()
    s3_store.client.meta.events.register("before-call.s3", lambda model, **_: sent.update([model.name]))
    _archive(conn, s3_store, make_memories(2 * PER_USER, dim=TEST_DIM, users=("alice", "bob")))
    probed = min(2 * PER_USER, RetrievalConfig().retrievability_sample_size)
    assert sent == Counter({"PutObject": 2, "GetObject": 2 + probed, "HeadObject": 4})


def test_a_pack_whose_checksum_is_not_its_name_is_read_member_by_member(conn, s3_store):
    """verify_members trusts a HEAD only when the store's checksum is the pack's own digest: a pack
    replaced by other bytes is read, and only the member that differs fails."""
    _archive(conn, s3_store, make_memories(PER_USER, dim=TEST_DIM, users=("alice",)))
    rows = _rows(conn)
    wanted = [(r["storage_ref"], r["backup_sha256"]) for r in rows]
    assert packs.verify_members(s3_store, wanted) == [None] * len(rows)
    key = s3_store.key_from_ref(rows[0]["storage_ref"])
    data = bytearray(s3_store.get(key))
    start, size = s3_store.locate(rows[2]["storage_ref"])[1]
    data[start + size // 2] ^= 0x01
    s3_store.client.put_object(
        Bucket=s3_store.bucket, Key=key, Body=bytes(data), ChecksumAlgorithm="SHA256"
    )  # the server's checksum is now of the damaged bytes
    got = packs.verify_members(s3_store, wanted)
    assert isinstance(got[2], IntegrityError)
    assert [g for i, g in enumerate(got) if i != 2] == [None] * (len(rows) - 1)


def test_a_damaged_member_fails_its_own_checks_and_no_neighbours(conn, s3_store):
    _archive(conn, s3_store, make_memories(PER_USER, dim=TEST_DIM, users=("alice",)))
    rows = _rows(conn)
    key = s3_store.key_from_ref(rows[0]["storage_ref"])
    data = bytearray(s3_store.get(key))
    victim = rows[3]
    start, size = s3_store.locate(victim["storage_ref"])[1]
    data[start + size // 2] ^= 0x01  # one bit inside one member
    s3_store.client.put_object(Bucket=s3_store.bucket, Key=key, Body=bytes(data))
    with pytest.raises(IntegrityError):
        s3_store.read_ref(victim["storage_ref"], victim["backup_sha256"])
    for r in rows:
        if r is not victim:
            assert sha256_hex(s3_store.read_ref(r["storage_ref"], r["backup_sha256"])) == r["backup_sha256"]
    checked = integrity.verify_committed(conn, s3_store, ["night-1"])
    assert checked.missing == [] and checked.mismatched == [victim["storage_ref"]]
    s3_store.delete(key)
    gone = integrity.verify_committed(conn, s3_store, ["night-1"])
    assert sorted(gone.missing) == sorted(r["storage_ref"] for r in rows) and gone.mismatched == []


def test_read_members_reads_a_dense_set_in_one_range_and_scattered_members_one_range_each(conn, s3_store):
    """A restore of ids picked across packs asks for a few members of each: they are read one range each,
    not the whole pack; most of a pack is one ranged GET. Every member is checked on either path."""
    _archive(conn, s3_store, make_memories(3 * PER_USER, dim=TEST_DIM, users=("alice",)))
    rows = sorted(_rows(conn), key=lambda r: s3_store.locate(r["storage_ref"])[1][0])  # pack order
    assert len({s3_store.key_from_ref(r["storage_ref"]) for r in rows}) == 1
    sent: list[str] = []
    s3_store.client.meta.events.register(
        "provide-client-params.s3.GetObject", lambda params, **_: sent.append(params.get("Range", "whole"))
    )
    wanted = [(r["storage_ref"], r["backup_sha256"]) for r in rows]
    scattered = [wanted[0], wanted[len(wanted) // 2], wanted[-1]]  # 3 of 36: far below SPAN_DENSITY
    got = packs.read_members(s3_store, scattered)
    assert [sha256_hex(g) if isinstance(g, bytes) else g for g in got] == [w[1] for w in scattered]
    assert len(sent) == 3 and all(r.startswith("bytes=") for r in sent)  # one member's range each
    sent.clear()
    first_half = wanted[: len(wanted) // 2]
    got = packs.read_members(s3_store, first_half)
    assert [sha256_hex(g) if isinstance(g, bytes) else g for g in got] == [w[1] for w in first_half]
    lo, _ = s3_store.locate(first_half[0][0])[1]
    last_start, last_size = s3_store.locate(first_half[-1][0])[1]
    assert sent == [f"bytes={lo}-{last_start + last_size - 1}"]  # one range, from the first to the last
    bad = [(ref, "0" * 64) for ref, _ in first_half[:2]] + first_half[2:]
    got = packs.read_members(s3_store, bad)  # a wrong sha256 fails its member only, on the dense path
    assert [isinstance(g, IntegrityError) for g in got] == [True, True] + [False] * (len(first_half) - 2)
    got = packs.read_members(s3_store, [(scattered[0][0], "0" * 64), scattered[1]])
    assert (
        isinstance(got[0], IntegrityError)
        and isinstance(got[1], bytes)
        and sha256_hex(got[1]) == scattered[1][1]
    )


def test_a_ref_names_a_byte_range_or_is_refused(s3_store):
    ref = s3_store.member_ref("test/packs/n/abc.jsonl", 10, 5)
    assert ref.endswith("#bytes=10-14") and s3_store.locate(ref) == ("test/packs/n/abc.jsonl", (10, 5))
    assert s3_store.key_from_ref(ref) == "test/packs/n/abc.jsonl"
    for bad in (
        ref.replace("#bytes=10-14", "#bytes=14-10"),
        ref.replace("#bytes=", "#range="),
        ref + "#bytes=1-2",
    ):
        with pytest.raises(InvalidInputError, match="storage_ref"):
            s3_store.locate(bad)


def test_forgetting_one_member_rewrites_its_pack_without_it(conn, versioned_store):
    store = versioned_store
    history = make_memories(PER_USER, dim=TEST_DIM, users=("alice",))
    history[2]["content"] = "My locker code at the gym is 4417-secret."
    _archive(conn, store, history)
    old_key = store.key_from_ref(_rows(conn)[0]["storage_ref"])
    forgotten = history[2]["id"]
    result = forget_memory(conn, store, "alice", forgotten, actor="test")
    assert forgotten in result.memory_ids
    kept = _rows(conn, "alice")
    assert len(kept) == PER_USER - 1 and forgotten not in {r["original_id"] for r in kept}
    new_keys = {store.key_from_ref(r["storage_ref"]) for r in kept}
    assert len(new_keys) == 1 and old_key not in new_keys
    # The rows' backup object is the rewritten pack's; the old pack's record went with its last member.
    objects = conn.execute("SELECT ref FROM backup_objects WHERE user_id = 'alice'").fetchall()
    assert [store.key_from_ref(o["ref"]) for o in objects] == list(new_keys)
    assert [v for v in list_versions(store, old_key) if v.key == old_key] == []  # every version gone
    assert not any(b"4417-secret" in data for data in bucket_bytes(store))
    for r in kept:  # the neighbours are intact where they now live
        doc = BackupObject.from_json_bytes(store.read_ref(r["storage_ref"], r["backup_sha256"]))
        assert doc.original_id == r["original_id"]
    # What is left of alice in the bucket is the rewritten pack her rows name, nothing else.
    assert {f"{k}@*" for k in new_keys} == {
        o.rsplit("@", 1)[0] + "@*" for o in remaining(conn, store, "alice").objects
    }
    report = restore_archives(conn, store, actor="test", user_id="alice", pause_archival=False)
    assert report.restored == PER_USER - 1 and report.failed == 0


def test_a_forget_killed_after_rewriting_the_pack_completes_when_run_again(conn, versioned_store):
    store = versioned_store
    history = make_memories(PER_USER, dim=TEST_DIM, users=("alice",))
    _archive(conn, store, history)
    forgotten = history[0]["id"]
    steps = forget_steps(store, "alice", forgotten, actor="test")
    from memory_lib.core.plans import Call, RunPlan, run_plan

    step = next(steps)
    while True:  # run until the rewritten pack is written, then stop: the rows still name the old one
        result = run_plan(conn, step.plan) if isinstance(step, RunPlan) else cast(Call, step).fn()
        if (
            isinstance(step, Call)
            and isinstance(result, dict)
            and any(isinstance(v, dict) for v in result.values())
        ):
            break  # rewrite_without's result: pack key -> {memory id: its new place}
        step = steps.send(result)
    steps.close()
    assert all(r["storage_ref"].count("#") == 1 for r in _rows(conn, "alice"))
    run_forget(conn, forget_steps(store, "alice", forgotten, actor="test"))
    kept = _rows(conn, "alice")
    assert len(kept) == PER_USER - 1
    for r in kept:
        assert sha256_hex(store.read_ref(r["storage_ref"], r["backup_sha256"])) == r["backup_sha256"]
    kept_keys = {store.key_from_ref(r["storage_ref"]) for r in kept}
    assert {o.rsplit("@", 1)[0] for o in remaining(conn, store, "alice").objects} == kept_keys


def test_forget_user_removes_every_pack_and_leaves_other_users_packs(conn, versioned_store):
    store = versioned_store
    _archive(conn, store, make_memories(2 * PER_USER, dim=TEST_DIM, users=("alice", "bob")))
    bob_before = {r["storage_ref"] for r in _rows(conn, "bob")}
    forget_user(conn, store, "alice", actor="test")
    left = remaining(conn, store, "alice")
    assert left.clean, left
    assert {r["storage_ref"] for r in _rows(conn, "bob")} == bob_before
    for r in _rows(conn, "bob"):
        assert sha256_hex(store.read_ref(r["storage_ref"], r["backup_sha256"])) == r["backup_sha256"]


def test_a_dead_runs_unrecorded_pack_is_purged_by_the_next_backup_step(conn, versioned_store):
    """A run killed between a pack's PUT and its checkpoints leaves a pack no row records. If a member
    changes before the re-run, the re-run's pack differs; the stale one (with the old content) is
    deleted, every version, so that no copy escapes forget."""
    from memory_lib.archival.archive import backup_batch, embed_batch, summarize_batch
    from memory_lib.archival.claims import claim_batch

    store = versioned_store
    history = make_memories(PER_USER, dim=TEST_DIM, users=("alice",))
    insert_memories(conn, history, actor="test")
    claim_batch(conn, "night-1", CRITERIA, NOW)
    summarize_batch(conn, "night-1", ExtractiveSummarizer(), CRITERIA)
    embed_batch(conn, "night-1", HashingEmbedder(TEST_DIM), CRITERIA)
    # The dead run's backup step: it started (as backup_batch records first), PUT its pack as
    # backup_batch plans it, and died before the checkpoint.
    conn.execute("UPDATE archival_batches SET backup_started_at = now() WHERE batch_key = 'night-1'")
    rows = conn.execute("SELECT memory_id, claimed_at FROM archival_attempts ORDER BY memory_id").fetchall()
    originals = fetch_memories(conn, [r["memory_id"] for r in rows])
    members = []
    for r in rows:
        doc = BackupObject.from_row(
            originals[r["memory_id"]], archived_at=r["claimed_at"], archive_reason="age_decay"
        )
        data = doc.to_json_bytes()
        members.append(("alice", packs.Member(r["memory_id"], data, sha256_hex(data))))
    (dead,) = packs.plan_units(store, "night-1", members, min_members=CRITERIA.pack_min_members)
    packs.put_unit(store, dead)
    conn.execute("UPDATE memories SET importance_score = 0.11 WHERE id = %s", (history[0]["id"],))

    backup_batch(conn, "night-1", store, CRITERIA)
    recorded = {r["backup_key"] for r in conn.execute("SELECT backup_key FROM archival_attempts").fetchall()}
    assert len(recorded) == 1 and dead.key not in recorded
    assert not [v for v in list_versions(store, dead.key) if v.key == dead.key]  # no version, no marker
    assert [k for k in store.list("packs/")] == list(recorded)
