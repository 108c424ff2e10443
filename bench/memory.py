"""memory: peak RSS of an archival run over a small and a 10x larger backlog (it must not grow with the
backlog).

Each run is a fresh subprocess (`python -m bench.memory --child ...`) that imports the library,
connects, and runs the nightly archival (memory_lib.archival.nights.run_night: claim, summarize, embed, back
up to SeaweedFS S3, verify, commit) for the same number of nights of 500, so both runs do the same
work and only the backlog differs. `--batches 0` drains the whole backlog instead (then the larger
run also does 10x the work: a leak would show). Peak = the child's VmHWM.
"""

from __future__ import annotations

import argparse
import json
import os
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
DEFAULT_BATCHES = 3
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

    import psutil

    from memory_lib.archival.archive import ArchivalServices
    from memory_lib.core.config import ArchivalCriteria
    from memory_lib.llm.embedding import HashingEmbedder
    from memory_lib.llm.summarize import ExtractiveSummarizer
    from memory_lib.storage.objectstore import LocalObjectStore, S3ObjectStore, s3_client

    from . import adapters

    if args.s3_endpoint:
        store: Any = S3ObjectStore(s3_client(args.s3_endpoint, "us-east-1"), args.s3_bucket, "bench")
    else:
        store = LocalObjectStore(Path(args.local_root), "bench")
    services = ArchivalServices(ExtractiveSummarizer(), HashingEmbedder(args.dim), store)
    criteria = ArchivalCriteria(batch_size=args.batch_size)
    conn = bench_connect(args.url, prepare=True)
    rss_ready = psutil.Process().memory_info().rss
    archived = nights = 0
    with stopwatch() as t:
        while args.batches == 0 or nights < args.batches:
            done = adapters.archival_night(conn, services, criteria, FIRST_NIGHT + timedelta(days=nights))
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
                "engine": adapters.archival_engine(),
            }
        )
    )
    conn.close()
    return 0


# --------------------------------------------------------------------------- parent


@contextmanager
def _store_args(opts: Options, root: Path):
    """Child arguments and environment for the object store: SeaweedFS (started here) or --s3-endpoint."""
    if opts.s3_endpoint:
        from memory_lib.storage.objectstore import s3_client

        from .archival import ensure_bucket

        bucket = opts.s3_bucket or "memory-archive-bench"
        ensure_bucket(s3_client(opts.s3_endpoint, "us-east-1"), bucket)
        yield ["--s3-endpoint", opts.s3_endpoint, "--s3-bucket", bucket], {}
        return
    from tests.support.seaweedfs import run_seaweedfs

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
    report.figures = {"runs": results, "peak_ratio": ratio(results[-1]["peak_rss"], base["peak_rss"])}
    return report


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2:]))
    sys.exit("usage: python -m bench memory ... (this module's own entry point is for its child process)")
