"""Checks run before any work touches the object store, shared by the CLI and the Dagster resources.

A configuration that would fail every memory is refused up front, naming what to fix: an S3 bucket that
does not exist (SeaweedFS and some MinIO set-ups would create it on the first PUT), credentials the store
refuses, a local root that is not a writable directory, an API key of the wrong shape. Those raise
PreflightError (a ConfigError; ObjectStoreConfigError for the store's). A store that cannot be reached
raises a plain ObjectStoreError: an outage, not a configuration. No secret is ever part of a message.
Plain Python on purpose: no Dagster import here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from .core.config import EmbeddingConfig, LLMConfig, ObjectStoreConfig, Settings
from .core.errors import ObjectStoreConfigError, ObjectStoreError, PreflightError
from .llm.client import llm_provider
from .llm.embedding import embedding_provider
from .storage.objectstore import LOCAL_ROOT_FIELD, LOCAL_ROOT_VARIABLE, local_root_problem, s3_client

BUCKET_SETTING = "MEMORY_ARCHIVE_BUCKET (object_store.bucket)"
UNVERSIONED = (
    "without versioning, a backup deleted or overwritten after its memory was archived cannot be recovered "
    "by the nightly integrity check, and commit checks each backup under the users' write locks"
)


@dataclass(frozen=True)
class Preflight:
    """What the checks found. `location`: the bucket's name, or the local root. `versioning`: the bucket's
    status ('Enabled', 'Suspended', 'Off', or 'unknown' when these credentials may not read it); None for
    the local store. `warnings`: one line each."""

    store: str
    location: str
    versioning: str | None = None
    warnings: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.store == "s3":
            return f"bucket {self.location!r}: exists, versioning {self.versioning}"
        return f"local object root {self.location}: a writable directory, or one can be created"


def check_bucket(client: Any, bucket: str, endpoint: str | None) -> str:
    """HEAD the bucket, then return its versioning status. Run before any PUT. A missing bucket (404),
    refused credentials (403, or none found) and a wrong region raise ObjectStoreConfigError naming the
    bucket; an endpoint that cannot be reached or answers 5xx raises ObjectStoreError."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        PartialCredentialsError,
        ProfileNotFound,
    )

    where = f"bucket {bucket!r} at {endpoint or 'AWS S3'}"
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as exc:
        meta = exc.response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode")
        if status == 404:
            raise ObjectStoreConfigError(
                f"{where} does not exist: create it (versioning on) or fix {BUCKET_SETTING}; nothing was written",
                variable="MEMORY_ARCHIVE_BUCKET",
                value=bucket,
            ) from None
        if status == 403:
            raise ObjectStoreConfigError(
                f"{where}: credentials refused (HTTP 403): the S3 access key or secret is wrong, or may not "
                "access this bucket (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the AWS profile); nothing was written",
                variable="AWS_ACCESS_KEY_ID",
            ) from None
        if status in (301, 400):
            region = (meta.get("HTTPHeaders") or {}).get("x-amz-bucket-region")
            hint = f" (the bucket is in {region})" if region else ""
            raise ObjectStoreConfigError(
                f"{where}: HEAD bucket refused (HTTP {status}){hint}: check AWS_REGION and "
                "MEMORY_ARCHIVE_S3_ENDPOINT_URL",
                variable="AWS_REGION",
            ) from None
        raise ObjectStoreError(f"{where}: HEAD bucket failed (HTTP {status}): store unavailable") from None
    except (NoCredentialsError, PartialCredentialsError, ProfileNotFound) as exc:
        raise ObjectStoreConfigError(
            f"{where}: no usable S3 credentials ({exc}): set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or an AWS profile",
            variable="AWS_ACCESS_KEY_ID",
        ) from None
    except BotoCoreError as exc:  # endpoint unreachable, timeouts after the retries
        raise ObjectStoreError(f"{where}: unreachable: {exc}") from None
    try:
        return client.get_bucket_versioning(Bucket=bucket).get("Status") or "Off"
    except ClientError:  # credentials without s3:GetBucketVersioning
        return "unknown"
    except BotoCoreError as exc:
        raise ObjectStoreError(f"{where}: unreachable: {exc}") from None


def versioning_warning(bucket: str, status: str) -> str | None:
    """The warning for a bucket whose versioning is not Enabled, else None."""
    if status == "Enabled":
        return None
    state = "unknown (these credentials may not read it)" if status == "unknown" else status
    return f"bucket {bucket!r}: versioning {state}: turn it on: {UNVERSIONED}"


def check_local_root(root: Path) -> None:
    """The local store's root is a writable directory, or one can be created there (the local store's own
    rule, objectstore.local_root_problem). Creates nothing."""
    problem = local_root_problem(Path(root).resolve())
    if problem is not None:
        raise PreflightError(
            f"invalid {LOCAL_ROOT_VARIABLE}={str(root)!r} ({LOCAL_ROOT_FIELD}): {problem}",
            variable=LOCAL_ROOT_VARIABLE,
            value=str(root),
        )


def check_object_store(
    cfg: ObjectStoreConfig, local_root: Path, *, client: Any = None, endpoint: str | None = None
) -> Preflight:
    """The store of `cfg`: an S3 bucket through `client` (default: memory_lib's client from `cfg` and the
    AWS credential chain), or the local `local_root`."""
    if cfg.kind != "s3":
        check_local_root(local_root)
        return Preflight("local", str(local_root))
    if not cfg.bucket:  # ObjectStoreConfig already refuses this; narrows the type
        raise PreflightError(
            f"{BUCKET_SETTING} is required when object_store.kind='s3'", variable="MEMORY_ARCHIVE_BUCKET"
        )
    if client is None:
        endpoint = str(cfg.endpoint_url) if cfg.endpoint_url else None
        client = s3_client(
            endpoint,
            cfg.region_name,
            connect_timeout=cfg.connect_timeout_seconds,
            read_timeout=cfg.read_timeout_seconds,
            max_attempts=cfg.max_attempts,
        )
    versioning = check_bucket(client, cfg.bucket, endpoint)
    warning = versioning_warning(cfg.bucket, versioning)
    return Preflight("s3", cfg.bucket, versioning, (warning,) if warning else ())


# Each vendor's keys start with its prefix; checked only against the vendor's own API (no custom base URL).
_KEY_SHAPES = {
    "anthropic": ("ANTHROPIC_API_KEY", "sk-ant-", "Anthropic"),
    "openai": ("OPENAI_API_KEY", "sk-", "OpenAI"),
}


def _check_key_shape(provider: str, secret: SecretStr | None, base_url: object) -> None:
    """A set key of the wrong shape is refused; the message shows no more than its first 3 characters."""
    name, prefix, vendor = _KEY_SHAPES[provider]
    if secret is None or base_url:
        return  # unset (the summarizer/embedder says so), or a gateway with keys of its own
    key = secret.get_secret_value()
    wrong = not key.startswith(prefix) or (provider == "openai" and key.startswith("sk-ant-"))
    if wrong or any(c.isspace() or c in "'\"" for c in key):
        begins = f"begins {key[:3]!r}, " if len(key) >= 16 else ""
        raise PreflightError(
            f"{name} does not look like an {vendor} API key (those start with {prefix!r}, no spaces or quotes; "
            f"this one {begins}{len(key)} characters): set the key the {vendor} console shows",
            variable=name,
        )


def check_llm_key(llm: LLMConfig) -> None:
    """The key of the summarizer's provider has that vendor's shape (when set, for the vendor's API)."""
    provider = llm_provider(llm)
    if provider == "anthropic":
        _check_key_shape(provider, llm.anthropic_api_key, llm.base_url or llm.anthropic_base_url)
    elif provider == "openai":
        _check_key_shape(provider, llm.openai_api_key, llm.base_url or llm.openai_base_url)


def check_embedding_key(embedding: EmbeddingConfig) -> None:
    """The embedder's OpenAI key has OpenAI's shape when the embedder is OpenAI's (explicitly, or 'auto'
    with the key)."""
    if embedding_provider(embedding) == "openai":
        _check_key_shape("openai", embedding.openai_api_key, embedding.base_url or embedding.openai_base_url)


def preflight(settings: Settings, *, llm: bool = True) -> Preflight:
    """Every check for a command that touches the store: the API keys first (`llm`: the command summarizes
    and embeds), then the object store. Raises PreflightError for a configuration to fix, ObjectStoreError
    for a store that cannot be reached."""
    if llm:
        check_llm_key(settings.llm)
        check_embedding_key(settings.embedding)
    return check_object_store(settings.object_store, settings.local_object_root)
