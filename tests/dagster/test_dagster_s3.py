"""One S3 configuration: the Dagster object store checks its bucket at the start of a run, against
the session's SeaweedFS (which would create a missing bucket on the first PUT)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, cast

import dagster as dg
import pytest
from botocore.exceptions import ClientError
from dagster_aws.s3 import S3Resource

from memory_assets.resources import ObjectStoreResource
from memory_lib.core.errors import ObjectStoreError


def s3_resource(seaweed, bucket: str) -> ObjectStoreResource:
    s3 = S3Resource(
        endpoint_url=seaweed.endpoint_url,
        region_name=seaweed.region,
        aws_access_key_id=seaweed.access_key,
        aws_secret_access_key=seaweed.secret_key,
    )
    return ObjectStoreResource(kind="s3", bucket=bucket, prefix="test", s3=s3)


def bucket_exists(seaweed, bucket: str) -> bool:
    try:
        seaweed.client().head_bucket(Bucket=bucket)
    except ClientError:
        return False
    return True


def test_a_missing_bucket_fails_the_setup_naming_it_and_is_not_created(seaweed):
    bucket = f"missing-{os.urandom(4).hex()}"
    with (
        pytest.raises(dg.DagsterResourceFunctionError) as err,
        dg.build_resources({"object_store": s3_resource(seaweed, bucket)}),
    ):
        pass
    cause = err.value.__cause__
    assert isinstance(cause, ObjectStoreError)
    assert f"bucket '{bucket}' at {seaweed.endpoint_url} does not exist" in str(cause)
    assert not bucket_exists(seaweed, bucket)  # checked before any PUT: SeaweedFS did not auto-create it


def test_the_resource_and_the_cli_refuse_a_missing_bucket_through_one_preflight(seaweed):
    from memory_lib.core.config import ObjectStoreConfig
    from memory_lib.core.errors import ObjectStoreConfigError
    from memory_lib.preflight import check_object_store
    from memory_lib.storage.objectstore import s3_client

    bucket = f"missing-{os.urandom(4).hex()}"
    with (
        pytest.raises(dg.DagsterResourceFunctionError) as err,
        dg.build_resources({"object_store": s3_resource(seaweed, bucket)}),
    ):
        pass
    client = s3_client(seaweed.endpoint_url, seaweed.region, seaweed.access_key, seaweed.secret_key)
    with pytest.raises(ObjectStoreConfigError) as lib:
        check_object_store(
            ObjectStoreConfig(kind="s3", bucket=bucket),
            Path("unused"),
            client=client,
            endpoint=seaweed.endpoint_url,
        )
    assert type(err.value.__cause__) is ObjectStoreConfigError and str(err.value.__cause__) == str(lib.value)
    assert "MEMORY_ARCHIVE_BUCKET" in str(lib.value)
    assert not bucket_exists(seaweed, bucket)


def test_a_run_on_a_missing_bucket_fails_before_any_step(seaweed):
    bucket = f"missing-{os.urandom(4).hex()}"

    @dg.asset
    def writes_a_backup(object_store: ObjectStoreResource) -> None:
        object_store.get_store().put("memories/x.json", b"{}", hashlib.sha256(b"{}").hexdigest())

    result = dg.materialize(
        [writes_a_backup], resources={"object_store": s3_resource(seaweed, bucket)}, raise_on_error=False
    )
    assert not result.success
    assert not result.get_asset_materialization_events()
    run_failure = result.get_run_failure_event().message
    assert run_failure is not None
    failure = run_failure + "".join(
        # a failure event's data is a StepFailureData (Dagster types it as the union of every event's data)
        str(cast(Any, e.event_specific_data).error.cause)
        for e in result.all_events
        if e.is_failure and e.event_specific_data
    )
    assert bucket in failure
    assert not bucket_exists(seaweed, bucket)


def run_log(seaweed, bucket: str) -> tuple[str | None, str]:
    """A run using the store: the versioning found at setup, and the run's event log as the UI shows it."""
    found: list[str | None] = []

    @dg.asset
    def uses_the_store(object_store: ObjectStoreResource) -> None:
        found.append(object_store.versioning)
        store = object_store.get_store()  # the store of a checked bucket works as before
        store.put("memories/x.json", b"{}", hashlib.sha256(b"{}").hexdigest())
        assert store.get("memories/x.json") == b"{}"

    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [uses_the_store], resources={"object_store": s3_resource(seaweed, bucket)}, instance=instance
        )
        assert result.success
        logs = "\n".join(f"{e.level} {e.user_message}" for e in instance.all_logs(result.run_id))
    return found[0], logs


def test_versioning_is_reported_and_warned_when_off(seaweed):
    bucket = seaweed.create_bucket(f"plain-{os.urandom(4).hex()}")
    versioning, logs = run_log(seaweed, bucket)
    assert versioning == "Off"
    assert f"{logging.WARNING} bucket '{bucket}': versioning Off: turn it on" in logs


def test_a_versioned_bucket_is_reported_enabled(seaweed):
    bucket = seaweed.create_bucket(f"versioned-{os.urandom(4).hex()}")
    seaweed.client().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    versioning, logs = run_log(seaweed, bucket)
    assert versioning == "Enabled"
    assert (
        f"{logging.INFO} bucket '{bucket}': exists, versioning Enabled" in logs
        and "versioning Off" not in logs
    )


def test_the_local_store_has_no_bucket_to_check(tmp_path):
    with dg.build_resources(
        {"object_store": ObjectStoreResource(kind="local", local_root=str(tmp_path))}
    ) as r:
        assert r.object_store.versioning is None
