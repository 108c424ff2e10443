"""The sections of Settings (memory_lib.core.config): every threshold and setting with its default.

Each section is a frozen pydantic model that forbids unknown keys, so a typo in code or Dagster config
is an error. memory_lib.core.config assembles them into Settings and reads the environment; import them
from there.
"""

from __future__ import annotations

import json
import re
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

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
from pydantic_settings import NoDecode

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


def _api_key(value: SecretStr) -> SecretStr | None:
    # Surrounding whitespace is a paste accident; a key of only whitespace is no key.
    stripped = value.get_secret_value().strip()
    return SecretStr(stripped) if stripped else None


# A vendor's API key: never shown by repr, str or an error message (SecretStr).
ApiKey = Annotated[SecretStr, AfterValidator(_api_key)]


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
        0.3,
        ge=0.0,
        description="Bonus for a hit inside a time the query names ('on 31 Dec 2023', 'last year', "
        "'in May 2023'; a named day counts from the day before to two days after).",
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
        description="A memory written shortly before or after one of the best full-text matches (up to "
        "context_neighbours on each side, within context_window_minutes) gains this share of that match's "
        "score, times context_decay per step away: in a conversation the answer often follows the message "
        "that shares the question's words. 0: off.",
    )
    context_neighbours: int = Field(
        5, ge=1, le=50, description="How many memories on each side of a match can be its context."
    )
    context_decay: float = Field(
        0.85,
        gt=0.0,
        le=1.0,
        description="Each step further from the match keeps this share of the context credit (1: none lost).",
    )
    context_window_minutes: float = Field(
        60.0, gt=0.0, description="How close in time two memories must be written to be each other's context."
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
        description="Share of a batch's sampled archived memories that their own most specific sentence must "
        "find in the top 10; below it archival pauses (the CLI, the bench and Dagster alike).",
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
    anthropic_api_key: ApiKey | None = Field(None, description="The Anthropic API key (ANTHROPIC_API_KEY).")
    openai_api_key: ApiKey | None = Field(None, description="The OpenAI API key (OPENAI_API_KEY).")
    anthropic_base_url: HttpURL | None = Field(
        None,
        description="Anthropic's API when llm.base_url is unset (ANTHROPIC_BASE_URL, as the SDK reads it).",
    )
    openai_base_url: HttpURL | None = Field(
        None, description="OpenAI's API when llm.base_url is unset (OPENAI_BASE_URL, as the SDK reads it)."
    )
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
    openai_api_key: ApiKey | None = Field(
        None, description="The OpenAI API key of the embedder; unset: OPENAI_API_KEY, as the LLM's."
    )
    openai_base_url: HttpURL | None = Field(
        None,
        description="OpenAI's API when embedding.base_url is unset; unset: OPENAI_BASE_URL, as the LLM's.",
    )
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
