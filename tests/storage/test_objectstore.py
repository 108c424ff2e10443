"""Object storage against a real filesystem and a real S3 server (SeaweedFS on loopback). No mocks."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_lib.core.config import Settings
from memory_lib.core.errors import IntegrityError, InvalidInputError, ObjectNotFoundError, ObjectStoreError
from memory_lib.storage.objectstore import (
    LocalObjectStore,
    ObjectStore,
    S3ObjectStore,
    object_store_from_settings,
    s3_client,
)
from testing.seaweedfs import S3Endpoint

BUCKET = "memory-archive-test"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _doc(n: int = 0) -> bytes:
    return json.dumps({"id": str(uuid.uuid4()), "n": n, "content": "remember the milk"}).encode()


@pytest.fixture(scope="module")
def raw_s3(seaweed: S3Endpoint):
    """The session's SeaweedFS (tests/fix_store.py), with this module's bucket."""
    client = seaweed.client()
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        seaweed.create_bucket(BUCKET)
    return client


@dataclass
class StoreCase:
    store: ObjectStore
    tamper: Callable[[str, bytes], None]  # replace an object's bytes behind the store's back


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCase:
    prefix = f"t-{uuid.uuid4().hex[:8]}"  # one shared bucket: each test gets its own prefix
    if request.param == "local":
        local = LocalObjectStore(tmp_path / "objects", prefix)

        def tamper_file(key: str, data: bytes) -> None:
            (local.root / key).write_bytes(data)

        return StoreCase(local, tamper_file)
    seaweed: S3Endpoint = request.getfixturevalue("seaweed")
    raw = request.getfixturevalue("raw_s3")
    client = s3_client(seaweed.endpoint_url, seaweed.region, seaweed.access_key, seaweed.secret_key)
    s3 = S3ObjectStore(client, BUCKET, prefix)

    def tamper_object(key: str, data: bytes) -> None:
        # A correct SHA256 checksum for the new bytes: the server accepts them as a valid upload.
        raw.put_object(Bucket=BUCKET, Key=key, Body=data, ChecksumAlgorithm="SHA256")

    return StoreCase(s3, tamper_object)


@pytest.fixture
def s3store(seaweed: S3Endpoint, raw_s3) -> S3ObjectStore:
    client = s3_client(seaweed.endpoint_url, seaweed.region, seaweed.access_key, seaweed.secret_key)
    return S3ObjectStore(client, BUCKET, f"t-{uuid.uuid4().hex[:8]}")


def test_round_trip(case: StoreCase) -> None:
    store = case.store
    assert isinstance(store, ObjectStore)
    data = _doc()
    key = store.key_for(uuid.uuid4())
    assert store.head(key) is None

    stored = store.put(key, data, _sha(data))

    assert (stored.key, stored.sha256, stored.size) == (key, _sha(data), len(data))
    assert stored.ref == store.ref_for(key)
    assert store.key_from_ref(stored.ref) == key
    head = store.head(key)
    assert head is not None and (head.sha256, head.size) == (_sha(data), len(data))
    assert store.verify(key, _sha(data), len(data)).sha256 == _sha(data)
    assert store.get(key) == data
    assert store.get_verified(key, _sha(data)) == data
    assert list(store.list()) == [key]
    assert list(store.list("memories/")) == [key]
    assert list(store.list("other/")) == []

    store.delete(key)
    assert store.head(key) is None
    assert list(store.list()) == []


def test_overwrite_replaces_the_object(case: StoreCase) -> None:
    store, key = case.store, case.store.key_for(uuid.uuid4())
    first, second = _doc(1), _doc(2) + b" "
    store.put(key, first, _sha(first))
    stored = store.put(key, second, _sha(second))
    assert (stored.sha256, stored.size) == (_sha(second), len(second))
    assert store.get_verified(key, _sha(second)) == second


def test_put_with_wrong_sha256_writes_nothing(case: StoreCase) -> None:
    store, key, data = case.store, case.store.key_for(uuid.uuid4()), _doc()
    with pytest.raises(IntegrityError) as info:
        store.put(key, data, _sha(b"something else"))
    assert key in str(info.value)
    assert store.head(key) is None
    assert list(store.list()) == []


@pytest.mark.parametrize("same_size", [True, False])
def test_tampered_object_fails_verification(case: StoreCase, same_size: bool) -> None:
    store, key, data = case.store, case.store.key_for(uuid.uuid4()), _doc()
    store.put(key, data, _sha(data))
    forged = data.replace(b"milk", b"MILK") if same_size else data + b"\n"
    case.tamper(key, forged)

    with pytest.raises(IntegrityError) as info:
        store.verify(key, _sha(data), len(data))
    assert key in str(info.value)
    assert ("sha256" if same_size else "size") in info.value.what
    with pytest.raises(IntegrityError):
        store.get_verified(key, _sha(data))
    assert store.get(key) == forged  # plain get returns what is there; callers use get_verified


def test_missing_key(case: StoreCase) -> None:
    store, key = case.store, case.store.key_for(uuid.uuid4())
    with pytest.raises(ObjectNotFoundError) as info:
        store.get(key)
    assert info.value.key == key
    with pytest.raises(ObjectNotFoundError):
        store.get_verified(key, _sha(b""))
    with pytest.raises(ObjectNotFoundError):
        store.verify(key, _sha(b""), 0)


def test_delete_is_idempotent(case: StoreCase) -> None:
    store, key, data = case.store, case.store.key_for(uuid.uuid4()), _doc()
    store.delete(key)  # never existed
    store.put(key, data, _sha(data))
    store.delete(key)
    store.delete(key)
    assert store.head(key) is None


def test_list_returns_all_keys_in_order(case: StoreCase) -> None:
    store = case.store
    if isinstance(store, S3ObjectStore):
        store.list_page_size = 10
    keys = sorted(store.key_for(uuid.uuid4()) for _ in range(25))
    for key in keys:
        store.put(key, b"{}", _sha(b"{}"))
    store.put(f"{store.prefix}/other/x.json", b"{}", _sha(b"{}"))

    assert list(store.list("memories/")) == keys
    assert len(list(store.list())) == 26


@pytest.mark.s3
def test_s3_list_paginates(s3store: S3ObjectStore) -> None:
    s3store.list_page_size = 10
    keys = sorted(s3store.key_for(uuid.uuid4()) for _ in range(25))
    for key in keys:
        s3store.put(key, b"{}", _sha(b"{}"))
    pages: list[int] = []

    def count(parsed: dict, **_: object) -> None:
        pages.append(len(parsed.get("Contents", [])))

    s3store.client.meta.events.register("after-call.s3.ListObjectsV2", count)
    assert list(s3store.list()) == keys
    assert pages == [10, 10, 5]


@pytest.mark.parametrize("key", ["../escape.json", "a/../../escape.json", "/etc/passwd", "a//b", "", "a/./b"])
def test_keys_escaping_the_root_are_rejected(case: StoreCase, key: str) -> None:
    for call in (
        lambda: case.store.put(key, b"{}", _sha(b"{}")),
        lambda: case.store.get(key),
        lambda: case.store.head(key),
        lambda: case.store.delete(key),
    ):
        with pytest.raises(InvalidInputError) as info:
            call()
        assert info.value.field == "key"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b.json", ".", "..", "", "...", "\\", "c\0"]), min_size=1, max_size=6))
def test_accepted_keys_stay_inside_the_root(parts: list[str]) -> None:
    store = LocalObjectStore(Path("/srv/objects"))
    key = "/".join(parts)
    try:
        ref = store.ref_for(key)
    except InvalidInputError as e:
        assert e.field == "key"
        return
    path = Path(ref.removeprefix("file://"))
    assert os.path.normpath(path) == str(path) and path.is_relative_to(store.root)
    assert store.key_from_ref(ref) == key


def test_local_rejects_symlink_out_of_root(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "root", "p")
    (tmp_path / "root" / "p").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "root" / "p" / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(InvalidInputError):
        store.put("p/link/x.json", b"{}", _sha(b"{}"))
    assert list((tmp_path / "outside").iterdir()) == []


def test_ref_of_another_store_is_rejected(case: StoreCase) -> None:
    for ref in ("s3://another-bucket/p/memories/x.json", "file:///elsewhere/p/x.json", "", "p/x.json"):
        with pytest.raises(InvalidInputError) as info:
            case.store.key_from_ref(ref)
        assert info.value.field == "storage_ref"
    with pytest.raises(InvalidInputError) as info:
        case.store.key_from_ref(case.store.ref_for("p/x.json").replace("p/x.json", "p/../../x.json"))
    assert info.value.field == "storage_ref"


def test_key_for_prefixes(tmp_path: Path) -> None:
    oid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert LocalObjectStore(tmp_path).key_for(oid) == f"memory-archive/memories/{oid}.json"
    assert LocalObjectStore(tmp_path, "/a/b/").key_for(oid) == f"a/b/memories/{oid}.json"
    assert LocalObjectStore(tmp_path, "").key_for(oid) == f"memories/{oid}.json"
    assert S3ObjectStore(None, "bkt", "").ref_for(f"memories/{oid}.json") == f"s3://bkt/memories/{oid}.json"
    local = LocalObjectStore(tmp_path)
    assert local.ref_for("k/x.json") == f"file://{tmp_path.resolve()}/k/x.json"


def test_local_put_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    keys = {store.key_for(uuid.uuid4()) for _ in range(3)}
    for key in keys:
        for n in range(3):  # overwrites go through the temp file too
            data = _doc(n)
            store.put(key, data, _sha(data))
    files = {p.relative_to(store.root).as_posix() for p in store.root.rglob("*") if p.is_file()}
    assert files == keys
    # A temp file left by a crash is not an object.
    (store.root / store.prefix / "memories" / ".x.json.abc.tmp").write_bytes(b"partial")
    assert set(store.list()) == keys


@pytest.mark.s3
def test_s3_server_rejects_body_not_matching_checksum(raw_s3, s3store: S3ObjectStore) -> None:
    key = s3store.key_for(uuid.uuid4())
    with pytest.raises(ClientError) as info:
        raw_s3.put_object(
            Bucket=BUCKET,
            Key=key,
            Body=b'{"a": 1}',
            ChecksumSHA256=base64.b64encode(hashlib.sha256(b'{"a": 2}').digest()).decode(),
        )
    assert info.value.response["Error"]["Code"] == "BadDigest"
    assert s3store.head(key) is None


@pytest.mark.s3
def test_s3_head_returns_checksum_without_get(s3store: S3ObjectStore) -> None:
    """SeaweedFS returns ChecksumSHA256 on HEAD: verification needs no GET."""
    data = _doc()
    key = s3store.key_for(uuid.uuid4())
    s3store.put(key, data, _sha(data))
    response = s3store.client.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    assert base64.b64decode(response["ChecksumSHA256"]).hex() == _sha(data)
    assert response["Metadata"] == {"sha256": _sha(data)}
    assert s3store.verify(key, _sha(data), len(data)).sha256 == _sha(data)
    assert s3store.verified_by_get == 0


@pytest.mark.s3
def test_s3_object_without_sha256_checksum_is_verified_by_get(
    raw_s3, s3store: S3ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    # Uploaded by another tool with botocore's default CRC32: HEAD carries no SHA256 to compare.
    data = _doc()
    key = s3store.key_for(uuid.uuid4())
    raw_s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    assert "ChecksumSHA256" not in raw_s3.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")

    with caplog.at_level(logging.WARNING, logger="memory_lib.storage.objectstore"):
        assert s3store.verify(key, _sha(data), len(data)).sha256 == _sha(data)
    assert s3store.verified_by_get == 1
    assert "verifying objects by GET" in caplog.text
    with pytest.raises(IntegrityError):
        s3store.verify(key, _sha(data + b"x"), len(data))


@pytest.mark.s3
def test_s3_metadata_disagreeing_with_record_fails(raw_s3, s3store: S3ObjectStore) -> None:
    data = _doc()
    key = s3store.key_for(uuid.uuid4())
    raw_s3.put_object(
        Bucket=BUCKET, Key=key, Body=data, ChecksumAlgorithm="SHA256", Metadata={"sha256": "0" * 64}
    )
    with pytest.raises(IntegrityError) as info:
        s3store.verify(key, _sha(data), len(data))
    assert "metadata" in info.value.what


@pytest.mark.s3
def test_s3_wrong_secret_is_an_object_store_error(seaweed: S3Endpoint) -> None:
    wrong = "0" * len(seaweed.secret_key)
    store = S3ObjectStore(
        s3_client(seaweed.endpoint_url, "us-east-1", seaweed.access_key, wrong), BUCKET, "t"
    )
    data = _doc()
    with pytest.raises(IntegrityError):  # checked before any request is made
        store.put(store.key_for(uuid.uuid4()), data, _sha(b"other"))
    for call in (
        lambda: store.put(store.key_for(uuid.uuid4()), data, _sha(data)),
        lambda: store.get("t/x.json"),
        lambda: store.head("t/x.json"),
        lambda: list(store.list()),
    ):
        with pytest.raises(ObjectStoreError) as info:
            call()
        assert not isinstance(info.value, ObjectNotFoundError)
        message = str(info.value)
        assert "403" in message or "SignatureDoesNotMatch" in message or "AccessDenied" in message
        assert wrong not in message and seaweed.access_key not in message


@pytest.mark.s3
def test_s3_missing_bucket_is_an_error_not_a_missing_key(seaweed: S3Endpoint) -> None:
    client = s3_client(seaweed.endpoint_url, "us-east-1", seaweed.access_key, seaweed.secret_key)
    store = S3ObjectStore(client, "no-such-bucket-here", "t")
    with pytest.raises(ObjectStoreError) as info:
        store.get("t/x.json")
    assert not isinstance(info.value, ObjectNotFoundError)
    assert "NoSuchBucket" in str(info.value)


@pytest.mark.s3
def test_store_from_settings(tmp_path: Path, seaweed: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    local = object_store_from_settings(Settings(state_dir=tmp_path / "state"))
    assert isinstance(local, LocalObjectStore)
    assert local.root == (tmp_path / "state" / "objects").resolve() and local.root.is_dir()

    # Credentials through the standard AWS environment variables.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings.from_env(
        {
            "MEMORY_ARCHIVE_BUCKET": BUCKET,
            "MEMORY_ARCHIVE_PREFIX": "/from-settings/",
            "MEMORY_ARCHIVE_S3_ENDPOINT_URL": seaweed.endpoint_url,
            "AWS_REGION": "us-east-1",
        }
    )
    s3 = object_store_from_settings(settings)
    assert isinstance(s3, S3ObjectStore) and s3.prefix == "from-settings"
    data = _doc()
    key = s3.key_for(uuid.uuid4())
    assert s3.put(key, data, _sha(data)).ref == f"s3://{BUCKET}/{key}"
    assert s3.get_verified(key, _sha(data)) == data


def test_objectstore_does_not_import_dagster() -> None:
    import subprocess
    import sys

    code = "import sys, memory_lib.storage.objectstore; sys.exit('dagster' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
