"""The Slow Path: retention_scores → archival_candidates → memory_summaries → archive_backups → archive_rows.

Thin: each asset loops over its run's nights in date order and calls one memory_lib stage per night,
in the order of memory_lib.archival.pipeline.run_batch. All state is in Postgres (archival_batches /
archival_attempts), so there is no IO manager: a re-run resumes where the last one stopped, and a
night already done does no new work.

Per-night truth: every asset records one materialization per night with that night's own numbers
(metadata.record_nights), also when a run covers a range of nights. archive_rows records the tiers at
the end of each night, its archival included (memory_lib.lifecycle.retention.tier_counts: an archive row
counts from its batch's night, whenever the batch ran). What cannot be read as of a night (table
sizes, backlog, attempts) goes on the run's last night only, named as after the run. memory_summaries
records each of its two steps' counts (summarize, embed), never their sum. A size is an int whose
name says bytes, with the same size as text with its unit beside it (metadata.size_metadata).

Scale-out: a run tagged `memory-archive/shard: i/n` (partitions.SHARD_TAG) works on the users of shard
i of n only, in its own batch per night, so n runs of one night archive concurrently. Its per-night
numbers are its shard's (metadata `shard`); `night_all_shards_*` are the night's totals over every
shard, read from the database right after the shard's own work on that night.

Writes of the gates: archive_backups decides each night's gate before deletion (fidelity round trip,
error rate) and, when it fails, sends unfaithful backups back and pauses archival (who/why/when in
archival_pause); archive_rows runs memory_lib.archival.post_commit after each night's commit (gate
after commit, tier integrity, stall diagnosis, retrievability) and pauses on a failure. The asset
checks in checks.py only read: a check re-run from the UI changes nothing.
"""

import time
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any, TypedDict

import dagster as dg

from memory_assets.definition_time import STORE_KIND
from memory_assets.metadata import counts, markdown_table, record_nights, size_metadata, store_location
from memory_assets.resources import (
    ArchivalCriteriaResource,
    DatabaseResource,
    EmbedderResource,
    ObjectStoreResource,
    SummarizerResource,
)
from memory_lib.archival import nights, pipeline, post_commit, retrievability
from memory_lib.archival.archive import StepResult
from memory_lib.archival.claims import attempt_counts
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.pricing import OFFLINE_PER_1000, unknown_price, usd_per_1000
from memory_lib.core.rows import Conn
from memory_lib.core.shards import Shard
from memory_lib.lifecycle import eligibility, retention
from memory_lib.lifecycle import pause as pause_switch
from memory_lib.llm import batches, ledger
from memory_lib.llm.summarize import Summarizer
from memory_lib.storage.objectstore import ObjectStore
from memory_lib.storage.store import tier_stats

from .partitions import SLOW_PATH, backfill_policy, run_nights, run_shard
from .partitions import nights as night_partitions
from .retention import retention_scores

GROUP = "slow_path"
OWNERS = ["team:memory-archive"]


class _CommonAssetArgs(TypedDict):
    """The dg.asset arguments every Slow Path asset shares (typed, so `**_COMMON` type-checks)."""

    partitions_def: dg.PartitionsDefinition[str]
    backfill_policy: dg.BackfillPolicy
    group_name: str
    owners: Sequence[str]
    tags: dict[str, str]


# Bump a code_version when the asset's own logic changes what it writes; the UI then marks the
# nights materialized by older code as stale.
_COMMON = _CommonAssetArgs(
    partitions_def=night_partitions,
    backfill_policy=backfill_policy,
    group_name=GROUP,
    owners=OWNERS,
    tags={"domain": "archival", "tier": "slow_path"},
)


def _step_metadata(t: nights.StepTotals) -> dict[str, object]:
    meta: dict[str, object] = {
        "processed": t.processed,
        "failed": t.failed,
        "released": t.released,
        "duration_s": round(t.seconds, 2),
        **counts("failed_step", dict(t.failed_by_step)),
    }
    if t.errors:
        meta["errors"] = markdown_table(["memory: error"], [[e] for e in t.errors[:10]], width=300)
    if t.skipped:
        meta["paused_because"] = next(iter(t.skipped.values()))
    return meta


def _two_step_metadata(t: nights.StepTotals, results: Sequence[StepResult]) -> dict[str, object]:
    """memory_summaries' figures: each step's own (a memory goes through both, so the steps' counts
    are not added up): summarize_processed memories taken up by the summarizer, of them summarized and
    summarize_failed; embed_processed summaries taken up by the embedder (this run's and those
    summarized by an earlier run of the night), of them embedded and embed_failed. failed and released
    are memories (a memory fails or is released at one step at most)."""
    step = {r.step: r for r in results}
    summarize, embed = step.get("summarize"), step.get("embed")
    meta = _step_metadata(t)
    del meta["processed"]  # the two steps' sum: each memory twice
    return {
        "summarize_processed": summarize.processed if summarize else 0,
        "summarized": summarize.succeeded if summarize else 0,
        "summarize_failed": summarize.failed if summarize else 0,
        "embed_processed": embed.processed if embed else 0,
        "embedded": embed.succeeded if embed else 0,
        "embed_failed": embed.failed if embed else 0,
        **meta,
    }


def _llm_ledger_metadata(conn: Conn, batch_key: str, summarizer: Summarizer) -> dict[str, object]:
    """The night's LLM spend from the ledger (every paid answer for this night's batch, over all runs
    of the night): totals, one row per model and mode (sync/batch), and the price per 1,000 memories."""
    rows = ledger.usage_of_batches(conn, [batch_key])
    meta: dict[str, object] = {
        "llm_requests": sum(r.requests for r in rows),
        "input_tokens": sum(r.input_tokens for r in rows),
        "output_tokens": sum(r.output_tokens for r in rows),
        "cache_read_input_tokens": sum(r.cache_read_input_tokens for r in rows),
        "cache_creation_input_tokens": sum(r.cache_creation_input_tokens for r in rows),
        "llm_cost_usd": round(sum(r.cost_usd for r in rows), 6),
        "llm_unpriced_requests": sum(r.unpriced for r in rows),
    }
    if rows:
        meta["llm_by_model"] = markdown_table(
            ["model", "mode", "requests", "failed", "input", "output", "cache read", "cost USD"],
            [
                [
                    r.model,
                    r.mode,
                    r.requests,
                    r.failed,
                    r.input_tokens,
                    r.output_tokens,
                    r.cache_read_input_tokens,
                    f"{r.cost_usd:.6f}",
                ]
                for r in rows
            ],
        )
    return meta | _per_1000_metadata(conn, batch_key, rows, summarizer)


def _per_1000_metadata(
    conn: Conn, batch_key: str, rows: Sequence[ledger.ModelUsage], summarizer: Summarizer
) -> dict[str, object]:
    """This night's measured USD per 1,000 memories: its ledger cost (every paid answer, failed ones
    included) over the memories it summarized, x 1000, with the models and whether that was batch or list
    price. Never a run's total: both counts are of this night's batch only."""
    if not rows:
        if summarizer.kind == "extractive-offline":
            return {"usd_per_1000_memories": 0.0, "price_per_1000_memories": OFFLINE_PER_1000}
        return {"price_per_1000_memories": f"{summarizer.kind}:{summarizer.model}: no LLM answer this night"}
    models = ", ".join(dict.fromkeys(r.model for r in rows))
    unpriced = ", ".join(dict.fromkeys(r.model for r in rows if r.unpriced))
    if unpriced:
        return {"price_per_1000_memories": unknown_price(unpriced)}
    summarized = ledger.memories_summarized(conn, [batch_key])
    cost = sum(r.cost_usd for r in rows)
    if summarized == 0:
        return {"price_per_1000_memories": f"{models}: ${cost:.6f} spent, no memory summarized this night"}
    per_1000 = usd_per_1000(cost, summarized)
    modes = {r.mode for r in rows}
    price = "batch" if modes == {"batch"} else "list" if modes == {"sync"} else "batch and list"
    return {
        "usd_per_1000_memories": round(per_1000, 6),
        "usd_per_1000_memories_price": price,
        "price_per_1000_memories": f"{models}: ${per_1000:.4f} per 1,000 memories at {price} price "
        f"(this night: ${cost:.6f} for {summarized} memories summarized)",
    }


def _log_run(context: dg.AssetExecutionContext, started: float, what: str) -> None:
    ns = run_nights(context)
    context.log.info(f"{what}: {len(ns)} night(s) {ns[0]}..{ns[-1]} in {time.monotonic() - started:.2f}s")


@dg.asset(**_COMMON, deps=[retention_scores], kinds={"postgres"}, code_version="2")
def archival_candidates(
    context: dg.AssetExecutionContext, database: DatabaseResource, archival: ArchivalCriteriaResource
) -> dg.MaterializeResult:
    """Claim each night's batch: eligible memories as of the end of the night, at most batch_size,
    each in at most one open attempt (row locks). Idempotent per night; nothing claimed while paused."""
    started = time.monotonic()
    criteria = archival.get_criteria()
    run = run_nights(context)
    shard = run_shard(context)  # a bad tag fails here, before anything is claimed
    by_night: dict[date, dict[str, object]] = {}
    with database.connect() as conn:
        for night in run:
            o = nights.claim_night(conn, night, criteria, SLOW_PATH.timezone, shard=shard)
            meta: dict[str, object] = {"batch_size": criteria.batch_size, **_shard_meta(conn, night, shard)}
            if o.claim is not None:
                meta |= {
                    "claimed": o.claim.claimed,
                    # Every reason, zeros included, so each plots as its own line (ttl_expired among them).
                    **counts("claimed", dict.fromkeys(eligibility.REASONS, 0) | o.claim.by_reason),
                    "newly_claimed": o.claim.newly_claimed,
                    "taken_over": o.claim.taken_over,
                }
            else:
                meta |= {"claimed": 0, "paused_because": o.skipped}
            by_night[night] = meta
        backlog = eligibility.eligible_counts(conn, criteria, nights.night_as_of(run[-1], SLOW_PATH.timezone))
        by_night[run[-1]] |= {
            "eligible_after": sum(backlog.values()),
            **counts("eligible_after", dict.fromkeys(eligibility.REASONS, 0) | backlog),
            **{f"attempts_{k}": v for k, v in attempt_counts(conn).items()},
            "backlog_read": f"eligible_after_*: as of the end of {run[-1]}, after this run's claims; attempts_*: "
            f"every batch's open attempts, at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        }
    record_nights(context, by_night)
    _log_run(context, started, "claimed")
    return dg.MaterializeResult()


@dg.asset(
    **_COMMON,
    deps=[archival_candidates],
    pool=SLOW_PATH.llm_pool,
    kinds={"postgres", "llm"},
    code_version="2",
)
def memory_summaries(
    context: dg.AssetExecutionContext,
    database: DatabaseResource,
    summarizer: SummarizerResource,
    embedder: EmbedderResource,
    archival: ArchivalCriteriaResource,
) -> dg.MaterializeResult:
    """Summarize each claimed memory (LLM, rate-limited, retried) and embed the summary. A failed or
    empty summary is recorded for that memory; the run goes on. Runs in the LLM concurrency pool.

    A night with more than llm.batch_threshold memories goes through the provider's batch API at half
    price: this step submits it and polls it up to llm.batch_wait_seconds (memory_lib.llm.batches says why
    this step polls rather than a sensor); what is still running then waits for the next run. Metadata:
    the night's LLM ledger (tokens, cost per model and mode), not this run's totals; the night's measured
    usd_per_1000_memories (that cost over the memories it summarized, with model and batch/list price in
    price_per_1000_memories; "unknown price ..." for a model without one); and the memories
    still held by LLM batches (`stalled` and `why` when one of them is stalled: memory_lib.archival.stalls)."""
    started = time.monotonic()
    criteria = archival.get_criteria()
    llm = summarizer.get_summarizer()
    emb = embedder.get_embedder()
    workers = summarizer.llm_config().max_concurrency
    shard = run_shard(context)
    by_night: dict[date, dict[str, object]] = {}
    with database.connect() as conn:
        for night in run_nights(context):
            o = nights.summarize_night(conn, night, llm, emb, criteria, workers=workers, shard=shard)
            t = nights.totals([o])
            preview = conn.execute(
                """SELECT a.memory_id, m.content, a.summary FROM archival_attempts a
                   JOIN memories m ON m.id = a.memory_id AND m.user_id = a.user_id
                   WHERE a.batch_key = %s AND a.summary IS NOT NULL ORDER BY a.updated_at DESC LIMIT 5""",
                (o.batch_key,),
            ).fetchall()
            by_night[night] = {
                "shard": str(shard),
                **_two_step_metadata(t, o.results),
                # Left claimed in a provider batch still running; the next run of the night collects them.
                "waiting_in_llm_batch": t.waiting,
                **_held_metadata(conn, o.batch_key),
                "summarizer": f"{llm.kind}:{llm.model}",
                "embedder": emb.model,
                **_llm_ledger_metadata(conn, o.batch_key, llm),
                "preview": markdown_table(
                    ["memory", "original", "summary"],
                    [[str(r["memory_id"])[:8], r["content"], r["summary"]] for r in preview],
                ),
            }
    record_nights(context, by_night)
    _log_run(context, started, "summarized")
    return dg.MaterializeResult()


@dg.asset(**_COMMON, deps=[memory_summaries], kinds={"postgres", STORE_KIND}, code_version="2")
def archive_backups(
    context: dg.AssetExecutionContext,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
    archival: ArchivalCriteriaResource,
) -> dg.MaterializeResult:
    """Write each summarized memory's full original as canonical JSON, verified (sha256, size) after
    the write; the checkpoint records key, sha256 and size. Nothing is deleted here.

    Then the gate before deletion, per night (pipeline.fidelity_stage, pipeline.gate_stage): every
    backup read back and compared with its source; an unfaithful one goes back to be backed up again,
    and a failed round trip or an error rate above max_error_rate pauses archival. The blocking
    checks backups_round_trip and error_rate_gate then report it (read-only) and stop archive_rows."""
    started = time.monotonic()
    criteria = archival.get_criteria()
    store = object_store.get_store()
    shard = run_shard(context)
    by_night: dict[date, dict[str, object]] = {}
    with database.connect() as conn:
        for night in run_nights(context):
            o = nights.backup_night(conn, night, store, criteria, shard=shard)
            t = nights.totals([o])
            meta: dict[str, object] = {
                "shard": str(shard),
                **_step_metadata(t),
                "objects_written": t.succeeded,
                **size_metadata("bytes_written", t.bytes_written, note="backups written this night"),
                "store": store_location(store),
            }
            if not o.skipped:
                meta |= _gate_before_commit(conn, o.batch_key, store, criteria)
            by_night[night] = meta
    record_nights(context, by_night)
    _log_run(context, started, "backed up")
    return dg.MaterializeResult()


def _gate_before_commit(
    conn: Conn, batch_key: str, store: ObjectStore, criteria: ArchivalCriteria
) -> dict[str, object]:
    """The night's fidelity round trip and error gate, with their writes on failure (as run_batch)."""
    fid = pipeline.fidelity_stage(conn, batch_key, store, criteria, actor=nights.ACTOR)
    meta: dict[str, object] = {
        "round_trip_checked": fid.checked,
        "round_trip_faithful": fid.faithful,
        "round_trip_failed": len(fid.failures),
    }
    if fid.passed:
        gate = pipeline.gate_stage(conn, batch_key, criteria, actor=nights.ACTOR)
        meta |= {
            "attempted": gate.status.attempted,
            "failed_total": gate.status.failed,
            "error_rate": round(gate.status.error_rate, 4),
            "gate_passed": gate.passed,
        }
    else:
        meta["gate_passed"] = False
    if not meta["gate_passed"]:
        meta["paused"] = pause_switch.pause_status(conn).describe()
    return meta


@dg.asset(
    **_COMMON,
    deps=[archive_backups],
    kinds={"postgres", STORE_KIND},
    code_version="2",
    freshness_policy=dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=26)),
)
def archive_rows(
    context: dg.AssetExecutionContext,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
    archival: ArchivalCriteriaResource,
    embedder: EmbedderResource,
):
    """Replace each backed-up original by its archive row (summary + summary embedding + backup
    reference), one transaction per chunk, with an 'archived' audit event. Runs only after the
    fidelity and error-rate checks passed; re-checks the gate and the pause per night itself.

    After each night's commit, the post-commit stage every caller runs
    (memory_lib.archival.post_commit): the gate again (over every step including verify and commit)
    and the tier integrity (every memory in exactly one tier, every committed backup present), a
    failure of either pausing archival; a night that failed the gate after commit fails the asset (the
    nights before it are recorded as materialized: they did archive). Then the retrievability probe: a
    sample of the night's searchable archive rows (superseded originals, hidden from search, are never
    sampled) searched with their own most specific sentence (memory_lib.archival.retrievability), kept on
    the batch for the archive_retrievable check; a night below the floor pauses archival once the
    run's nights are done (later nights and runs archive nothing until an operator clears it).
    Each night says whether it stalled and why (memory_lib.archival.stalls); a night whose memories wait in a
    stalled LLM batch submission fails the step (alerted by archival_failure_alert) without a pause:
    the next run resolves the submission. Freshness: a night not archived within 26 h."""
    started = time.monotonic()
    criteria = archival.get_criteria()
    store = object_store.get_store()
    retrieval = database.run_settings().retrieval
    run = run_nights(context)
    shard = run_shard(context)
    by_night: dict[date, dict[str, Any]] = {}  # Dagster metadata values
    failing: list[tuple[date, str]] = []
    stalled: list[tuple[date, str]] = []  # gate passed, yet memories wait in a stalled LLM batch submission
    probes: list[retrievability.NightRetrievability] = []
    with database.connect() as conn:
        for night in run:
            o = nights.commit_night(conn, night, store, criteria, shard=shard)
            t = nights.totals([o])
            meta: dict[str, Any] = {**_step_metadata(t), "archived": t.succeeded}
            if not o.skipped:
                # The pause of an unfindable night waits for the run's last night (below).
                after = post_commit.post_commit_stage(
                    conn,
                    o.batch_key,
                    store,
                    embedder.get_embedder(),
                    criteria,
                    retrieval,
                    actor=nights.ACTOR,
                    pause_retrievability=False,
                )
                stall = after.stall
                if not after.gate.passed:
                    failing.append((night, after.gate.describe() + (f"; {stall.why}" if stall.why else "")))
                elif stall.failure:
                    stalled.append((night, stall.why or o.batch_key))
                probes.append(after.retrievability)
                meta |= _retrievability_metadata(after.retrievability)
                meta |= {"stalled": stall.stalled, "held_by_llm_batches": sum(h.memories for h in stall.held)}
                meta |= {"why": stall.why} if stall.why else {}
            by_night[night] = (
                _shard_meta(conn, night, shard)
                | meta
                | _archived_by(conn, o.batch_key)
                | _night_tiers(conn, night, shard)
            )
        # After the run's nights: the pause blocks the nights after this run.
        post_commit.pause_unfindable(
            conn, probes, actor=nights.ACTOR, batch_key=nights.batch_key_for(run[-1], shard)
        )
        stats = tier_stats(conn)
    # Table sizes cannot be read as of a night: the run's last night gets them, named as after the run.
    when = f"after the run of {run[0]}..{run[-1]}, at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC (not as of this night)"
    by_night[run[-1]] |= {
        **size_metadata("hot_table_bytes_after_run", stats.hot_bytes, note=f"memories table {when}"),
        **size_metadata(
            "archive_table_bytes_after_run", stats.archived_bytes, note=f"archived_memories table {when}"
        ),
    }
    _log_run(context, started, "committed")
    if failing or stalled:
        # The nights that passed did archive (a stalled one too): record them, then fail the step.
        bad = {n for n, _ in failing}
        for night, meta in by_night.items():
            if night not in bad:
                yield dg.AssetMaterialization(
                    asset_key=context.asset_key, partition=str(night), metadata=meta
                )
        text = []
        if failing:
            text.append(
                f"{len(failing)} night(s) failed the gate after commit; first: {failing[0][1]}. "
                "Failed memories stay hot and archival is paused."
            )
        if stalled:
            text.append(
                f"{len(stalled)} night(s) have memories stalled in an LLM batch submission; first: "
                f"{stalled[0][1]}. The next run looks the submission up or releases it."
            )
        raise dg.Failure(
            description=" ".join(text),
            metadata={
                "nights_failing": markdown_table(
                    ["night", "why"], [[str(n), d] for n, d in (failing + stalled)[:30]], width=300
                )
            },
        )
    record_nights(context, by_night)
    yield dg.MaterializeResult()


def _retrievability_metadata(result: retrievability.NightRetrievability) -> dict[str, object]:
    """The night's retrievability probe (kept on the batch for the archive_retrievable check)."""
    meta: dict[str, object] = {"retrievability_sampled": result.sampled}
    if result.share_found is not None:
        meta["retrievable_share"] = round(result.share_found, 4)
    return meta


def _held_metadata(conn: Conn, batch_key: str) -> dict[str, object]:
    """The night's memories still waiting in LLM batch submissions; `why` names the stalled ones."""
    held = batches.held_submissions(conn, batch_key)
    stuck = [h.describe() for h in held if h.stalled]
    meta: dict[str, object] = {"held_by_llm_batches": sum(h.memories for h in held), "stalled": bool(stuck)}
    return meta | ({"why": "; ".join(stuck)} if stuck else {})


def _shard_meta(conn: Conn, night: date, shard: Shard) -> dict[str, object]:
    """Which shard these numbers are of and, for a shard run, the night's totals over every shard
    (read from the database: a shard's own counts are never shown as the night's)."""
    if shard.is_all:
        return {"shard": str(shard)}
    return {
        "shard": str(shard),
        **{f"night_all_shards_{k}": v for k, v in nights.night_totals(conn, night).items()},
    }


def _night_tiers(conn: Conn, night: date, shard: Shard) -> dict[str, object]:
    """Hot and archived memories (stubs included) at the end of the night, its own archival included,
    every user's (memory_lib.lifecycle.retention.tier_counts): the figures stub_conversions records for
    the night too. The split of the archived into stubs is on stub_conversions, which runs after."""
    t = retention.tier_counts(conn, nights.night_as_of(night, SLOW_PATH.timezone))
    meta: dict[str, object] = {"hot_memories": t.hot, "archived_memories": t.archived + t.stub}
    if not shard.is_all:
        meta["tiers_of"] = "every user; other shards' runs of this night may not have committed yet"
    return meta


def _archived_by(conn: Conn, batch_key: str) -> dict[str, object]:
    reasons = conn.execute(
        """SELECT archive_reason, count(*) AS n, sum(backup_size_bytes) AS bytes FROM archived_memories
           WHERE metadata->>'batch_key' = %s GROUP BY 1""",
        (batch_key,),
    ).fetchall()
    sample = conn.execute(
        """SELECT original_id, user_id, archive_reason, summary FROM archived_memories
           WHERE metadata->>'batch_key' = %s ORDER BY archived_at DESC LIMIT 5""",
        (batch_key,),
    ).fetchall()
    return {
        "archived_total": sum(r["n"] for r in reasons),
        **counts("archived_total", {r["archive_reason"]: r["n"] for r in reasons}),
        **size_metadata(
            "backup_bytes_total",
            int(sum(r["bytes"] or 0 for r in reasons)),
            note="the backups of the archive rows this night made",
        ),
        "sample": markdown_table(
            ["original", "user", "reason", "summary"],
            [[str(r["original_id"])[:8], r["user_id"], r["archive_reason"], r["summary"]] for r in sample],
        ),
    }
