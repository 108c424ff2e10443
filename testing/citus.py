"""Test databases on a real Citus cluster, distributed by the statements the docs give.

`make test` starts the cluster of `../shared/tools/citus/cluster.sh` and sets TEST_CITUS_ADMIN_URL (the
superuser) and TEST_CITUS_URL (the application role, no superuser) for its Citus pass. A database here is
what a user gets by following docs/how-to/distributed-postgres.md: made on every node with the extensions
a DBA installs, migrated by the application role, then distributed by the page's SQL block run as written.
Making one takes seconds, so a session keeps its databases and empties one between tests (`reset`).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from memory_lib.core import plans as plan_runtime
from memory_lib.core.plans import Sql
from memory_lib.storage.db import migrate_database

DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "distributed-postgres.md"
ADMIN_ENV, APP_ENV = "TEST_CITUS_ADMIN_URL", "TEST_CITUS_URL"
# Kept across tests: the migrations' record. Emptied and then put back as the migrations left them:
SEEDED_TABLES = ("memory_archive_settings", "archival_pause")
KEPT_TABLES = ("schema_migrations",)


def citus_urls() -> tuple[str, str] | None:
    """(admin, app) URLs when the Citus pass is on, else None."""
    admin, app = os.environ.get(ADMIN_ENV), os.environ.get(APP_ENV)
    return (admin, app) if admin and app else None


def distribution_blocks(page: Path = DOCS_PAGE) -> dict[str, str]:
    """The page's SQL blocks marked `<!-- citus: NAME -->`, by name."""
    text = page.read_text(encoding="utf-8")
    found = re.findall(r"<!--\s*citus:\s*([\w-]+)\s*-->\s*\n```sql\n(.*?)```", text, re.S)
    return dict(found)


def distribution_sql() -> str:
    """The statements that distribute a migrated schema, exactly as the page prints them."""
    return distribution_blocks()["distribute"]


def run_script(url: str, script: str) -> None:
    """Run a page's SQL block statement by statement in one session, as psql would."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in split_statements(script):
            conn.execute(statement.encode())


def split_statements(script: str) -> list[str]:
    lines = [line for line in script.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def _with_db(url: str, dbname: str) -> str:
    return make_conninfo(url, dbname=dbname)


class CitusDatabases:
    """Distributed databases on one cluster, made on demand and reused: `new()` hands out one that is
    free (emptied), `release()` empties it again."""

    def __init__(self, admin_url: str, app_url: str, *, prefix: str | None = None):
        self.admin_url, self.app_url = admin_url, app_url
        self.role = str(conninfo_to_dict(app_url)["user"])
        self.prefix = prefix or f"ct_{uuid.uuid4().hex[:6]}"
        self._free: dict[int, list[str]] = {}
        self._made: list[str] = []
        self._seeded: dict[str, dict[str, list[tuple[object, ...]]]] = {}

    def _workers(self) -> list[tuple[str, int]]:
        with psycopg.connect(self.admin_url) as conn:
            rows = conn.execute(
                "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary'"
            ).fetchall()
        return [(str(h), int(p)) for h, p in rows]

    def worker_urls(self, url: str) -> list[str]:
        """The superuser on `url`'s database on each worker."""
        name = str(conninfo_to_dict(url)["dbname"])
        return [make_conninfo(self.admin_url, host=h, port=str(p), dbname=name) for h, p in self._workers()]

    def create(self, dim: int, *, distribute: bool = True) -> str:
        """A new database on every node, set up as the docs' DBA steps say, migrated by the application
        role and (unless `distribute` is false) distributed by the page's statements."""
        name = f"{self.prefix}_{len(self._made)}"
        workers = self._workers()
        nodes = [self.admin_url] + [make_conninfo(self.admin_url, host=h, port=str(p)) for h, p in workers]
        for node in nodes:
            with psycopg.connect(_with_db(node, "postgres"), autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        for node in nodes[1:]:
            with psycopg.connect(_with_db(node, name), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION citus")
        self._made.append(name)
        coordinator = conninfo_to_dict(self.admin_url)
        with psycopg.connect(_with_db(self.admin_url, name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION citus")
            conn.execute(
                "SELECT citus_set_coordinator_host(%s, %s)",
                (coordinator.get("host", "127.0.0.1"), int(coordinator.get("port") or 5432)),
            )
            for host, port in workers:
                conn.execute("SELECT citus_add_node(%s, %s)", (host, port))
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
            role = sql.Identifier(self.role)
            conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(name), role))
            conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA public TO {}").format(role))
        url = _with_db(self.app_url, name)
        migrate_database(url, dim)
        if distribute:
            run_script(url, distribution_sql())
        return url

    def new(self, dim: int) -> str:
        free = self._free.setdefault(dim, [])
        if free:
            return free.pop()
        url = self.create(dim)
        with psycopg.connect(url) as conn:
            self._seeded[url] = {
                t: conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(t))).fetchall()
                for t in SEEDED_TABLES
            }
        return url

    def release(self, url: str, dim: int) -> None:
        self.reset(url)
        self._free.setdefault(dim, []).append(url)

    def reset(self, url: str) -> None:
        """Empty every table but the migrations' record and put back what the migrations seeded, as the
        superuser: with triggers off on every node (the append-only tables refuse a DELETE by trigger;
        a TRUNCATE of distributed tables deadlocked with itself), one connection per worker."""
        dbname = conninfo_to_dict(url)["dbname"]
        with psycopg.connect(_with_db(self.admin_url, str(dbname))) as conn:
            # Other tests' sessions on this database (a pool left open) would hold locks.
            conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() AND usename = %s",
                (self.role,),
            )
            conn.execute("SET LOCAL citus.multi_shard_modify_mode = 'sequential'")
            conn.execute("SET LOCAL citus.propagate_set_commands = 'local'")
            conn.execute("SET LOCAL session_replication_role = 'replica'")
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> ALL(%s)",
                    (list(KEPT_TABLES),),
                )
            ]
            for table in tables:
                conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
            for table, rows in self._seeded.get(url, {}).items():
                for row in rows:
                    conn.execute(
                        sql.SQL("INSERT INTO {} VALUES ({})").format(
                            sql.Identifier(table), sql.SQL(", ").join(sql.Placeholder() * len(row))
                        ),
                        [Jsonb(v) if isinstance(v, dict | list) else v for v in row],
                    )

    def drop_all(self) -> None:
        workers = self._workers()
        nodes = [self.admin_url] + [make_conninfo(self.admin_url, host=h, port=str(p)) for h, p in workers]
        for name in self._made:
            for node in nodes:
                with psycopg.connect(_with_db(node, "postgres"), autocommit=True) as conn:
                    conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                    )
        self._made.clear()
        self._free.clear()


class PlanRecorder:
    """Every statement the plan runtime (memory_lib.core.plans) runs, explained just before it runs, in
    its plan's transaction, with its values bound client-side (Citus 13.2 refuses the EXPLAIN of a
    statement with server-side parameters on a worker). A plan is the text of EXPLAIN (COSTS OFF), or
    with fmt="json" the JSON plan's root; None for what is not a query (a LOCK, a SET)."""

    def __init__(self, fmt: Literal["text", "json"] = "text") -> None:
        self.fmt = fmt
        self.statements: list[tuple[str, Any]] = []

    def _explain(self, conn: Any, op: Sql) -> Any:
        if not re.match(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", op.query, re.I):
            return None
        cur = psycopg.ClientCursor(conn, row_factory=dict_row)
        if self.fmt == "json":
            row = cur.execute("EXPLAIN (FORMAT JSON) " + op.query, op.params).fetchone()
            assert row is not None
            return row["QUERY PLAN"][0]["Plan"]
        rows = cur.execute("EXPLAIN (COSTS OFF) " + op.query, op.params).fetchall()
        return "\n".join(r["QUERY PLAN"] for r in rows)

    def wrap(self, conn: Any, plan: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
        try:
            op = next(plan)  # a plan may end before its first statement
            while True:
                if isinstance(op, Sql):
                    self.statements.append((op.query, self._explain(conn, op)))
                op = plan.send((yield op))
        except StopIteration as stop:
            return stop.value

    def take(self) -> list[tuple[str, Any]]:
        out, self.statements = self.statements, []
        return out

    def install(self, monkeypatch: Any) -> PlanRecorder:
        """Record every plan the sync runtime runs (its inner `_run_plan`: public callers included)."""
        original = plan_runtime._run_plan

        def run(conn: Any, plan: Any, **kw: Any) -> Any:
            return original(conn, self.wrap(conn, plan), **kw)

        monkeypatch.setattr(plan_runtime, "_run_plan", run)
        return self
