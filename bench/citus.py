"""citus: the same data on one node and on a Citus cluster, in the same run: default search latency and
top-10, and the archival rate of N concurrent shard processes.

* One node: a plain database on the cluster's coordinator (same PostgreSQL 15 + pgvector binaries, no
  citus extension), made by the superuser with `vector` and `btree_gin`, owned by the application role,
  migrated by it. Cluster: a database made by testing.citus.CitusDatabases: migrated and distributed by
  the statements of docs/how-to/distributed-postgres.md, as a user following the page gets it.
* Search: search's corpus (bench.search_corpus: real text, 1536-d, 4 users; n hot + 4n archived rows as
  migration 007 stores them), loaded by binary COPY into both databases chunk by chunk (the same rows,
  the same ids), HNSW built after the load, counts and BM25 statistics checked on both. Then
  `MemoryClient.search` with every setting its default (a client over a pool per database) for the same
  held-out queries, node and cluster interleaved: p50/p95 per side, their ratio (goal cluster <= 1.5x),
  and how often the two top-10s are the same memories.
* Archival: a backlog as bench.shards loads it (generated text, every memory eligible, 32 users balanced
  over shards) in a fresh database per run, drained by N concurrent `memory-archive archive --shard i/N
  --until-drained` processes (offline extractive summarizer, hashing embedder, a local object store or
  S3): 1 process on the node, 1 and 2 on the cluster. Memories/s over the wall clock and the ratio to the
  node. After each run every memory must be exactly once in hot or archive. A process that fails is
  reported with its message (a row and the failures table), never a traceback; the bench goes on.

Cluster URLs: TEST_CITUS_ADMIN_URL / TEST_CITUS_URL, else the shared kit's defaults on 127.0.0.1:16000.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from memory_lib import MemoryClient, Settings
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.shards import Shard
from memory_lib.storage.db import migrate_database

from .common import (
    REPO_ROOT,
    Options,
    Report,
    Table,
    bench_connect,
    build_index,
    cli_env,
    copy_archived,
    copy_hot,
    drop_index,
    machine_info,
    percentiles_ms,
    ratio,
    scratch_dir,
    set_embedding_model,
    stopwatch,
)
from .machine import loadavg, memory_archive_command
from .search_corpus import ARCHIVED_PER_HOT, DIM, NOW, Corpus

NAME = "citus"
DEFAULT_SIZE, SMOKE_SIZE = 10_000, 300
DEFAULT_QUERIES, SMOKE_QUERIES = 200, 12
DEFAULT_BACKLOG, SMOKE_BACKLOG = 2_000, 96
CLUSTER_SHARDS = (1, 2)
K = 10
RATIO_GOAL = 1.5
RUN_TIMEOUT_S = 1800.0
log = logging.getLogger(__name__)
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:16000/memories"
DEFAULT_APP_URL = "postgresql://memory_owner:change-me@127.0.0.1:16000/memories"


def cluster_urls() -> tuple[str, str]:
    """(admin, app): the test pass's URLs when set, else the shared kit's defaults."""
    from testing.citus import citus_urls

    return citus_urls() or (DEFAULT_ADMIN_URL, DEFAULT_APP_URL)


def _one_line(exc: BaseException | str, limit: int = 400) -> str:
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:limit]


# --------------------------------------------------------------------------- databases


class Databases:
    """The run's databases on the cluster: plain ones on the coordinator (one node) and distributed ones
    (testing.citus.CitusDatabases); all dropped at the end, also on error."""

    def __init__(self, admin_url: str, app_url: str):
        from testing.citus import CitusDatabases

        self.admin_url, self.app_url = admin_url, app_url
        self.prefix = f"bench_citus_{uuid.uuid4().hex[:6]}"
        self.cluster = CitusDatabases(admin_url, app_url, prefix=f"{self.prefix}_c")
        self.role = str(conninfo_to_dict(app_url)["user"])
        self._plain: list[str] = []
        self._distributed: list[str] = []

    def node(self) -> str:
        """A plain database on the coordinator, set up as a DBA would for one node, migrated by the app role."""
        name = f"{self.prefix}_n{len(self._plain)}"
        with psycopg.connect(make_conninfo(self.admin_url, dbname="postgres"), autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(self.role))
            )
        self._plain.append(name)
        with psycopg.connect(make_conninfo(self.admin_url, dbname=name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
        url = make_conninfo(self.app_url, dbname=name)
        migrate_database(url, DIM)
        log.info("plain database %s made and migrated", name)
        return url

    def distributed(self) -> str:
        with stopwatch() as t:
            url = self.cluster.create(DIM)
        self._distributed.append(str(conninfo_to_dict(url)["dbname"]))
        log.info("distributed database made, migrated and distributed in %.1f s", t[0])
        return url

    def drop(self) -> None:
        """Every database of the run, all at once: each DROP DATABASE waits for a checkpoint of its node
        (minutes on a loaded machine), and concurrent ones share it."""
        with psycopg.connect(self.admin_url) as conn:
            workers = conn.execute(
                "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary'"
            ).fetchall()
        nodes = [self.admin_url] + [make_conninfo(self.admin_url, host=h, port=str(p)) for h, p in workers]
        pairs = [(self.admin_url, name) for name in self._plain] + [
            (node, name) for name in self._distributed for node in nodes
        ]

        def drop_one(pair: tuple[str, str]) -> None:
            node, name = pair
            with psycopg.connect(make_conninfo(node, dbname="postgres"), autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

        with stopwatch() as t, ThreadPoolExecutor(max(1, len(pairs))) as pool:
            list(pool.map(drop_one, pairs))
        log.info("%d databases dropped in %.1f s", len(self._plain) + len(self._distributed), t[0])
        self._plain.clear()
        self._distributed.clear()
        self.cluster.drop_all()  # its own record of them (IF EXISTS: nothing left to drop)


@contextmanager
def databases(admin_url: str, app_url: str) -> Iterator[Databases]:
    dbs = Databases(admin_url, app_url)
    try:
        yield dbs
    finally:
        dbs.drop()


def cluster_info(admin_url: str) -> dict[str, Any]:
    with psycopg.connect(admin_url) as conn:
        row = conn.execute(
            "SELECT split_part(citus_version(), ' ', 2), "
            "(SELECT count(*) FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary'), "
            "current_setting('citus.shard_count')"
        ).fetchone()
    assert row is not None
    return {"citus": row[0], "workers": int(row[1]), "shard_count": int(row[2])}


def user_placement(url: str, users: list[str]) -> dict[str, str]:
    """Each user's worker (host:port of its memories shard) on a distributed database."""
    out: dict[str, str] = {}
    with psycopg.connect(url) as conn:
        for u in users:
            row = conn.execute(
                """SELECT nodename || ':' || nodeport FROM citus_shards
                   WHERE table_name = 'memories'::regclass
                     AND shardid = get_shard_id_for_distribution_column('memories', %s::text)""",
                (u,),
            ).fetchone()
            out[u] = str(row[0]) if row else "?"
    return out


# --------------------------------------------------------------------------- search


SIDES = ("one node", "cluster")


def load_corpus(conns: dict[str, Any], corpus: Corpus) -> dict[str, dict[str, Any]]:
    """The corpus' hot and archived rows COPYed into every database chunk by chunk (the same rows and
    ids everywhere), HNSW built after; per side: seconds and the counts read back."""
    model = corpus.model
    out: dict[str, dict[str, Any]] = {s: {"load_s": 0.0} for s in conns}
    defs: dict[str, tuple[str, str]] = {}
    for side, conn in conns.items():
        set_embedding_model(conn, model)
        defs[side] = (
            drop_index(conn, "memories_embedding_hnsw"),
            drop_index(conn, "archived_summary_bits_hnsw"),
        )
    for chunk in corpus.hot_rows():
        for side, conn in conns.items():
            with stopwatch() as t:
                copy_hot(conn, chunk, model=model)
            out[side]["load_s"] += t[0]
    for chunk in corpus.archived_rows(ARCHIVED_PER_HOT):
        for side, conn in conns.items():
            with stopwatch() as t:
                copy_archived(conn, chunk, model=model, archived_at=NOW - timedelta(days=1))
            out[side]["load_s"] += t[0]
    log.info("loaded: %s", {s: round(f["load_s"], 1) for s, f in out.items()})
    for side, conn in conns.items():
        conn.execute("VACUUM ANALYZE memories")
        conn.execute("VACUUM ANALYZE archived_memories")
        hot_def, archived_def = defs[side]
        out[side]["hnsw_build_s"] = build_index(conn, hot_def, "memories") + build_index(
            conn, archived_def, "archived_memories"
        )
        row = conn.execute(
            """SELECT (SELECT count(*) FROM memories) AS hot,
                      (SELECT count(*) FROM archived_memories) AS archived,
                      (SELECT coalesce(sum(docs), 0) FROM user_corpus_stats) AS docs,
                      (SELECT count(*) FROM user_term_stats) AS terms"""
        ).fetchone()
        out[side] |= {k: int(v) for k, v in row.items()}
        log.info("%s: HNSW built in %.1f s, %s", side, out[side]["hnsw_build_s"], out[side])
    return out


def check_loads(loads: dict[str, dict[str, Any]], n: int) -> list[str]:
    """Problems with the loads: a side missing rows, or BM25 statistics the triggers did not keep."""
    want = {"hot": n, "archived": ARCHIVED_PER_HOT * n, "docs": n + ARCHIVED_PER_HOT * n}
    problems = [
        f"{side}: {k} = {figs[k]:,}, expected {v:,}"
        for side, figs in loads.items()
        for k, v in want.items()
        if figs[k] != v
    ]
    problems += [f"{side}: no user_term_stats rows" for side, figs in loads.items() if not figs["terms"]]
    terms = {figs["terms"] for figs in loads.values()}
    if len(terms) > 1:
        problems.append(f"user_term_stats rows differ: { ({s: f['terms'] for s, f in loads.items()}) }")
    return problems


@dataclass
class SearchRun:
    times: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SIDES})
    tops: dict[str, list[list[uuid.UUID]]] = field(default_factory=lambda: {s: [] for s in SIDES})
    phase2: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SIDES})


def search_both(clients: dict[str, MemoryClient], corpus: Corpus, warmup: int = 3) -> SearchRun:
    """Every query on both sides, the side going first alternating; top-10 memory ids (the original id
    for archived hits: an archive row's own id differs between the databases)."""
    texts = [t.content for t in corpus.queries]
    users = [t.user_id for t in corpus.queries]
    for i in range(min(warmup, len(texts))):
        for side in SIDES:
            clients[side].search(users[i], texts[i], now=NOW)
    run = SearchRun()
    for i in range(len(texts)):
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:
            with stopwatch() as t:
                result = clients[side].search(users[i], texts[i], now=NOW)
            run.times[side].append(t[0])
            run.tops[side].append([h.provenance.memory_id for h in result.hits[:K]])
            run.phase2[side] += result.phase2_reason is not None
    return run


@contextmanager
def exact_vector_scans() -> Iterator[None]:
    """Every user's vector arms exact (every row compared) instead of the HNSW walk above EXACT_MAX hot
    and ARCHIVED_EXACT_MAX archived rows: the ground truth that approximate top-10s are compared with."""
    from memory_lib.retrieval import sql as sql_module  # statement_params reads it per search

    saved = sql_module.EXACT_MAX, sql_module.ARCHIVED_EXACT_MAX
    sql_module.EXACT_MAX = sql_module.ARCHIVED_EXACT_MAX = 10**9
    try:
        yield
    finally:
        sql_module.EXACT_MAX, sql_module.ARCHIVED_EXACT_MAX = saved


def exact_tops(clients: dict[str, MemoryClient], corpus: Corpus) -> dict[str, list[list[uuid.UUID]]]:
    """Each side's top-10 for every query with exact vector scans (untimed)."""
    tops: dict[str, list[list[uuid.UUID]]] = {s: [] for s in SIDES}
    with exact_vector_scans():
        for t in corpus.queries:
            for side in SIDES:
                result = clients[side].search(t.user_id, t.content, now=NOW)
                tops[side].append([h.provenance.memory_id for h in result.hits[:K]])
    return tops


def agreement(a: list[list[uuid.UUID]], b: list[list[uuid.UUID]]) -> dict[str, float]:
    """Share of queries whose top-10s are the same ids in the same order, the same ids in any order, and the
    mean overlap |a ∩ b| / max(|a|, |b|)."""
    same_order = [x == y for x, y in zip(a, b, strict=True)]
    same_set = [set(x) == set(y) for x, y in zip(a, b, strict=True)]
    overlap = [len(set(x) & set(y)) / max(len(x), len(y), 1) for x, y in zip(a, b, strict=True)]
    return {
        "identical": float(np.mean(same_order)) if a else float("nan"),
        "same_set": float(np.mean(same_set)) if a else float("nan"),
        "mean_overlap": float(np.mean(overlap)) if a else float("nan"),
    }


def measure_search(report: Report, dbs: Databases, n: int, n_queries: int, embedder: str | None) -> None:
    corpus = Corpus(n, n_queries, embedder)
    urls = {"one node": dbs.node(), "cluster": dbs.distributed()}
    with ExitStack() as stack:
        conns = {s: stack.enter_context(bench_connect(u)) for s, u in urls.items()}
        report.machine = machine_info(conns["one node"])  # the versions the node database runs
        loads = load_corpus(conns, corpus)
    problems = check_loads(loads, n)
    if problems:
        raise RuntimeError("the loads differ from the corpus: " + "; ".join(problems))
    users = sorted({t.user_id for t in corpus.texts})
    placement = user_placement(urls["cluster"], users)
    queries = corpus.lift(corpus.qvecs)
    embedder_ = corpus.embedder([t.content for t in corpus.queries], queries)
    with ExitStack() as stack:
        clients = {
            s: stack.enter_context(
                MemoryClient.connect(u, embedder=embedder_, settings=Settings(), actor="bench")
            )
            for s, u in urls.items()
        }
        load_start = loadavg()
        with stopwatch() as t:
            run = search_both(clients, corpus)
        load_end = loadavg()
        exact = exact_tops(clients, corpus)
    log.info("searched in %.1f s", t[0])
    p = {s: percentiles_ms(run.times[s]) for s in SIDES}
    agree = agreement(run.tops["one node"], run.tops["cluster"])
    # HNSW is approximate and each shard has a graph of its own: the default top-10s may differ where the
    # index walks differ. With exact scans both must be the same; each side's default vs its exact
    # top-10 is the approximation's own recall.
    exact_agree = agreement(exact["one node"], exact["cluster"])
    ann = {s: agreement(run.tops[s], exact[s]) for s in SIDES}
    r50, r95 = (
        ratio(p["cluster"]["p50"], p["one node"]["p50"]),
        ratio(p["cluster"]["p95"], p["one node"]["p95"]),
    )
    rows: list[list[Any]] = []
    for side in SIDES:
        base = side == "one node"
        rows.append(
            [
                side + (" (baseline)" if base else ""),
                p[side]["p50"],
                p[side]["p95"],
                p[side]["p99"],
                1.0 if base else r50,
                1.0 if base else r95,
                run.phase2[side] / len(corpus.queries),
                loads[side]["load_s"],
                None if base else agree["identical"],
                None if base else agree["same_set"],
                None if base else agree["mean_overlap"],
                None if base else exact_agree["identical"],
                ann[side]["mean_overlap"],
            ]
        )
    workers = sorted(set(placement.values()))
    spread = ", ".join(f"{w}: {sum(1 for v in placement.values() if v == w)}" for w in workers)
    verdict = (
        f"cluster/node p95 {r95:.2f}x ({'meets' if r95 <= RATIO_GOAL else 'misses'} <= {RATIO_GOAL}x), "
        f"p50 {r50:.2f}x; identical top-{K} for {agree['identical']:.0%} of the queries "
        f"({'meets' if agree['identical'] == 1.0 else 'misses'} the goal: all); with exact vector scans "
        f"identical for {exact_agree['identical']:.0%}; default vs exact overlap@{K}: one node "
        f"{ann['one node']['mean_overlap']:.3f}, cluster {ann['cluster']['mean_overlap']:.3f}"
    )
    report.tables.append(
        Table(
            f"Default search, one node vs the Citus cluster: {n:,} hot + {ARCHIVED_PER_HOT * n:,} archived memories "
            f"of {len(users)} users, {DIM}-d ({corpus.what}, lifted) (ms)",
            [
                "database",
                "p50",
                "p95",
                "p99",
                "ratio p50",
                "ratio p95",
                "phase 2 share",
                "load s",
                f"identical top-{K}",
                f"same top-{K} set",
                f"mean overlap@{K}",
                f"identical top-{K}, exact scans",
                f"overlap@{K} with exact",
            ],
            rows,
            f"Baseline: the same rows in a plain database on the coordinator (no citus extension, same PostgreSQL "
            f"and pgvector), same run. `MemoryClient.search(user, query)` with default settings, each side through "
            f"its own pool, {len(corpus.queries)} held-out queries, each user's own, node and cluster interleaved "
            f"(the first alternating) after 3 warm-up queries. Top-{K} compared by memory id (an archived hit's "
            f"original id): identical = same ids in the same order. Exact scans: the same queries again, untimed, "
            f"with every user's vector arm exact (the ground truth; HNSW walks differ between one index and a "
            f"shard's); overlap with exact = a side's default top-{K} against its own exact one. Cluster: "
            f"distributed by the docs' statements; the "
            f"users' memories shards are on {spread}. Load = binary COPY of both tables (through the coordinator on "
            f"the cluster), HNSW built after. 1-min load average {load_start[0]} → {load_end[0]} on "
            f"{report.machine.get('nproc', '?')} cores shared by the coordinator, both workers and this process. "
            f"{verdict}.",
        )
    )
    report.figures["search"] = {
        "n_hot": n,
        "n_archived": ARCHIVED_PER_HOT * n,
        "queries": len(corpus.queries),
        "embedder": corpus.what,
        "users": placement,
        "one_node": p["one node"],
        "cluster": p["cluster"],
        "ratio_p50": r50,
        "ratio_p95": r95,
        "goal_ratio": RATIO_GOAL,
        "meets_ratio_goal": r95 <= RATIO_GOAL and r50 <= RATIO_GOAL,
        "top10": agree,
        "top10_exact_scans": exact_agree,
        "top10_vs_exact": ann,
        "phase2_share": {s: run.phase2[s] / len(corpus.queries) for s in SIDES},
        "loads": loads,
        "loadavg": [load_start, load_end],
    }


# --------------------------------------------------------------------------- archival


@dataclass
class Proc:
    shard: Shard
    start: float = 0.0
    end: float = 0.0
    returncode: int | None = None
    batches: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def archived(self) -> int:
        return sum(int(b.get("archived") or 0) for b in self.batches)


def drain(env: dict[str, str], shard: Shard) -> Proc:
    """One `memory-archive archive --shard i/N --until-drained` process: its JSON lines, exit code and (on
    failure) the CLI's message."""
    cmd = [memory_archive_command(), "archive", "--shard", str(shard), "--until-drained"]
    proc = Proc(shard, start=time.time())
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.end, proc.error = time.time(), f"timed out after {RUN_TIMEOUT_S:.0f} s"
        return proc
    proc.end, proc.returncode = time.time(), done.returncode
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            try:
                proc.batches.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    bad = [b for b in proc.batches if b.get("failed") or not b.get("ok", True)]
    if done.returncode != 0:
        proc.error = f"exit {done.returncode}: " + _one_line(
            cli_message(done.stderr) or done.stdout[-400:] or "(no output)"
        )
        if "Traceback" in done.stderr:
            proc.error += " (with a traceback)"
    elif bad:
        b = bad[0]
        proc.error = _one_line(f"batch {b.get('batch_key')}: {b.get('problem') or b.get('failed_by_step')}")
    return proc


EXCEPTION_LINE = re.compile(r"^(?:(?:[a-z_]\w*\.)+[A-Z]\w*|[A-Z]\w*(?:Error|Exception|Warning)): ")


def cli_message(stderr: str) -> str:
    """What the CLI said: after a traceback, its exception line (and the server's HINT/DETAIL after it),
    else the last line."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if EXCEPTION_LINE.match(lines[i]):
            return " ".join(lines[i:])
    return lines[-1] if lines else ""


def run_concurrently(env: dict[str, str], n: int) -> list[Proc]:
    procs: list[Proc | None] = [None] * n
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        barrier.wait()
        try:
            procs[i] = drain(env, Shard(i, n))
        except Exception as exc:  # the harness itself (no command, ...): reported as the run's failure
            procs[i] = Proc(Shard(i, n), time.time(), time.time(), error=_one_line(exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [p for p in procs if p is not None]


def check_tiers(conn: Any, before: set[uuid.UUID]) -> dict[str, int]:
    """How many memories are hot, archived, both, archived twice, lost or new: a correct run has
    both = twice = lost = new = 0 whatever it archived."""
    hot = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
    archived = [
        r["original_id"] for r in conn.execute("SELECT original_id FROM archived_memories").fetchall()
    ]
    arch = set(archived)
    return {
        "hot": len(hot),
        "archived": len(archived),
        "both": len(hot & arch),
        "twice": len(archived) - len(arch),
        "lost": len(before - hot - arch),
        "new": len((hot | arch) - before),
    }


@dataclass
class ArchivalRun:
    side: str
    n: int
    backlog: int
    eligible: int | None = None
    procs: list[Proc] = field(default_factory=list)
    tiers: dict[str, int] = field(default_factory=dict)
    load_s: float = 0.0
    load_start: list[float] = field(default_factory=list)
    load_end: list[float] = field(default_factory=list)
    error: str | None = None  # setting up or checking the run (the processes' own errors are theirs)

    @property
    def archived(self) -> int:
        return sum(p.archived for p in self.procs)

    @property
    def wall(self) -> float:
        return (
            max(p.end for p in self.procs) - min(p.start for p in self.procs) if self.procs else float("nan")
        )

    @property
    def rate(self) -> float:
        return ratio(self.archived, self.wall) if self.procs else float("nan")

    @property
    def problems(self) -> list[str]:
        out = [self.error] if self.error else []
        out += [f"shard {p.shard}: {p.error}" for p in self.procs if p.error]
        t = self.tiers
        if t:
            bad = {k: t[k] for k in ("both", "twice", "lost", "new") if t[k]}
            if bad:
                out.append(f"tiers: {bad} (each memory must be exactly once in hot or archive)")
            if not any(p.error for p in self.procs) and t["archived"] != self.eligible:
                out.append(f"archived {t['archived']} of {self.eligible} eligible")
            if t["archived"] != self.archived:
                out.append(f"processes report {self.archived} archived, the table holds {t['archived']}")
        return out


def store_env(root: Path, name: str, s3: Any | None) -> dict[str, str]:
    if s3 is None:
        return {
            "MEMORY_ARCHIVE_OBJECT_STORE": "local",
            "MEMORY_ARCHIVE_LOCAL_ROOT": str(root / name / "objects"),
        }
    return s3.env | {
        "MEMORY_ARCHIVE_OBJECT_STORE": "s3",
        "MEMORY_ARCHIVE_BUCKET": s3.bucket,
        "MEMORY_ARCHIVE_PREFIX": f"{name}-{uuid.uuid4().hex[:6]}",
        "MEMORY_ARCHIVE_S3_ENDPOINT_URL": s3.endpoint_url,
        "AWS_REGION": "us-east-1",
    }


def archival_run(dbs: Databases, side: str, n: int, backlog: int, root: Path, s3: Any | None) -> ArchivalRun:
    from .shards import eligible_total, load_backlog

    run = ArchivalRun(side, n, backlog)
    name = f"{'node' if side == 'one node' else 'cluster'}-{n}"
    try:
        url = dbs.node() if side == "one node" else dbs.distributed()
        with bench_connect(url) as conn, stopwatch() as t:
            load_backlog(conn, backlog)
            before = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
            run.eligible = eligible_total(conn, datetime.now(UTC))
        run.load_s = t[0]
        log.info("%s N=%d: backlog of %d loaded in %.1f s", side, n, backlog, t[0])
    except Exception as exc:
        run.error = "setting up: " + _one_line(exc)
        return run
    env = cli_env(url, store_env(root, name, s3), root / name / "state", dim=DIM)
    # The children import this checkout's memory_lib (an editable install may point at another one).
    env["PYTHONPATH"] = str(REPO_ROOT) + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else "")
    run.load_start = loadavg()
    run.procs = run_concurrently(env, n)
    run.load_end = loadavg()
    log.info(
        "%s N=%d: %d archived in %.1f s, %s", side, n, run.archived, run.wall, [p.error for p in run.procs]
    )
    try:
        with bench_connect(url) as conn:
            run.tiers = check_tiers(conn, before)
    except Exception as exc:
        run.error = "checking tiers: " + _one_line(exc)
    return run


@contextmanager
def object_store(opts: Options, root: Path) -> Iterator[Any | None]:
    """None (a local object store per run) unless --stores s3 or --s3-endpoint: then S3 (SeaweedFS started
    here, or the endpoint given)."""
    if not (opts.s3_endpoint or (opts.stores and "s3" in opts.stores)):
        yield None
        return
    from .shards import s3_target

    with s3_target(opts, root) as s3:
        yield s3


def total_row(r: ArchivalRun, baseline: ArchivalRun, base: float) -> list[Any]:
    """A run's total: its rate and ratio when it went through, else what failed (each process's own
    message is on its row) and whether the tiers still hold every memory once."""
    failed = sum(1 for p in r.procs if p.error)
    tiers_ok = bool(r.tiers) and not any(r.tiers[k] for k in ("both", "twice", "lost", "new"))
    if not r.problems:
        status = "ok: every memory once in hot or archive, all eligible archived"
    elif r.error or not tiers_ok or not failed:
        status = "FAILED: " + "; ".join(p for p in r.problems if not p.startswith("shard "))
    else:
        status = f"FAILED: {failed} of {r.n} processes (see their rows); tiers intact, {r.tiers['archived']} archived"
    ok = not r.problems
    return [
        r.side,
        r.n,
        "total",
        None,
        r.archived,
        r.wall,
        r.rate if ok else None,
        ratio(r.rate, base) if ok and r is not baseline else None,
        None,
        status,
    ]


def measure_archival(
    report: Report, dbs: Databases, opts: Options, backlog: int, root: Path
) -> list[ArchivalRun]:
    runs: list[ArchivalRun] = []
    with object_store(opts, root) as s3:
        plan = [("one node", 1)] + [("cluster", n) for n in CLUSTER_SHARDS]
        for side, n in plan:
            runs.append(archival_run(dbs, side, n, backlog, root, s3))
        store = "S3 (" + s3.endpoint_url + ")" if s3 is not None else "a local object store (files)"
    base = runs[0].rate if not runs[0].problems else float("nan")
    rows: list[list[Any]] = []
    for r in runs:
        first = min((p.start for p in r.procs), default=0.0)
        for p in r.procs:
            rows.append(
                [
                    r.side,
                    r.n,
                    f"shard {p.shard}",
                    p.start - first,
                    p.archived,
                    p.end - p.start,
                    ratio(p.archived, p.end - p.start),
                    None,
                    len(p.batches),
                    p.error or "ok",
                ]
            )
        rows.append(total_row(r, runs[0], base))
    report.tables.append(
        Table(
            "Archival: N concurrent `memory-archive archive --shard i/N --until-drained` processes, one node vs "
            "the Citus cluster",
            [
                "database",
                "N",
                "process",
                "started at s",
                "archived",
                "seconds",
                "memories/s",
                "vs one node",
                "batches",
                "status",
            ],
            rows,
            f"Baseline: 1 process on the one-node database, same run. Each row set drains a fresh database holding "
            f"the same kind of backlog ({backlog:,} memories, {DIM}-d, 32 users balanced over shards, every one "
            f"eligible; bench.shards' loader), default settings but the offline extractive summarizer, the hashing "
            f"embedder and {store}. Seconds: a process's start (included) to its exit; total = first start to last "
            f"exit, memories/s = archived / that wall clock; vs one node = that rate over the node's. After each run "
            f"every memory of the backlog is checked to be exactly once in hot or archive. A failed process shows the "
            f"CLI's message in `status` (and in the failures table), its rate is not compared. Cores: "
            f"{report.machine.get('nproc', '?')}, shared by the coordinator, both workers and every process "
            f"(1-min load average "
            + "; ".join(
                f"{r.side} N={r.n}: {r.load_start[0] if r.load_start else '-'} → "
                f"{r.load_end[0] if r.load_end else '-'}"
                for r in runs
            )
            + ").",
        )
    )
    report.figures["archival"] = {
        f"{'node' if r.side == 'one node' else 'cluster'}_{r.n}": {
            "side": r.side,
            "n": r.n,
            "backlog": r.backlog,
            "eligible": r.eligible,
            "archived": r.archived,
            "wall_s": r.wall,
            "rate_per_s": r.rate,
            "ratio_vs_node": None if r is runs[0] or r.problems else ratio(r.rate, base),
            "tiers": r.tiers,
            "load_s": r.load_s,
            "problems": r.problems,
            "processes": [
                {
                    "shard": str(p.shard),
                    "archived": p.archived,
                    "seconds": p.end - p.start,
                    "batches": len(p.batches),
                    "returncode": p.returncode,
                    "error": p.error,
                }
                for p in r.procs
            ],
        }
        for r in runs
    }
    return runs


# --------------------------------------------------------------------------- run


def run(opts: Options) -> Report:
    sizes = opts.sizes_or([DEFAULT_SIZE], [SMOKE_SIZE])
    if len(sizes) != 1:
        raise ValueError(f"--size {sizes}: the citus bench takes one corpus size")
    n = sizes[0]
    n_queries = opts.queries_or(DEFAULT_QUERIES, SMOKE_QUERIES)
    backlog = SMOKE_BACKLOG if opts.smoke else DEFAULT_BACKLOG
    embedder = (opts.embedders or ("hashing" if opts.smoke else None,))[0]
    admin, app = cluster_urls()
    report = Report(
        NAME,
        {
            "size": n,
            "archived_per_hot": ARCHIVED_PER_HOT,
            "queries": n_queries,
            "backlog": backlog,
            "cluster_shards": list(CLUSTER_SHARDS),
            "dim": DIM,
            "batch_size": ArchivalCriteria().batch_size,
            "coordinator": _redacted(admin),
        },
    )
    failures: list[list[str]] = []
    report.params |= cluster_info(admin)
    with bench_connect(admin) as conn:
        report.machine = machine_info(conn)  # also when the search part fails
    with databases(admin, app) as dbs, scratch_dir(opts.workdir, "ma-bench-citus-") as root:
        try:
            measure_search(report, dbs, n, n_queries, embedder)
        except Exception as exc:  # reported, then the archival part still runs
            failures.append(["search", _one_line(exc, 1000)])
        for r in measure_archival(report, dbs, opts, backlog, root):
            failures += [[f"archival, {r.side}, N={r.n}", p] for p in r.problems]
    report.figures["failures"] = [{"step": s, "error": e} for s, e in failures]
    if failures:
        report.tables.append(
            Table(
                "FAILURES",
                ["step", "error"],
                failures,
                "What failed in this run (the figures above leave them out). On a cluster whose fixes are not in yet, "
                "the archival claim fails with `could not run distributed query with FOR UPDATE/SHARE commands`.",
            )
        )
    return report


def _redacted(url: str) -> str:
    info = conninfo_to_dict(url)
    return f"{info.get('host', '?')}:{info.get('port', '5432')}"
