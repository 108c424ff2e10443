"""A restored memory's backup is kept, recorded by its restore's audit event (promotion.KEPT_BACKUPS_SQL):
the orphan sweep counts it as recorded, `sweep --remove` leaves it, and forget deletes it (and redacts
the event, after which a copy left behind is an orphan again). Lone backups and packs, on a local
directory and on SeaweedFS (S3), real Postgres."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memory_lib.archival import integrity
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.models import sha256_hex
from memory_lib.lifecycle.forget import forget_memory, forget_user, remaining
from memory_lib.lifecycle.restore import restore_archive, restore_archives
from memory_lib.storage import packs
from memory_lib.storage.object_versions import list_versions
from memory_lib.storage.store import insert_memories
from testing.backups import bucket_bytes
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories

CRITERIA = ArchivalCriteria()
PER_USER = CRITERIA.pack_min_members + 2


def _archive(conn, store, as_of: datetime = NOW, batch_key: str = "night-1") -> int:
    services = archival_services(store)
    report = run_batch(conn, services, CRITERIA, batch_key=batch_key, as_of=as_of, actor="test")
    assert report.ok, report.problem
    return report.archived


def _seeded(conn, store) -> dict[str, list]:
    """A pack each for pat and quinn, three lone backups for carol (below the pack threshold), all
    archived, their checkpoints pruned by the passed audit: only archive rows record the backups."""
    many = make_memories(2 * PER_USER, dim=TEST_DIM, users=("pat", "quinn"), age_days=400)
    few = make_memories(3, dim=TEST_DIM, users=("carol",), age_days=400, seed=7)
    insert_memories(conn, many + few, actor="test")
    assert _archive(conn, store) == len(many) + len(few)
    assert conn.execute("SELECT count(*) AS n FROM archival_attempts").fetchone()["n"] == 0
    ids: dict[str, list] = {}
    for m in many + few:
        ids.setdefault(m["user_id"], []).append(m["id"])
    return ids


def _member(conn, store, user: str, memory_id) -> tuple[str, bytes]:
    """The key and the bytes of an archived memory's backup (its pack member, or its lone object)."""
    row = conn.execute(
        f"SELECT {packs.backup_sql('a')} FROM archived_memories a WHERE a.user_id = %s AND a.original_id = %s",
        (user, memory_id),
    ).fetchone()
    return store.key_from_ref(row["storage_ref"]), store.read_ref(row["storage_ref"], row["backup_sha256"])


def _restore_some(conn, store, ids) -> dict[str, str]:
    """pat: one member of the pack (its neighbours stay archived); quinn: all (the pack only kept);
    carol: one lone backup. Returns the kept keys by user."""
    kept = {
        "pat": _member(conn, store, "pat", ids["pat"][0])[0],
        "quinn": _member(conn, store, "quinn", ids["quinn"][0])[0],
        "carol": _member(conn, store, "carol", ids["carol"][0])[0],
    }
    assert packs.is_pack_key(kept["pat"]) and packs.is_pack_key(kept["quinn"])
    assert not packs.is_pack_key(kept["carol"])
    restore_archive(conn, store, user_id="pat", original_id=ids["pat"][0], actor="test")
    report = restore_archives(conn, store, actor="test", user_id="quinn")
    assert report.restored == PER_USER and report.failed == 0
    restore_archive(conn, store, user_id="carol", original_id=ids["carol"][0], actor="test")
    return kept


def test_a_clean_restore_leaves_no_orphan_and_sweep_removes_nothing(conn, object_store):
    store = object_store
    ids = _seeded(conn, store)
    kept = _restore_some(conn, store, ids)
    listed = integrity.backup_keys(store)
    assert set(kept.values()) <= set(listed)
    # No archive row names quinn's pack or carol's lone backup any more: the restore events record them.
    assert integrity.orphaned_backups(conn, store) == []
    report = integrity.sweep_orphans(conn, store, remove=True)
    assert (report.orphans, report.removed, report.kept) == ([], [], {})
    assert integrity.backup_keys(store) == listed  # every kept backup still there

    # Archived again once the criteria, counted from the restores, select them: new backups beside the
    # kept ones (carol's lone key is written again), and still nothing unrecorded.
    later = datetime.now(UTC) + timedelta(days=91)
    assert _archive(conn, store, as_of=later, batch_key="night-91") == 1 + PER_USER + 1
    assert set(listed) <= set(integrity.backup_keys(store))
    assert integrity.sweep_orphans(conn, store).orphans == []


def test_forget_deletes_kept_backups_and_then_a_copy_left_behind_is_an_orphan(conn, versioned_store):
    store = versioned_store
    ids = _seeded(conn, store)
    pat_key, pat_bytes = _member(conn, store, "pat", ids["pat"][0])
    kept = _restore_some(conn, store, ids)

    # The whole user: quinn's kept pack goes, every version, and nothing of quinn is left.
    forget_user(conn, store, "quinn", actor="test")
    left = remaining(conn, store, "quinn")
    assert left.clean, left
    assert [v for v in list_versions(store, kept["quinn"]) if v.key == kept["quinn"]] == []

    # One restored memory whose kept backup is a pack member: the pack is rewritten without it (its
    # archived neighbours move), the old pack deleted: its bytes are in no version of any object.
    forget_memory(conn, store, "pat", ids["pat"][0], actor="test")
    assert not any(pat_bytes in data for data in bucket_bytes(store))
    assert [v for v in list_versions(store, pat_key) if v.key == pat_key] == []
    for original_id in ids["pat"][1:]:  # the neighbours still restore from where they moved
        restore_archive(conn, store, user_id="pat", original_id=original_id, actor="test")

    # One restored memory with a lone kept backup.
    forget_memory(conn, store, "carol", ids["carol"][0], actor="test")
    assert [v for v in list_versions(store, kept["carol"]) if v.key == kept["carol"]] == []
    assert integrity.sweep_orphans(conn, store).orphans == []

    # Forget redacted the restore's event: it records nothing now, so a copy of the forgotten memory's
    # backup found in the bucket is an orphan, and `sweep --remove` deletes it.
    stray = b'{"left":"behind"}'
    store.put(kept["carol"], stray, sha256_hex(stray))
    assert integrity.orphaned_backups(conn, store) == [kept["carol"]]
    report = integrity.sweep_orphans(conn, store, remove=True)
    assert report.removed == [kept["carol"]]
    assert [v for v in list_versions(store, kept["carol"]) if v.key == kept["carol"]] == []
