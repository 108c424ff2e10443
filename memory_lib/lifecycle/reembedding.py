"""Re-embedding migrations: a new embedder, model and/or dimension, without
downtime. Dual write, backfill, atomic flip, flip back, drop.

Design, and why:
- A second set of columns beside each vector (`embedding_next`, `summary_bits_next`, their model and dim
  columns, see VECTOR_GROUPS) sized for the target, on every table holding vectors of the embedding
  space: memories, archived_memories (bits, written from the summary text), memory_digests, memory_facts,
  and archival_attempts (the archive run's checkpoint of summary embeddings). `start` adds them (catalog
  only, instant) and records the migration in `embedding_migrations` (sql/017).
- The flip swaps column NAMES in one transaction (embedding -> embedding_prev, embedding_next ->
  embedding, ...), with the settings row (embedding_model, embedding_dim). Every reader and writer keeps
  using `embedding` and never needs to know a migration exists; an old reader cannot mix spaces because
  the space check (search.checked_shape_plan) reads the settings after taking ACCESS SHARE locks on the
  vector tables (search.LOCK_VECTOR_TABLES): it waits for a flip in progress and then sees the flip's
  settings and columns together (LOCK takes no snapshot, so a REPEATABLE READ search's snapshot is taken
  after the lock: the documented idiom). A flip back is the same swap the other way.
- The secondary columns (`_next` while running, `_prev` once flipped) are kept valid by two rules:
  (1) a BEFORE UPDATE trigger per table (`<table>_reembed_guard`) clears a row's secondary vector when
  its active vector changes without the secondary being written in the same statement, so a secondary
  vector never describes old content; (2) every row whose secondary model column is NULL is "pending"
  and the backfill (`backfill_batch`) fills it. Dual write (`fill_flow`, run by the clients after a
  write) is an optimization: rows written without it are picked up by the backfill, so correctness
  never depends on a client knowing about the migration. While flipped the secondary is the OLD space,
  still backfilled and dual-written with the source embedder: that is what makes a flip back lossless.
- The HNSW index of a secondary vector column is built CONCURRENTLY by `ensure_indexes` (the flip
  calls it before locking), not during the backfill. Measured (8k hot rows, hashing 384 -> 256-d, 2
  shared cores): backfill 25 s + build 5 s with the index built after, against 78 s for the backfill
  with the index present from the start (each UPDATE then also inserts into the new graph).
- The flip refuses (ReembeddingError naming each table's uncovered row count) unless coverage is full,
  and refuses while an archival run holds summary embeddings of the old space in open checkpoints.
- Migrations are rendered with the embedding dim ({{EMBEDDING_DIM}}): after a flip to another dim, the
  recorded checksums are re-rendered for it (db.rerender_migration_checksums), so `migrate` keeps working.

Costs: the backfill updates every row once (new row versions: an archival run in progress re-backs up a
memory the backfill touched, which is correct but costs a PUT; a non-HOT update also re-inserts the row
into the table's existing indexes, the old HNSW graph included: ~300 rows/s measured on 2 cores with a
cheap embedder, the UPDATE taking ~80% of it), the flip scans each table once under an ACCESS EXCLUSIVE
lock (coverage count and SET NOT NULL; 0.15 s for 20k rows), and `drop_old` is catalog only (the dropped
columns' bytes are reclaimed as rows are rewritten, or by VACUUM FULL / pg_repack).

Modules: this one starts, flips, flips back, aborts and drops a migration and builds its indexes;
backfill.py fills the secondary columns (the backfill and the clients' dual write: rows embedded with no
lock held, written only if unchanged); vector_groups.py holds what both use (the vector groups, the
migration record, the embedder a recorded model names).
"""

from __future__ import annotations

import psycopg

from ..core import validation
from ..core.errors import InvalidInputError
from ..core.rows import Conn
from ..llm.embedding import (
    LOCAL_MODEL_DIM,
    LOCAL_MODEL_NAME,
    HashingEmbedder,
)
from ..storage import partitioning
from ..storage.db import rerender_migration_checksums
from .backfill import DualWriter, backfill_batch, fill_flow, pending
from .vector_groups import (
    BY_KIND,
    HNSW_MAX_VECTOR_DIM,
    KINDS,
    MIGRATION_SQL,
    VECTOR_GROUPS,
    Group,
    Kind,
    Migration,
    ReembeddingError,
    active_migration,
    embedder_for,
)

# Defined in .vector_groups and .backfill; importable from here as before.
__all__ = [
    "KINDS",
    "DualWriter",
    "Kind",
    "Migration",
    "ReembeddingError",
    "abort",
    "active_migration",
    "backfill_batch",
    "check_target",
    "coverage",
    "drop_old",
    "embedder_for",
    "ensure_indexes",
    "fill_flow",
    "flip",
    "flip_back",
    "pending",
    "start",
]

_LOCK_ALL = "LOCK TABLE " + ", ".join(g.table for g in VECTOR_GROUPS) + " IN ACCESS EXCLUSIVE MODE"


def _lock_all(conn: Conn, timeout: str = "30s") -> None:
    """ACCESS EXCLUSIVE on every vector table, for this transaction. Waiting behind a long transaction
    would queue every search behind this lock: give up after `timeout` instead (retry later)."""
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
    # Citus: the DDL and the guard functions that follow over one connection per node (it refuses a
    # function command after DDL run in parallel in the transaction), and the guard trigger created on
    # the shards (it touches only its own row). One node: unused settings.
    conn.execute("SET LOCAL citus.multi_shard_modify_mode = 'sequential'")
    conn.execute("SET LOCAL citus.enable_unsafe_triggers = on")
    conn.execute(_LOCK_ALL)


# --------------------------------------------------------------------------- start / abort


def _guard_sql(g: Group, suffix: str) -> list[str]:
    """The guard's statements, one per string: Citus sends a DDL statement's text to the shards, and a
    string of several there fails ("cannot insert multiple commands into a prepared statement")."""
    clear = " ".join(f"NEW.{c.name}{suffix} := NULL;" for c in g.cols)
    return [
        f"""CREATE OR REPLACE FUNCTION {g.table}_reembed_guard() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
            -- A secondary vector is valid only for the content its active twin was made from.
            IF NEW.{g.vector} IS DISTINCT FROM OLD.{g.vector}
               AND NEW.{g.vector}{suffix} IS NOT DISTINCT FROM OLD.{g.vector}{suffix} THEN
                {clear}
            END IF;
            RETURN NEW;
        END $fn$""",
        f"DROP TRIGGER IF EXISTS {g.table}_reembed_guard ON {g.table}",
        f"""CREATE TRIGGER {g.table}_reembed_guard BEFORE UPDATE ON {g.table}
            FOR EACH ROW EXECUTE FUNCTION {g.table}_reembed_guard()""",
    ]


def _drop_guards_sql() -> list[str]:
    return [
        stmt
        for g in VECTOR_GROUPS
        for stmt in (
            f"DROP TRIGGER IF EXISTS {g.table}_reembed_guard ON {g.table}",
            f"DROP FUNCTION IF EXISTS {g.table}_reembed_guard()",
        )
    ]


def _run_all(conn: Conn, statements: list[str]) -> None:
    for statement in statements:
        conn.execute(statement)


def check_target(target_model: str, target_dim: int) -> str:
    """The target's own rules (start checks them first; a caller may check before building its
    embedder): a label, a dim HNSW can index, and the dim a built-in model makes. Returns the model."""
    target_model = validation.text("target_model", target_model, max_chars=validation.MAX_LABEL_CHARS)
    if (
        isinstance(target_dim, bool)
        or not isinstance(target_dim, int)
        or not 1 <= target_dim <= HNSW_MAX_VECTOR_DIM
    ):
        raise InvalidInputError(
            "target_dim", target_dim, f"must be an integer from 1 to {HNSW_MAX_VECTOR_DIM} (HNSW)"
        )
    if target_model == LOCAL_MODEL_NAME and target_dim != LOCAL_MODEL_DIM:
        raise InvalidInputError(
            "target_dim", target_dim, f"{LOCAL_MODEL_NAME} makes {LOCAL_MODEL_DIM}-d vectors"
        )
    if target_model.startswith("hashing-lexical-") and target_model != HashingEmbedder(target_dim).model:
        raise InvalidInputError(
            "target_model",
            target_model,
            f"the {target_dim}-d hashing embedder is {HashingEmbedder(target_dim).model!r}",
        )
    return target_model


def start(conn: Conn, target_model: str, target_dim: int, *, actor: str) -> Migration:
    """Start re-embedding into (target_model, target_dim): record it and add the `_next` columns.

    Refused when a migration is open, when the target is the active space, or when no embedding model
    is recorded yet (an empty database just changes its settings). Catalog-only DDL: instant."""
    target_model = check_target(target_model, target_dim)
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    with conn.transaction():
        _lock_all(conn)
        settings = {
            r["key"]: r["value"]
            for r in conn.execute(
                "SELECT key, value FROM memory_archive_settings WHERE key IN ('embedding_model', 'embedding_dim')"
            )
        }
        if "embedding_model" not in settings:
            raise ReembeddingError(
                "no embedding model is recorded in this database yet: nothing to re-embed (set the new embedder)"
            )
        source_model, source_dim = settings["embedding_model"], int(settings["embedding_dim"])
        if (source_model, source_dim) == (target_model, target_dim):
            raise InvalidInputError(
                "target_model", target_model, f"is already the active space ({source_dim}-d)"
            )
        open_ = active_migration(conn)
        if open_ is not None:
            raise ReembeddingError(
                f"re-embedding {open_.id} ({open_.source_model} -> {open_.target_model}) is {open_.state}: "
                "finish it (drop_old) or abort it first"
            )
        row = conn.execute(
            """INSERT INTO embedding_migrations (source_model, source_dim, target_model, target_dim, started_by)
               VALUES (%s, %s, %s, %s, %s) RETURNING id""",
            (source_model, source_dim, target_model, target_dim, actor),
        ).fetchone()
        assert row is not None  # INSERT ... RETURNING returns the inserted row
        mid = row["id"]
        for g in VECTOR_GROUPS:
            adds = ", ".join(f"ADD COLUMN {c.name}_next {c.type.format(dim=target_dim)}" for c in g.cols)
            conn.execute(f"ALTER TABLE {g.table} {adds}")
        conn.execute(
            f"ALTER TABLE memories ADD CONSTRAINT memories_embedding_dim_m{mid}_check "
            f"CHECK (embedding_dim_next = {target_dim})"
        )
        # 007's rule for the write-only halfvec: never kept at rest (the bits are).
        conn.execute(
            f"ALTER TABLE archived_memories ADD CONSTRAINT archived_summary_embedding_m{mid}_not_kept "
            "CHECK (summary_embedding_next IS NULL)"
        )
        for g in VECTOR_GROUPS:
            if g.kind is not None:
                _run_all(conn, _guard_sql(g, "_next"))
        migration = active_migration(conn)
    assert migration is not None
    return migration


def abort(conn: Conn, *, actor: str) -> Migration:
    """Give up a running (not flipped) migration: drop the `_next` columns; the active space is untouched."""
    return _close(conn, actor, state="running", what="abort", suffix="_next", final="aborted")


def _close(conn: Conn, actor: str, *, state: str, what: str, suffix: str, final: str) -> Migration:
    """End the open migration (abort, drop_old): drop the `suffix` columns, record `final`, one transaction."""
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    with conn.transaction():
        _lock_all(conn)
        m = _require(conn, state, what)
        _drop_secondary(conn, suffix)
        conn.execute(
            """UPDATE embedding_migrations SET state = %s, finished_at = now(), finished_by = %s
               WHERE id = %s""",
            (final, actor, m.id),
        )
    return _by_id(conn, m.id)


def _in_state(m: Migration | None, state: str, what: str, *, missing: str) -> Migration:
    if m is None:
        raise ReembeddingError(missing)
    if m.state != state:
        raise ReembeddingError(f"re-embedding {m.id} is {m.state}: {what} needs it {state}")
    return m


def _require(conn: Conn, state: str, what: str) -> Migration:
    return _in_state(
        active_migration(conn, for_update=True),
        state,
        what,
        missing=f"no re-embedding is open: nothing to {what}",
    )


def _by_id(conn: Conn, mid: int) -> Migration:
    row = conn.execute(f"{MIGRATION_SQL} WHERE id = %s", (mid,)).fetchone()
    assert row is not None  # `mid` was just read; migrations are never deleted
    return Migration(**row)


def _drop_secondary(conn: Conn, suffix: str) -> None:
    _run_all(conn, _drop_guards_sql())
    for g in VECTOR_GROUPS:
        drops = ", ".join(f"DROP COLUMN {c.name}{suffix}" for c in g.cols)
        conn.execute(f"ALTER TABLE {g.table} {drops}")


def coverage(conn: Conn) -> dict[str, int]:
    """Pending (uncovered) rows per table of the open migration's secondary columns; {} without one."""
    m = active_migration(conn)
    if m is None:
        return {}
    return {BY_KIND[k].table: pending(conn, k) for k in KINDS}


# --------------------------------------------------------------------------- indexes


def _index_name(g: Group, m: Migration) -> str:
    return f"{g.table}_{g.vector}_m{m.id}_hnsw"


def ensure_indexes(conn: Conn) -> list[str]:
    """Build the HNSW index of each secondary vector column that lacks one, CONCURRENTLY (reads and writes
    go on). Idempotent; an invalid index left by an interrupted build is dropped and rebuilt. Needs an
    autocommit connection. Returns the indexes built."""
    m = active_migration(conn)
    if m is None:
        return []
    built = []
    for g in VECTOR_GROUPS:
        if g.index is None:
            continue
        col = f"{g.vector}{m.suffix}"
        have = conn.execute(
            """SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
               WHERE i.indrelid = %s::regclass AND a.attname = %s""",
            (g.table, col),
        ).fetchall()
        if any(r["indisvalid"] for r in have):
            continue
        parts = partitioning.partitions_of(conn, g.table)
        for r in have:  # a partitioned index cannot be dropped concurrently (its partitions' go with it)
            conn.execute(f'DROP INDEX {"" if parts else "CONCURRENTLY "}IF EXISTS "{r["relname"]}"')
        name = _index_name(g, m)
        if name in {r["relname"] for r in have} or m.suffix == "_prev":
            name = f"{name}_{m.flips}"
        partitioning.create_index(
            conn,
            f"CREATE INDEX {name} ON {g.table} USING {g.index.format(col=col)}",
            partitions=parts,
            concurrently=True,
        )
        built.append(name)
    return built


# --------------------------------------------------------------------------- flip


def _quantize_sql(dim: int) -> list[str]:
    """007's trigger for the dimension now active (its UPDATE OF column list binds to the column itself)."""
    return [
        "DROP TRIGGER IF EXISTS archived_memories_quantize ON archived_memories",
        f"""CREATE OR REPLACE FUNCTION archived_memories_quantize() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
            IF NEW.summary_embedding IS NOT NULL THEN
                NEW.summary_bits := binary_quantize(NEW.summary_embedding)::bit({dim});
                NEW.summary_embedding := NULL;
            END IF;
            RETURN NEW;
        END $fn$""",
        """CREATE TRIGGER archived_memories_quantize BEFORE INSERT OR UPDATE OF summary_embedding ON archived_memories
            FOR EACH ROW EXECUTE FUNCTION archived_memories_quantize()""",
        # Two statements: Citus runs an ADD CONSTRAINT only as the ALTER's one subcommand.
        "ALTER TABLE archived_memories DROP CONSTRAINT IF EXISTS archived_stub_without_vector",
        """ALTER TABLE archived_memories ADD CONSTRAINT archived_stub_without_vector
            CHECK ((stubbed_at IS NULL) = (summary_bits IS NOT NULL))""",
    ]


def _swap(conn: Conn, m: Migration, *, to_state: str, actor: str, lock_timeout: str) -> Migration:
    """Make the secondary space active, in one transaction; the active space becomes the secondary."""
    incoming, outgoing = m.suffix, ("_prev" if m.state == "running" else "_next")
    new_model, new_dim = m.secondary
    _lock_all(conn, lock_timeout)
    uncovered = {k: v for k, v in coverage(conn).items() if v}
    if uncovered:
        detail = ", ".join(f"{t}: {n}" for t, n in uncovered.items())
        raise ReembeddingError(
            f"cannot flip to {new_model!r} ({new_dim}-d): rows without a {incoming} vector ({detail}); "
            "run the backfill (`memory-archive reembed backfill` or the reembedding asset) first"
        )
    held = conn.execute(
        """SELECT count(*) AS n, array_agg(DISTINCT batch_key) AS batches FROM archival_attempts
           WHERE summary_embedding IS NOT NULL AND status NOT IN ('archived', 'released')"""
    ).fetchone()
    assert held is not None  # an aggregate without GROUP BY returns one row
    if held["n"]:
        raise ReembeddingError(
            f"cannot flip: {held['n']} open archival checkpoints hold summary embeddings of the active space "
            f"(batches {held['batches']}): let the archival run finish, then flip"
        )
    for g in VECTOR_GROUPS:
        for c in g.cols:
            conn.execute(f"ALTER TABLE {g.table} RENAME COLUMN {c.name} TO {c.name}__swap")
            conn.execute(f"ALTER TABLE {g.table} RENAME COLUMN {c.name}{incoming} TO {c.name}")
            conn.execute(f"ALTER TABLE {g.table} RENAME COLUMN {c.name}__swap TO {c.name}{outgoing}")
        nulls = [
            f"ALTER COLUMN {c.name} SET NOT NULL, ALTER COLUMN {c.name}{outgoing} DROP NOT NULL"
            for c in g.cols
            if c.not_null
        ]
        if nulls:
            conn.execute(f"ALTER TABLE {g.table} {', '.join(nulls)}")
    _run_all(conn, _quantize_sql(new_dim))
    for g in VECTOR_GROUPS:
        if g.kind is not None:
            _run_all(conn, _guard_sql(g, outgoing))
    rerender_migration_checksums(conn, new_dim)  # reads the settings' dim: before they change
    for key, value in (("embedding_model", new_model), ("embedding_dim", str(new_dim))):
        conn.execute(
            """INSERT INTO memory_archive_settings (key, value) VALUES (%s, %s)
               ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value""",
            (key, value),
        )
    conn.execute(
        """UPDATE embedding_migrations SET state = %s, flipped_at = now(), flipped_by = %s, flips = flips + 1
           WHERE id = %s""",
        (to_state, actor, m.id),
    )
    return _by_id(conn, m.id)


def flip(conn: Conn, *, actor: str, lock_timeout: str = "30s") -> Migration:
    """Make the target space active: searches and writes use the new vectors from the commit on. Refused
    unless every row has its `_next` vector. Builds the missing indexes first (CONCURRENTLY)."""
    return _flip(conn, "running", "flipped", "flip", actor=actor, lock_timeout=lock_timeout)


def flip_back(conn: Conn, *, actor: str, lock_timeout: str = "30s") -> Migration:
    """Make the source space active again (the migration is `running` again). Refused unless every row
    has its `_prev` vector (writes made while flipped are dual-written or backfilled into it)."""
    return _flip(conn, "flipped", "running", "flip back", actor=actor, lock_timeout=lock_timeout)


def _flip(
    conn: Conn, from_state: str, to_state: str, what: str, *, actor: str, lock_timeout: str
) -> Migration:
    """flip and flip_back: the indexes built (CONCURRENTLY, outside a transaction), then the swap."""
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    _require_outside(conn, from_state, what)
    ensure_indexes(conn)
    with conn.transaction():
        return _swap(
            conn, _require(conn, from_state, what), to_state=to_state, actor=actor, lock_timeout=lock_timeout
        )


def _require_outside(conn: Conn, state: str, what: str) -> None:
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ReembeddingError(f"{what} builds indexes CONCURRENTLY: call it outside a transaction")
    _in_state(active_migration(conn), state, what, missing=f"no {state} re-embedding: nothing to {what}")


def drop_old(conn: Conn, *, actor: str) -> Migration:
    """After a flip, on request: drop the `_prev` columns (and their indexes, triggers); `finished`.
    From here a flip back is impossible."""
    return _close(conn, actor, state="flipped", what="drop the old vectors", suffix="_prev", final="finished")
