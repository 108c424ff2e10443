"""The demo, through Dagster: `python -m memory_assets.demo [--full] [--days N] [--users N] [--per-day LO,HI] [--dim D]`.

1. Starts the embedded Postgres under $MEMORY_ARCHIVE_STATE_DIR (default: the checkout's .state) and recreates the
   dedicated database `memory_demo` (never DATABASE_URL's database), loads a deterministic history
   (149 days by default, --full for 450) and searches one memory that the nights will archive.
2. Backfills every night from the history's first eligible night to yesterday as a Dagster backfill of
   slow_path_job: starts `dagster-daemon` on $DAGSTER_HOME (default <state>/dagster), submits the
   backfill (the daemon splits it by the backfill policy, 30 nights a run, and the run queue runs them
   one after another in date order) and prints each run's per-night results from the event log. The UI
   (`make dev`) then shows the backfill, slow_path_job's runs and the timeline.
3. Prints the checks, the tiers and table sizes before/after, the objects written, a few archive rows,
   the same search after archival with one expansion, the consolidation (consolidation_job for each
   month partition and yearly_digests_job for their years, run in the demo's Dagster instance so the UI
   shows them; the months start at the history's first month), and one memory restored
   through the `rollback` job and compared byte for byte; then the backfill's final status (the daemon
   marks it on its next loop) and stops the daemon.
Offline: extractive summaries and hashing embeddings, no network call. Stops the processes it started.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import sys
import time
import warnings
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

if TYPE_CHECKING:  # imported lazily at run time (main imports memory_lib once settings are set)
    pass

from memory_assets.demo_consolidation import consolidation
from memory_assets.demo_output import QUIET, human, plural, probe_query, section, show_hits

ROOT = Path(__file__).resolve().parent.parent
DEMO_DB = "memory_demo"
OBJECTS = "demo-objects"
DAEMON_LOG = "dagster-daemon.log"
DEFAULT_DAYS = 149
FULL_DAYS = 450


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m memory_assets.demo", description=__doc__.splitlines()[0])
    # 149 days (~11k memories) give 60 nights to archive, 2 runs of the backfill policy's 30 nights: the
    # demo takes under 3 minutes on 2 cores. --full is the 15-month history (~34k memories, 13 runs).
    p.add_argument("--days", type=int, default=None, help=f"days of history (default {DEFAULT_DAYS})")
    p.add_argument(
        "--full", action="store_true", help=f"the full {FULL_DAYS}-day history (~34k memories, 10-20 minutes)"
    )
    p.add_argument("--users", type=int, default=4, help="users, 1-4 (default 4)")
    p.add_argument("--per-day", default="50,100", help="memories a day across users, LO,HI (default 50,100)")
    p.add_argument("--dim", type=int, default=384, help="embedding dimension (default 384)")
    args = p.parse_args(argv)
    if args.full and args.days is not None:
        p.error(f"--full and --days={args.days}: give one of them")
    args.days = FULL_DAYS if args.full else (args.days or DEFAULT_DAYS)
    try:
        lo, _, hi = args.per_day.partition(",")
        args.per_day = (int(lo), int(hi or lo))
    except ValueError:
        p.error(f"--per-day={args.per_day!r}: expected LO,HI such as 50,100")
    if args.days < 100:
        p.error(f"--days={args.days}: at least 100, so some memories are older than min_age_days=90")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    started = time.monotonic()
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the daemon and the Postgres server are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from memory_lib.core.config import default_state_dir

    state = Path(os.getenv("MEMORY_ARCHIVE_STATE_DIR") or default_state_dir()).resolve()
    history_end = datetime.combine(
        datetime.now(UTC).date(), datetime.min.time(), UTC
    )  # generate_history's end

    from memory_lib.core.config import ArchivalCriteria, Settings

    criteria = ArchivalCriteria()
    # The first night whose end is min_age_days after the history's first day: the first with candidates.
    first_night = (history_end - timedelta(days=args.days - criteria.min_age_days + 1)).date()
    # The partitions are built at import from the environment: start them at the first eligible night.
    os.environ["MEMORY_ARCHIVE_PARTITION_START"] = first_night.isoformat()
    # Consolidation's months start at the history's first month: the first nights archive its memories.
    first_month = (history_end - timedelta(days=args.days)).date().replace(day=1)
    os.environ["MEMORY_ARCHIVE_SLOW_PATH__CONSOLIDATION_START_DATE"] = first_month.isoformat()
    demo_settings = {
        "MEMORY_ARCHIVE_PARTITION_START": first_night.isoformat(),
        "MEMORY_ARCHIVE_SLOW_PATH__CONSOLIDATION_START_DATE": first_month.isoformat(),
        "MEMORY_ARCHIVE_EMBEDDED_DB": DEMO_DB,
        "MEMORY_ARCHIVE_EMBEDDING_DIM": str(args.dim),
        "MEMORY_ARCHIVE_EMBEDDER": "hashing",
        "MEMORY_ARCHIVE_SUMMARIZER": "extractive",
        "MEMORY_ARCHIVE_OBJECT_STORE": "local",
        "MEMORY_ARCHIVE_LOCAL_ROOT": str(state / OBJECTS),
        "MEMORY_ARCHIVE_STATE_DIR": str(state),
    }
    timezone = Settings.from_env().slow_path.timezone
    # The retrievability gate's sample and floor: the defaults, unless the environment sets them.
    retrieval = Settings.from_env().retrieval
    from memory_lib.archival.nights import night_as_of

    zone_today = datetime.now(UTC).astimezone(ZoneInfo(timezone)).date()
    last_night = zone_today - timedelta(days=1)

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    logging.getLogger("dagster").setLevel(logging.WARNING)
    import dagster as dg
    import psycopg
    from psycopg.conninfo import make_conninfo

    from memory_assets import backfill
    from memory_assets.defs.rollback.jobs import rollback
    from memory_assets.defs.slow_path.partitions import BACKFILL_NIGHTS_PER_RUN
    from memory_assets.demo_data import generate_history
    from memory_assets.dev import DEMO_ENV, demo_env, prepare_dagster_home
    from memory_assets.resources import (
        DatabaseResource,
        EmbedderResource,
        ObjectStoreResource,
        SummarizerResource,
    )
    from memory_lib.archival import integrity
    from memory_lib.client import MemoryClient
    from memory_lib.core.models import BackupObject, NewMemory
    from memory_lib.lifecycle import eligibility
    from memory_lib.llm.embedding import HashingEmbedder
    from memory_lib.storage import packs
    from memory_lib.storage.db import EmbeddedPostgres, connect, migrate
    from memory_lib.storage.objectstore import LocalObjectStore
    from memory_lib.storage.store import insert_memories, tier_stats

    print(
        "memory-archive demo: the Slow Path through Dagster (offline: extractive summaries, "
        f"HashingEmbedder {args.dim}-d lexical embeddings, local object store)"
    )
    print(f"state dir {state}; database {DEMO_DB} in the embedded Postgres (DATABASE_URL is not used)")
    server = EmbeddedPostgres(state / "pg")
    server_url = server.start()
    daemon_stack = ExitStack()  # the dagster-daemon, once started
    submitted: backfill.SubmittedBackfill | None = None
    try:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DEMO_DB} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {DEMO_DB}")
            # A throwaway database: skip the WAL flush per commit (the steps checkpoint every memory
            # in its own statement). A crash may lose the last commits, never consistency.
            admin.execute(f"ALTER DATABASE {DEMO_DB} SET synchronous_commit = off")
        url = make_conninfo(server_url, dbname=DEMO_DB)
        migrate(url, embedding_dim=args.dim)
        shutil.rmtree(state / OBJECTS, ignore_errors=True)
        (state / DEMO_ENV).write_text(
            "# Written by python -m memory_assets.demo; read by python -m memory_assets.dev --demo\n"
            + "".join(f"{k}={v}\n" for k, v in demo_settings.items())
        )
        conn = connect(url)

        section("Loading the history")
        t = time.monotonic()
        embedder = HashingEmbedder(args.dim)
        items = list(
            generate_history(end=history_end, days=args.days, per_day=args.per_day, users=args.users)
        )
        # The history's last day goes through MemoryClient.add below, as an agent writes; the days before
        # it are loaded like an existing memory table being imported, with their access history (access
        # counts and last reads, which `add` does not write: they come from reads).
        last_day = history_end - timedelta(days=1)
        today = [m for m in items if m.created_at >= last_day]
        items = [m for m in items if m.created_at < last_day]
        vectors = embedder.embed([m.content for m in items])
        # Bulk load: building the HNSW index once after the COPY is several times faster than
        # inserting into it row by row; it is rebuilt from its own definition, so it is the migration's.
        indexdef = conn.execute("SELECT pg_get_indexdef('memories_embedding_hnsw'::regclass) AS d").fetchone()
        assert indexdef is not None  # one row: the index exists (the migration created it)
        hnsw = indexdef["d"]
        conn.execute("DROP INDEX memories_embedding_hnsw")
        batch: list[NewMemory] = []
        for m, v in zip(items, vectors, strict=True):
            batch.append(m.as_new_memory(v, embedder.model))
            if len(batch) == 5000:
                insert_memories(conn, batch, actor="demo-loader")
                batch = []
        insert_memories(conn, batch, actor="demo-loader")
        conn.execute("SET maintenance_work_mem = '256MB'")
        conn.execute(hnsw)
        conn.execute("RESET maintenance_work_mem")
        writer = MemoryClient(conn, embedder=embedder, settings=Settings.from_env(), actor="demo-agent")
        outcomes = Counter(
            writer.add(
                m.user_id,
                m.content,
                category=m.category,
                domain=m.domain,
                importance=m.importance_score,
                metadata=m.metadata,
                entity_links=m.entity_links,
                now=m.created_at,
            ).outcome
            for m in today
        )
        print(
            f"the last day's {len(today)} memories written with MemoryClient.add (add-only): "
            + ", ".join(f"{outcomes[o]} {o}" for o in ("created", "duplicate", "merged", "superseded"))
        )
        items += today
        users = Counter(m.user_id for m in items)
        print(
            f"{len(items)} memories of {plural(len(users), 'user')} over {args.days} days "
            f"({items[0].created_at:%Y-%m-%d} .. {items[-1].created_at:%Y-%m-%d}) in {time.monotonic() - t:.0f} s"
        )
        before = tier_stats(conn)
        print(f"tiers before: hot {before.hot}, archived {before.archived}")
        print(
            f"table bytes before: memories {human(before.hot_bytes)}, archived_memories {human(before.archived_bytes)}"
        )

        # Memories the last night may archive, as they are now: the restore check compares against these.
        watch = [
            r["id"]
            for r in eligibility.select_eligible(conn, criteria, night_as_of(last_night, timezone), 50)
        ]
        snapshot = integrity.exact_rows(conn, watch)
        # Recall before: one of them, searched by its names and numbers as a user remembers them (one with
        # a number when there is one: the history repeats its sentences with other names and numbers).
        queries = {i: probe_query(snapshot[i]["content"]) for i in watch}
        probe_id = min(
            (i for i in watch if queries[i]), key=lambda i: not re.search(r"\d", queries[i]), default=None
        )
        probe = None if probe_id is None else snapshot[probe_id]
        reader = MemoryClient(conn, embedder=embedder, settings=Settings.from_env(), actor="demo-reader")
        if probe is not None:
            section("Recall before archival: memory_lib's search, default settings")
            query = queries[probe["id"]]
            print(f"memory {str(probe['id'])[:8]} ({probe['user_id']}, hot): {probe['content']!r}")
            print(f"query, its names and numbers: {query!r}")
            show_hits(reader.search(probe["user_id"], query), probe["id"])

        section(f"Backfill {first_night} .. {last_night}: a Dagster backfill run by the daemon")
        print(
            f"retrievability probe: up to {retrieval.retrievability_sample_size} archived memories a night, each "
            f"searched by its most specific sentence; at least {100 * retrieval.retrievability_floor:.0f}% must be in the "
            "top 10"
        )
        # The daemon, its code server and the runs get the demo's settings (demo.env), not DATABASE_URL.
        env = demo_env(dict(os.environ))
        home = prepare_dagster_home(env)
        os.environ.update({k: env[k] for k in ("DAGSTER_HOME", "DAGSTER_PG_URL") if k in env})
        instance = dg.DagsterInstance.get()
        # A new database: the materializations of an earlier demo's nights no longer describe it.
        instance.wipe_assets(
            [
                dg.AssetKey(k)
                for k in (
                    "retention_scores",
                    "archival_candidates",
                    "memory_summaries",
                    "archive_backups",
                    "archive_rows",
                    "stub_conversions",
                )
            ]
        )
        print(
            f"Dagster instance: {home} ({'postgres' if env.get('DAGSTER_PG_URL') else 'sqlite'} storage); "
            f"daemon log: {state / DAEMON_LOG}"
        )
        nights = [first_night + timedelta(days=i) for i in range((last_night - first_night).days + 1)]
        check_results: dict[str, list[tuple[bool, str, dict[str, Any]]]] = {}
        totals: Counter[str] = Counter()
        done: list[backfill.RunResult] = []
        expected = 0

        def report(run: backfill.RunResult) -> None:
            # One materialization per night and asset, each with that night's own numbers: add them up.
            done.append(run)
            night_totals: Counter[str] = Counter()
            for m in run.materializations:
                values: dict[str, Any] = {k: v.value for k, v in m.metadata.items()}
                for field in {
                    "archival_candidates": ("claimed",),
                    "archive_rows": ("archived",),
                    "archive_backups": ("bytes_written",),
                }.get(m.asset_key.path[-1], ()):
                    night_totals[field] += values.get(field, 0)
            totals.update(night_totals)
            outcomes: Counter[str] = Counter()
            for ev in run.checks:  # one per check and night, from the run's event log
                values = {k: v.value for k, v in ev.metadata.items()} | {"night": ev.partition}
                check_results.setdefault(ev.check_name, []).append((ev.passed, ev.severity.value, values))
                outcomes[f"{ev.check_name} {'ok' if ev.passed else 'FAILED'}"] += 1
            marks = ", ".join(f"{k} x{v}" for k, v in outcomes.items())
            print(
                f"run {len(done):>2}/{expected} {run.nights[0]}..{run.nights[1]} {run.status}: "
                f"claimed {night_totals['claimed']:>5}, archived {night_totals['archived']:>5}; {marks} "
                f"({run.seconds:.0f} s)",
                flush=True,
            )

        t = time.monotonic()
        # The daemon runs until the end: it marks the backfill done on its next loop (up to 30 s after
        # the last run), while the demo goes on.
        daemon = daemon_stack.enter_context(backfill.running_daemon(env, state / DAEMON_LOG))
        submitted = backfill.submit_job_backfill(
            instance,
            "slow_path_job",
            [n.isoformat() for n in nights],
            env=env,
            title=f"memory-archive demo backlog {first_night}..{last_night}",
            tags={"memory-archive/demo": "backfill"},
        )
        expected = submitted.runs_expected
        print(
            f"backfill {submitted.backfill_id}: {plural(len(nights), 'night')} of slow_path_job in {plural(expected, 'run')} "
            f"of up to {BACKFILL_NIGHTS_PER_RUN} nights (backfill policy), one run at a time (run queue), "
            f"at most {criteria.batch_size} memories a night; the daemon starts them",
            flush=True,
        )
        backfill.wait_for_backfill(
            instance,
            submitted.backfill_id,
            timeout_s=6 * 3600,
            on_run=report,
            daemon=daemon,
            runs_finished=expected,
        )
        print(
            f"{len(done)}/{expected} runs finished in {time.monotonic() - t:.0f} s "
            "(a failed gate fails its run and pauses archival: the later runs archive nothing)"
        )
        backfill_s = time.monotonic() - t
        store_resource = ObjectStoreResource(
            kind="local", local_root=str(state / OBJECTS), prefix="memory-archive"
        )

        section("Check results")
        for name, runs in check_results.items():
            passed = sum(1 for p, _, _ in runs if p)
            detail = ""
            if name == "stubs_backed_up":
                # The state of the whole bucket when each night was checked: the last night's is now's.
                last = runs[-1][2]
                detail = (
                    f"{last['stubs']} stubs, {last['backups_missing']} backups missing, "
                    f"{last['backups_mismatched']} mismatched at the last night"
                )
            elif name == "backups_round_trip":
                detail = (
                    f"{sum(m['checked'] for _, _, m in runs)} backups read back, "
                    f"{sum(m['faithful'] for _, _, m in runs)} faithful, {sum(m['failed'] for _, _, m in runs)} failed"
                )
            elif name == "error_rate_gate":
                worst = max(runs, key=lambda r: r[2]["error_rate"])[2]
                failing = [m["night"] for p, sev, m in runs if not p and sev == "ERROR"]
                detail = (
                    f"{sum(m['failed'] for _, _, m in runs)}/{sum(m['attempted'] for _, _, m in runs)} failed; "
                    f"worst night {worst['night']} {100 * worst['error_rate']:.1f}% "
                    f"(max {100 * worst['max_error_rate']:.0f}%)"
                    + (f"; failing nights: {', '.join(failing[:10])}" if failing else "")
                )
            elif name == "archive_retrievable":
                probed = [m for _, _, m in runs if not m.get("nothing_to_check")]
                detail = (
                    f"{sum(m['found'] for m in probed)}/{sum(m['sampled'] for m in probed)} sampled archived memories "
                    f"found in the top 10 by their most specific sentence over {plural(len(probed), 'night')}; "
                    f"{plural(len(runs) - len(probed), 'night')} with nothing archived to probe"
                )
            elif name == "tiers_consistent":
                problems: Counter[str] = Counter()
                for _, _, meta in runs:
                    problems.update(
                        {
                            k: v
                            for k, v in meta.items()
                            if isinstance(v, int)
                            and not isinstance(v, bool)
                            and k not in ("archived_by_this_night", "backups_checked")
                        }
                    )
                detail = ", ".join(f"{k} {v}" for k, v in problems.items())
            verdict = "PASSED" if passed == len(runs) else "FAILED"
            print(f"{name:<20} {verdict} on {passed}/{len(runs)} nights" + (f" ({detail})" if detail else ""))

        section("After the backfill")
        after = tier_stats(conn)
        print(
            f"tiers after: hot {after.hot}, archived {after.archived} "
            f"(claimed {totals['claimed']}, archived {totals['archived']} in {backfill_s:.0f} s)"
        )
        print(
            f"memories {before.hot} -> {after.hot + after.archived} in total: each exactly once in hot or archive"
        )
        t = time.monotonic()
        conn.execute("VACUUM FULL ANALYZE memories")
        conn.execute("VACUUM FULL ANALYZE archived_memories")
        vacuumed = tier_stats(conn)
        print("table bytes (pg_total_relation_size: heap + TOAST + indexes)")
        print(
            f"  memories:          before {human(before.hot_bytes):>9}   after archival {human(after.hot_bytes):>9}"
            f"   after VACUUM FULL {human(vacuumed.hot_bytes):>9}"
        )
        print(
            f"  archived_memories: before {human(before.archived_bytes):>9}   after archival "
            f"{human(after.archived_bytes):>9}   after VACUUM FULL {human(vacuumed.archived_bytes):>9}"
        )
        both_before, both_after = (
            before.hot_bytes + before.archived_bytes,
            vacuumed.hot_bytes + vacuumed.archived_bytes,
        )
        print(
            f"  both:              {human(both_before)} -> {human(both_after)} "
            f"({100 * (both_before - both_after) / both_before:.0f}% less; VACUUM FULL took {time.monotonic() - t:.1f} s; "
            "deleted rows only free disk after a vacuum)"
        )
        store = store_resource.get_store()
        assert isinstance(store, LocalObjectStore)
        keys = integrity.backup_keys(store)
        object_bytes = sum((store.root / k).stat().st_size for k in keys)
        db_row = conn.execute(
            "SELECT coalesce(sum(backup_size_bytes), 0) AS b FROM archived_memories"
        ).fetchone()
        assert db_row is not None  # an aggregate returns one row
        db_bytes = db_row["b"]
        n_packs = sum(map(packs.is_pack_key, keys))
        print(
            f"objects written: {len(keys)} ({n_packs} of them packs of one user's memories),"
            f" {human(object_bytes)} under {store.root}/memory-archive"
            f" (archive rows record {human(db_bytes)})"
        )

        section(
            "Some archive rows (offline extractive summaries keep the most informative sentences verbatim;"
            " the demo's memories are one sentence long)"
        )
        rows = conn.execute(
            f"""SELECT DISTINCT ON (a.user_id) a.original_id, a.user_id, a.archive_reason, a.original_created_at,
                       a.summary, {packs.backup_sql("a")}
                FROM archived_memories a ORDER BY a.user_id, a.original_created_at LIMIT 4"""
        ).fetchall()
        for r in rows:
            doc = BackupObject.from_json_bytes(store.read_ref(r["storage_ref"], r["backup_sha256"]))
            print(
                f"- {r['user_id']} {r['original_created_at']:%Y-%m-%d} [{r['archive_reason']}] {str(r['original_id'])[:8]}"
            )
            print(f"    summary:  {r['summary']}")
            print(f"    original: {doc.content}")

        if probe is not None:
            section("Recall after archival: the same search, then one expansion")
            result = reader.search(probe["user_id"], queries[probe["id"]])
            print(f"phase 2 (archived summaries) searched: {result.phase2_reason or 'no'}")
            hit = show_hits(result, probe["id"])
            if hit is not None and hit.source == "archived":
                client = MemoryClient(conn, embedder=embedder, object_store=store)
                expansion = client.expand(probe["user_id"], hit.id)
                print(
                    f"expanded archive {str(hit.id)[:8]}: sha256 verified; original text equal to the memory "
                    f"before archival: {expansion.content == probe['content']}; promoted to hot: {expansion.promoted}"
                )

        consolidated_ok = consolidation(
            conn,
            instance,
            {
                "database": DatabaseResource(database_url=url),
                "embedder": EmbedderResource(provider="hashing", dim=args.dim),
                "summarizer": SummarizerResource(provider="extractive"),
            },
        )

        section("Restore through the rollback job, compared byte for byte")
        archived_now = {
            r["original_id"]
            for r in conn.execute(
                "SELECT original_id FROM archived_memories WHERE original_id = ANY(%s)", (watch,)
            ).fetchall()
        }
        # Not the recall probe: its expansion counted an access on the archive row.
        pick = next((i for i in watch if i in archived_now and (probe is None or i != probe["id"])), None)
        restored_ok = False
        if pick is None:
            print("none of the watched memories was archived: nothing to restore")
        else:
            run = rollback.execute_in_process(
                resources={"database": DatabaseResource(database_url=url), "object_store": store_resource},
                instance=instance,
                run_config={"loggers": QUIET["loggers"]}
                | {
                    "ops": {"restore_archives": {"config": {"original_ids": [str(pick)], "operator": "demo"}}}
                },
            )
            back = integrity.exact_rows(conn, [pick]).get(pick)
            want = snapshot[pick]
            restored_ok = run.success and back == want
            differing = [k for k in want if back is None or back[k] != want[k]]
            print(
                f"memory {pick} ({want['user_id']}): restored by run {run.run_id[:8]}; "
                f"{len(want)} columns compared (embedding as {args.dim} float32 = {len(want['embedding'])} bytes, "
                "metadata, entity_links, timestamps, tsvector)"
            )
            print("byte-exact: YES" if restored_ok else f"byte-exact: NO, differs in {differing}")
            final = tier_stats(conn)
            print(f"tiers now: hot {final.hot}, archived {final.archived}")
        conn.close()
        result = backfill.wait_for_backfill(instance, submitted.backfill_id, timeout_s=120, daemon=daemon)
        ok = result.status.value == "COMPLETED_SUCCESS"
        print(f"backfill {submitted.backfill_id}: {result.status.value}, as the daemon marked it")
        daemon_stack.close()
        submitted = None
        all_green = ok and consolidated_ok and all(p for runs in check_results.values() for p, _, _ in runs)
        section("Done")
        print(
            f"demo finished in {time.monotonic() - started:.0f} s: "
            f"{'all checks green' if all_green else 'SOME CHECKS FAILED'}; restore byte-exact: {restored_ok}"
        )
        print("UI on the demo database: python -m memory_assets.dev --demo   (then http://127.0.0.1:3000)")
        return 0 if all_green and restored_ok else 1
    except BaseException:
        daemon_stack.close()
        if submitted is not None:  # the daemon is stopped: say so in the instance, not "in progress"
            backfill.cancel_backfill(instance, submitted.backfill_id, "the demo stopped before the end")
            print(f"backfill stopped; the daemon's log: {state / DAEMON_LOG}")
        raise
    finally:
        daemon_stack.close()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
