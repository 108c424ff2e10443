"""The object-store fixtures: a local directory store, S3 stores on fresh buckets of the session's
SeaweedFS, and both as one parametrized `object_store`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from memory_lib.storage.objectstore import LocalObjectStore, ObjectStore, S3ObjectStore
from testing.seaweedfs import S3Endpoint


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    from testing.seaweedfs import run_seaweedfs

    with run_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as endpoint:
        yield endpoint


@pytest.fixture
def local_store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects", prefix="test")


@pytest.fixture
def s3_store(seaweed: S3Endpoint) -> S3ObjectStore:
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    seaweed.create_bucket(bucket)
    return S3ObjectStore(seaweed.client(), bucket, prefix="test")


@pytest.fixture
def versioned_store(seaweed: S3Endpoint) -> S3ObjectStore:
    """An S3 store on a fresh SeaweedFS bucket with versioning Enabled (what erasure and recovery need)."""
    bucket = f"v-{uuid.uuid4().hex[:12]}"
    seaweed.create_bucket(bucket)
    client = seaweed.client()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    assert client.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    return S3ObjectStore(client, bucket, prefix="test")


@pytest.fixture(params=["local", "s3"])
def object_store(request: pytest.FixtureRequest) -> ObjectStore:
    store: ObjectStore = request.getfixturevalue(f"{request.param}_store")
    return store


@pytest.fixture(autouse=True)
def _fresh_boto3_default_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3.client() uses one default session, which keeps the credentials it first resolved: each test
    resolves its own (a test that ran earlier with other AWS variables must not decide them)."""
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
