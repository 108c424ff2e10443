"""Where a memory's backup lives, for tests that look at or damage objects: a lone backup object or a
member of a pack (memory_lib.storage.packs) addressed by "<pack ref>#bytes=<first>-<last>"."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from memory_lib.lifecycle.promotion import ARCHIVE_ROW
from memory_lib.storage.object_versions import list_versions
from memory_lib.storage.objectstore import LocalObjectStore, ObjectStore, S3ObjectStore
from memory_lib.storage.packs import backup_sql, ref_sql

# Every archive row's backup ref, as the product composes it (backup_objects, migration 023).
# Whole archive rows with their storage_ref, as every move reads them.
ARCHIVE_ROWS_SQL = f"SELECT {ARCHIVE_ROW} FROM archived_memories a"
ARCHIVE_REFS_SQL = f"SELECT a.original_id, a.user_id, {backup_sql('a')} FROM archived_memories a"


def object_refs(store: ObjectStore, refs: Iterable[str]) -> set[str]:
    """The refs of the objects holding these backups (a pack member's ref without its byte range)."""
    return {store.ref_for(store.key_from_ref(r)) for r in refs}


def backup_ref(conn, memory_id: uuid.UUID) -> str:
    """A memory's backup ref: from its archive row, else from its archival attempt."""
    row = conn.execute(
        f"""SELECT coalesce((SELECT {ref_sql("a")} FROM archived_memories a WHERE a.original_id = %(id)s),
                           (SELECT backup_ref FROM archival_attempts WHERE memory_id = %(id)s)) AS ref""",
        {"id": memory_id},
    ).fetchone()
    assert row["ref"], f"memory {memory_id} has no backup"
    return row["ref"]


def members_sharing(conn, store: ObjectStore, ref: str) -> int:
    """How many archived memories' backups live in the object holding `ref`."""
    key = store.key_from_ref(ref)
    refs = [r["storage_ref"] for r in conn.execute(ARCHIVE_REFS_SQL).fetchall()]
    return sum(store.key_from_ref(r) == key for r in refs)


def tamper(store: LocalObjectStore, ref: str, old: bytes, new: bytes) -> None:
    """Replace `old` by `new` once inside the one backup `ref` names, on a local store's disk. Same
    length, so the other members of a pack keep their byte ranges and stay intact."""
    assert len(old) == len(new), "a same-length edit keeps a pack's other members intact"
    key, member = store.locate(ref)
    path = store.root / key
    data = bytearray(path.read_bytes())
    start, size = member or (0, len(data))
    at = data.find(old, start, start + size)
    assert at >= 0, f"{old!r} not in the backup {ref}"
    data[at : at + len(old)] = new
    path.write_bytes(bytes(data))


def edit_content(store: LocalObjectStore, ref: str) -> None:
    """Change one character of the backup's content on disk (same size: a pack's other members stay
    intact), as a silent corruption or tampering would."""
    key, member = store.locate(ref)
    path = store.root / key
    data = bytearray(path.read_bytes())
    start, size = member or (0, len(data))
    at = data.index(b'"content":"', start, start + size) + len(b'"content":"')
    data[at : at + 1] = b"#" if data[at : at + 1] != b"#" else b"%"
    path.write_bytes(bytes(data))


def bucket_bytes(store: S3ObjectStore) -> list[bytes]:
    """Every version of every object in the bucket, as bytes: what a search for a forgotten memory's
    bytes must come back empty from."""
    out = []
    for v in list_versions(store, ""):
        if not v.delete_marker:
            got = store.client.get_object(Bucket=store.bucket, Key=v.key, VersionId=v.version_id)
            out.append(got["Body"].read())
    return out
