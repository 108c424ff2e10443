"""Integrity after commit: every memory exactly once in hot or archive, records that agree, backups
that still exist, and backup objects that nothing records (the sweep)."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

from psycopg.types.json import Jsonb

from ..core.errors import IntegrityError, ObjectNotFoundError
from ..core.models import to_float32
from ..core.rows import Conn, Row
from ..core.statuses import OPEN_STATUSES
from ..lifecycle.promotion import KEPT_BACKUPS_SQL
from ..storage import packs
from ..storage.db import ONE_CONNECTION_PER_WORKER
from ..storage.object_versions import list_versions, make_current, purge
from ..storage.objectstore import ObjectStore, StoredObject
from ..storage.store import MEMORY_COLUMNS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IntegrityReport:
    both_tiers: int  # memories archived by these batches that still have a hot row
    double_open: int  # memories in two open archival attempts
    lost: int  # archived by these batches, now neither hot nor archived
    archived_without_event: int  # archive rows of these batches without an 'archived' audit event
    mismatched_records: int  # archive row and attempt disagree on the backup (ref or sha256)
    archived: int  # archive rows written by these batches

    @property
    def passed(self) -> bool:
        return not (
            self.both_tiers
            or self.double_open
            or self.lost
            or self.archived_without_event
            or self.mismatched_records
        )

    def problems(self) -> dict[str, int]:
        names = ("both_tiers", "double_open", "lost", "archived_without_event", "mismatched_records")
        return {n: getattr(self, n) for n in names}


def integrity_report(conn: Conn, batch_keys: Sequence[str]) -> IntegrityReport:
    """Every memory of these batches exactly once in hot or archive, and their records agree.

    Each query reads these batches' rows through an index (archive rows by batch key, attempts by batch
    and status, open attempts), so the audit costs what the night did, not the size of the tiers. The
    memories the batches did not touch were checked by the nights that moved them: every move (commit,
    re-promotion, restore) is one transaction, and one archive row per memory is a unique key."""
    row = conn.execute(
        f"""SELECT
            (SELECT count(*) FROM archived_memories a
               JOIN memories m ON m.id = a.original_id AND m.user_id = a.user_id
              WHERE a.metadata->>'batch_key' = ANY(%(keys)s)) AS both_tiers,
            (SELECT count(*) FROM (SELECT memory_id FROM archival_attempts WHERE status = ANY(%(open)s)
                                   GROUP BY user_id, memory_id HAVING count(*) > 1) d) AS double_open,
            (SELECT count(*) FROM archival_attempts t
              WHERE t.batch_key = ANY(%(keys)s) AND t.status = 'archived'
                AND NOT EXISTS (SELECT 1 FROM memories m WHERE m.id = t.memory_id AND m.user_id = t.user_id)
                AND NOT EXISTS (SELECT 1 FROM archived_memories a
                                WHERE a.original_id = t.memory_id AND a.user_id = t.user_id)) AS lost,
            (SELECT count(*) FROM archived_memories a
              WHERE a.metadata->>'batch_key' = ANY(%(keys)s)
                AND NOT EXISTS (SELECT 1 FROM memory_events e
                                WHERE e.memory_id = a.original_id AND e.user_id = a.user_id
                                  AND e.event_type = 'archived'))
                AS archived_without_event,
            (SELECT count(*) FROM archival_attempts t
               JOIN archived_memories a ON a.original_id = t.memory_id AND a.user_id = t.user_id
              WHERE t.batch_key = ANY(%(keys)s) AND t.status = 'archived'
                AND a.metadata->>'batch_key' = t.batch_key
                AND (a.backup_digest <> decode(t.backup_sha256, 'hex') OR {packs.ref_sql("a")} <> t.backup_ref))
                AS mismatched_records,
            (SELECT count(*) FROM archived_memories a WHERE a.metadata->>'batch_key' = ANY(%(keys)s)) AS archived
        """,
        {"keys": list(batch_keys), "open": list(OPEN_STATUSES)},
    ).fetchone()
    assert row is not None  # a SELECT without FROM returns exactly one row
    return IntegrityReport(**row)


BACKUP_PREFIXES = ("memories/", "packs/")  # lone backups, then packs (memory_lib.storage.packs)


def backup_keys(store: ObjectStore) -> list[str]:
    """Every backup object's key: lone backups and packs."""
    return [k for prefix in BACKUP_PREFIXES for k in store.list(prefix)]


def orphaned_backups(
    conn: Conn, store: ObjectStore, prefix: str | None = None, *, keys: list[str] | None = None
) -> list[str]:
    """Backup objects nothing records (a crash between put and checkpoint, repaired by a re-run).

    Recorded: by an archival attempt (its checkpoint), by an archive row (its backup object), or, for
    the backup a restore or re-promotion kept, by that move's audit event until forget redacts it
    (promotion.KEPT_BACKUPS_SQL). So a clean restore leaves no orphan, and a forgotten memory's backup
    left behind is one."""
    if keys is None:
        keys = list(store.list(prefix)) if prefix is not None else backup_keys(store)
    if not keys:
        return []
    known = {
        r["backup_key"]
        for r in conn.execute(
            "SELECT backup_key FROM archival_attempts WHERE backup_key = ANY(%s)", (keys,)
        ).fetchall()
    }
    # An archived memory's checkpoint row is pruned after its audit: its archive row records the key.
    refs = {store.ref_for(k): k for k in keys if k not in known and not packs.is_pack_key(k)}
    ids = [i for i in map(_memory_id_of, refs.values()) if i is not None]
    if ids:
        known |= {
            refs[r["storage_ref"]]
            for r in conn.execute(
                f"SELECT {packs.ref_sql('a')} AS storage_ref FROM archived_memories a WHERE a.original_id = ANY(%s)",
                (ids,),
            ).fetchall()
            if r["storage_ref"] in refs
        }
    # A pack is recorded while an archive row names its backup object (a row per object, kept after the
    # last member was restored or forgotten: that no longer records the pack).
    pack_refs = {store.ref_for(k): k for k in keys if k not in known and packs.is_pack_key(k)}
    if pack_refs:
        known |= {
            pack_refs[r["ref"]]
            for r in conn.execute(
                """SELECT o.ref FROM backup_objects o WHERE o.ref = ANY(%s) AND EXISTS
                       (SELECT 1 FROM archived_memories a WHERE a.backup_object = o.id AND a.user_id = o.user_id)""",
                (list(pack_refs),),
            ).fetchall()
        }
    # A restored memory's backup, lone or a pack, is kept on record by its restore's event.
    kept_refs = {store.ref_for(k): k for k in keys if k not in known}
    if kept_refs:
        known |= {
            kept_refs[r["ref"]]
            for r in conn.execute(KEPT_BACKUPS_SQL, (list(kept_refs),)).fetchall()
            if r["ref"] in kept_refs
        }
    return [k for k in keys if k not in known]


def purge_unrecorded_packs(
    conn: Conn, batch_key: str, store: ObjectStore, user_ids: Sequence[str]
) -> list[str]:
    """Delete, every version, the packs of `batch_key` in the folders of `user_ids` (and of the layout
    before owner tags) that no attempt and no archive row records: a dead run's puts whose checkpoints
    never landed. Called by the batch's backup step under the batch's lease when an earlier run
    started it, so no live run is between its put and its checkpoint. (forget finds such packs by
    listing the user's folder either way: this is the storage they would waste.)"""
    folders = [f"packs/{packs.owner_tag(u)}/{batch_key}/" for u in sorted(set(user_ids))] + [
        f"packs/{batch_key}/"
    ]
    # A batch key may hold '/': keep only the packs directly in this batch's folder.
    keys = [
        k
        for folder in folders
        for k in store.list(folder)
        if packs.is_pack_key(k) and packs.batch_of(store, k) == batch_key
    ]
    orphans = orphaned_backups(conn, store, keys=keys)
    for key in orphans:
        purge(store, key)
    return orphans


def _memory_id_of(key: str) -> uuid.UUID | None:
    """The memory id a backup key names (`.../memories/<id>.json`), or None for another key."""
    try:
        return uuid.UUID(key.rsplit("/", 1)[-1].removesuffix(".json"))
    except ValueError:
        return None


def exact_rows(conn: Conn, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Row]:
    """Hot rows with every column, the embedding as raw float32 bytes: equal means byte-exact."""
    rows = conn.execute(
        f"SELECT {MEMORY_COLUMNS}, content_tsv::text AS content_tsv FROM memories WHERE id = ANY(%s)",
        (list(ids),),
    ).fetchall()
    out = {}
    for r in rows:
        r = dict(r)
        r["embedding"] = to_float32(r["embedding"]).tobytes()
        out[r["id"]] = r
    return out


@dataclass(frozen=True)
class CommittedBackups:
    """Backups of committed archive rows checked in object storage (HEAD: size and sha256)."""

    committed: int  # archive rows written by these batches
    checked: int  # of them checked (all up to the sample size, a random sample above it)
    missing: list[str]  # storage refs with no object (after recovery)
    mismatched: list[str]  # storage refs whose object differs from the recorded sha256/size (after recovery)
    recovered: list[str] = field(default_factory=list)  # refs found missing or different, then recovered

    @property
    def passed(self) -> bool:
        return not (self.missing or self.mismatched)


@dataclass(frozen=True)
class TierAudit:
    """A committed batch's audit as recorded (`record_audit`): what the read-only check reports."""

    batch_key: str
    integrity: IntegrityReport
    committed: CommittedBackups
    audited_at: datetime

    @property
    def passed(self) -> bool:
        return self.integrity.passed and self.committed.passed

    def problems(self) -> dict[str, int]:
        """Only the non-zero problems, the missing and differing backups included."""
        found = {k: v for k, v in self.integrity.problems().items() if v}
        if self.committed.missing:
            found["backups_missing"] = len(self.committed.missing)
        if self.committed.mismatched:
            found["backups_mismatched"] = len(self.committed.mismatched)
        return found


# Backups HEADed by the post-commit audit, per batch: every one up to 1,000, a random 1,000 above.
# Every backup was already read back in full (fidelity) and HEADed by commit (under the locks, just
# before its original was deleted, when no bucket version keeps it): this audit looks for what
# happened since (an object of a versioned bucket deleted during commit, a lifecycle rule, the wrong
# bucket). A smaller sample would save requests but miss a single lost object most of the time, and
# one lost original is what the product promises never happens.
AUDIT_SAMPLE = 1000


def audit_batch(
    conn: Conn, store: ObjectStore, batch_key: str, *, sample_max: int | None = None
) -> TierAudit:
    """integrity_report and verify_committed (a sample of `sample_max`, default AUDIT_SAMPLE) of one
    committed batch, kept on the batch (record_audit). A passed audit then prunes the batch's
    archived checkpoint rows (prune_archived_attempts); a failed one keeps them for the investigation."""
    report = integrity_report(conn, [batch_key])
    committed = verify_committed(
        conn, store, [batch_key], sample_max=AUDIT_SAMPLE if sample_max is None else sample_max
    )
    if not committed.passed:
        recovered = recover_from_versions(conn, store, committed.missing + committed.mismatched)
        committed = replace(
            committed,
            missing=[r for r in committed.missing if r not in recovered],
            mismatched=[r for r in committed.mismatched if r not in recovered],
            recovered=sorted(recovered),
        )
    at = datetime.now(UTC)
    conn.execute(
        "UPDATE archival_batches SET tier_audit = %s WHERE batch_key = %s",
        (
            Jsonb({"integrity": asdict(report), "committed": asdict(committed), "at": at.isoformat()}),
            batch_key,
        ),
    )
    audit = TierAudit(batch_key, report, committed, at)
    if audit.passed:
        prune_archived_attempts(conn, batch_key)
    return audit


def prune_archived_attempts(conn: Conn, batch_key: str) -> int:
    """Delete the batch's checkpoint rows of memories it archived; returns how many.

    Only rows whose archive row exists and records the same backup (ref and sha256): what the row
    recorded is then kept by the archive row, its 'archived' audit event and the backup object.
    The batch counts them (archival_batches.archived_pruned), so batch_status and the night's totals
    are unchanged. Open and released attempts are never pruned: retries, takeovers, eligibility and
    liveness read them. Idempotent: a second call finds nothing to delete.
    """
    users = [
        r["user_id"]
        for r in conn.execute(
            """SELECT DISTINCT user_id FROM archival_attempts WHERE batch_key = %s AND status = 'archived'
               ORDER BY 1""",
            (batch_key,),
        ).fetchall()
    ]
    with conn.transaction():
        conn.execute(ONE_CONNECTION_PER_WORKER)
        # One DELETE per user (one shard each): Citus refuses a write to the batch (a reference table)
        # after a multi-shard write in the same transaction.
        pruned = 0
        for user in users:
            pruned += conn.execute(
                f"""DELETE FROM archival_attempts t USING archived_memories a
                   WHERE t.batch_key = %s AND t.user_id = %s AND t.status = 'archived'
                     AND a.user_id = t.user_id AND a.original_id = t.memory_id
                     AND a.backup_digest = decode(t.backup_sha256, 'hex') AND {packs.ref_sql("a")} = t.backup_ref""",
                (batch_key, user),
            ).rowcount
        if pruned:
            conn.execute(
                "UPDATE archival_batches SET archived_pruned = archived_pruned + %s WHERE batch_key = %s",
                (pruned, batch_key),
            )
    return pruned


def recorded_audit(conn: Conn, batch_key: str) -> TierAudit | None:
    """The last audit `audit_batch` kept for the batch, or None when it was never audited (not committed)."""
    row = conn.execute(
        "SELECT tier_audit AS a FROM archival_batches WHERE batch_key = %s", (batch_key,)
    ).fetchone()
    if row is None or row["a"] is None:
        return None
    a = row["a"]
    return TierAudit(
        batch_key,
        IntegrityReport(**a["integrity"]),
        CommittedBackups(**a["committed"]),
        datetime.fromisoformat(a["at"]),
    )


def verify_committed(
    conn: Conn,
    store: ObjectStore,
    batch_keys: Sequence[str],
    *,
    sample_max: int = 1000,
    workers: int = 8,
) -> CommittedBackups:
    """HEAD the backup of each archive row these batches committed (a random sample above
    `sample_max`). Commit verifies a backup no bucket version keeps under its locks, before deleting
    the original; a versioned one before its transaction, so an object deleted in between is found
    here (and put back by recover_from_versions). What neither prevents, a backup deleted after its
    commit, is found here too."""
    rows = conn.execute(
        f"""SELECT {packs.backup_sql("a")}, a.backup_size_bytes FROM archived_memories a
           WHERE a.metadata->>'batch_key' = ANY(%s)""",
        (list(batch_keys),),
    ).fetchall()
    sample = rows if len(rows) <= sample_max else random.sample(rows, sample_max)
    missing: list[str] = []
    mismatched: list[str] = []

    whole = [r for r in sample if store.locate(r["storage_ref"])[1] is None]
    members = [r for r in sample if store.locate(r["storage_ref"])[1] is not None]

    def head(r: Row) -> StoredObject | None:
        try:
            return store.head(store.key_from_ref(r["storage_ref"]))
        except ObjectNotFoundError:
            return None

    if whole:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(whole)))) as pool:
            heads = list(pool.map(head, whole))  # another error (the store down) raises, as before
        for r, obj in zip(whole, heads, strict=True):
            if obj is None:
                missing.append(r["storage_ref"])
            elif obj.sha256 != r["backup_sha256"] or obj.size != r["backup_size_bytes"]:
                mismatched.append(r["storage_ref"])
    # Pack members: one HEAD per pack whose checksum is the digest in its name, else one GET per pack
    # with each member's bytes checked against its own sha256 (packs.verify_members).
    read = packs.verify_members(
        store, [(r["storage_ref"], r["backup_sha256"]) for r in members], workers=workers
    )
    for r, got in zip(members, read, strict=True):
        if isinstance(got, ObjectNotFoundError):
            missing.append(r["storage_ref"])
        elif isinstance(got, IntegrityError):
            mismatched.append(r["storage_ref"])
        elif isinstance(got, BaseException):
            raise got  # the store down: raises, as for a lone backup's HEAD
    return CommittedBackups(len(rows), len(sample), missing, mismatched)


def recover_from_versions(conn: Conn, store: ObjectStore, refs: Sequence[str]) -> set[str]:
    """Put back the backups of archive rows whose object was deleted or overwritten after commit's
    verification (the verify -> commit race: the original is gone, so the backup is the only copy).
    On a versioned bucket the verified bytes are still the version the row recorded
    (`backup_version_id`): that version is copied on top, then each member is read back against its
    sha256. Returns the refs recovered; without versioning there is nothing to recover from (commit
    verifies such backups under its locks instead, and the preflight warns about the bucket)."""
    if not refs:
        return set()
    rows = conn.execute(
        """SELECT backup_ref(o.ref, a.backup_offset, a.backup_size_bytes) AS storage_ref,
                  encode(a.backup_digest, 'hex') AS backup_sha256,
                  a.backup_version_id
           FROM backup_objects o JOIN archived_memories a ON a.backup_object = o.id AND a.user_id = o.user_id
           WHERE o.ref = ANY(%s) AND backup_ref(o.ref, a.backup_offset, a.backup_size_bytes) = ANY(%s)""",
        (sorted({store.ref_for(store.key_from_ref(r)) for r in refs}), list(refs)),
    ).fetchall()
    restored: dict[tuple[str, str], bool] = {}
    put_back = []
    for r in rows:
        key, version = store.key_from_ref(r["storage_ref"]), r["backup_version_id"]
        if version is None:
            continue
        if (key, version) not in restored:
            restored[key, version] = make_current(store, key, version)
        if restored[key, version]:
            put_back.append(r)
    # Read back as every other check does: one read per pack for all of its members, each checked.
    read = packs.read_members(store, [(r["storage_ref"], r["backup_sha256"]) for r in put_back])
    recovered = {
        r["storage_ref"]
        for r, got in zip(put_back, read, strict=True)
        if not isinstance(got, ObjectNotFoundError | IntegrityError)
    }
    for got in read:
        if isinstance(got, BaseException) and not isinstance(got, ObjectNotFoundError | IntegrityError):
            raise got  # the store down: raises, as verify_committed does
    if recovered:
        log.warning("recovered %d backups from their recorded object versions", len(recovered))
    return recovered


@dataclass(frozen=True)
class SweepReport:
    """Backup objects (lone and packs) that no attempt and no archive row records."""

    listed: int
    orphans: list[str]
    removed: list[str]
    kept: dict[str, str]  # orphan key -> why it was not removed


def _keys_in_any_version(store: ObjectStore) -> list[str]:
    """Every backup key with a stored version, current or not (a key whose current version is a delete
    marker still holds its bytes on a versioned bucket); the current keys for a store without versions."""
    try:
        found = {v.key for prefix in BACKUP_PREFIXES for v in list_versions(store, _full_key(store, prefix))}
    except TypeError:
        return backup_keys(store)
    return sorted(k for k in found if packs.is_pack_key(k) or _memory_id_of(k) is not None)


def _full_key(store: ObjectStore, name: str) -> str:
    return f"{store.prefix}/{name}" if store.prefix else name


def sweep_orphans(conn: Conn, store: ObjectStore, *, remove: bool = False) -> SweepReport:
    """Find (and with `remove`, delete every version of) backup objects without a record.

    An orphan comes from a run killed between an object's put and its checkpoint. It is removed only
    when its memory is hot and in no open attempt (the next archival writes it again) or gone from
    both tiers; an object an archive row points to is never an orphan, nor is the backup a restore or
    re-promotion kept (recorded by its audit event: orphaned_backups). Removal purges every version
    and delete marker of the key (memory_lib.storage.object_versions): a delete alone would leave the bytes in
    a noncurrent version on a versioned bucket.
    """
    listed = _keys_in_any_version(store)
    orphans = orphaned_backups(conn, store, keys=listed)
    removed: list[str] = []
    kept: dict[str, str] = {}
    if orphans:
        open_ids, open_batches = set(), set()
        for r in conn.execute(
            "SELECT memory_id, batch_key FROM archival_attempts WHERE status = ANY(%s)",
            (list(OPEN_STATUSES),),
        ).fetchall():
            open_ids.add(str(r["memory_id"]))
            open_batches.add(r["batch_key"])
        for key in orphans:
            if packs.is_pack_key(key):
                # A pack's members are only known by reading it; its batch is in its key.
                if packs.batch_of(store, key) in open_batches:
                    kept[key] = "its batch has open attempts: the run will write it again"
                    continue
            elif key.rsplit("/", 1)[-1].removesuffix(".json") in open_ids:
                kept[key] = "its memory is in an open attempt: the run will write it again"
                continue
            if remove:
                purge(store, key)
                removed.append(key)
    return SweepReport(len(listed), orphans, removed, kept)
