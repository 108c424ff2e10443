"""Backup packs: many memories of one user in one backup object, each still addressable and verifiable alone.

Object requests, not bytes, bound archival on a small machine: every object costs a PUT, the fidelity
GET, commit's check and the audit's. So the backup step writes a user's memories of one batch as one
object when there are at least `criteria.pack_min_members` of them (fewer: one object each, as before).

Format: the members' canonical backup documents (models.BackupObject.to_json_bytes, unchanged), each
followed by one newline: a JSON Lines file. Each member keeps its own sha256 and size in Postgres, and
its ref names its byte range (objectstore: "<pack ref>#bytes=<first>-<last>"), so expanding or
restoring one memory is one ranged GET checked against that member's sha256. The key is
`<prefix>/packs/u=<owner tag>/<batch key>/<sha256 of the pack>.jsonl`: written once, never
overwritten. The owner tag is a digest of the user id (`owner_tag`), not the id: forget finds every
pack that can hold a user's bytes by listing the user's folder, whether or not a row records it (a run
killed between its put and its checkpoint). Packs written before the tag (`packs/<batch
key>/<sha256>.jsonl`) are still read; forget_user finds those by their rows, or, unrecorded, by
reading them. Invariants:
* a pack holds the memories of one user only (forget_user deletes whole packs);
* its owner tag is that user's;
* a member's bytes are exactly its standalone backup document (same sha256 either way);
* readers go through `read_members`, which reads each object once for all of its members asked for.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..core.errors import IntegrityError, ObjectNotFoundError
from ..core.models import sha256_hex
from .objectstore import ObjectStore, StoredObject


def ref_sql(row: str = "a") -> str:
    """SQL for the storage_ref of the archive row aliased `row`: its backup object's ref (backup_objects,
    by number), plus the member's byte range when the backup is a pack member. backup_ref() composes it in
    objectstore's form (migration 023); the object is read by its key, so the statement stays on one user."""
    return (
        f"backup_ref((SELECT o.ref FROM backup_objects o WHERE o.id = {row}.backup_object"
        f" AND o.user_id = {row}.user_id), {row}.backup_offset, {row}.backup_size_bytes)"
    )


def backup_sql(row: str = "a") -> str:
    """SQL for the backup of the archive row aliased `row` as readers take it: `storage_ref` (ref_sql) and
    `backup_sha256`, the 32 bytes the row keeps (backup_digest, migration 024) as 64 hex digits."""
    return f"{ref_sql(row)} AS storage_ref, encode({row}.backup_digest, 'hex') AS backup_sha256"


# Records the objects of (user_id, ref) pairs, once each; then an archive row takes an object's number with
# object_of_sql and a member's offset with backup_member_offset(ref). Sorted: two writers recording the
# same objects take their locks in one order.
RECORD_OBJECTS_SQL = """
    INSERT INTO backup_objects (user_id, ref)
    SELECT DISTINCT t.user_id, backup_object_ref(t.ref) FROM unnest(%(users)s::text[], %(refs)s::text[]) AS t(user_id, ref)
    ORDER BY 1, 2
    ON CONFLICT (ref, user_id) DO NOTHING"""


def object_of_sql(user: str, ref: str) -> str:
    """SQL for the number of the backup object holding `ref` (SQL expressions) of `user`."""
    return (
        f"(SELECT o.id FROM backup_objects o WHERE o.ref = backup_object_ref({ref}) AND o.user_id = {user})"
    )


PACK_MAX_BYTES = 8 * 1024 * 1024  # a larger group is split: one PUT stays small enough to retry cheaply
SUFFIX = ".jsonl"


@dataclass(frozen=True)
class Member:
    memory_id: uuid.UUID
    data: bytes  # the member's canonical backup document
    sha256: str


@dataclass(frozen=True)
class Unit:
    """One object to put: a single memory's backup (`packed` False) or a pack of one user's members."""

    key: str
    data: bytes
    sha256: str
    members: tuple[Member, ...]
    offsets: tuple[int, ...]
    packed: bool


@dataclass(frozen=True)
class StoredMember:
    """Where one memory's backup went: the object, and the member's own ref, sha256 and size."""

    object: StoredObject
    ref: str
    sha256: str
    size: int


def plan_units(
    store: ObjectStore,
    batch_key: str,
    members: Sequence[tuple[str, Member]],
    *,
    min_members: int,
    max_bytes: int = PACK_MAX_BYTES,
) -> list[Unit]:
    """Group (user_id, member) pairs into objects: a user's members packed when they are at least
    `min_members`, split so that no pack passes `max_bytes`; the rest one object each."""
    by_user: dict[str, list[Member]] = {}
    for user_id, m in members:
        by_user.setdefault(user_id, []).append(m)
    units: list[Unit] = []
    for user_id, group in by_user.items():
        if len(group) < min_members:
            units += [Unit(store.key_for(m.memory_id), m.data, m.sha256, (m,), (0,), False) for m in group]
            continue
        chunk: list[Member] = []
        size = 0
        for m in group:
            if chunk and size + len(m.data) + 1 > max_bytes:
                units.append(_pack(store, batch_key, chunk, user_id))
                chunk, size = [], 0
            chunk.append(m)
            size += len(m.data) + 1
        units.append(_pack(store, batch_key, chunk, user_id))
    return units


OWNER_MARK = "u="


def owner_tag(user_id: str) -> str:
    """The folder of a user's packs: a digest of the user id (128 bits: two users never share one)."""
    return OWNER_MARK + sha256_hex(user_id.encode("utf-8"))[:32]


def owner_of(store: ObjectStore, key: str) -> str | None:
    """The owner tag of a pack key, or None for a pack written before tags (or not a pack)."""
    start = packs_prefix(store)
    if not is_pack_key(key) or not key.startswith(start):
        return None
    first = key[len(start) :].split("/", 1)[0]
    return first if first.startswith(OWNER_MARK) else None


def packs_prefix(store: ObjectStore) -> str:
    """Where every pack of the store is (a full key prefix)."""
    return f"{store.prefix}/packs/" if store.prefix else "packs/"


def owner_prefix(store: ObjectStore, user_id: str) -> str:
    """The folder of every pack of `user_id` (a full key prefix)."""
    return f"{packs_prefix(store)}{owner_tag(user_id)}/"


def _pack(
    store: ObjectStore, batch_key: str, members: list[Member], user_id: str = "", *, folder: str | None = None
) -> Unit:
    offsets, parts, at = [], [], 0
    for m in members:
        offsets.append(at)
        parts += [m.data, b"\n"]
        at += len(m.data) + 1
    data = b"".join(parts)
    digest = sha256_hex(data)
    if folder is not None:
        key = f"{folder}/{digest}{SUFFIX}"
    else:
        key = f"{owner_prefix(store, user_id)}{batch_key}/{digest}{SUFFIX}"
    return Unit(key, data, digest, tuple(members), tuple(offsets), True)


def rewrite_without(
    store: ObjectStore, key: str, keep: Sequence[dict[str, Any]]
) -> dict[uuid.UUID, StoredMember]:
    """Write a new pack beside `key` holding only the members `keep` (rows with original_id,
    storage_ref, backup_sha256 naming members of `key`), each checked against its sha256 first; returns
    each kept member's new place. The new key is its content's sha256: a re-run writes the same object.
    The old pack is left for the caller to purge once the rows point to the new one (forget)."""
    wanted = sorted(keep, key=lambda r: store.locate(r["storage_ref"])[1] or (0, 0))
    read = read_members(store, [(r["storage_ref"], r["backup_sha256"]) for r in wanted], workers=1)
    members = []
    for r, got in zip(wanted, read, strict=True):
        if isinstance(got, BaseException):
            raise got  # never drop a member we cannot read intact: the old pack stays, the forget re-runs
        members.append(Member(r["original_id"], got, r["backup_sha256"]))
    unit = _pack(store, "", members, folder=key.rsplit("/", 1)[0])
    stored = put_unit(store, unit)
    return {m.memory_id: s for m, s in zip(members, stored, strict=True)}


def put_unit(store: ObjectStore, unit: Unit) -> list[StoredMember]:
    """Put one unit (verified by the store) and describe each of its members."""
    stored = store.put(unit.key, unit.data, unit.sha256)
    if not unit.packed:
        m = unit.members[0]
        return [StoredMember(stored, stored.ref, m.sha256, len(m.data))]
    return [
        StoredMember(stored, store.member_ref(unit.key, at, len(m.data)), m.sha256, len(m.data))
        for m, at in zip(unit.members, unit.offsets, strict=True)
    ]


SPAN_DENSITY = 0.25  # read_members: one GET over a pack's wanted members when they fill a quarter of it


def read_members(
    store: ObjectStore,
    wanted: Sequence[tuple[str, str]],
    *,
    workers: int = 8,
    on_error: Callable[[BaseException], BaseException] | None = None,
) -> list[bytes | BaseException]:
    """The bytes of each (ref, sha256), or the exception reading or checking it raised, in order.

    Each pack is read once for all the members asked of it (one ranged GET from the first to the last)
    when they fill at least SPAN_DENSITY of that range, else one ranged GET per member; a whole-object
    ref is the store's get_verified. Every member is checked against its own sha256 and size."""
    by_key: dict[str, list[int]] = {}
    located: list[tuple[str, tuple[int, int] | None]] = []
    for i, (ref, _sha) in enumerate(wanted):
        key, member = store.locate(ref)
        located.append((key, member))
        by_key.setdefault(key, []).append(i)
    out: list[bytes | BaseException] = [b""] * len(wanted)

    def read(key: str) -> list[tuple[int, bytes | BaseException]]:
        idx = by_key[key]
        whole = [i for i in idx if located[i][1] is None]
        parts = {i: span for i in idx if (span := located[i][1]) is not None}  # index -> (offset, size)
        done: list[tuple[int, bytes | BaseException]] = []
        for i in whole:
            try:
                done.append((i, store.get_verified(key, wanted[i][1])))
            except Exception as exc:
                done.append((i, exc))
        if parts:
            spans = list(parts.values())
            lo = min(s[0] for s in spans)
            hi = max(s[0] + s[1] for s in spans)
            # One ranged GET over the members when they fill enough of it (a night's commit or a
            # user's restore asks for most of a pack); a few scattered members are read one range each,
            # not the whole pack for them (a restore of ids picked across many packs).
            dense = len(parts) > 1 and sum(s[1] for s in spans) >= SPAN_DENSITY * (hi - lo)
            try:
                data = store.get_range(key, lo, hi - lo) if dense else None
            except Exception as exc:
                return done + [(i, exc) for i in parts]
            for i in parts:
                ref, sha = wanted[i]
                try:
                    if data is None:
                        done.append((i, store.read_ref(ref, sha)))
                    else:
                        start, size = parts[i]
                        done.append((i, member_bytes(data, ref, (start - lo, size), sha)))
                except Exception as exc:
                    done.append((i, exc))
        return done

    keys = list(by_key)
    if not keys:
        return out
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys)))) as pool:
        for results in pool.map(read, keys):
            for i, value in results:
                out[i] = on_error(value) if on_error and isinstance(value, BaseException) else value
    return out


def pack_digest(key: str) -> str | None:
    """The sha256 a pack's name carries (`<...>/<sha256 of the pack>.jsonl`), or None when `key` names
    no such pack (a lone backup)."""
    if not is_pack_key(key):
        return None
    name = key.rsplit("/", 1)[-1][: -len(SUFFIX)]
    return name if len(name) == 64 and all(c in "0123456789abcdef" for c in name) else None


def verify_members(
    store: ObjectStore, wanted: Sequence[tuple[str, str]], *, workers: int = 8
) -> list[BaseException | None]:
    """Per (ref, sha256): None when those bytes are in the store as recorded, else the exception that
    says why (ObjectNotFoundError, IntegrityError, or the store's error), in order. Reads nothing that
    one HEAD can prove.

    A pack is named by the sha256 of its content, and each member's sha256 was taken from the bytes
    that content was joined from: when the store's own checksum of the object (HEAD) is that sha256 and
    the object covers every member's range, every member is intact, and one HEAD checks them all
    instead of a GET of the pack and a sha256 per member. A pack the HEAD does not prove so (another
    checksum, none from the server, a name without a digest) is read and each member checked alone
    (read_members), so a damaged member is named, not its neighbours. A lone backup is read
    (get_verified): the caller HEADs lone backups itself where a HEAD is enough.
    """
    by_key: dict[str, list[int]] = {}
    spans: list[tuple[int, int] | None] = []
    for i, (ref, _sha) in enumerate(wanted):
        key, member = store.locate(ref)
        spans.append(member)
        by_key.setdefault(key, []).append(i)
    out: list[BaseException | None] = [None] * len(wanted)

    def check(key: str) -> list[tuple[int, BaseException | None]]:
        idx = by_key[key]
        digest = pack_digest(key)
        if digest is not None and all(spans[i] is not None for i in idx):
            try:
                obj = store.head(key)
            except Exception as exc:  # the store down: every member of the object says so
                return [(i, exc) for i in idx]
            if obj is None:
                return [(i, ObjectNotFoundError(key)) for i in idx]
            ends = max(s[0] + s[1] for i in idx if (s := spans[i]) is not None)
            if obj.sha256 == digest and obj.size >= ends:
                return [(i, None) for i in idx]
        read = read_members(store, [wanted[i] for i in idx], workers=1)
        return [(i, r if isinstance(r, BaseException) else None) for i, r in zip(idx, read, strict=True)]

    keys = list(by_key)
    if not keys:
        return out
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys)))) as pool:
        for results in pool.map(check, keys):
            for i, problem in results:
                out[i] = problem
    return out


def member_bytes(pack: bytes, ref: str, member: tuple[int, int], sha256: str) -> bytes:
    """A member's bytes cut from its pack, checked against its recorded size and sha256."""
    start, size = member
    data = pack[start : start + size]
    if len(data) != size:
        raise IntegrityError(f"{ref} (size)", str(size), str(len(data)))
    actual = sha256_hex(data)
    if actual != sha256:
        raise IntegrityError(f"{ref} (sha256)", sha256, actual)
    return data


def is_pack_key(key: str) -> bool:
    """Whether `key` names a pack (written by plan_units or rewrite_without)."""
    parts = key.split("/")
    return key.endswith(SUFFIX) and "packs" in parts[:-2]


def batch_of(store: ObjectStore, key: str) -> str:
    """The batch key a pack key was written for (`<prefix>/packs/[u=<tag>/]<batch key>/<sha256>.jsonl`)."""
    start = packs_prefix(store)
    if not is_pack_key(key) or not key.startswith(start):
        raise ValueError(f"not a pack key of this store: {key!r}")
    folder = key[len(start) :].rsplit("/", 1)[0]
    return folder.split("/", 1)[1] if owner_of(store, key) else folder
