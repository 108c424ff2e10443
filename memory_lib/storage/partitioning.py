"""Tenant partitioning: `memories` and `archived_memories` HASH-partitioned by user_id (a setting).

With `user_partitions` = N >= 2, each of the two tables is a partitioned table of N hash partitions
(`memories_p000` ...), each partition with its own HNSW, GIN and B-tree indexes: a search filtered to
one user (every search is) is pruned to one partition at plan time, so it walks a vector graph built
over that partition's users only. With 1 the tables are plain again; unset, the database keeps its
layout.

`convert` rebuilds a table in the requested layout, in one transaction, under an ACCESS EXCLUSIVE
lock: the old table is renamed, the new one created like it (columns, defaults, CHECK constraints,
generated columns, storage, comments), the rows copied, and its keys, indexes, triggers, foreign keys
(its own and those pointing at it) and grants re-created from the catalog's own definitions, under
their names. A failure anywhere rolls back to the table as it was. Every primary key and unique index
includes user_id (sql/022_distribution_keys.sql), which partitioning requires.

Invariants:
* Rows are copied, never transformed: every column of every row is the same after a conversion (the
  generated columns are recomputed from the same values).
* Converting to the layout the table has is a no-op; any layout converts to any other.
* Triggers are created after the copy, so the copy fires none of them (term statistics, retention
  marks and the like are already right for the rows copied).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from psycopg import sql

from ..core.errors import InvalidInputError, SchemaError
from ..core.rows import Conn

log = logging.getLogger(__name__)

PARTITIONED_TABLES = ("memories", "archived_memories")  # in lock order
MAX_PARTITIONS = 1000  # partition names carry the remainder in 3 digits (memories_p999)


@dataclass(frozen=True)
class Layout:
    table: str
    partitions: int  # 1: a plain table

    def __str__(self) -> str:
        return f"{self.table}: " + (
            "not partitioned" if self.partitions == 1 else f"{self.partitions} hash partitions by user_id"
        )


def check_partitions(value: int | None) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_PARTITIONS:
        raise InvalidInputError(
            "user_partitions", value, f"must be an integer from 1 (not partitioned) to {MAX_PARTITIONS}"
        )


def layout(conn: Conn, table: str) -> Layout:
    """The table's current layout (read-only)."""
    row = conn.execute(
        """SELECT p.partstrat, p.partattrs::text AS attrs,
                  (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid) AS n
           FROM pg_class c LEFT JOIN pg_partitioned_table p ON p.partrelid = c.oid
           WHERE c.oid = to_regclass(%s)""",
        (table,),
    ).fetchone()
    if row is None:
        raise SchemaError(f"table {table} does not exist: run `memory-archive migrate`")
    if row["partstrat"] is None:
        return Layout(table, 1)
    return Layout(table, int(row["n"]))


def ensure(conn: Conn, partitions: int | None) -> list[Layout]:
    """Bring both tables to `partitions` (None: leave them); returns the layouts converted to. One
    transaction for both, so the two tables never disagree."""
    check_partitions(partitions)
    if partitions is None:
        return []
    done: list[Layout] = []
    with conn.transaction():
        for table in PARTITIONED_TABLES:
            conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(table)))
        for table in PARTITIONED_TABLES:
            if layout(conn, table).partitions != partitions:
                convert(conn, table, partitions)
                done.append(Layout(table, partitions))
    for d in done:
        log.info("converted %s", d)
    return done


_GRANTS_SQL = """SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(a.grantee::regrole::text) END AS grantee,
                         a.privilege_type
                  FROM pg_class c, aclexplode(c.relacl) a
                  WHERE c.oid = %s::regclass AND a.grantee <> c.relowner ORDER BY 1, 2"""


def _grant(conn: Conn, relation: str, grants: list[dict[str, str]]) -> None:
    for g in grants:
        conn.execute(
            sql.SQL("GRANT {} ON {} TO {}").format(
                sql.SQL(g["privilege_type"]), sql.Identifier(relation), sql.SQL(g["grantee"])
            )
        )


_INDEX_DEF = re.compile(r"^(CREATE (?:UNIQUE )?INDEX) (\S+) ON (?:ONLY )?(\S+) (USING .*)$", re.S)


def create_index(conn: Conn, definition: str, *, partitions: list[str], concurrently: bool = False) -> None:
    """Create an index from its definition (pg_get_indexdef's form). On a partitioned table, each
    partition gets its own index named after the parent's (`<name>_p000`), attached to it: plans then
    name the index they use, and `concurrently` builds each partition's without blocking writes (a
    partitioned table's own index cannot be built concurrently)."""
    m = _INDEX_DEF.match(definition.strip())
    if m is None:
        raise SchemaError(f"unexpected index definition: {definition}")
    head, name, table, rest = m.groups()
    conc = " CONCURRENTLY" if concurrently else ""
    if not partitions:
        conn.execute(sql.SQL(f"{head}{conc} {name} ON {table} {rest}"))
        return
    conn.execute(sql.SQL(f"{head} {name} ON ONLY {table} {rest}"))
    schema = table.rsplit(".", 1)[0] + "." if "." in table else ""
    for i, part in enumerate(partitions):
        child = f"{name}_p{i:03d}"
        conn.execute(sql.SQL(f"{head}{conc} {child} ON {schema}{part} {rest}"))
        conn.execute(sql.SQL(f"ALTER INDEX {schema}{name} ATTACH PARTITION {schema}{child}"))


def partitions_of(conn: Conn, table: str) -> list[str]:
    """The table's partitions in remainder order (none for a plain table)."""
    return [
        r["name"]
        for r in conn.execute(
            """SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = %s::regclass ORDER BY c.relname""",
            (table,),
        ).fetchall()
    ]


def _partition_name(table: str, i: int) -> str:
    return f"{table}_p{i:03d}"


def convert(conn: Conn, table: str, partitions: int) -> None:
    """Rebuild `table` as `partitions` hash partitions by user_id (1: a plain table). Call inside a
    transaction holding the table's lock (`ensure` does)."""
    check_partitions(partitions)
    ident = sql.Identifier(table)
    old = f"{table}__before_conversion"
    # What the catalog says about the table, read before the rename so the definitions name it.
    keys = conn.execute(
        """SELECT conname, pg_get_constraintdef(oid) AS def, conindid FROM pg_constraint
           WHERE conrelid = %s::regclass AND contype IN ('p', 'u', 'x') ORDER BY contype, conname""",
        (table,),
    ).fetchall()
    key_indexes = {k["conindid"] for k in keys}
    indexes = [
        r
        for r in conn.execute(
            """SELECT indexrelid, pg_get_indexdef(indexrelid) AS def FROM pg_index
               WHERE indrelid = %s::regclass ORDER BY indexrelid::regclass::text""",
            (table,),
        ).fetchall()
        if r["indexrelid"] not in key_indexes
    ]
    own_fks = conn.execute(
        """SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint
           WHERE conrelid = %s::regclass AND contype = 'f' AND conparentid = 0 ORDER BY conname""",
        (table,),
    ).fetchall()
    inbound_fks = conn.execute(
        """SELECT conrelid::regclass::text AS tbl, conname, pg_get_constraintdef(oid) AS def FROM pg_constraint
           WHERE confrelid = %s::regclass AND contype = 'f' AND conparentid = 0 AND conrelid <> confrelid
           ORDER BY 1, 2""",
        (table,),
    ).fetchall()
    triggers = conn.execute(
        """SELECT tgname, pg_get_triggerdef(oid) AS def FROM pg_trigger
           WHERE tgrelid = %s::regclass AND NOT tgisinternal AND tgparentid = 0 ORDER BY tgname""",
        (table,),
    ).fetchall()
    grants = conn.execute(_GRANTS_SQL, (table,)).fetchall()
    columns = [
        r["attname"]
        for r in conn.execute(
            """SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0
               AND NOT attisdropped AND attgenerated = '' ORDER BY attnum""",
            (table,),
        ).fetchall()
    ]
    if partitions > 1 and not all("user_id" in k["def"] for k in keys):
        raise SchemaError(
            f"{table}: a key without user_id cannot be partitioned by user_id: run `memory-archive migrate`"
        )

    # Views over the table (term_documents) are dropped with the old table and made again over the
    # new one, from their definitions read now (they name the table, not its new name).
    views = conn.execute(
        """SELECT DISTINCT v.oid::regclass::text AS name, pg_get_viewdef(v.oid) AS def
           FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class v ON v.oid = r.ev_class
           WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = %s::regclass AND v.relkind = 'v'""",
        (table,),
    ).fetchall()
    view_grants = {v["name"]: conn.execute(_GRANTS_SQL, (v["name"],)).fetchall() for v in views}
    children = [
        r["child"]
        for r in conn.execute(
            "SELECT inhrelid::regclass::text AS child FROM pg_inherits WHERE inhparent = %s::regclass",
            (table,),
        ).fetchall()
    ]
    for fk in inbound_fks:
        conn.execute(
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                sql.SQL(fk["tbl"]), sql.Identifier(fk["conname"])
            )
        )
    conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(ident, sql.Identifier(old)))
    for child in children:  # the new partitions take these names
        conn.execute(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(
                sql.Identifier(child), sql.Identifier(f"{child}__before_conversion")
            )
        )
    like = sql.SQL(
        "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED "
        "INCLUDING STORAGE INCLUDING COMMENTS INCLUDING COMPRESSION)"
    ).format(ident, sql.Identifier(old))
    if partitions > 1:
        conn.execute(like + sql.SQL(" PARTITION BY HASH (user_id)"))
        for i in range(partitions):
            conn.execute(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES WITH (MODULUS {}, REMAINDER {})").format(
                    sql.Identifier(_partition_name(table, i)), ident, sql.Literal(partitions), sql.Literal(i)
                )
            )
    else:
        conn.execute(like)
    cols = sql.SQL(", ").join(map(sql.Identifier, columns))
    conn.execute(
        sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(ident, cols, cols, sql.Identifier(old))
    )
    for v in views:
        conn.execute(sql.SQL("DROP VIEW {}").format(sql.Identifier(v["name"])))
    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(old)))
    for k in keys:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                ident, sql.Identifier(k["conname"]), sql.SQL(k["def"])
            )
        )
    for ix in indexes:
        create_index(
            conn,
            ix["def"],
            partitions=[_partition_name(table, i) for i in range(partitions)] if partitions > 1 else [],
        )
    for t in triggers:
        conn.execute(sql.SQL(t["def"]))
    for fk in own_fks:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                ident, sql.Identifier(fk["conname"]), sql.SQL(fk["def"])
            )
        )
    for fk in inbound_fks:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                sql.SQL(fk["tbl"]), sql.Identifier(fk["conname"]), sql.SQL(fk["def"])
            )
        )
    _grant(conn, table, grants)
    for v in views:
        conn.execute(sql.SQL("CREATE VIEW {} AS {}").format(sql.Identifier(v["name"]), sql.SQL(v["def"])))
        _grant(conn, v["name"], view_grants[v["name"]])
    conn.execute(sql.SQL("ANALYZE {}").format(ident))
