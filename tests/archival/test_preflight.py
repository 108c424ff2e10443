"""memory_lib.preflight, and the CLI's refusals and exit statuses, against the session's real SeaweedFS
(which would create a missing bucket on the first PUT) and the real database."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime

import boto3
import dagster as dg
import psycopg
import pytest

from memory_lib.cli import EXIT_FAILED, EXIT_INPUT, EXIT_UNAVAILABLE, exit_code, main
from memory_lib.core.config import LLMConfig, Settings
from memory_lib.core.errors import (
    IntegrityError,
    ObjectStoreConfigError,
    ObjectStoreError,
    PreflightError,
    SchemaError,
    SummarizationError,
)
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.preflight import UNVERSIONED, check_llm_key, preflight
from memory_lib.storage.db import connect
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.factories import make_memories
from testing.rows import one

ANTHROPIC_SHAPED = "sk-ant-api03-" + "x" * 40
OPENAI_SHAPED = "sk-proj-" + "y" * 40


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bucket_names(seaweed) -> set[str]:
    return {b["Name"] for b in seaweed.client().list_buckets().get("Buckets", [])}


@pytest.fixture
def s3_env(cli_env, seaweed, monkeypatch):
    """cli_env with the S3 store of the session's SeaweedFS (credentials through the AWS variables) and
    eligible memories in the database. Set MEMORY_ARCHIVE_BUCKET per test."""
    monkeypatch.setenv("MEMORY_ARCHIVE_S3_ENDPOINT_URL", seaweed.endpoint_url)
    monkeypatch.setenv("AWS_REGION", seaweed.region)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it caches the credentials it first read
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "MEMORY_ARCHIVE_LOCAL_ROOT",
    ):
        monkeypatch.delenv(name, raising=False)
    with connect(cli_env) as conn:
        insert_memories(
            conn,
            make_memories(
                6,
                dim=TEST_DIM,
                age_days=400,
                now=datetime.now(UTC),
                embedding_model=HashingEmbedder(TEST_DIM).model,
            ),
            actor="test",
        )
    return cli_env


def attempts(db_url: str) -> int:
    with connect(db_url) as conn:
        return one(conn.execute("SELECT count(*) AS n FROM archival_attempts"))["n"]


def test_cli_archive_into_a_missing_bucket_exits_2_naming_it_and_creates_no_bucket(
    s3_env, seaweed, monkeypatch, capsys
):
    bucket = f"missing-{os.urandom(4).hex()}"
    monkeypatch.setenv("MEMORY_ARCHIVE_BUCKET", bucket)
    assert main(["archive"]) == EXIT_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert (
        f"bucket '{bucket}' at {seaweed.endpoint_url} does not exist" in err
        and "MEMORY_ARCHIVE_BUCKET" in err
    )
    assert bucket not in bucket_names(seaweed)  # SeaweedFS was never sent a PUT that would create it
    assert attempts(s3_env) == 0


def test_cli_archive_with_wrong_credentials_exits_2_before_claiming(s3_env, seaweed, monkeypatch, capsys):
    bucket = seaweed.create_bucket(f"creds-{os.urandom(4).hex()}")
    wrong = "0" * len(seaweed.secret_key)
    monkeypatch.setenv("MEMORY_ARCHIVE_BUCKET", bucket)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    assert main(["archive"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert f"bucket '{bucket}'" in err and "credentials refused" in err
    assert wrong not in err and seaweed.secret_key not in err
    assert attempts(s3_env) == 0  # refused up front, not memory by memory until the gate pauses archival


def test_cli_archive_against_an_unreachable_store_exits_4(s3_env, monkeypatch, capsys):
    monkeypatch.setenv("MEMORY_ARCHIVE_BUCKET", "any-bucket")
    monkeypatch.setenv("MEMORY_ARCHIVE_S3_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("MEMORY_ARCHIVE_OBJECT_STORE__MAX_ATTEMPTS", "1")
    assert main(["archive"]) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "bucket 'any-bucket'" in err and "unreachable" in err
    assert attempts(s3_env) == 0


def test_cli_sweep_warns_about_an_unversioned_bucket(s3_env, seaweed, monkeypatch, capsys):
    bucket = seaweed.create_bucket(f"plain-{os.urandom(4).hex()}")
    monkeypatch.setenv("MEMORY_ARCHIVE_BUCKET", bucket)
    assert main(["sweep"]) == 0
    assert f"memory-archive: warning: bucket '{bucket}': versioning Off: turn it on: {UNVERSIONED}" in (
        capsys.readouterr().err
    )


def test_preflight_reports_versioning_and_warns_unless_enabled(s3_env, seaweed, monkeypatch):
    bucket = seaweed.create_bucket(f"plain-{os.urandom(4).hex()}")
    monkeypatch.setenv("MEMORY_ARCHIVE_BUCKET", bucket)
    found = preflight(Settings.from_env())
    assert (found.store, found.location, found.versioning) == ("s3", bucket, "Off")
    [warning] = found.warnings
    assert bucket in warning and "cannot be recovered by the nightly integrity check" in warning

    seaweed.client().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    found = preflight(Settings.from_env())
    assert (found.versioning, found.warnings) == ("Enabled", ())
    assert found.describe() == f"bucket '{bucket}': exists, versioning Enabled"


def test_cli_archive_refuses_a_malformed_llm_key_without_showing_it(cli_env, monkeypatch, capsys):
    key = "sk-proj-" + "s3cr3t" * 8  # an OpenAI key pasted as the Anthropic one
    monkeypatch.setenv("MEMORY_ARCHIVE_SUMMARIZER", "auto")
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    assert main(["archive"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "ANTHROPIC_API_KEY does not look like an Anthropic API key" in err and "'sk-ant-'" in err
    assert "s3cr3t" not in err
    assert attempts(cli_env) == 0


def _llm(env: dict[str, str], **llm: object) -> LLMConfig:
    """settings.llm as Settings.from_env reads `env` (the keys among it), with `llm` on top."""
    return Settings.from_env(env, llm=llm).llm


def test_llm_key_shapes():
    check_llm_key(
        _llm({"ANTHROPIC_API_KEY": ANTHROPIC_SHAPED, "OPENAI_API_KEY": "whatever"})
    )  # auto: Anthropic
    check_llm_key(_llm({"OPENAI_API_KEY": OPENAI_SHAPED}))
    check_llm_key(_llm({"ANTHROPIC_API_KEY": "nope"}, provider="extractive"))  # no LLM: no key used
    check_llm_key(_llm({"ANTHROPIC_API_KEY": "gateway-key"}, base_url="http://127.0.0.1:9/v1"))
    check_llm_key(_llm({"ANTHROPIC_API_KEY": "gateway-key", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}))
    for env in (
        {"OPENAI_API_KEY": ANTHROPIC_SHAPED},
        {"ANTHROPIC_API_KEY": f'"{ANTHROPIC_SHAPED}"'},
        {"ANTHROPIC_API_KEY": "sk-ant-api03 x"},
    ):
        with pytest.raises(PreflightError) as err:
            check_llm_key(_llm(env))
        assert next(iter(env.values()))[3:] not in str(err.value)


def test_a_local_root_that_is_a_file_is_refused(cli_env, tmp_path, monkeypatch, capsys):
    root = tmp_path / "not-a-dir"
    root.write_text("x")
    monkeypatch.setenv("MEMORY_ARCHIVE_LOCAL_ROOT", str(root))
    assert main(["restore", "--all"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert f"MEMORY_ARCHIVE_LOCAL_ROOT='{root}'" in err and "not a directory" in err


def test_an_unreachable_database_exits_4(cli_env, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", f"postgresql://u:p@127.0.0.1:{closed_port()}/db?connect_timeout=2")
    assert main(["stats"]) == EXIT_UNAVAILABLE
    assert "cannot reach the database" in capsys.readouterr().err


def test_exit_codes_mean_one_thing_each():
    refused = ObjectStoreConfigError("bucket 'x' does not exist")
    assert isinstance(refused, ObjectStoreError) and exit_code(refused) == EXIT_INPUT
    assert exit_code(ObjectStoreError("s3 put failed: ServiceUnavailable (HTTP 503)")) == EXIT_UNAVAILABLE
    assert exit_code(SummarizationError("overloaded")) == EXIT_UNAVAILABLE
    assert exit_code(SchemaError("run migrate")) == EXIT_INPUT
    assert exit_code(IntegrityError("k", "a", "b")) == EXIT_FAILED
    assert (
        exit_code(psycopg.OperationalError("server closed the connection unexpectedly")) == EXIT_UNAVAILABLE
    )
    wrong_password = psycopg.OperationalError('FATAL:  password authentication failed for user "u"')
    assert exit_code(wrong_password) == EXIT_INPUT


def test_dagster_summarizer_refuses_a_malformed_key(monkeypatch):
    from memory_assets.resources import SummarizerResource

    monkeypatch.setenv("ANTHROPIC_API_KEY", "not-a-key-" + "z" * 20)
    with (
        pytest.raises(dg.DagsterResourceFunctionError) as err,
        dg.build_resources({"summarizer": SummarizerResource(provider="anthropic")}),
    ):
        pass
    assert isinstance(err.value.__cause__, PreflightError) and "ANTHROPIC_API_KEY" in str(err.value.__cause__)
