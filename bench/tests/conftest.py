"""The bench's own tests: every benchmark at its smoke size and the bench's helpers. They live with the
bench (bench and tests never import each other) and take their SeaweedFS from the testing package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testing.seaweedfs import S3Endpoint, run_seaweedfs


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    with run_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as endpoint:
        yield endpoint


@pytest.fixture(autouse=True)
def _fresh_boto3_default_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3.client() uses one default session, which keeps the credentials it first resolved: each bench
    run in this process resolves the AWS variables its test sets."""
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
