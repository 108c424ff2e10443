"""Consolidation above the per-memory summary: monthly_digests, yearly_digests, memory_facts, key_moments.

Thin: each asset builds its partition (a month, or a year) for every user through memory_lib
(memory_lib.consolidation.digests.build_period, memory_lib.consolidation.facts); what a build reads, its fingerprint and why an
unchanged period writes nothing are memory_lib's. With an LLM configured (the summarizer resource's
provider), digests and facts come from it (JSON validated by pydantic); offline they come from the
extractive digest builder and the rule-based fact extractor, named as such in summarizer_kind / extractor.
"""

import time
import warnings
from collections import Counter

import dagster as dg

from memory_assets.defs.slow_path.assets import archive_rows
from memory_assets.metadata import markdown_table
from memory_assets.resources import DatabaseResource, EmbedderResource, SummarizerResource
from memory_lib.consolidation.digests import (
    DigestBuilder,
    ExtractiveDigestBuilder,
    LLMDigestBuilder,
    build_period,
    period_users,
)
from memory_lib.consolidation.facts import (
    FactExtractor,
    LLMFactExtractor,
    RuleFactExtractor,
    build_facts,
    build_key_moments,
)
from memory_lib.llm.json_answers import json_llm_from_settings

from .partitions import TIMEZONE, months, partition_day, years

# allow_nonexistent_upstream_partitions is beta in 1.13: say so once, here. A month's first days may
# predate the first archival night.
warnings.filterwarnings(
    "ignore", message=r"Parameter `allow_nonexistent_upstream_partitions`", category=dg.BetaWarning
)

GROUP = "consolidation"
OWNERS = ["team:memory-archive"]
_TAGS = {"domain": "consolidation"}


def builders(summarizer: SummarizerResource) -> tuple[DigestBuilder, FactExtractor]:
    """The LLM's builders when the summarizer's settings resolve to a provider, else the offline ones."""
    llm = json_llm_from_settings(summarizer.llm_config())
    if llm is None:
        return ExtractiveDigestBuilder(), RuleFactExtractor()
    return LLMDigestBuilder(llm), LLMFactExtractor(llm)


def _statuses(outcomes) -> dict[str, int]:
    counts = Counter(o.status for o in outcomes)
    return {s: counts.get(s, 0) for s in ("built", "unchanged", "deleted")}


def _digest_level(
    context: dg.AssetExecutionContext,
    level: int,
    database: DatabaseResource,
    embedder: EmbedderResource,
    summarizer: SummarizerResource,
) -> dg.MaterializeResult:
    started = time.monotonic()
    builder, _ = builders(summarizer)
    day = partition_day(context)
    with database.connect() as conn:
        outcomes = build_period(
            conn, level, day, builder=builder, embedder=embedder.get_embedder(), tz=TIMEZONE
        )
    rows = [[o.user_id, o.status, o.sources] for o in outcomes]
    return dg.MaterializeResult(
        metadata={
            "users": len(outcomes),
            **_statuses(outcomes),
            "builder": f"{builder.kind}:{builder.model}",
            "sources": sum(o.sources for o in outcomes),
            "duration_s": round(time.monotonic() - started, 2),
            "per_user": markdown_table(["user", "status", "sources"], rows[:50]),
        }
    )


@dg.asset(
    partitions_def=months,
    group_name=GROUP,
    owners=OWNERS,
    tags=_TAGS,
    kinds={"postgres"},
    code_version="1",
    # Lineage: a month is consolidated from what archival left (nights of the month); the month's first
    # nights may predate the first archival night.
    deps=[
        dg.AssetDep(
            archive_rows,
            partition_mapping=dg.TimeWindowPartitionMapping(allow_nonexistent_upstream_partitions=True),
        )
    ],
)
def monthly_digests(
    context: dg.AssetExecutionContext,
    database: DatabaseResource,
    embedder: EmbedderResource,
    summarizer: SummarizerResource,
) -> dg.MaterializeResult:
    """Level 2: one digest per user of the month, from the month's archived summaries and hot memories
    (the digest JSON in `body`: summary, key topics and people, highlights; provenance in
    source_memory_ids); rewritten only when a covered memory changed (source_fingerprint)."""
    return _digest_level(context, 2, database, embedder, summarizer)


@dg.asset(
    partitions_def=years,
    group_name=GROUP,
    owners=OWNERS,
    tags=_TAGS,
    kinds={"postgres"},
    code_version="1",
    deps=[monthly_digests],
)
def yearly_digests(
    context: dg.AssetExecutionContext,
    database: DatabaseResource,
    embedder: EmbedderResource,
    summarizer: SummarizerResource,
) -> dg.MaterializeResult:
    """Level 3: one digest per user of the year, from that user's monthly digests (the same builder,
    memory_lib.consolidation.digests.build_level, one level up)."""
    return _digest_level(context, 3, database, embedder, summarizer)


@dg.asset(
    partitions_def=months,
    group_name=GROUP,
    owners=OWNERS,
    tags=_TAGS,
    kinds={"postgres"},
    code_version="1",
    deps=[monthly_digests],
)
def memory_facts(
    context: dg.AssetExecutionContext,
    database: DatabaseResource,
    embedder: EmbedderResource,
    summarizer: SummarizerResource,
) -> dg.MaterializeResult:
    """Facts (people, projects, places, preferences, dates) of the month's memories, per user, with
    their source memories and validity (a newer value of a single-valued predicate closes the older)."""
    started = time.monotonic()
    _, extractor = builders(summarizer)
    day = partition_day(context)
    with database.connect() as conn:
        outcomes = [
            build_facts(conn, u, day, extractor=extractor, embedder=embedder.get_embedder(), tz=TIMEZONE)
            for u in period_users(conn, 2, day, tz=TIMEZONE)
        ]
    return dg.MaterializeResult(
        metadata={
            "users": len(outcomes),
            **_statuses(outcomes),
            "extractor": extractor.name,
            "inserted": sum(o.inserted for o in outcomes),
            "deleted": sum(o.deleted for o in outcomes),
            "kept": sum(o.kept for o in outcomes),
            "duration_s": round(time.monotonic() - started, 2),
        }
    )


@dg.asset(
    partitions_def=months,
    group_name=GROUP,
    owners=OWNERS,
    tags=_TAGS,
    kinds={"postgres"},
    code_version="1",
    deps=[monthly_digests],
)
def key_moments(context: dg.AssetExecutionContext, database: DatabaseResource) -> dg.MaterializeResult:
    """The month's high-importance events per user, each with its source memory."""
    day = partition_day(context)
    with database.connect() as conn:
        outcomes = [
            build_key_moments(conn, u, day, tz=TIMEZONE) for u in period_users(conn, 2, day, tz=TIMEZONE)
        ]
        row = conn.execute("SELECT count(*) AS n FROM key_moments WHERE month = %s", (day,)).fetchone()
        assert row is not None  # an aggregate returns one row
        total = row["n"]
    return dg.MaterializeResult(
        metadata={"users": len(outcomes), **_statuses(outcomes), "key_moments": total}
    )
