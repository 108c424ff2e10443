"""Every stored version of an object, listed and deleted: what erasure needs beyond ObjectStore.delete.

On a versioned S3 bucket a DELETE only adds a delete marker: the bytes stay in noncurrent versions.
Erasure lists every version and delete marker of a key (ListObjectVersions) and deletes each by its
VersionId, which removes it for good. A local store has one version per key, plus the temporary files
a crashed put may have left beside it (they hold the same bytes), which are removed too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .objectstore import TMP_SUFFIX, LocalObjectStore, ObjectStore, S3ObjectStore, check_key, s3_errors


@dataclass(frozen=True)
class ObjectVersion:
    key: str
    version_id: str | None  # None: an unversioned store (local) or a bucket that never had versioning
    delete_marker: bool = False


def list_versions(store: ObjectStore, prefix: str) -> list[ObjectVersion]:
    """Every version and delete marker whose key starts with `prefix` (a full key, store prefix included)."""
    if isinstance(store, S3ObjectStore):
        return _s3_versions(store, prefix)
    if isinstance(store, LocalObjectStore):
        return _local_versions(store, prefix)
    raise TypeError(f"{type(store).__name__} cannot list object versions: erasure needs a local or S3 store")


def purge(store: ObjectStore, key: str) -> int:
    """Delete every version of `key` (and its delete markers); returns how many were deleted.
    Idempotent: a key with nothing stored deletes nothing."""
    check_key(key)
    found = [v for v in list_versions(store, key) if v.key == key or _is_local_tmp_of(v.key, key)]
    if isinstance(store, S3ObjectStore):
        for v in found:
            with s3_errors("delete version", store.bucket, key):
                if v.version_id is None:
                    store.client.delete_object(Bucket=store.bucket, Key=v.key)
                else:
                    store.client.delete_object(Bucket=store.bucket, Key=v.key, VersionId=v.version_id)
        return len(found)
    for v in found:
        (store.root / v.key).unlink(missing_ok=True)  # type: ignore[attr-defined]
    return len(found)


def _s3_versions(store: S3ObjectStore, prefix: str) -> list[ObjectVersion]:
    out: list[ObjectVersion] = []
    kwargs: dict[str, Any] = {"Bucket": store.bucket, "Prefix": prefix}
    while True:
        with s3_errors("list versions", store.bucket, prefix):
            page = store.client.list_object_versions(**kwargs)
        for v in page.get("Versions", ()):
            out.append(ObjectVersion(v["Key"], _version(v.get("VersionId"))))
        for m in page.get("DeleteMarkers", ()):
            out.append(ObjectVersion(m["Key"], _version(m.get("VersionId")), delete_marker=True))
        if not page.get("IsTruncated"):
            return out
        kwargs["KeyMarker"] = page.get("NextKeyMarker")
        kwargs["VersionIdMarker"] = page.get("NextVersionIdMarker")


def _version(value: str | None) -> str | None:
    # S3 names the single version of an object written before versioning was enabled "null"; it is
    # deleted by that id like any other.
    return value or None


def _local_versions(store: LocalObjectStore, prefix: str) -> list[ObjectVersion]:
    base = store.root / prefix.rsplit("/", 1)[0] if "/" in prefix else store.root
    if not base.is_dir():
        return []
    out = []
    for dirpath, _dirs, files in os.walk(base):
        rel = Path(dirpath).relative_to(store.root).as_posix()
        for name in files:
            key = name if rel == "." else f"{rel}/{name}"
            real = _real_key_of_tmp(key)
            if key.startswith(prefix) or (real is not None and real.startswith(prefix)):
                out.append(ObjectVersion(key, None))
    return sorted(out, key=lambda v: v.key)


def _real_key_of_tmp(key: str) -> str | None:
    """`dir/.name.<hex>.tmp` (LocalObjectStore.put's temp file) -> `dir/name`."""
    head, _, name = key.rpartition("/")
    if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
        return None
    real = name[1:].removesuffix(TMP_SUFFIX).rsplit(".", 1)[0]
    return f"{head}/{real}" if head else real


def _is_local_tmp_of(candidate: str, key: str) -> bool:
    return _real_key_of_tmp(candidate) == key


def read_version(store: ObjectStore, version: ObjectVersion) -> bytes:
    """The bytes of one stored version (not a delete marker): what erasure reads of an object that no
    row records, to know whose it is, even when its current version is a delete marker."""
    if version.delete_marker:
        raise ValueError(f"{version.key}@{version.version_id} is a delete marker: it holds no bytes")
    if isinstance(store, S3ObjectStore):
        extra = {"VersionId": version.version_id} if version.version_id else {}
        with s3_errors("get version", store.bucket, version.key):
            body: bytes = store.client.get_object(Bucket=store.bucket, Key=version.key, **extra)[
                "Body"
            ].read()
        return body
    if isinstance(store, LocalObjectStore):
        return (store.root / check_key(version.key)).read_bytes()
    raise TypeError(f"{type(store).__name__} cannot read object versions: erasure needs a local or S3 store")


def kept_version(version_id: str | None) -> bool:
    """Whether a put's `version_id` names a version the bucket keeps when the key is deleted or
    overwritten (versioning Enabled when it was written). None (a local store, a bucket without
    versioning) and S3's "null" (versioning Suspended: the next write of the key replaces it) do not."""
    return bool(version_id) and version_id != "null"


def make_current(store: ObjectStore, key: str, version_id: str) -> bool:
    """Copy the stored version `version_id` of `key` on top, as its current version (the bytes of a
    backup deleted or overwritten after it was verified). False when the store keeps no versions or
    that version is gone."""
    if not isinstance(store, S3ObjectStore) or not kept_version(version_id):
        return False
    if not any(
        v.key == key and v.version_id == version_id and not v.delete_marker for v in list_versions(store, key)
    ):
        return False
    with s3_errors("copy version", store.bucket, key):
        store.client.copy_object(
            Bucket=store.bucket,
            Key=key,
            CopySource={"Bucket": store.bucket, "Key": key, "VersionId": version_id},
        )
    return True


def list_folders(store: ObjectStore, prefix: str) -> list[str]:
    """The folders directly under `prefix` (full key prefixes ending in '/') holding any version."""
    if isinstance(store, S3ObjectStore):
        out: set[str] = set()
        kwargs: dict[str, Any] = {"Bucket": store.bucket, "Prefix": prefix, "Delimiter": "/"}
        while True:
            with s3_errors("list folders", store.bucket, prefix):
                page = store.client.list_object_versions(**kwargs)
            out |= {p["Prefix"] for p in page.get("CommonPrefixes", ())}
            if not page.get("IsTruncated"):
                return sorted(out)
            kwargs["KeyMarker"] = page.get("NextKeyMarker")
            kwargs["VersionIdMarker"] = page.get("NextVersionIdMarker")
    if isinstance(store, LocalObjectStore):
        base = store.root / prefix
        return sorted(f"{prefix}{p.name}/" for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    raise TypeError(f"{type(store).__name__} cannot list folders: erasure needs a local or S3 store")
