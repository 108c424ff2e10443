"""memory: a night's time and peak RSS of an archival run over a small and a 10x larger backlog (neither
may grow with the backlog: a night costs what the night does).

Each run is a fresh subprocess (`python -m bench.memory --child ...`) that imports the library,
connects, and runs nights of 500 as the nightly job runs them (memory_lib.archival.nights.run_night:
the night's retention scores, then claim, summarize, embed, back up to SeaweedFS S3, verify, commit),
with default settings. Between two nights a day of use goes through the public API (untimed):
MemoryClient.add of 100 new memories and record_access of 300. Each night also reads what the Dagster
retention asset shows for it (the score distribution and the tiers per user). The first night after
the bulk load computes every memory's retention once (as the first night after an import or an
upgrade does); it is reported on its own, and the later nights are the steady state. Both runs do the
same work and only the backlog differs. `--batches 0` drains the whole backlog instead (then the
larger run also does 10x the work: a leak would show). Peak = the child's VmHWM.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from .common import (
    REPO_ROOT,
    Options,
    Report,
    Table,
    bench_connect,
    bench_server,
    ratio,
    scratch_dir,
    stopwatch,
)

NAME = "memory"
DEFAULT_SIZES = (10_000, 100_000)
SMOKE_SIZES = (200, 2000)
DEFAULT_BATCHES = 4  # the first night (every memory's first retention score) and three steady nights
DAY_ADDS = 20  # between two nights: MemoryClient.add calls (each searches its near-duplicates)
DAY_ACCESSES = 300  # and memories used (record_access)
DIM = 1536
FIRST_NIGHT = date(2026, 1, 1)


# --------------------------------------------------------------------------- child


def peak_rss_bytes() -> int:
    """This process's RSS high-water mark since exec.

    Not getrusage's ru_maxrss: Linux keeps it across fork + exec, so a child of a parent that held
    100k vectors would report the parent's size. VmHWM belongs to the address space exec created.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux: best available


def _child(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--s3-endpoint")
    p.add_argument("--s3-bucket")
    p.add_argument("--local-root")
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--dim", type=int, required=True)
    args = p.parse_args(argv)

    import psutil  # type: ignore[import-untyped]

    from memory_lib.archival.archive import ArchivalServices
    from memory_lib.archival.nights import night_as_of
    from memory_lib.client import MemoryClient
    from memory_lib.core.config import ArchivalCriteria, RetentionConfig, Settings
    from memory_lib.lifecycle import retention
    from memory_lib.llm.embedding import HashingEmbedder
    from memory_lib.llm.summarize import ExtractiveSummarizer
    from memory_lib.storage.objectstore import LocalObjectStore, S3ObjectStore, s3_client

    from . import adapters

    if args.s3_endpoint:
        store: Any = S3ObjectStore(s3_client(args.s3_endpoint, "us-east-1"), args.s3_bucket, "bench")
    else:
        store = LocalObjectStore(Path(args.local_root), "bench")
    embedder = HashingEmbedder(args.dim)
    services = ArchivalServices(ExtractiveSummarizer(), embedder, store)
    criteria = ArchivalCriteria(batch_size=args.batch_size)
    conn = bench_connect(args.url, prepare=True)
    client = MemoryClient(conn, embedder=embedder, settings=Settings(), actor="bench")
    users = [
        r["user_id"] for r in conn.execute("SELECT DISTINCT user_id FROM memories ORDER BY 1").fetchall()
    ]
    rng = random.Random(5)
    rss_ready = psutil.Process().memory_info().rss
    archived = nights = 0
    per_night: list[dict[str, float]] = []
    with stopwatch() as t:
        while args.batches == 0 or nights < args.batches:
            night = FIRST_NIGHT + timedelta(days=nights)
            as_of = night_as_of(night, "UTC")
            if nights:  # a day of use through the public API, untimed
                day = as_of - timedelta(hours=12)
                for i in range(DAY_ADDS):
                    client.add(
                        users[i % len(users)], f"Day {nights} note {i}: checked the Heron rollout.", now=day
                    )
                hot = conn.execute(
                    "SELECT user_id, id FROM memories ORDER BY random() LIMIT %s", (DAY_ACCESSES,)
                ).fetchall()
                for user in {r["user_id"] for r in hot}:
                    ids = [r["id"] for r in hot if r["user_id"] == user]
                    client.record_access(user, ids, now=day + timedelta(minutes=rng.randrange(600)))
            with stopwatch() as t_ret:  # what run_night does first, timed on its own here
                scored = retention.score(conn, as_of, RetentionConfig(), timezone="UTC")
            with stopwatch() as t_night:
                done = adapters.archival_night(conn, services, criteria, night)
            with stopwatch() as t_ui:  # what the assets read for the night's metadata: scores, then tiers
                retention.distribution(conn, as_of, cold_migration_days=criteria.cold_migration_days)
                retention.tier_counts(conn, as_of)
            per_night.append(
                {
                    "retention_s": t_ret[0],
                    "computed": scored.scored,
                    "archival_s": t_night[0],
                    "ui_reads_s": t_ui[0],
                    "night_s": t_ret[0] + t_night[0] + t_ui[0],
                }
            )
            nights += 1
            archived += done
            if done == 0:
                break
    peak = peak_rss_bytes()
    print(
        json.dumps(
            {
                "rss_ready": rss_ready,
                "peak_rss": peak,
                "rss_end": psutil.Process().memory_info().rss,
                "archived": archived,
                "nights": nights,
                "seconds": t[0],
                "per_night": per_night,
                "engine": adapters.archival_engine(),
            }
        )
    )
    conn.close()
    return 0


# --------------------------------------------------------------------------- parent


def _steady(run: dict[str, Any]) -> dict[str, float]:
    """The mean of the nights after the first (the first alone when there is no other)."""
    nights = run["per_night"][1:] or run["per_night"][:1]
    return {k: sum(n[k] for n in nights) / len(nights) for k in nights[0]}


@contextmanager
def _store_args(opts: Options, root: Path):
    """Child arguments and environment for the object store: SeaweedFS (started here) or --s3-endpoint."""
    if opts.s3_endpoint:
        from memory_lib.storage.objectstore import s3_client

        from .machine import ensure_bucket

        bucket = opts.s3_bucket or "memory-archive-bench"
        ensure_bucket(s3_client(opts.s3_endpoint, "us-east-1"), bucket)
        yield ["--s3-endpoint", opts.s3_endpoint, "--s3-bucket", bucket], {}
        return
    from testing.seaweedfs import run_seaweedfs

    with run_seaweedfs(root / "seaweedfs") as ep:
        bucket = ep.create_bucket("bench-memory")
        env = {"AWS_ACCESS_KEY_ID": ep.access_key, "AWS_SECRET_ACCESS_KEY": ep.secret_key}
        yield ["--s3-endpoint", ep.endpoint_url, "--s3-bucket", bucket], env


def run(opts: Options) -> Report:
    from .archival import load_backlog

    sizes = opts.sizes_or(DEFAULT_SIZES, SMOKE_SIZES)
    batches = DEFAULT_BATCHES if opts.batches is None else opts.batches
    batch_size = 50 if opts.smoke else 500
    if opts.smoke and opts.batches is None:
        batches = 2
    report = Report(NAME, {"sizes": sizes, "batches": batches, "batch_size": batch_size, "dim": DIM})
    results = []
    with (
        bench_server(opts.workdir) as server,
        scratch_dir(opts.workdir, "ma-bench-mem-") as root,
        _store_args(opts, root) as (store_args, store_env),
    ):
        report.machine = server.machine_info()
        for n in sizes:
            url = server.create(f"mem_{n}", DIM)
            with bench_connect(url) as conn, stopwatch() as load_t:
                # The hot HNSW index is not read or written by archival (deletes leave it to VACUUM):
                # skipping its build keeps the 100k run short without changing what is measured.
                load_backlog(conn, n, hnsw=False)
            cmd = [
                sys.executable,
                "-m",
                "bench.memory",
                "--child",
                "--url",
                url,
                "--batches",
                str(batches),
                "--batch-size",
                str(batch_size),
                "--dim",
                str(DIM),
                *store_args,
            ]
            proc = subprocess.run(
                cmd,
                cwd=REPO_ROOT,
                env=os.environ | store_env,
                capture_output=True,
                text=True,
                timeout=3600,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"archival child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            res |= {"backlog": n, "load_s": load_t[0]}
            if batches and res["archived"] != min(n, batches * batch_size):
                raise AssertionError(
                    f"backlog {n}: archived {res['archived']}, expected {batches * batch_size}"
                )
            if not batches and res["archived"] != n:
                raise AssertionError(f"backlog {n}: drained {res['archived']} of {n}")
            results.append(res)
            server.drop(f"mem_{n}")
    base = results[0]
    mib = 1024 * 1024
    rows = []
    for r in results:
        rows.append(
            [
                r["backlog"],
                r["archived"],
                r["nights"],
                r["rss_ready"] / mib,
                r["peak_rss"] / mib,
                (r["peak_rss"] - r["rss_ready"]) / mib,
                ratio(r["peak_rss"], base["peak_rss"]),
                r["seconds"],
            ]
        )
    work = "the whole backlog" if not batches else f"{batches} nights of {batch_size}"
    report.tables.append(
        Table(
            f"Peak RSS of an archival run ({work}), by backlog size",
            [
                "backlog",
                "archived",
                "nights",
                "RSS ready MiB",
                "peak RSS MiB",
                "growth during run MiB",
                f"peak vs {base['backlog']:,} backlog",
                "run s",
            ],
            rows,
            f"Baseline: the run over the {base['backlog']:,}-memory backlog. Engine: {base['engine']}; SeaweedFS S3, "
            f"offline summarizer, hashing embedder, {DIM}-d. 'RSS ready' = after imports and connect, before the run; "
            "peak = the child's VmHWM (RSS high-water mark).",
        )
    )
    steady = [_steady(r) for r in results]
    night_rows = []
    for r, st in zip(results, steady, strict=True):
        first = r["per_night"][0]
        night_rows.append(
            [
                r["backlog"],
                first["computed"],
                first["night_s"],
                len(r["per_night"]) - 1,
                st["computed"],
                st["retention_s"],
                st["archival_s"],
                st["ui_reads_s"],
                st["night_s"],
                ratio(st["night_s"], steady[0]["night_s"]),
            ]
        )
    report.tables.append(
        Table(
            f"A night's time by backlog size (nights of {batch_size}, default settings)",
            [
                "backlog",
                "first night: retention rows computed",
                "first night s",
                "steady nights",
                "retention rows computed / night",
                "retention s",
                "archival s",
                "UI reads s",
                "night s",
                f"night vs {base['backlog']:,} backlog",
            ],
            night_rows,
            "Steady nights: the mean of the nights after the first, each after a day of use through the public "
            f"API ({DAY_ADDS} MemoryClient.add, {DAY_ACCESSES} memories used with record_access). Night = the "
            "night's retention scores (memory_lib.lifecycle.retention.score: only memories written, used or "
            "re-categorized since the last night) + memory_lib.archival.nights.run_night (claim, summarize, "
            "embed, back up, verify, commit) + what the Dagster retention asset reads for the night's metadata "
            "(score distribution and tiers per user). The first night after a bulk load computes every "
            "memory's retention once, as the first night after an import or an upgrade does.",
        )
    )
    report.figures = {
        "runs": results,
        "peak_ratio": ratio(results[-1]["peak_rss"], base["peak_rss"]),
        "night_ratio": ratio(steady[-1]["night_s"], steady[0]["night_s"]),
        "steady_night_s": {r["backlog"]: st["night_s"] for r, st in zip(results, steady, strict=True)},
    }
    return report


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2:]))
    sys.exit("usage: python -m bench memory ... (this module's own entry point is for its child process)")
