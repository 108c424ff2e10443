"""Dagster resources over memory_lib: settings, Postgres, object store, summarizer, embedder, archival criteria.

SettingsResource reads the environment (`memory_lib.core.config.Settings.from_env()`) once per run: at
run time it is the only place memory_assets reads it (the definition-time values are in
memory_assets.definition_time). Every other resource takes it as its `settings`, and every field left
unset (None) comes from it, so the environment configures a deployment and Dagster config overrides
single values. Merged values are validated by
the pydantic models of memory_lib.core.config: a bad value fails the run at resource setup with an error
naming the field. API keys and database passwords never go through Dagster config: SDK keys come from
the environment, DATABASE_URL is read by SettingsResource and never bound in Dagster config (the UI would
show it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from memory_lib.core.config import ArchivalCriteria, EmbeddingConfig, LLMConfig, ObjectStoreConfig, Settings
from memory_lib.core.errors import InvalidInputError, SchemaError
from memory_lib.core.rows import Conn
from memory_lib.llm.embedding import Embedder, embedder_from_settings
from memory_lib.llm.summarize import Summarizer, summarizer_from_settings
from memory_lib.preflight import check_embedding_key, check_llm_key, check_object_store
from memory_lib.storage.db import Database, check_schema, connect, open_database, prepare_database
from memory_lib.storage.objectstore import LocalObjectStore, ObjectStore, S3ObjectStore, s3_client


def _merged(model: type[BaseModel], base: BaseModel, overrides: dict[str, Any], section: str) -> Any:
    """`base` with the non-None `overrides`, validated by `model`; errors name `section.field`."""
    data = base.model_dump() | {k: v for k, v in overrides.items() if v is not None}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(p) for p in err["loc"]) or "value"
        raise InvalidInputError(f"{section}.{name}", err.get("input"), err["msg"]) from None


def _set_fields(resource: dg.ConfigurableResource, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(resource, n) for n in names}


def _run_id(context: dg.InitResourceContext) -> str | None:
    return context.run.run_id if context.run is not None else None


class SettingsResource(dg.ConfigurableResource):
    """memory-archive's Settings, read from the environment once per run and shared by every resource
    of the run (the definitions bind one instance as each resource's `settings`).

    Dagster sets a nested resource up once per resource that holds it, so the Settings read at a run's
    first setup are kept by run id (`_BY_RUN`) and handed to the others: one read per run. Outside a
    run (a resource method called directly), `get` reads the environment on first use and keeps it."""

    _BY_RUN: ClassVar[dict[str, Settings]] = {}
    _settings: Settings | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        run_id = _run_id(context)
        if run_id is None:
            self._settings = Settings.from_env()
            return
        if run_id not in self._BY_RUN:
            self._BY_RUN[run_id] = Settings.from_env()
        self._settings = self._BY_RUN[run_id]

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if (run_id := _run_id(context)) is not None:
            self._BY_RUN.pop(run_id, None)

    def get(self) -> Settings:
        if self._settings is None:
            self._settings = Settings.from_env()
        return self._settings


class UsesSettings(dg.ConfigurableResource):
    """A resource whose unset fields come from a SettingsResource; without one (a resource built by hand,
    as in tests) it keeps its own."""

    settings: SettingsResource | None = Field(
        default=None, description="The run's settings; unset: this resource reads its own."
    )

    _own_settings: SettingsResource | None = PrivateAttr(default=None)

    def base_settings(self) -> Settings:
        if self.settings is not None:
            return self.settings.get()
        if self._own_settings is None:
            self._own_settings = SettingsResource()
        return self._own_settings.get()


class DatabaseResource(UsesSettings):
    """Postgres + pgvector: `database_url` (DATABASE_URL), else the embedded server under the state dir,
    database `embedded_database` (MEMORY_ARCHIVE_EMBEDDED_DB) — resolved by memory_lib.storage.db from the same
    Settings as the library and the CLI, with the fields set here on top.

    Each run process opens the database at setup and releases its hold on the embedded server at
    teardown (the server stops when its last holder leaves). Setup checks the schema read-only
    (memory_lib.storage.db.check_schema, a few catalog queries) and migrates only when that check fails, so a
    run on an up-to-date database takes no migration lock and runs no DDL. It migrates as the role of its
    database URL, so on your own Postgres that is the role that owns the schema (docs/how-to/postgres.md,
    "Which role migrates").
    """

    database_url: str | None = Field(default=None, description="postgresql:// URL; unset: embedded server.")
    embedded_database: str | None = Field(
        default=None, description="Database inside the embedded server (created if missing); unset: postgres."
    )
    state_dir: str | None = Field(
        default=None, description="Embedded server's state dir (MEMORY_ARCHIVE_STATE_DIR)."
    )
    embedding_dim: int | None = Field(
        default=None, description="Dim of a new database's vectors; unset: settings."
    )

    _db: Database | None = PrivateAttr(default=None)
    _url: str | None = PrivateAttr(default=None)

    def run_settings(self) -> Settings:
        """The run's Settings with this resource's fields on top: what the database and the assets use."""
        fields = _set_fields(self, ("database_url", "embedded_database", "state_dir"))
        overrides = {k: v for k, v in fields.items() if v}
        base = self.base_settings()
        return Settings(**(base.model_dump() | overrides)) if overrides else base

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        settings = self.run_settings()
        db = open_database(settings, create=True)
        try:
            check_schema(db.url)
        except SchemaError:
            db.close()  # prepare_database opens it again, then applies the pending migrations
            db = prepare_database(settings, embedding_dim=self.embedding_dim)
        except BaseException:
            db.close()
            raise
        self._db = db
        self._url = db.url

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("DatabaseResource used outside a run (setup_for_execution not called)")
        return self._url

    @contextmanager
    def connect(self) -> Iterator[Conn]:
        conn = connect(self.url)
        try:
            yield conn
        finally:
            conn.close()


class ObjectStoreResource(UsesSettings):
    """Where backups go: a local folder, or an S3-compatible bucket through dagster-aws's S3Resource
    (its endpoint_url reaches R2, MinIO or SeaweedFS). Unset fields come from settings.

    At the start of a run (setup_for_execution) the store is checked by memory_lib.preflight, as the CLI
    does: an S3 bucket must exist and accept the credentials, a local root must be a writable directory
    (else the run fails before any step, naming what to fix); the bucket's versioning status is logged,
    as a warning when it is not Enabled."""

    kind: str | None = Field(default=None, description="'local' or 's3'; unset: settings.")
    local_root: str | None = None
    bucket: str | None = None
    prefix: str | None = None
    s3: S3Resource | None = Field(
        default=None, description="S3 client settings; unset: endpoint/region from settings."
    )

    _versioning: str | None = PrivateAttr(default=None)

    def config(self) -> ObjectStoreConfig:
        return _merged(
            ObjectStoreConfig,
            self.base_settings().object_store,
            _set_fields(self, ("kind", "local_root", "bucket", "prefix")),
            "object_store",
        )

    def _s3(self, cfg: ObjectStoreConfig) -> tuple[Any, str | None]:
        """memory_lib's client from the S3Resource's settings (one client factory for the library and
        Dagster), not s3.get_client(): it has connect/read timeouts and bounded retries, so a frozen
        endpoint fails the step's memories instead of hanging the run."""
        s3 = self.s3 or S3Resource(endpoint_url=cfg.endpoint_url, region_name=cfg.region_name)
        client = s3_client(
            s3.endpoint_url,
            s3.region_name,
            s3.aws_access_key_id,
            s3.aws_secret_access_key,
            connect_timeout=cfg.connect_timeout_seconds,
            read_timeout=cfg.read_timeout_seconds,
            max_attempts=cfg.max_attempts,
        )
        return client, s3.endpoint_url

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        cfg = self.config()
        client, endpoint = self._s3(cfg) if cfg.kind == "s3" else (None, None)
        found = check_object_store(cfg, self._local_root(cfg), client=client, endpoint=endpoint)
        self._versioning = found.versioning
        log = context.log or logging.getLogger(__name__)
        log.info(found.describe())
        for warning in found.warnings:
            log.warning(warning)

    def _local_root(self, cfg: ObjectStoreConfig) -> Path:
        return Path(cfg.local_root) if cfg.local_root else self.base_settings().local_object_root

    @property
    def versioning(self) -> str | None:
        """The bucket's versioning status found at setup ('Enabled', 'Suspended', 'Off', 'unknown');
        None for the local store or outside a run."""
        return self._versioning

    def get_store(self) -> ObjectStore:
        cfg = self.config()
        if cfg.kind == "s3":
            assert cfg.bucket is not None  # ObjectStoreConfig requires it for kind='s3'
            client, _ = self._s3(cfg)
            return S3ObjectStore(client, cfg.bucket, cfg.prefix)
        root = self._local_root(cfg)
        root.mkdir(parents=True, exist_ok=True)
        return LocalObjectStore(root, cfg.prefix)


class SummarizerResource(UsesSettings):
    """The LLM (or offline extractive) summarizer, with the client-side rate limit and retries of
    memory_lib.llm.summarize. API keys come from ANTHROPIC_API_KEY / OPENAI_API_KEY only."""

    provider: str | None = Field(default=None, description="auto, anthropic, openai or extractive.")
    base_url: str | None = None
    anthropic_model: str | None = None
    openai_model: str | None = None
    max_output_tokens: int | None = None
    requests_per_second: float | None = None
    max_concurrency: int | None = None
    max_retries: int | None = None
    timeout_seconds: float | None = None
    batch_threshold: int | None = Field(default=None, description="Above this many memories: the batch API.")
    batch_poll_seconds: float | None = None
    batch_wait_seconds: float | None = None

    _summarizer: Summarizer | None = PrivateAttr(default=None)
    _config: LLMConfig | None = PrivateAttr(default=None)

    def llm_config(self) -> LLMConfig:
        if self._config is None:
            names = (
                "provider",
                "base_url",
                "anthropic_model",
                "openai_model",
                "max_output_tokens",
                "requests_per_second",
                "max_concurrency",
                "max_retries",
                "timeout_seconds",
                "batch_threshold",
                "batch_poll_seconds",
                "batch_wait_seconds",
            )
            self._config = _merged(LLMConfig, self.base_settings().llm, _set_fields(self, names), "llm")
        return self._config

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        check_llm_key(self.llm_config())  # a malformed key fails the run here, not once per memory

    def get_summarizer(self) -> Summarizer:
        # One summarizer per process: its rate limiter then spans every night of the step.
        if self._summarizer is None:
            self._summarizer = summarizer_from_settings(self.llm_config())
        return self._summarizer


class EmbedderResource(UsesSettings):
    """The embedder of summaries; it must match the model and dim of the hot tier's embeddings."""

    provider: str | None = Field(default=None, description="auto, openai, local or hashing.")
    dim: int | None = None
    base_url: str | None = None
    openai_model: str | None = None
    local_model: str | None = None

    _embedder: Embedder | None = PrivateAttr(default=None)

    def config(self) -> EmbeddingConfig:
        names = ("provider", "dim", "base_url", "openai_model", "local_model")
        return _merged(EmbeddingConfig, self.base_settings().embedding, _set_fields(self, names), "embedding")

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        check_embedding_key(self.config())

    def get_embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = embedder_from_settings(self.config())
        return self._embedder


class ArchivalCriteriaResource(UsesSettings):
    """Which memories are archived and the gates (memory_lib.core.config.ArchivalCriteria); set a field in
    the launchpad (resources.archival.config) to override it for one run."""

    min_age_days: int | None = None
    max_importance_score: float | None = None
    max_recent_access_count: int | None = None
    recent_access_window_days: int | None = None
    force_archive_age_days: int | None = None
    batch_size: int | None = None
    pack_min_members: int | None = None
    exempt_categories: list[str] | None = None
    max_error_rate: float | None = None
    max_attempts: int | None = None
    lease_seconds: int | None = None
    step_deadline_seconds: float | None = None
    policy: str | None = None
    cold_migration_days: int | None = None

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.get_criteria()  # a bad value fails the run here, before any step does work

    def get_criteria(self) -> ArchivalCriteria:
        names = tuple(ArchivalCriteria.model_fields)
        return _merged(ArchivalCriteria, self.base_settings().archival, _set_fields(self, names), "archival")
