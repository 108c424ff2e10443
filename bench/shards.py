"""shards: one archival backlog drained by 1, 2 and 4 concurrent user-shard runs; each run's rate, the
total, and the total's ratio to the 1-shard run measured in the same bench run.

One backlog is loaded once (generated text, 1536-d synthetic vectors, hot HNSW in place, every memory
older than the force-archive age so all of it is eligible; 32 users chosen so that the shards of 2 and
of 4 hold the same number of users and memories) and cloned for every launcher and N, so only the
launcher and the number of shards differ. Offline extractive summarizer, hashing embedder, SeaweedFS
S3 on loopback (or --s3-endpoint), every other setting its default. Two launchers, each its own table:

* cli: N concurrent shard workers; worker i runs `memory-archive archive --shard i/N` (a process of
  its own, one batch of archival.batch_size) again and again until its shard is drained. A worker's
  time includes each process's start.
* dagster: a Dagster instance per N with the run queue's max_concurrent_runs = N (and the concurrency
  pools' default limit = N, as the scale-out guide says), a real `dagster-daemon`, and N backfills of
  slow_path_job over the same nights, one per shard (run tag memory-archive/shard = i/N). A run's time
  is Dagster's own (start to end of the run record, after its worker process has loaded the
  definitions); the total's wall clock also holds the later runs' launches.

After each N: every memory of the backlog is in exactly one tier, once; the archived count equals the
backlog's eligible count; each run's archived count equals the archived rows of its shard's users.
Anything else raises. `python -m bench.shards --launcher cli` runs one launcher only.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from memory_lib.archival.nights import night_as_of
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.shards import Shard
from memory_lib.lifecycle.eligibility import eligible_counts
from memory_lib.llm.embedding import HashingEmbedder

from .common import (
    HotRow,
    LowRankSpace,
    Options,
    Report,
    Table,
    bench_connect,
    bench_server,
    build_index,
    cli_env,
    copy_hot,
    demo_texts,
    drop_index,
    machine_info,
    old_timestamps,
    ratio,
    scratch_dir,
    set_embedding_model,
    stopwatch,
)
from .machine import loadavg, memory_archive_command

NAME = "shards"
DEFAULT_SIZE = 2_000
SMOKE_SIZE = 96
SHARD_COUNTS = (1, 2, 4)
LAUNCHERS = ("cli", "dagster")
DIM = 1536
# Memories are created > 400 days before AS_OF: older than force_archive_age_days on every night below
# and today, so the whole backlog is eligible whichever as_of a launcher claims with.
AS_OF = datetime(2026, 1, 1, tzinfo=UTC)
FIRST_NIGHT = date(2026, 1, 1)
USERS_PER_SHARD_OF_4 = 8
RUN_TIMEOUT_S = 1800.0

MODEL = (
    "total ≈ min(N × one shard's rate, LLM rate limit, object store PUT/s, Postgres commit/s): shards "
    "add workers, not capacity of the services they share."
)


# --------------------------------------------------------------------------- the backlog


def balanced_users(conn: psycopg.Connection[Any], per_shard_of_4: int = USERS_PER_SHARD_OF_4) -> list[str]:
    """User ids whose shards of 4 (hence also of 2) hold `per_shard_of_4` users each, by the same
    stable hash the shards use: every shard run of an N gets the same amount of work."""
    rows = conn.execute(
        """SELECT u, mod(hashtextextended(u, 0) & 9223372036854775807, 4) AS s
           FROM (SELECT 'bench-user-' || lpad(g::text, 4, '0') AS u FROM generate_series(0, 999) g) x
           ORDER BY u"""
    ).fetchall()
    picked: dict[int, list[str]] = {s: [] for s in range(4)}
    for r in rows:
        if len(picked[r["s"]]) < per_shard_of_4:
            picked[r["s"]].append(r["u"])
    if any(len(v) < per_shard_of_4 for v in picked.values()):
        raise RuntimeError(f"not enough user ids per shard of 4: {picked}")
    # Interleaved by shard: memory j goes to user j mod 32, so every shard's count differs by at most 1.
    return [picked[s][k] for k in range(per_shard_of_4) for s in range(4)]


def load_backlog(conn: psycopg.Connection[Any], n: int, *, seed: int = 0) -> list[str]:
    """n eligible hot memories over balanced users (as bench.archival.load_backlog, its users replaced);
    returns the users."""
    model = HashingEmbedder(DIM).model
    set_embedding_model(conn, model)
    users = balanced_users(conn)
    hnsw_def = drop_index(conn, "memories_embedding_hnsw")
    texts = demo_texts(min(n, 20_000), seed=7 + seed)
    created = old_timestamps(n, AS_OF, seed=seed)
    space = LowRankSpace(DIM, seed=1)
    offset = 0
    for chunk in space.chunks(n, seed=21 + seed):
        rows = []
        for j, vec in enumerate(chunk):
            i = offset + j
            t = texts[i % len(texts)]
            rows.append(
                HotRow(
                    uuid.uuid4(),
                    users[i % len(users)],
                    t.content,
                    vec,
                    created[i],
                    importance_score=t.importance_score,
                    category=t.category,
                    domain=t.domain,
                    metadata={"source": "bench", "turn": i},
                )
            )
        offset += copy_hot(conn, rows, model=model)
    conn.execute("VACUUM ANALYZE memories")
    build_index(conn, hnsw_def, "memories")
    return users


def nights_for(n: int, batch_size: int) -> list[date]:
    """Enough nights for one shard to drain the backlog (a night claims at most batch_size per shard)."""
    return [FIRST_NIGHT + timedelta(days=i) for i in range(max(1, math.ceil(n / batch_size)))]


def eligible_total(conn: psycopg.Connection[Any], as_of: datetime) -> int:
    return sum(eligible_counts(conn, ArchivalCriteria(), as_of).values())


def verify(
    conn: psycopg.Connection[Any], before: set[uuid.UUID], eligible: int, runs: list[RunFigures], n: int
) -> None:
    """Every memory exactly once in hot or archive; archived == eligible; each run's count == its
    shard's archived rows. Raises AssertionError naming what differs."""
    hot = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
    archived = [
        r["original_id"] for r in conn.execute("SELECT original_id FROM archived_memories").fetchall()
    ]
    problems = []
    if len(archived) != len(set(archived)):
        problems.append(f"{len(archived) - len(set(archived))} memories archived more than once")
    if hot & set(archived):
        problems.append(f"{len(hot & set(archived))} memories both hot and archived")
    if hot | set(archived) != before:
        problems.append(
            f"{len(before - hot - set(archived))} memories lost, {len((hot | set(archived)) - before)} new"
        )
    if len(archived) != eligible:
        problems.append(f"archived {len(archived)} != eligible {eligible} of the backlog")
    by_shard = {
        r["s"]: r["n"]
        for r in conn.execute(
            """SELECT mod(hashtextextended(user_id, 0) & 9223372036854775807, %s) AS s, count(*) AS n
               FROM archived_memories GROUP BY 1""",
            (n,),
        ).fetchall()
    }
    for run in runs:
        if run.archived != by_shard.get(run.shard.index, 0):
            problems.append(
                f"run of shard {run.shard} reports {run.archived} archived, "
                f"its users have {by_shard.get(run.shard.index, 0)} archive rows"
            )
    if sum(r.archived for r in runs) != len(archived):
        problems.append(
            f"runs report {sum(r.archived for r in runs)} archived, the table holds {len(archived)}"
        )
    if problems:
        raise AssertionError(f"{n} shard run(s): " + "; ".join(problems))


# --------------------------------------------------------------------------- figures


@dataclass
class RunFigures:
    shard: Shard
    archived: int
    start: float  # wall-clock seconds (time.time), comparable across processes
    end: float
    batches: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def rate(self) -> float:
        return ratio(self.archived, self.seconds)


@dataclass
class NFigures:
    n: int
    runs: list[RunFigures]
    load_start: list[float]
    load_end: list[float]
    eligible: int
    peak_connections: int  # to the clone's database, sampled while the runs went on

    @property
    def archived(self) -> int:
        return sum(r.archived for r in self.runs)

    @property
    def wall(self) -> float:
        """First run's start to last run's end: the time the N runs took together."""
        return max(r.end for r in self.runs) - min(r.start for r in self.runs)

    @property
    def rate(self) -> float:
        """The backlog over the common wall clock: what the N runs delivered together."""
        return ratio(self.archived, self.wall)

    @property
    def rate_sum(self) -> float:
        """The runs' own rates added up: equal to `rate` when the runs start and end together; above it by
        what staggered starts and unequal shards cost."""
        return sum(r.rate for r in self.runs)


# --------------------------------------------------------------------------- services


@dataclass
class S3Target:
    endpoint_url: str
    bucket: str
    env: dict[str, str]  # credentials for child processes ({} when they come from this environment)


@contextmanager
def s3_target(opts: Options, root: Path) -> Iterator[S3Target]:
    """SeaweedFS on loopback (started here), or --s3-endpoint with credentials from the AWS environment.
    The bucket is versioned, as the preflight asks of a production bucket."""
    from memory_lib.storage.objectstore import s3_client

    from .machine import ensure_bucket

    if opts.s3_endpoint:
        bucket = opts.s3_bucket or "memory-archive-bench"
        client = s3_client(opts.s3_endpoint, "us-east-1")
        ensure_bucket(client, bucket)
        client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        yield S3Target(opts.s3_endpoint, bucket, {})
        return
    from testing.seaweedfs import run_seaweedfs

    with run_seaweedfs(root / "seaweedfs") as ep:
        bucket = ep.create_bucket("bench-shards")
        ep.client().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        yield S3Target(
            ep.endpoint_url,
            bucket,
            {"AWS_ACCESS_KEY_ID": ep.access_key, "AWS_SECRET_ACCESS_KEY": ep.secret_key},
        )


def child_env(db_url: str, s3: S3Target, prefix: str, state_dir: Path) -> dict[str, str]:
    """bench.common.cli_env for the clone's database with S3 at `prefix`."""
    return cli_env(
        db_url,
        s3.env
        | {
            "MEMORY_ARCHIVE_OBJECT_STORE": "s3",
            "MEMORY_ARCHIVE_BUCKET": s3.bucket,
            "MEMORY_ARCHIVE_PREFIX": prefix,
            "MEMORY_ARCHIVE_S3_ENDPOINT_URL": s3.endpoint_url,
            "AWS_REGION": "us-east-1",
        },
        state_dir,
        dim=DIM,
    )


@contextmanager
def connection_sampler(server_url: str, dbname: str, interval_s: float = 0.2) -> Iterator[dict[str, int]]:
    """Count the connections to `dbname` (pg_stat_activity) every `interval_s` while the block runs;
    out["peak"] is the most seen at once: what N shard runs need of Postgres' max_connections."""
    out = {"peak": 0}
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(server_url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)
                ).fetchone()
                out["peak"] = max(out["peak"], int(row[0]) if row else 0)
                if stop.wait(interval_s):
                    return

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()


def _threads(jobs: Sequence[Callable[[], RunFigures]]) -> list[RunFigures]:
    """Run the jobs in threads released together; re-raise the first error after all have ended."""
    results: list[RunFigures | None] = [None] * len(jobs)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = jobs[i]()
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


# --------------------------------------------------------------------------- launcher (a): the CLI


def cli_worker(env: dict[str, str], shard: Shard, batch_size: int) -> RunFigures:
    """`memory-archive archive --shard i/N` until a batch claims less than a full batch (the shard is
    drained). A process that fails, or a batch with a failed memory, raises."""
    cmd = [memory_archive_command(), "archive", "--shard", str(shard)]
    archived = batches = 0
    start = time.time()
    while True:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(cmd[1:])}` exited {proc.returncode}:\n{proc.stderr[-2000:]}\n{proc.stdout[-1000:]}"
            )
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        if out["failed"] or not out["ok"]:
            raise AssertionError(f"shard {shard}: batch {out['batch_key']} failed: {out}")
        archived += out["archived"]
        batches += 1
        if out["claimed"] < batch_size:
            break
    return RunFigures(shard, archived, start, time.time(), batches)


def run_cli(env: dict[str, str], n: int, batch_size: int) -> list[RunFigures]:
    shards = [Shard(i, n) for i in range(n)]
    return _threads([functools.partial(cli_worker, env, s, batch_size) for s in shards])


# --------------------------------------------------------------------------- launcher (b): Dagster


def shard_tag() -> str:
    """memory_assets' run tag of a shard run. Its module reads the settings when first imported: a first
    night set for that import keeps it from looking for a database (and logging that it found none)."""
    saved = os.environ.get("MEMORY_ARCHIVE_PARTITION_START")
    os.environ["MEMORY_ARCHIVE_PARTITION_START"] = FIRST_NIGHT.isoformat()
    try:
        from memory_assets.defs.slow_path.partitions import SHARD_TAG
    finally:
        if saved is None:
            del os.environ["MEMORY_ARCHIVE_PARTITION_START"]
        else:
            os.environ["MEMORY_ARCHIVE_PARTITION_START"] = saved
    return SHARD_TAG


def dagster_home(env: dict[str, str], n: int) -> Path:
    """The project's instance file in env's DAGSTER_HOME, with the run queue's max_concurrent_runs = n
    and the pools' default limit = n (the llm_api pool would otherwise let one summarize step run at a
    time across the n runs)."""
    import yaml  # type: ignore[import-untyped]  # a dependency of dagster

    from memory_assets.dev import prepare_dagster_home

    home = prepare_dagster_home(env)
    path = home / "dagster.yaml"
    config = yaml.safe_load(path.read_text())
    config["concurrency"]["runs"]["max_concurrent_runs"] = n
    config["concurrency"]["pools"]["default_limit"] = n
    path.write_text(
        f"# memory_assets.dev's instance file; bench shards: max_concurrent_runs and pools at {n}.\n"
        + yaml.safe_dump(config, sort_keys=False)
    )
    return home


def submit_shard_backfills(instance: Any, env: dict[str, str], n: int, nights: list[date]) -> list[str]:
    """One backfill of slow_path_job over `nights` per shard of n (run tag memory-archive/shard = i/n),
    stored before the daemon starts so it sees them all at once. The first goes through
    memory_assets.backfill.submit_job_backfill (which loads the workspace to check the partitions);
    the others are copies of it with their own id and shard tag."""
    from dagster._core.utils import make_new_backfill_id

    from memory_assets.backfill import submit_job_backfill

    tag = shard_tag()
    keys = [d.isoformat() for d in nights]
    first = submit_job_backfill(
        instance,
        "slow_path_job",
        keys,
        title=f"bench shards 0/{n}",
        tags={tag: f"0/{n}"},
        env=env,
    )
    if first.runs_expected != 1:
        raise RuntimeError(f"{len(keys)} nights make {first.runs_expected} runs per backfill, expected 1")
    ids = [first.backfill_id]
    stored = instance.get_backfill(first.backfill_id)
    for i in range(1, n):
        copy = stored._replace(
            backfill_id=make_new_backfill_id(), tags={tag: f"{i}/{n}"}, title=f"bench shards {i}/{n}"
        )
        instance.add_backfill(copy)
        ids.append(copy.backfill_id)
    return ids


def run_dagster(env: dict[str, str], n: int, nights: list[date], log: Path) -> list[RunFigures]:
    import dagster as dg

    from memory_assets.backfill import backfill_runs, read_run, running_daemon, wait_for_backfill

    dagster_home(env, n)
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    ids = submit_shard_backfills(instance, env, n, nights)
    figures = []
    with running_daemon(env, log) as daemon:
        for backfill_id in ids:
            try:
                wait_for_backfill(
                    instance, backfill_id, timeout_s=RUN_TIMEOUT_S, daemon=daemon, runs_finished=1
                )
            except (TimeoutError, RuntimeError) as e:
                raise RuntimeError(f"{e}\n{log.read_text()[-3000:]}") from e
    for backfill_id in ids:
        (record,) = backfill_runs(instance, backfill_id)
        run = read_run(instance, record)
        if run.status != dg.DagsterRunStatus.SUCCESS.value or run.start_time is None or run.end_time is None:
            raise AssertionError(
                f"run {run.run_id} of backfill {backfill_id}: {run.status}\n{log.read_text()[-3000:]}"
            )
        archived = sum(
            int(str(m.metadata["archived"].value))  # an IntMetadataValue per night
            for m in run.materializations
            if m.asset_key == dg.AssetKey("archive_rows")
        )
        shard = Shard.parse(record.dagster_run.tags[shard_tag()])
        figures.append(
            RunFigures(shard, archived, run.start_time, run.end_time, len(nights), {"run_id": run.run_id})
        )
    instance.dispose()
    return sorted(figures, key=lambda f: f.shard.index)


# --------------------------------------------------------------------------- run


def run(opts: Options, launchers: Sequence[str] = LAUNCHERS) -> Report:
    unknown = set(launchers) - set(LAUNCHERS)
    if unknown or not launchers:
        raise ValueError(f"launchers={list(launchers)!r}: expected some of {list(LAUNCHERS)}")
    sizes = opts.sizes_or([DEFAULT_SIZE], [SMOKE_SIZE])
    if len(sizes) != 1:
        raise ValueError(f"--size {sizes}: the shard bench takes one backlog size")
    size = sizes[0]
    batch_size = ArchivalCriteria().batch_size
    nights = nights_for(size, batch_size)
    report = Report(
        NAME,
        {
            "size": size,
            "dim": DIM,
            "shard_counts": list(SHARD_COUNTS),
            "launchers": list(launchers),
            "batch_size": batch_size,
            "nights": [nights[0].isoformat(), nights[-1].isoformat()],
        },
    )
    with ExitStack() as stack:
        server = stack.enter_context(bench_server(opts.workdir))
        root = stack.enter_context(scratch_dir(opts.workdir, "ma-bench-shards-"))
        s3 = stack.enter_context(s3_target(opts, root))
        tmpl = "shards_backlog"
        url = server.create(tmpl, DIM)
        with bench_connect(url) as conn, stopwatch() as load_t:
            report.machine = machine_info(conn)
            users = load_backlog(conn, size)
            before = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
        report.figures = {"load_s": load_t[0], "users": len(users), "launchers": {}}
        for launcher in launchers:
            results: list[NFigures] = []
            for n in SHARD_COUNTS:
                db = f"shards_{launcher}_{n}"
                run_url = server.clone(tmpl, db)
                work = root / db
                env = child_env(run_url, s3, f"{db}-{uuid.uuid4().hex[:6]}", work / "state")
                with bench_connect(run_url) as conn:
                    as_of = datetime.now(UTC) if launcher == "cli" else night_as_of(nights[-1], "UTC")
                    eligible = eligible_total(conn, as_of)
                    if eligible != size:
                        raise AssertionError(f"{db}: {eligible} of {size} memories eligible, expected all")
                load_start = loadavg()
                with connection_sampler(server.url, db) as connections:
                    if launcher == "cli":
                        runs = run_cli(env, n, batch_size)
                    else:
                        env |= {
                            "DAGSTER_HOME": str(work / "dagster"),
                            "MEMORY_ARCHIVE_PARTITION_START": FIRST_NIGHT.isoformat(),
                        }
                        runs = run_dagster(env, n, nights, work / "daemon.log")
                figs = NFigures(n, runs, load_start, loadavg(), eligible, connections["peak"])
                with bench_connect(run_url) as conn:
                    verify(conn, before, eligible, runs, n)
                results.append(figs)
                server.drop(db)
            _table(report, launcher, results, size)
    return report


LAUNCHER_TITLES = {
    "cli": "CLI: N concurrent `memory-archive archive --shard i/N` workers",
    "dagster": "Dagster: N shard backfills run by dagster-daemon, max_concurrent_runs = N",
}
LAUNCHER_NOTES = {
    "cli": "A run = one shard's worker: `memory-archive archive --shard i/N` repeated (one process per batch of "
    "500, the CLI's cap) until its shard is drained; its time includes every process start.",
    "dagster": "A run = one Dagster run of slow_path_job over the backfill's nights for one shard (tag "
    "memory-archive/shard); its time is the run record's start (its worker process has started and loaded the "
    "definitions) to end: every asset and blocking check of every night; the total's wall clock also holds "
    "the launches of the runs that started later (`started at s`). Instance: the project's dagster.yaml with "
    "max_concurrent_runs = N and the pools' default limit = N (with the default limit 1 the llm_api pool "
    "lets one summarize step run at a time across all runs).",
}


def _table(report: Report, launcher: str, results: list[NFigures], size: int) -> None:
    base = results[0].rate
    rows: list[list[Any]] = []
    for r in results:
        first = min(run.start for run in r.runs)
        for run in r.runs:
            rows.append(
                [r.n, f"shard {run.shard}", run.start - first, run.archived, run.seconds, run.rate]
                + [None] * 4
            )
        rows.append(
            [r.n, "total", None, r.archived, r.wall, None, r.rate_sum, r.rate, ratio(r.rate, base)]
            + [r.peak_connections]
        )
    cpus = os.cpu_count()
    loads = "; ".join(f"N={r.n}: {r.load_start[0]} → {r.load_end[0]}" for r in results)
    note = (
        f"Baseline: the 1-shard run of this launcher, same backlog ({size:,} memories, 1536-d, every one "
        "eligible), measured in the same bench run; each N on a fresh clone of it. Real pipeline, default "
        "settings: offline extractive summarizer + hashing embedder, SeaweedFS S3 on loopback. Checked after "
        "each N: every memory exactly once in hot or archive, archived = eligible, each run's count = its "
        f"shard's archive rows. Total row: seconds = first run's start to last run's end (wall); "
        "Σ run memories/s = the runs' rates added; backlog ÷ wall = what they delivered together (lower when "
        "starts are staggered or shards unequal); the ratio is backlog ÷ wall over the 1-shard run's. "
        "Peak connections: to the run's database at once (pg_stat_activity every 0.2 s). "
        f"{LAUNCHER_NOTES[launcher]} What bounds the total here: the CPU. This machine "
        f"has {cpus} cores shared by Postgres, SeaweedFS and every worker (and other jobs: 1-min load average "
        f"{loads}), so N > {cpus} runs only split the same cores. Model: {MODEL} With a hosted LLM the "
        "summarize step waits on the network and the LLM rate limit is the usual bound."
    )
    report.tables.append(
        Table(
            f"Shard runs, {LAUNCHER_TITLES[launcher]}",
            [
                "N",
                "run",
                "started at s",
                "archived",
                "seconds",
                "memories/s",
                "Σ run memories/s",
                "backlog ÷ wall memories/s",
                "total vs 1 shard",
                "peak connections",
            ],
            rows,
            note,
        )
    )
    report.figures["launchers"][launcher] = {
        str(r.n): {
            "archived": r.archived,
            "eligible": r.eligible,
            "wall_s": r.wall,
            "total_rate_per_s": r.rate,
            "sum_of_run_rates_per_s": r.rate_sum,
            "ratio_vs_1": ratio(r.rate, base),
            "peak_connections": r.peak_connections,
            "load_start": r.load_start,
            "load_end": r.load_end,
            "runs": [
                {
                    "shard": str(run.shard),
                    "archived": run.archived,
                    "seconds": run.seconds,
                    "rate_per_s": run.rate,
                    "batches": run.batches,
                    **run.detail,
                }
                for run in r.runs
            ],
        }
        for r in results
    }
    report.figures["cpu_count"] = cpus


# --------------------------------------------------------------------------- one launcher from a shell


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.shards [--launcher cli|dagster] [bench options]`: as `python -m bench shards`,
    with one launcher only."""
    from .__main__ import options, parser
    from .common import RESULTS_DIR, write_json

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--launcher", choices=LAUNCHERS, action="append")
    args, rest = p.parse_known_args(argv)
    bench_args = parser().parse_args([NAME, *rest])
    opts = options(bench_args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    report = run(opts, tuple(args.launcher or LAUNCHERS))
    report.seconds = time.perf_counter() - started
    report.params["smoke"] = opts.smoke
    print(report.markdown(), flush=True)
    suffix = "-smoke" if opts.smoke else ""
    path = write_json(report, bench_args.json or RESULTS_DIR / f"{NAME}{suffix}.json")
    print(f"(JSON: {path})\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
