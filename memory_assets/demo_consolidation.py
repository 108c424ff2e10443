"""The demo's consolidation section (memory_assets.demo): monthly and yearly digests, facts and key
moments through Dagster, as the monthly schedules run them, and one "who is X?" answered from facts."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from memory_assets.demo_output import QUIET, plural, section

if TYPE_CHECKING:
    import dagster as dg

    from memory_lib.core.rows import Conn


def consolidation(conn: Conn, instance: dg.DagsterInstance, resources: dict[str, Any]) -> bool:
    """Level-2 and level-3 digests, facts and key moments through Dagster, as the monthly schedules run
    them: consolidation_job for each month partition that has memories, then yearly_digests_job for
    each of their years (offline builders, with the jobs' blocking checks), in `instance`, so the UI
    shows them materialized; then the figures, and one "who is X?" answered from facts. Months with
    memories that are not partitions (before the first month partition) are named, not built; so is the
    month in progress, which becomes a partition when it ends."""
    import dagster as dg

    from memory_assets.defs.consolidation import assets as consolidation
    from memory_assets.defs.consolidation import checks
    from memory_assets.defs.consolidation.jobs import consolidation_job, yearly_job
    from memory_assets.defs.consolidation.partitions import TIMEZONE, months, years
    from memory_lib.consolidation.facts import who_is
    from memory_lib.consolidation.sources import user_months

    section(
        "Consolidation through Dagster: monthly and yearly digests, facts and key moments (offline builders)"
    )
    t = time.monotonic()
    keys = [
        consolidation.monthly_digests.key,
        consolidation.yearly_digests.key,
        consolidation.memory_facts.key,
        consolidation.key_moments.key,
    ]
    # A new database: an earlier demo's digests no longer describe it.
    instance.wipe_assets(keys)
    defs = dg.Definitions(
        assets=[
            consolidation.monthly_digests,
            consolidation.yearly_digests,
            consolidation.memory_facts,
            consolidation.key_moments,
        ],
        asset_checks=[
            checks.monthly_digests_provenance,
            checks.monthly_digests_fresh,
            checks.yearly_digests_provenance,
            checks.memory_facts_provenance,
            checks.key_moments_provenance,
        ],
        jobs=[consolidation_job, yearly_job],
        resources=resources,
    )
    with_memories = sorted({m for _, m in user_months(conn, tz=TIMEZONE)})
    partitions = set(months.get_partition_keys())
    built = [m for m in with_memories if m.isoformat() in partitions]
    not_partitions = [m for m in with_memories if m.isoformat() not in partitions]
    year_keys = sorted({str(m.year) for m in built} & set(years.get_partition_keys()))
    runs: list[tuple[str, str, Any]] = []
    for job, partition_keys in (
        ("consolidation_job", [m.isoformat() for m in built]),
        ("yearly_digests_job", year_keys),
    ):
        for key in partition_keys:
            result = defs.resolve_job_def(job).execute_in_process(
                partition_key=key, instance=instance, run_config=QUIET, raise_on_error=False
            )
            runs.append((job, key, result))
    failed_checks = [
        f"{e.check_name} {key}" for _, key, r in runs for e in r.get_asset_check_evaluations() if not e.passed
    ]
    failed_runs = [f"{job} {key}" for job, key, r in runs if not r.success]
    n = {
        r["t"]: r["n"]
        for r in conn.execute(
            """SELECT 'l2' AS t, count(*) AS n FROM memory_digests WHERE level = 2 UNION ALL
           SELECT 'l3', count(*) FROM memory_digests WHERE level = 3 UNION ALL
           SELECT 'facts', count(*) FROM memory_facts UNION ALL SELECT 'closed', count(*) FROM memory_facts
           WHERE valid_to IS NOT NULL UNION ALL SELECT 'moments', count(*) FROM key_moments"""
        ).fetchall()
    }

    def span(keys: list[str]) -> str:
        return f"{keys[0]}..{keys[-1]}" if keys else "none"

    month_keys = [f"{m:%Y-%m}" for m in built]
    print(
        f"months {span(month_keys)} by {plural(len(month_keys), 'run')} of consolidation_job, years "
        f"{span(year_keys)} by {plural(len(year_keys), 'run')} of yearly_digests_job, in the Dagster instance: "
        f"{n['l2']} monthly and {n['l3']} yearly digests, {n['facts']} facts ({n['closed']} closed by a newer "
        f"value), {n['moments']} key moments in {time.monotonic() - t:.1f} s"
    )
    first = min(partitions, default="")
    before = [f"{m:%Y-%m}" for m in not_partitions if m.isoformat() < first]
    if before:
        print(f"not built: {', '.join(before)}, before the first month partition {first[:7]}")
    in_progress = datetime.now(UTC).astimezone(ZoneInfo(TIMEZONE)).date()
    print(
        f"the month in progress, {in_progress:%Y-%m}, becomes a partition when it ends (the monthly schedule)"
    )
    print(
        "checks (blocking, per partition): provenance and freshness "
        + ("OK on every partition" if not failed_checks else f"FAILED: {', '.join(failed_checks[:10])}")
        + (f"; runs failed: {', '.join(failed_runs)}" if failed_runs else "")
    )
    d = conn.execute(
        "SELECT user_id, summary FROM memory_digests WHERE level = 3 ORDER BY period_start, user_id LIMIT 1"
    ).fetchone()
    if d:
        print(f"a yearly digest ({d['user_id']}): {d['summary'][:400]}")
    who = conn.execute(
        "SELECT user_id, object FROM memory_facts WHERE predicate = 'has manager' "
        "ORDER BY user_id, valid_from DESC LIMIT 1"
    ).fetchone()
    if who:
        print(f"who is {who['object']}? ({who['user_id']}, answered from facts, with their sources)")
        for f in who_is(conn, who["user_id"], who["object"], limit=6):
            print("  - " + _fact_line(conn, who["user_id"], f))
    return bool(runs) and not failed_checks and not failed_runs


def _fact_line(conn: Conn, user_id: str, fact: dict[str, Any], shown: int = 3) -> str:
    """One merged fact of `who_is` with its provenance: validity, and each source memory's id and tier
    (memory_lib.retrieval.consolidated.source_memories_plan, as a phase-3 expansion reads them)."""
    from memory_lib.core.plans import run_plan
    from memory_lib.retrieval.consolidated import source_memories_plan

    ids = fact["source_memory_ids"]
    memories, _ = run_plan(conn, source_memories_plan(user_id, ids))
    tier = {m.memory_id: m.tier for m in memories}
    until = f"until {fact['valid_to']:%Y-%m-%d}" if fact["valid_to"] else "still valid"
    sources = ", ".join(f"{i} ({tier.get(i, 'missing')})" for i in ids[:shown])
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    archived = sum(tier.get(i) == "archived" for i in ids)
    return (
        f"{fact['subject']} {fact['predicate']} {fact['object']} (from {fact['valid_from']:%Y-%m-%d}, {until}; "
        f"{len(ids)} source{'s' if len(ids) != 1 else ''}, {archived} archived: {sources}{more}; {', '.join(sorted(fact['extractors']))})"
    )
