"""Fixtures of the Dagster tests: object-store resources on a temporary folder or a SeaweedFS bucket."""

from __future__ import annotations

import os

import pytest
from dagster_aws.s3 import S3Resource

from memory_assets.resources import ObjectStoreResource


@pytest.fixture
def local_store_resource(tmp_path):
    return ObjectStoreResource(kind="local", local_root=str(tmp_path / "objects"), prefix="test")


@pytest.fixture
def s3_store_resource(seaweed):
    bucket = f"dg-{os.urandom(6).hex()}"
    seaweed.create_bucket(bucket)
    s3 = S3Resource(
        endpoint_url=seaweed.endpoint_url,
        region_name=seaweed.region,
        aws_access_key_id=seaweed.access_key,
        aws_secret_access_key=seaweed.secret_key,
    )
    return ObjectStoreResource(kind="s3", bucket=bucket, prefix="test", s3=s3)
