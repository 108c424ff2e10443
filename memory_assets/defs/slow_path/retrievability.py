"""The retrievability gate: can each night's archived memories still be found by two-phase search?

Blocking, ERROR severity, on archive_rows: a sample of each night's archived memories is searched with
its own first sentence (memory_lib.retrievability); a night whose share found in the top 10 is below
RetrievalConfig.retrievability_floor (0.9) fails the check and pauses archival, so later nights archive
nothing until an operator clears the pause (job `clear_archival_pause`).
"""

import dagster as dg

from memory_assets.metadata import markdown_table
from memory_assets.resources import DatabaseResource, EmbedderResource, ObjectStoreResource
from memory_lib import retrievability, slow_path
from memory_lib.config import Settings

from .assets import archive_rows
from .partitions import run_nights

_ACTOR = "slow-path-check"


@dg.asset_check(asset=archive_rows, blocking=True)
def archive_retrievable(
    context: dg.AssetCheckExecutionContext,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
    embedder: EmbedderResource,
) -> dg.AssetCheckResult:
    """Each night: the share of sampled archived memories found in the top 10 by their first sentence is
    at least the floor (0.9). A failing night pauses archival; the table names every night's share."""
    config = Settings.from_env().retrieval
    store, emb = object_store.get_store(), embedder.get_embedder()
    keys = [slow_path.batch_key_for(n) for n in run_nights(context)]
    with database.connect() as conn:
        nights = retrievability.probe_nights(conn, emb, store, keys, config=config)
        failing = [r for r in nights if not r.passed]
        if failing:
            slow_path.set_pause(
                conn, reason=failing[0].describe() + (f" (+{len(failing) - 1} more nights)" if len(failing) > 1 else ""),
                actor=_ACTOR, batch_key=failing[0].batch_key,
                details={"check": "archive_retrievable", "failing_nights": [r.batch_key for r in failing]},
            )  # fmt: skip
    sampled = sum(r.sampled for r in nights)
    found = sum(r.found for r in nights)
    meta: dict[str, object] = {
        "floor": config.retrievability_floor,
        "sampled": sampled,
        "found": found,
        **({"share_found": round(found / sampled, 4)} if sampled else {}),
        "nights_failing": len(failing),
        "failing_nights": ", ".join(r.batch_key for r in failing) or "none",
        "nights": markdown_table(
            ["night", "archived", "sampled", "found in top 10", "share", "passed"],
            [[r.batch_key, r.archived, r.sampled, r.found,
              "-" if r.share_found is None else f"{100 * r.share_found:.0f}%", "yes" if r.passed else "NO"]
             for r in (failing or nights)[:40]],
        ),  # fmt: skip
        "duration_s": round(sum(r.seconds for r in nights), 2),
    }
    if failing:
        meta["missed_examples"] = ", ".join(str(m) for r in failing for m in r.missed[:3])[:500]
    return dg.AssetCheckResult(
        passed=not failing,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=meta,
        description=None
        if not failing
        else f"{failing[0].describe()}: archived memories are not findable, archival paused",
    )
