"""The LLM cost ledger (table llm_usage, sql/015): one row per paid provider answer, from its `usage`.

Invariants:
* a row is written for every answer that arrived, usable or not (a malformed answer was billed too);
* rows are written before the summary's checkpoint: a crash between the two re-summarizes the memory
  and the ledger shows both answers, which is what the provider billed. A crash between the answer and
  its row loses that row (the ledger can undercount by the requests in flight, never overcount);
* the cost is priced when the row is written, from the price table configured then (list price for a
  synchronous call, batch price for a batch result); `priced` is false for a model without a price.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..core.rows import Conn
from .summarize import Summary

__all__ = [
    "INSERT_SQL",
    "LedgerEntry",
    "ModelUsage",
    "entry_params",
    "memories_summarized",
    "record_usage",
    "usage_by_model",
    "usage_of_batches",
]


@dataclass(frozen=True)
class LedgerEntry:
    spent: Summary  # the answer's usage and price (its text is not stored here)
    outcome: str  # "ok" or "failed"
    batch_key: str | None = None
    memory_id: uuid.UUID | None = None
    user_id: str | None = None
    purpose: str = "summary"


INSERT_SQL = """
    INSERT INTO llm_usage (batch_key, memory_id, user_id, purpose, provider, model, mode, request_id, outcome,
        input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens, cost_usd, priced)
    VALUES (%(batch_key)s, %(memory_id)s, %(user_id)s, %(purpose)s, %(provider)s, %(model)s, %(mode)s,
        %(request_id)s, %(outcome)s, %(input_tokens)s, %(output_tokens)s, %(cache_creation_input_tokens)s,
        %(cache_read_input_tokens)s, %(cost_usd)s, %(priced)s)
    ON CONFLICT (user_id, request_id) WHERE mode = 'batch' DO NOTHING"""


def entry_params(e: LedgerEntry) -> dict[str, object]:
    """INSERT_SQL's parameters for one entry (plans write ledger rows in their own transaction)."""
    s = e.spent
    return {
        "batch_key": e.batch_key,
        "memory_id": e.memory_id,
        "user_id": e.user_id,
        "purpose": e.purpose,
        "provider": s.kind,
        "model": s.model,
        "mode": s.mode,
        "request_id": s.request_id,
        "outcome": e.outcome,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "cache_creation_input_tokens": s.cache_creation_input_tokens,
        "cache_read_input_tokens": s.cache_read_input_tokens,
        "cost_usd": s.cost_usd,
        "priced": s.priced,
    }


def record_usage(conn: Conn, entries: Sequence[LedgerEntry]) -> None:
    """Append `entries` to the ledger in one transaction."""
    if not entries:
        return
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(INSERT_SQL, [entry_params(e) for e in entries])


@dataclass(frozen=True)
class ModelUsage:
    """The ledger's totals for one model and mode."""

    model: str
    mode: str
    requests: int
    failed: int
    memories: int
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cost_usd: float
    unpriced: int


def _totals(conn: Conn, where: str, params: dict[str, object]) -> list[ModelUsage]:
    rows = conn.execute(
        f"""SELECT model, mode, count(*) AS requests, count(*) FILTER (WHERE outcome = 'failed') AS failed,
                   count(DISTINCT memory_id) AS memories,
                   coalesce(sum(input_tokens), 0) AS input_tokens, coalesce(sum(output_tokens), 0) AS output_tokens,
                   coalesce(sum(cache_creation_input_tokens), 0) AS cache_creation_input_tokens,
                   coalesce(sum(cache_read_input_tokens), 0) AS cache_read_input_tokens,
                   coalesce(sum(cost_usd), 0) AS cost_usd, count(*) FILTER (WHERE NOT priced) AS unpriced
            FROM llm_usage WHERE {where} GROUP BY model, mode ORDER BY model, mode""",
        params,
    ).fetchall()
    return [ModelUsage(**{**r, "cost_usd": float(r["cost_usd"])}) for r in rows]


def usage_of_batches(conn: Conn, batch_keys: Iterable[str]) -> list[ModelUsage]:
    """Totals per model and mode of the answers recorded for these archival batches."""
    return _totals(conn, "batch_key = ANY(%(keys)s)", {"keys": list(batch_keys)})


def usage_by_model(conn: Conn, night_batch_key: str) -> list[ModelUsage]:
    """Totals per model and mode of one night: its batch and its shards' batches (`<key>-shard-*`)."""
    return _totals(
        conn,
        "(batch_key = %(k)s OR batch_key LIKE %(like)s)",
        {"k": night_batch_key, "like": night_batch_key + "-shard-%"},
    )


def memories_summarized(conn: Conn, batch_keys: Iterable[str]) -> int:
    """Memories of these archival batches with an accepted LLM summary (a ledger row with outcome 'ok'),
    each counted once: the memories the batches' LLM spend bought."""
    row = conn.execute(
        """SELECT count(DISTINCT memory_id) AS n FROM llm_usage
           WHERE batch_key = ANY(%(keys)s) AND purpose = 'summary' AND outcome = 'ok'""",
        {"keys": list(batch_keys)},
    ).fetchone()
    return int(row["n"]) if row else 0
