"""Object storage for archived memories: a local directory or an S3-compatible bucket.

Every write is verified before it is reported as stored, and every read can be checked against
the sha256 recorded in Postgres. Plain Python on purpose: no Dagster import here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import re
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError

from ..core.errors import (
    ConfigError,
    IntegrityError,
    InvalidInputError,
    ObjectNotFoundError,
    ObjectStoreError,
)
from ..core.models import sha256_hex

if TYPE_CHECKING:
    from ..core.config import Settings

logger = logging.getLogger(__name__)

TMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class StoredObject:
    """An object as the store holds it; `sha256` is lowercase hex of its bytes."""

    key: str
    ref: str
    sha256: str
    size: int
    version_id: str | None = None


class BackupReader(Protocol):
    """What reads a backup back by its ref, checked against its sha256 (every ObjectStore is one)."""

    def read_ref(self, ref: str, sha256: str) -> bytes: ...


@runtime_checkable
class ObjectStore(Protocol):
    """What the archiver needs from object storage. Keys are '/'-separated relative paths."""

    prefix: str

    def key_for(self, original_id: uuid.UUID) -> str: ...
    def put(self, key: str, data: bytes, sha256: str) -> StoredObject: ...
    def head(self, key: str) -> StoredObject | None: ...
    def verify(self, key: str, sha256: str, size: int) -> StoredObject: ...
    def get(self, key: str) -> bytes: ...
    def get_verified(self, key: str, sha256: str) -> bytes: ...
    def delete(self, key: str) -> None: ...
    def list(self, prefix: str = "") -> Iterator[str]: ...
    def ref_for(self, key: str) -> str: ...
    def key_from_ref(self, ref: str) -> str: ...
    def member_ref(self, key: str, start: int, size: int) -> str: ...
    def locate(self, ref: str) -> tuple[str, tuple[int, int] | None]: ...
    def get_range(self, key: str, start: int, size: int) -> bytes: ...
    def read_ref(self, ref: str, sha256: str) -> bytes: ...


# A backup inside a pack (memory_lib.storage.packs) is addressed by its object's ref plus the member's byte
# range, HTTP style and inclusive: "<ref>#bytes=<first>-<last>". A ref without it is a whole object.
_MEMBER = re.compile(r"#bytes=(\d{1,15})-(\d{1,15})\Z")


def check_key(key: str) -> str:
    """Reject keys that are not plain relative paths: they could escape a local root, and a key
    accepted by one store must mean the same object in the other."""
    if not isinstance(key, str) or not key:
        raise InvalidInputError("key", key, "must be a non-empty string")
    if key.startswith("/") or "\\" in key or "\0" in key or "#" in key:
        raise InvalidInputError("key", key, "must be a relative '/'-separated path")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidInputError("key", key, "must not contain empty, '.' or '..' segments")
    return key


class _BaseStore:
    prefix: str

    def __init__(self, prefix: str):
        self.prefix = prefix.strip("/")

    def key_for(self, original_id: uuid.UUID) -> str:
        name = f"memories/{original_id}.json"
        return f"{self.prefix}/{name}" if self.prefix else name

    def _ref_start(self) -> str:
        """What every ref of this store starts with: a scheme and the store's root or bucket."""
        raise NotImplementedError

    def ref_for(self, key: str) -> str:
        return f"{self._ref_start()}{check_key(key)}"

    def key_from_ref(self, ref: str) -> str:
        """The object a ref names (for a pack member: the pack)."""
        return self.locate(ref)[0]

    def member_ref(self, key: str, start: int, size: int) -> str:
        """The ref of `size` bytes at `start` inside the object `key` (a pack member)."""
        if start < 0 or size <= 0:
            raise InvalidInputError("member range", (start, size), "must be a non-empty range at offset >= 0")
        return f"{self.ref_for(key)}#bytes={start}-{start + size - 1}"

    def locate(self, ref: str) -> tuple[str, tuple[int, int] | None]:
        """(key, None) for a whole object's ref; (key, (start, size)) for a pack member's."""
        start = self._ref_start()
        if not isinstance(ref, str) or not ref.startswith(start):
            raise InvalidInputError("storage_ref", ref, f"not an object of this store ({start})")
        rest, member = ref[len(start) :], None
        if "#" in rest:
            found = _MEMBER.search(rest)
            if found is None or found.start() != rest.index("#"):
                raise InvalidInputError(
                    "storage_ref", ref, "has a fragment that is not '#bytes=<first>-<last>'"
                )
            first, last = int(found[1]), int(found[2])
            if last < first:
                raise InvalidInputError("storage_ref", ref, "names an empty byte range")
            rest, member = rest[: found.start()], (first, last - first + 1)
        try:
            return check_key(rest), member
        except InvalidInputError as e:
            raise InvalidInputError("storage_ref", ref, e.reason) from None

    def get_range(self, key: str, start: int, size: int) -> bytes:
        raise NotImplementedError

    def read_ref(self, ref: str, sha256: str) -> bytes:
        """The bytes a ref names (a whole object or a pack member), checked against `sha256`."""
        key, member = self.locate(ref)
        if member is None:
            return self.get_verified(key, sha256)
        data = self.get_range(key, *member)
        if len(data) != member[1]:
            raise IntegrityError(f"{ref} (size)", str(member[1]), str(len(data)))
        actual = sha256_hex(data)
        if actual != sha256:
            raise IntegrityError(f"{ref} (sha256)", sha256, actual)
        return data

    def _list_prefix(self, prefix: str) -> str:
        prefix = prefix.lstrip("/")
        return f"{self.prefix}/{prefix}" if self.prefix else prefix

    def head(self, key: str) -> StoredObject | None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def verify(self, key: str, sha256: str, size: int) -> StoredObject:
        """The stored object if its size and sha256 are the expected ones, else IntegrityError."""
        obj = self.head(key)
        if obj is None:
            raise ObjectNotFoundError(key)
        _check_stored(obj, sha256, size)
        return obj

    def get_verified(self, key: str, sha256: str) -> bytes:
        data = self.get(key)
        actual = sha256_hex(data)
        if actual != sha256:
            raise IntegrityError(f"{key} (sha256)", sha256, actual)
        return data

    def _check_put(self, key: str, data: bytes, sha256: str) -> None:
        check_key(key)
        actual = sha256_hex(data)
        if actual != sha256:  # the caller's record would not describe what we store
            raise IntegrityError(f"{key} (sha256 of data to put)", sha256, actual)


def _check_stored(obj: StoredObject, sha256: str, size: int) -> None:
    if obj.size != size:
        raise IntegrityError(f"{obj.key} (size)", str(size), str(obj.size))
    if obj.sha256 != sha256:
        raise IntegrityError(f"{obj.key} (sha256)", sha256, obj.sha256)


LOCAL_ROOT_FIELD = "object_store.local_root"
LOCAL_ROOT_VARIABLE = "MEMORY_ARCHIVE_LOCAL_ROOT"
# Kernel pseudo-filesystems: a directory there is never a place for files, whatever access() says.
_PSEUDO_FS = (Path("/proc"), Path("/sys"))


def local_root_problem(root: Path) -> str | None:
    """Why the absolute path `root` cannot be a local store's root, or None: it is a writable directory,
    or one can be created there. Reads the file system only, creates nothing."""
    for pseudo in _PSEUDO_FS:
        if root.is_relative_to(pseudo):
            return f"is under {pseudo}, a kernel pseudo-filesystem: choose a writable directory"
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        if existing == root:
            return "is an existing file, not a directory"
        return f"cannot be created: {existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return "is not writable" if existing == root else f"cannot be created: {existing} is not writable"
    return None


class LocalObjectStore(_BaseStore):
    """Objects as files under `root`; ref `file://<abs root>/<key>`."""

    def __init__(self, root: Path, prefix: str = "memory-archive"):
        super().__init__(prefix)
        self.root = Path(root).resolve()
        if (problem := local_root_problem(self.root)) is not None:
            raise InvalidInputError(LOCAL_ROOT_FIELD, str(root), problem)

    def _path(self, key: str) -> Path:
        path = self.root / check_key(key)
        # A symlink inside the root could still point outside it.
        if not path.resolve().is_relative_to(self.root):
            raise InvalidInputError("key", key, f"resolves outside the store root {self.root}")
        return path

    def _ref_start(self) -> str:
        return f"file://{self.root}/"

    def put(self, key: str, data: bytes, sha256: str) -> StoredObject:
        """Write atomically and durably (temp file, fsync, rename, fsync dir), then re-read to verify."""
        self._check_put(key, data, sha256)
        path = self._path(key)
        try:
            _makedirs(path.parent)
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}{TMP_SUFFIX}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            _fsync_dir(path.parent)
        except OSError as e:
            raise ObjectStoreError(f"write {key} under {self.root} failed: {e.strerror or e}") from e
        return self.verify(key, sha256, len(data))

    def head(self, key: str) -> StoredObject | None:
        """Size and sha256 computed from the file itself: for a local store that is the verification."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
                size = os.fstat(f.fileno()).st_size
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as e:
            raise ObjectStoreError(f"read {key} under {self.root} failed: {e.strerror or e}") from e
        return StoredObject(key, self.ref_for(key), digest, size)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        except OSError as e:
            raise ObjectStoreError(f"read {key} under {self.root} failed: {e.strerror or e}") from e

    def get_range(self, key: str, start: int, size: int) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(size)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        except OSError as e:
            raise ObjectStoreError(f"read {key} under {self.root} failed: {e.strerror or e}") from e

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
            if path.parent.is_dir():
                _fsync_dir(path.parent)
        except OSError as e:
            raise ObjectStoreError(f"delete {key} under {self.root} failed: {e.strerror or e}") from e

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under the store prefix + `prefix`, sorted like S3 lists them; temp files skipped."""
        full = self._list_prefix(prefix)
        if any(part in (".", "..") for part in full.split("/")):
            raise InvalidInputError("prefix", prefix, "must not contain '.' or '..' segments")
        # Walk only the deepest directory the prefix names completely.
        base = self.root.joinpath(*full.split("/")[:-1]) if "/" in full else self.root
        if not base.is_dir():
            return
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in files:
                if name.startswith(".") and name.endswith(TMP_SUFFIX):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(full):
                    keys.append(key)
        yield from sorted(keys, key=lambda k: k.encode())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs(path: Path) -> None:
    """mkdir -p that also fsyncs the parent of each new directory, so a new entry survives a crash."""
    if path.is_dir():
        return
    _makedirs(path.parent)
    try:
        path.mkdir()
    except FileExistsError:
        return
    _fsync_dir(path.parent)


class S3ObjectStore(_BaseStore):
    """Objects in an S3-compatible bucket; ref `s3://<bucket>/<key>`.

    Verification is a HEAD that returns the length and the SHA256 checksum the server checked
    on upload (S3, SeaweedFS and R2 do). Servers that return no SHA256 checksum on HEAD are
    verified by GET + sha256 of the body instead; `verified_by_get` counts those fallbacks.
    """

    def __init__(
        self, client: Any, bucket: str, prefix: str = "memory-archive", *, list_page_size: int = 1000
    ):
        super().__init__(prefix)
        self.client = client
        self.bucket = bucket
        self.list_page_size = list_page_size
        self.verified_by_get = 0
        self.verified_by_head = 0

    def _ref_start(self) -> str:
        return f"s3://{self.bucket}/"

    def put(self, key: str, data: bytes, sha256: str) -> StoredObject:
        """Upload with a SHA256 checksum the server must check (it rejects a mismatch).

        The PUT's response is the write's verification when it echoes that SHA256 (S3, SeaweedFS and
        R2 do): the server computed it over what it stored. (The ETag is no proof: with SSE-KMS it is
        not the MD5 of the bytes.) A server that echoes none costs a HEAD (`verified_by_head` counts
        those). The full read-back is the archiver's fidelity step, not this.
        """
        self._check_put(key, data, sha256)
        digest = bytes.fromhex(sha256)
        checksum = base64.b64encode(digest).decode()
        with s3_errors("put", self.bucket, key):
            response = self.client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=data,
                ContentType="application/json",
                ChecksumAlgorithm="SHA256",
                ChecksumSHA256=checksum,
                Metadata={"sha256": sha256},
            )
        echoed = response.get("ChecksumSHA256")
        if echoed is not None and echoed != checksum:
            raise IntegrityError(f"{key} (sha256 the server stored)", checksum, str(echoed))
        if echoed is None:
            self.verified_by_head += 1
            obj = self.verify(key, sha256, len(data))
            if obj.version_id is None and response.get("VersionId"):
                obj = replace(obj, version_id=response["VersionId"])
            return obj
        return StoredObject(key, self.ref_for(key), sha256, len(data), response.get("VersionId"))

    def head(self, key: str) -> StoredObject | None:
        """Size and sha256 from HEAD; from GET + sha256 when the server gives no SHA256 checksum."""
        found = self._head(key)
        return None if found is None else found[0]

    def _head(self, key: str) -> tuple[StoredObject, str | None] | None:
        """(object, hex sha256 from the object's metadata if any) or None if there is no such key."""
        check_key(key)
        try:
            with s3_errors("head", self.bucket, key):
                response = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except ObjectNotFoundError:
            return None
        meta = (response.get("Metadata") or {}).get("sha256")
        digest = _full_object_sha256(response)
        if digest is None:
            # No server checksum to trust: the object's own bytes are the only proof.
            if self.verified_by_get == 0:
                logger.warning(
                    "s3://%s returned no SHA256 checksum on HEAD (%s); verifying objects by GET + sha256",
                    self.bucket,
                    key,
                )
            self.verified_by_get += 1
            try:
                data, version_id = self._get(key)
            except ObjectNotFoundError:
                return None
            return StoredObject(key, self.ref_for(key), sha256_hex(data), len(data), version_id), meta
        obj = StoredObject(
            key, self.ref_for(key), digest, response["ContentLength"], response.get("VersionId")
        )
        return obj, meta

    def verify(self, key: str, sha256: str, size: int) -> StoredObject:
        found = self._head(key)
        if found is None:
            raise ObjectNotFoundError(key)
        obj, meta = found
        _check_stored(obj, sha256, size)
        # The metadata copy is written with the object; a different value means the object was
        # replaced or copied by something other than this store.
        if meta is not None and meta != sha256:
            raise IntegrityError(f"{key} (sha256 metadata)", sha256, meta)
        return obj

    def get(self, key: str) -> bytes:
        check_key(key)
        return self._get(key)[0]

    def _get(self, key: str) -> tuple[bytes, str | None]:
        with s3_errors("get", self.bucket, key):
            # ChecksumMode makes botocore check the body against the server's stored checksum.
            response = self.client.get_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
            return response["Body"].read(), response.get("VersionId")

    def get_range(self, key: str, start: int, size: int) -> bytes:
        """One ranged GET; the caller checks the member's own sha256 (the server's checksum covers
        the whole object, not a range)."""
        check_key(key)
        with s3_errors("get", self.bucket, key):
            response = self.client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + size - 1}"
            )
            return response["Body"].read()

    def delete(self, key: str) -> None:
        """S3 DELETE of a missing key succeeds, so this is idempotent."""
        check_key(key)
        with s3_errors("delete", self.bucket, key):
            self.client.delete_object(Bucket=self.bucket, Key=key)

    def list(self, prefix: str = "") -> Iterator[str]:
        full = self._list_prefix(prefix)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full, "MaxKeys": self.list_page_size}
        while True:
            with s3_errors("list", self.bucket, full):
                page = self.client.list_objects_v2(**kwargs)
            for item in page.get("Contents", ()):
                yield item["Key"]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token


def _full_object_sha256(response: dict[str, Any]) -> str | None:
    """Hex sha256 of the whole object from a HEAD response, or None if the server gave none.

    A multipart upload's COMPOSITE checksum ("<b64>-<parts>") is a hash of part hashes, not of
    the object, so it does not count.
    """
    value = response.get("ChecksumSHA256")
    if not value or response.get("ChecksumType") == "COMPOSITE" or "-" in value:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


@contextmanager
def s3_errors(op: str, bucket: str, key: str) -> Iterator[None]:
    """Translate botocore errors: 404/NoSuchKey → ObjectNotFoundError, the rest → ObjectStoreError.

    Messages carry the operation, object and S3 error code, never request headers or credentials.
    A HEAD has no body, so a missing bucket also reads as a missing key there (plain "404").
    """
    where = f"s3://{bucket}/{key}"
    try:
        yield
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", "?"))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchKey" or (status == 404 and code != "NoSuchBucket"):
            raise ObjectNotFoundError(key) from e
        raise ObjectStoreError(f"s3 {op} {where} failed: {code} (HTTP {status})") from e
    except FlexibleChecksumError as e:  # the body differs from the checksum the server stored
        raise IntegrityError(
            f"{key} (server checksum)",
            str(e.kwargs.get("expected_checksum")),
            str(e.kwargs.get("actual_checksum")),
        ) from e
    except BotoCoreError as e:  # connection, timeout, credentials missing: after botocore's retries
        raise ObjectStoreError(f"s3 {op} {where} failed: {type(e).__name__}: {e}") from e


def s3_client(
    endpoint_url: str | None,
    region_name: str | None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    *,
    connect_timeout: float = 5.0,
    read_timeout: float = 30.0,
    max_attempts: int = 3,
    max_pool_connections: int = 32,
) -> Any:
    """A boto3 S3 client with botocore's standard retries and bounded connect/read timeouts, so a
    frozen endpoint fails a call after about max_attempts × (connect + read timeout), never hangs.

    Credentials come from the standard AWS chain (env, config files, instance role) when not given.
    A custom endpoint (SeaweedFS, MinIO, R2) gets path-style addressing: bucket names need no DNS.
    """
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"mode": "standard", "max_attempts": max_attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        s3={"addressing_style": "path"} if endpoint_url else None,
        # Above the archiver's io_workers (16) and restore's readers, so no thread waits for a connection.
        max_pool_connections=max_pool_connections,
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region_name,
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        config=config,
    )


def object_store_from_settings(settings: Settings) -> ObjectStore:
    cfg = settings.object_store
    if cfg.kind == "s3":
        if not cfg.bucket:  # ObjectStoreConfig already refuses this; narrows the type
            raise InvalidInputError("object_store.bucket", cfg.bucket, "required when kind='s3'")
        client = s3_client(
            cfg.endpoint_url,
            cfg.region_name,
            connect_timeout=cfg.connect_timeout_seconds,
            read_timeout=cfg.read_timeout_seconds,
            max_attempts=cfg.max_attempts,
        )
        return S3ObjectStore(client, cfg.bucket, cfg.prefix)
    return open_local_store(settings.local_object_root, cfg.prefix)


def open_local_store(root: Path, prefix: str = "memory-archive") -> LocalObjectStore:
    """The local store at `root`, created if missing. A root that is not (and cannot become) a writable
    directory raises ConfigError naming MEMORY_ARCHIVE_LOCAL_ROOT and the path; nothing is written."""
    try:
        store = LocalObjectStore(root, prefix)
        _makedirs(store.root)
        return store
    except InvalidInputError as exc:
        reason = exc.reason
    except OSError as exc:
        reason = f"cannot be created: {exc.strerror or exc}"
    raise ConfigError(
        f"invalid {LOCAL_ROOT_VARIABLE}={str(root)!r} ({LOCAL_ROOT_FIELD}): {reason}",
        variable=LOCAL_ROOT_VARIABLE,
        value=str(root),
    )
