"""The Slow Path: archival_candidates → memory_summaries → archive_backups → archive_rows.

Thin: each asset loops over its run's nights in date order and calls one memory_lib.nights step.
All state is in Postgres (archival_batches / archival_attempts), so there is no IO manager: a re-run
resumes where the last one stopped, and a night already done does no new work.
"""

import time

import dagster as dg

from memory_assets.metadata import by_month, counts, markdown_table, store_location
from memory_assets.resources import (
    ArchivalCriteriaResource,
    DatabaseResource,
    EmbedderResource,
    ObjectStoreResource,
    SummarizerResource,
)
from memory_lib import eligibility, nights, pipeline
from memory_lib.claims import attempt_counts
from memory_lib.store import tier_stats

from .partitions import SLOW_PATH, backfill_policy, run_nights
from .partitions import nights as night_partitions

GROUP = "slow_path"
_COMMON = dict(partitions_def=night_partitions, backfill_policy=backfill_policy, group_name=GROUP)


def _step_metadata(t: nights.StepTotals, started: float) -> dict[str, object]:
    meta: dict[str, object] = {
        "failed": t.failed,
        "released": t.released,
        "duration_s": round(time.monotonic() - started, 2),
        "nights_skipped": len(t.skipped),
        **counts("failed_step", dict(t.failed_by_step)),
    }
    if t.errors:
        meta["errors"] = markdown_table(["memory: error"], [[e] for e in t.errors[:10]], width=300)
    if t.skipped:
        first = next(iter(t.skipped.items()))
        meta["skipped_because"] = f"{first[0]}: {first[1]}"
    return meta


@dg.asset(**_COMMON, kinds={"postgres"})
def archival_candidates(
    context: dg.AssetExecutionContext, database: DatabaseResource, archival: ArchivalCriteriaResource
) -> dg.MaterializeResult:
    """Claim each night's batch: eligible memories as of the end of the night, at most batch_size,
    each in at most one open attempt (row locks). Idempotent per night; nothing claimed while paused."""
    started = time.monotonic()
    criteria = archival.get_criteria()
    outcomes = []
    with database.connect() as conn:
        for night in run_nights(context):
            outcomes.append(nights.claim_night(conn, night, criteria, SLOW_PATH.timezone))
        last_as_of = nights.night_as_of(run_nights(context)[-1], SLOW_PATH.timezone)
        backlog = eligibility.eligible_counts(conn, criteria, last_as_of)
        liveness = attempt_counts(conn)
    claims = [o for o in outcomes if o.claim]
    paused = [o.skipped for o in outcomes if o.skipped]
    by_reason: dict[str, int] = {}
    for o in claims:
        for reason, n in o.claim.by_reason.items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    rows = by_month([(o.night.isoformat(), [o.claim.claimed]) for o in claims])
    return dg.MaterializeResult(
        metadata={
            "claimed": sum(by_reason.values()),
            **counts("claimed", by_reason),
            "nights": len(outcomes),
            "nights_newly_claimed": sum(1 for o in claims if o.claim.newly_claimed),
            "nights_paused": sum(1 for o in outcomes if o.skipped),
            "batch_size": criteria.batch_size,
            "eligible_after": sum(backlog.values()),
            "taken_over": sum(o.claim.taken_over for o in claims),
            **{f"attempts_{k}": v for k, v in liveness.items()},
            **({"paused_because": paused[0]} if paused else {}),
            "claimed_by_night": markdown_table(["night", "claimed"], [[k, *v] for k, v in rows]),
            "duration_s": round(time.monotonic() - started, 2),
        }
    )


@dg.asset(**_COMMON, deps=[archival_candidates], pool=SLOW_PATH.llm_pool, kinds={"postgres", "llm"})
def memory_summaries(
    context: dg.AssetExecutionContext,
    database: DatabaseResource,
    summarizer: SummarizerResource,
    embedder: EmbedderResource,
    archival: ArchivalCriteriaResource,
) -> dg.MaterializeResult:
    """Summarize each claimed memory (LLM, rate-limited, retried) and embed the summary. A failed or
    empty summary is recorded for that memory; the run goes on. Runs in the LLM concurrency pool."""
    started = time.monotonic()
    criteria = archival.get_criteria()
    llm = summarizer.get_summarizer()
    emb = embedder.get_embedder()
    workers = summarizer.llm_config().max_concurrency
    with database.connect() as conn:
        outcomes = [
            nights.summarize_night(conn, night, llm, emb, criteria, workers=workers)
            for night in run_nights(context)
        ]
        keys = [o.batch_key for o in outcomes if not o.skipped]
        preview = conn.execute(
            """SELECT a.memory_id, m.content, a.summary FROM archival_attempts a
               JOIN memories m ON m.id = a.memory_id
               WHERE a.batch_key = ANY(%s) AND a.summary IS NOT NULL ORDER BY a.updated_at DESC LIMIT 5""",
            (keys,),
        ).fetchall()
    summaries = nights.totals(outcomes)
    return dg.MaterializeResult(
        metadata={
            **_step_metadata(summaries, started),
            "summarized": sum(r.succeeded for o in outcomes for r in o.results if r.step == "summarize"),
            "embedded": sum(r.succeeded for o in outcomes for r in o.results if r.step == "embed"),
            "summarizer": f"{llm.kind}:{llm.model}",
            "embedder": emb.model,
            "input_tokens": summaries.input_tokens,
            "output_tokens": summaries.output_tokens,
            "estimated_cost_usd": round(summaries.cost_usd, 4),
            "preview": markdown_table(
                ["memory", "original", "summary"],
                [[str(r["memory_id"])[:8], r["content"], r["summary"]] for r in preview],
            ),
        }
    )


@dg.asset(**_COMMON, deps=[memory_summaries], kinds={"postgres", "s3"})
def archive_backups(
    context: dg.AssetExecutionContext,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
    archival: ArchivalCriteriaResource,
) -> dg.MaterializeResult:
    """Write each summarized memory's full original as canonical JSON, verified (sha256, size) after
    the write; the checkpoint records key, sha256 and size. Nothing is deleted here."""
    started = time.monotonic()
    criteria = archival.get_criteria()
    store = object_store.get_store()
    with database.connect() as conn:
        outcomes = [nights.backup_night(conn, night, store, criteria) for night in run_nights(context)]
    t = nights.totals(outcomes)
    return dg.MaterializeResult(
        metadata={
            **_step_metadata(t, started),
            "objects_written": t.succeeded,
            "bytes_written": t.bytes_written,
            "store": store_location(store),
        }
    )


@dg.asset(**_COMMON, deps=[archive_backups], kinds={"postgres"})
def archive_rows(
    context: dg.AssetExecutionContext,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
    archival: ArchivalCriteriaResource,
) -> dg.MaterializeResult:
    """Replace each backed-up original by its archive row (summary + summary embedding + backup
    reference), one transaction per chunk, with an 'archived' audit event. Runs only after the
    fidelity and error-rate checks passed; re-checks the gate and the pause per night itself."""
    started = time.monotonic()
    criteria = archival.get_criteria()
    store = object_store.get_store()
    with database.connect() as conn:
        stats_before = tier_stats(conn)
        outcomes = [nights.commit_night(conn, night, store, criteria) for night in run_nights(context)]
        keys = [o.batch_key for o in outcomes]
        # The gate again, over every step including verify and commit: a night that ended above the
        # error rate, or archived nothing of what it claimed, fails this asset (and pauses archival).
        after = [
            pipeline.gate_stage(conn, o.batch_key, criteria, actor=nights.ACTOR, after_commit=True)
            for o in outcomes
            if not o.skipped
        ]
        stats = tier_stats(conn)
        reasons = conn.execute(
            """SELECT archive_reason, count(*) AS n, sum(backup_size_bytes) AS bytes FROM archived_memories
               WHERE metadata->>'batch_key' = ANY(%s) GROUP BY 1""",
            (keys,),
        ).fetchall()
        sample = conn.execute(
            """SELECT original_id, user_id, archive_reason, summary FROM archived_memories
               WHERE metadata->>'batch_key' = ANY(%s) ORDER BY archived_at DESC LIMIT 5""",
            (keys,),
        ).fetchall()
    t = nights.totals(outcomes)
    failing = [g for g in after if not g.passed]
    if failing:
        raise dg.Failure(
            description=f"{len(failing)} night(s) failed the gate after commit; first: {failing[0].describe()}. "
            "Failed memories stay hot and archival is paused.",
            metadata={"nights_failing": markdown_table(["gate after commit"], [[g.describe()] for g in failing[:20]],
                                                       width=300)},
        )  # fmt: skip
    return dg.MaterializeResult(
        metadata={
            **_step_metadata(t, started),
            "archived": t.succeeded,
            **counts("archived_total", {r["archive_reason"]: r["n"] for r in reasons}),
            "backup_bytes_total": int(sum(r["bytes"] or 0 for r in reasons)),
            "hot_memories": stats.hot,
            "archived_memories": stats.archived,
            "hot_removed": stats_before.hot - stats.hot,
            "hot_table_bytes": stats.hot_bytes,
            "archive_table_bytes": stats.archived_bytes,
            "sample": markdown_table(
                ["original", "user", "reason", "summary"],
                [
                    [str(r["original_id"])[:8], r["user_id"], r["archive_reason"], r["summary"]]
                    for r in sample
                ],
            ),
        }
    )
