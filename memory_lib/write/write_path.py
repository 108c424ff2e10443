"""The write path: normalize, refuse secrets, chunk, upsert, add-only by default, supersede when known, TTL.

`add` for one user, in one transaction under a per-user advisory lock:

1. The same normalized text again (dedupe key = sha256 of user_id and the NFKC, whitespace-collapsed,
   casefolded text) is the same memory: its access count and updated_at are bumped (and its expiry
   renewed when a ttl_days is given), nothing else.
2. `supersedes=<id>`: the caller says the text replaces that live memory of theirs: it is inserted
   and the old one superseded (superseded_by + a 'superseded' event with reason 'explicit').
3. A restatement of one of the user's closest live memories (memory_lib.write.near_duplicates: the same
   words, or for a semantic embedder a close paraphrase with the same names, numbers, dates and
   negations) is merged into it.
4. When known, a close live memory is superseded: the LLM judge's verdict (memory_lib.write.write_judge,
   asked by the client before this transaction; 'duplicate' merges, 'updates'/'contradicts'
   supersede) or, opted in, the offline state rule ("lives in Lisbon" -> "lives in Porto").
5. Otherwise a new memory: add-only. Distinct events and texts that differ in a name, number, date,
   place or object are never merged or superseded by default.

A superseded memory stays as history (get/history show the chain; search skips it unless
include_superseded=True). Supersede keeps the old memory's pin and, unless a new one is given, its TTL.

A text longer than the chunk size (memory_lib.write.chunking: 512 tokens, or the embedder's limit) is
stored as chunks sharing a parent id (metadata.chunk), in one transaction: all or none. The same long
text again is a duplicate of its parent; chunks never merge with or supersede other memories.

TTL: ttl_days=None keeps a memory until the archival criteria take it; ttl_days=0 pins it (a
canonical fact); ttl_days=N > 0 sets expires_at = the write + N days, after which the nightly Slow
Path archives it with reason 'ttl_expired' (memory_lib.lifecycle.eligibility): archived, never dropped. A
pinned memory never expires.

Text that looks like a credential is refused (InvalidInputError on field "content", the secret
itself never echoed) unless the caller passes allow_secrets=True: it is checked before the text is
sent to an embedding API (memory_lib.write.secrets).
"""

from __future__ import annotations

import unicodedata
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import numpy as np
from psycopg.types.json import Jsonb

from ..core import validation
from ..core.config import RetrievalConfig, SecretDetectionConfig, WriteConfig
from ..core.errors import InvalidInputError
from ..core.locks import USER_LOCK_SQL
from ..core.models import NewMemory, sha256_hex, validate_memory
from ..core.plans import Plan, Sql
from ..core.validation import normalize_tags
from ..llm.ledger import INSERT_SQL as LEDGER_SQL
from ..llm.ledger import LedgerEntry, entry_params
from ..llm.summarize import Summary
from ..storage.events import EventType, event
from ..storage.space import checked_shape_plan
from ..storage.store import MEMORY_COLUMNS
from .chunking import Chunk
from .near_duplicates import (
    LexicalChange,
    Thresholds,
    content_words,
    lexical_change,
    restatement,
    salient_tokens,
    state_change,
    thresholds_for,
)
from .secrets import (
    DEFAULT_SECRETS,
    SecretFinding,
    check_no_secret,
    find_secret,
    looks_random,
    shannon_entropy,
)
from .write_judge import Candidate, Verdict

# Re-exported: the lexical guard lives in near_duplicates, the secret rule in secrets.
__all__ = [
    "LexicalChange",
    "SecretFinding",
    "check_no_secret",
    "content_words",
    "find_secret",
    "lexical_change",
    "looks_random",
    "shannon_entropy",
]

# --------------------------------------------------------------------------- normalization


def normalize_text(text: str) -> str:
    """Unicode NFKC, every run of whitespace one space, no leading or trailing space."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def dedupe_key(user_id: str, normalized: str) -> str:
    """Stable across processes and releases: sha256 of user_id, a unit separator, the casefolded text."""
    return sha256_hex(f"{user_id}\x1f{normalized.casefold()}")


# --------------------------------------------------------------------------- add


@dataclass(frozen=True)
class PreparedMemory:
    """A memory to add, validated except for its embedding (checked against the store in the plan)."""

    fields: dict[str, Any]  # NewMemory fields without the embedding
    content: str
    dedupe_key: str
    ttl_days: int | None = None  # None: no TTL; 0: pinned (fields["pinned"] is True); N: days

    @property
    def user_id(self) -> str:
        return self.fields["user_id"]

    def expires_at(self, now: datetime, *, pinned: bool | None = None) -> datetime | None:
        """When a memory written `now` expires: None without a TTL, when pinned, or for ttl_days 0."""
        pinned = self.fields["pinned"] if pinned is None else pinned
        if pinned or not self.ttl_days:
            return None
        return now + timedelta(days=self.ttl_days)


# metadata keys the write path sets itself
RESERVED_METADATA = {
    "tags": "pass tags with the tags= argument",
    "chunk": "is set by the write path for chunks",
}


def prepare_memory(
    user_id: str,
    content: str,
    *,
    category: str = "episodic",
    domain: str | None = None,
    importance: float = 0.5,
    tags: tuple[str, ...] | list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    pinned: bool = False,
    entity_links: list[uuid.UUID] | None = None,
    allow_secrets: object = False,  # checked here: validation.boolean
    ttl_days: int | None = None,
    secret_policy: SecretDetectionConfig = DEFAULT_SECRETS,
) -> PreparedMemory:
    """Normalize and validate everything that does not need the database or the embedder (so bad
    input never reaches the embedding API either). Rules: memory_lib.core.validation."""
    validation.user(user_id)
    if not isinstance(content, str):
        raise InvalidInputError("content", content, "must be a string")
    validation.storable("content", content)
    text = normalize_text(content)
    if not validation.has_visible_text(text):
        raise InvalidInputError("content", content, "is empty after normalization")
    ttl = validation.ttl_days("ttl_days", ttl_days)
    if ttl and validation.boolean("pinned", pinned):
        raise InvalidInputError(
            "ttl_days", ttl_days, "a pinned memory never expires: pass ttl_days=0 or None"
        )
    if not validation.boolean("allow_secrets", allow_secrets):
        check_no_secret("content", text, secret_policy)
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidInputError("metadata", metadata, "must be a mapping (a dict)")
    meta = dict(metadata or {})
    tag_list = normalize_tags(validation.tag_list("tags", tags))
    for key, reason in RESERVED_METADATA.items():
        if key in meta:
            raise InvalidInputError(f"metadata.{key}", meta[key], reason)
    if tag_list:
        meta["tags"] = list(tag_list)
    fields = {
        "user_id": user_id,
        "content": text,
        "embedding_model": "pending",
        "entity_links": [] if entity_links is None else entity_links,
        "metadata": meta,
        "domain": domain,
        "category": category,
        "importance_score": importance,
        "pinned": pinned or ttl == 0,
    }
    # A placeholder vector: only the embedding is checked later, against the store's shape.
    valid = validation.validated(NewMemory, fields | {"embedding": [0.0]})
    fields = valid.model_dump(include=set(fields))
    return PreparedMemory(fields, text, dedupe_key(user_id, text), ttl)


Outcome = Literal["created", "duplicate", "merged", "superseded"]
# Why a memory was merged or superseded: a restatement, the caller, the LLM judge, the opt-in state rule.
Reason = Literal["duplicate", "restatement", "explicit", "llm", "state_rule"]


@dataclass(frozen=True)
class AddResult:
    memory_id: uuid.UUID  # the live memory holding this text now (a long text: its first chunk)
    outcome: Outcome
    previous_id: uuid.UUID | None = None  # the duplicate, merged-into or superseded memory
    similarity: float | None = None  # cosine to previous_id
    change: LexicalChange | None = None
    parent_id: uuid.UUID | None = None  # a long text stored as chunks: their shared parent id
    chunk_ids: tuple[uuid.UUID, ...] = ()  # ...and the chunks' memory ids, in order
    expires_at: datetime | None = None  # when the memory is archived by its TTL (None: never by TTL)
    reason: Reason | None = None  # why it was merged or superseded (None: created)
    judge: dict[str, Any] | None = None  # the LLM judge's verdict, when one was asked


BIND_MODEL_SQL = """
    INSERT INTO memory_archive_settings (key, value) VALUES ('embedding_model', %(model)s)
    ON CONFLICT (key) DO NOTHING"""
# Rows written by other paths have no dedupe key: match them by the exact content's sha256.
FIND_EXACT_SQL = """
    SELECT id, expires_at FROM memories
    WHERE user_id = %(user_id)s AND superseded_by IS NULL
      AND (dedupe_key = %(key)s OR (dedupe_key IS NULL AND content_sha256 = %(sha)s))
    ORDER BY created_at LIMIT 1 FOR UPDATE"""
# Chunks of long texts are passages, not facts: a short text never merges into or supersedes one.
NEAREST_LIVE_SQL = """
    SELECT id, content, pinned, ttl_days, 1 - (embedding <=> %(embedding)s::vector) AS similarity
    FROM memories WHERE user_id = %(user_id)s AND superseded_by IS NULL AND NOT metadata ? 'chunk'
    ORDER BY embedding <=> %(embedding)s::vector LIMIT %(k)s"""
# The memory an add replaces (explicitly or by a verdict): locked, so no other writer moves it meanwhile.
TARGET_SQL = """
    SELECT id, user_id, content, pinned, ttl_days, superseded_by, metadata ? 'chunk' AS is_chunk FROM memories
    WHERE user_id = %(user_id)s AND id = %(id)s FOR UPDATE"""
# A TTL given again renews the expiry from now; without one the memory keeps its own.
TOUCH_SQL = """
    UPDATE memories SET access_count = access_count + 1,
           last_accessed_at = greatest(coalesce(last_accessed_at, %(now)s), %(now)s),
           updated_at = greatest(updated_at, %(now)s),
           pinned = pinned OR coalesce(%(ttl_days)s::int = 0, false),
           ttl_days = CASE WHEN %(ttl_days)s::int IS NULL OR pinned THEN ttl_days ELSE %(ttl_days)s::int END,
           expires_at = CASE WHEN %(ttl_days)s::int IS NULL OR pinned THEN expires_at
                             ELSE %(expires_at)s::timestamptz END
    WHERE user_id = %(user_id)s AND id = ANY(%(ids)s)
    RETURNING expires_at"""
INSERT_SQL = f"""
    INSERT INTO memories ({MEMORY_COLUMNS}, ttl_days, expires_at)
    VALUES (%(id)s, %(user_id)s, %(content)s, %(content_sha256)s, %(embedding)s, %(embedding_model)s,
            %(embedding_dim)s, %(entity_links)s, %(metadata)s, %(domain)s, %(category)s, %(importance_score)s,
            0, NULL, %(now)s, %(now)s, %(pinned)s, NULL, %(dedupe_key)s, %(ttl_days)s, %(expires_at)s)"""
SUPERSEDE_SQL = """
    UPDATE memories SET superseded_by = %(new_id)s, updated_at = greatest(updated_at, %(now)s)
    WHERE user_id = %(user_id)s AND id = %(old_id)s AND superseded_by IS NULL"""
# A long text added again: any live chunk of it (a parent may be partly archived) names the parent.
FIND_CHUNKED_SQL = """
    SELECT metadata -> 'chunk' ->> 'parent_id' AS parent_id FROM memories
    WHERE user_id = %(user_id)s AND superseded_by IS NULL AND dedupe_key = ANY(%(keys)s)
    ORDER BY created_at LIMIT 1 FOR UPDATE"""
PARENT_CHUNKS_SQL = """
    SELECT id FROM memories
    WHERE user_id = %(user_id)s AND metadata ? 'chunk' AND metadata -> 'chunk' ->> 'parent_id' = %(parent_id)s
      AND superseded_by IS NULL
    ORDER BY (metadata -> 'chunk' ->> 'index')::int FOR UPDATE"""


def touch(memory: PreparedMemory, ids: list[uuid.UUID], now: datetime) -> Plan[datetime | None]:
    """Count an access to the user's memories `ids` and apply `memory`'s ttl_days; the new expires_at."""
    rows = yield Sql(
        TOUCH_SQL,
        {
            "user_id": memory.user_id,
            "ids": ids,
            "now": now,
            "ttl_days": memory.ttl_days,
            "expires_at": memory.expires_at(now, pinned=False),
        },
        "all",
    )
    return rows[0]["expires_at"] if rows else None


def _start(memory: PreparedMemory, dim: int, embedding_model: str, actor: str, now: datetime) -> Plan[dict]:
    """Checks and locks every add begins with: the store's shape, the model bound, the user's lock."""
    validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    validation.timestamp("now", now)
    shape = yield from checked_shape_plan(dim, embedding_model)
    if shape["model"] is None:  # bound once: the settings table is replicated to every node on Citus
        yield Sql(BIND_MODEL_SQL, {"model": embedding_model}, "rowcount")
    # Serialize writers of one user: the duplicate checks and the insert must see the same rows.
    yield Sql(USER_LOCK_SQL, {"user_id": memory.user_id}, "one")
    return shape


def _find_exact(memory: PreparedMemory) -> Plan[dict | None]:
    row = yield Sql(
        FIND_EXACT_SQL,
        {"user_id": memory.user_id, "key": memory.dedupe_key, "sha": sha256_hex(memory.content)},
        "one",
    )
    return row


def _nearest(user_id: str, embedding: np.ndarray, k: int) -> Plan[list[dict]]:
    rows = yield Sql(NEAREST_LIVE_SQL, {"user_id": user_id, "embedding": embedding, "k": k}, "all")
    return rows


def judge_candidates(rows: list[dict], content: str, thresholds: Thresholds) -> list[Candidate]:
    """The close live memories to show the judge: none when one of them is restated (merged without
    asking), else those at or above the embedder's candidate floor, closest first."""
    if any(restatement(float(r["similarity"]), r["content"], content, thresholds) for r in rows):
        return []
    return [
        Candidate(r["id"], r["content"], float(r["similarity"]))
        for r in rows
        if float(r["similarity"]) >= thresholds.floor
    ]


def judge_candidates_plan(
    memory: PreparedMemory,
    embedding: np.ndarray,
    *,
    embedding_model: str,
    thresholds: Thresholds,
    k: int,
) -> Plan[list[Candidate]]:
    """Read-only, before the add's transaction: what the LLM judge must see ([] when the text is a
    duplicate or a restatement, or nothing is close): the judge's call holds no lock."""
    yield from checked_shape_plan(int(np.asarray(embedding).size), embedding_model)
    if (yield from _find_exact(memory)) is not None:
        return []
    return judge_candidates((yield from _nearest(memory.user_id, embedding, k)), memory.content, thresholds)


def add_plan(
    memory: PreparedMemory,
    embedding: np.ndarray,
    *,
    embedding_model: str,
    config: RetrievalConfig,
    actor: str,
    now: datetime,
    embedder_kind: str | None = None,
    write: WriteConfig | None = None,
    supersedes: uuid.UUID | None = None,
    verdict: Verdict | None = None,
) -> Plan[AddResult]:
    """Add one text that fits one memory (see the module docstring). `verdict`: the LLM judge's, asked
    by the client over judge_candidates_plan's candidates; it is applied only to a memory still live."""
    write = write or WriteConfig()
    user_id = memory.user_id
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    now = validation.timestamp("now", now)
    valid = validate_memory(
        memory.fields | {"embedding": embedding, "embedding_model": embedding_model},
        dim=int(np.asarray(embedding).size),
        embedding_model=embedding_model,
    )
    yield from _start(memory, int(valid.embedding.size), embedding_model, actor, now)
    judged = verdict.details() if verdict is not None else None
    yield from _bill(verdict, memory)

    target = None
    if supersedes is not None:
        target = yield from _live_target(user_id, supersedes, field="supersedes")
    exact = yield from _find_exact(memory)
    if exact is not None:
        if (
            target is not None and exact["id"] != target["id"]
        ):  # the new text is live already: it replaces target
            yield Sql(
                SUPERSEDE_SQL,
                {"user_id": user_id, "old_id": target["id"], "new_id": exact["id"], "now": now},
                "rowcount",
            )
            yield _superseded_event(target, exact["id"], memory.content, "explicit", None, actor, now, judged)
            return AddResult(
                exact["id"],
                "superseded",
                target["id"],
                reason="explicit",
                change=lexical_change(target["content"], memory.content),
            )
        expires = yield from touch(memory, [exact["id"]], now)
        yield event(exact["id"], user_id, EventType.UPDATED, actor, now, {"reason": "duplicate_add"})
        return AddResult(exact["id"], "duplicate", exact["id"], 1.0, expires_at=expires, reason="duplicate")
    if target is not None:
        return (yield from _supersede(valid, memory, target, None, "explicit", actor, now, judged))

    thresholds = near_duplicate_thresholds(config, embedding_model, embedder_kind)
    rows = yield from _nearest(user_id, valid.embedding, write.judge_candidates)
    for row in rows:
        similarity = float(row["similarity"])
        if restatement(similarity, row["content"], memory.content, thresholds):
            return (yield from _merge(memory, row["id"], similarity, "restatement", actor, now, judged))

    if verdict is not None and not verdict.failed and verdict.target is not None:
        locked = yield from _live_target(user_id, verdict.target, field=None)
        # A merge never drops a name, number, date or negation, whoever proposes it.
        if locked is not None and not (
            verdict.decision == "duplicate"
            and salient_tokens(locked["content"]) != salient_tokens(memory.content)
        ):
            found = next((float(r["similarity"]) for r in rows if r["id"] == locked["id"]), None)
            if verdict.decision == "duplicate":
                return (yield from _merge(memory, locked["id"], found, "llm", actor, now, judged))
            return (yield from _supersede(valid, memory, locked, found, "llm", actor, now, judged))
    if write.state_rule:
        for row in rows:
            similarity = float(row["similarity"])
            if state_change(row["content"], memory.content) is not None:
                locked = yield from _live_target(user_id, row["id"], field=None)
                if locked is not None:
                    return (
                        yield from _supersede(
                            valid, memory, locked, similarity, "state_rule", actor, now, judged
                        )
                    )

    new_id = yield from insert(valid, memory, actor, now, pinned=valid.pinned, supersedes=None, judge=judged)
    return AddResult(new_id, "created", expires_at=memory.expires_at(now), judge=judged)


def _live_target(user_id: str, memory_id: uuid.UUID, *, field: str | None) -> Plan[dict | None]:
    """The live, unchunked hot memory `memory_id` of the user, locked. field=None: None when it is not
    (a verdict's target that moved meanwhile); else InvalidInputError naming `field`."""
    row = yield Sql(TARGET_SQL, {"user_id": user_id, "id": memory_id}, "one")
    problem = (
        "is not a hot memory of this user (archived ones: restore first)"
        if row is None
        else f"was superseded already, by {row['superseded_by']}"
        if row["superseded_by"] is not None
        else "is a chunk of a long text: chunks are never superseded"
        if row["is_chunk"]
        else None
    )
    if problem is None:
        return row
    if field is None:
        return None
    raise InvalidInputError(field, str(memory_id), problem)


def _merge(
    memory: PreparedMemory,
    into: uuid.UUID,
    similarity: float | None,
    reason: Reason,
    actor: str,
    now: datetime,
    judged: dict[str, Any] | None,
) -> Plan[AddResult]:
    expires = yield from touch(memory, [into], now)
    details: dict[str, Any] = {"reason": "near_duplicate_add", "rule": reason}
    if similarity is not None:
        details["similarity"] = round(similarity, 4)
    if judged is not None:
        details["judge"] = judged
    yield event(into, memory.user_id, EventType.UPDATED, actor, now, details)
    return AddResult(into, "merged", into, similarity, expires_at=expires, reason=reason, judge=judged)


def _supersede(
    valid: NewMemory,
    memory: PreparedMemory,
    old: dict,
    similarity: float | None,
    reason: Reason,
    actor: str,
    now: datetime,
    judged: dict[str, Any] | None,
) -> Plan[AddResult]:
    """Insert the new memory and supersede `old` (locked, live). The new one keeps the old one's pin (it
    was pinned for a reason) and its TTL policy unless a new one is given."""
    pinned = valid.pinned or old["pinned"]
    ttl = memory.ttl_days if memory.ttl_days is not None else old["ttl_days"]
    update = PreparedMemory(memory.fields, memory.content, memory.dedupe_key, ttl)
    new_id = yield from insert(valid, update, actor, now, pinned=pinned, supersedes=old["id"], judge=judged)
    yield Sql(
        SUPERSEDE_SQL,
        {"user_id": memory.user_id, "old_id": old["id"], "new_id": new_id, "now": now},
        "rowcount",
    )
    yield _superseded_event(old, new_id, memory.content, reason, similarity, actor, now, judged)
    return AddResult(
        new_id,
        "superseded",
        old["id"],
        similarity,
        lexical_change(old["content"], memory.content),
        expires_at=update.expires_at(now, pinned=pinned),
        reason=reason,
        judge=judged,
    )


def _superseded_event(
    old: dict,
    new_id: uuid.UUID,
    content: str,
    reason: Reason,
    similarity: float | None,
    actor: str,
    now: datetime,
    judged: dict[str, Any] | None,
) -> Sql:
    change = lexical_change(old["content"], content)
    details: dict[str, Any] = {
        "superseded_by": str(new_id),
        "reason": reason,
        "removed": list(change.removed),
        "added": list(change.added),
    }
    if similarity is not None:
        details["similarity"] = round(similarity, 4)
    if judged is not None:
        details["judge"] = judged
    return event(old["id"], old["user_id"], EventType.SUPERSEDED, actor, now, details)


def _bill(verdict: Verdict | None, memory: PreparedMemory) -> Plan[None]:
    """The judge's answer in the ledger (llm_usage), in the add's transaction."""
    if verdict is None or verdict.usage is None:
        return
    u = verdict.usage
    spent = Summary("", u.model, verdict.provider, u.input_tokens, u.output_tokens, u.cost_usd, mode="sync")
    entry = LedgerEntry(
        spent, "failed" if verdict.failed else "ok", user_id=memory.user_id, purpose="write_judge"
    )
    yield Sql(LEDGER_SQL, entry_params(entry), "rowcount")


def near_duplicate_thresholds(config: RetrievalConfig, embedding_model: str, kind: str | None) -> Thresholds:
    """The embedder's calibrated thresholds with RetrievalConfig's overrides."""
    return thresholds_for(
        embedding_model, kind, paraphrase=config.near_duplicate_threshold, floor=config.near_duplicate_floor
    )


def chunk_key(parent_key: str, index: int) -> str:
    """A chunk's dedupe key: its parent's key and its place (two equal passages of one text differ)."""
    return sha256_hex(f"{parent_key}\x1fchunk\x1f{index}")


def add_chunks_plan(
    memory: PreparedMemory,
    chunks: list[Chunk],
    embeddings: np.ndarray,
    *,
    embedding_model: str,
    actor: str,
    now: datetime,
) -> Plan[AddResult]:
    """Add a long text as chunks sharing a parent id, all in this transaction; the same text again
    (any live chunk of it) is a duplicate of its parent. Chunks skip the near-duplicate rule."""
    user_id = memory.user_id
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    now = validation.timestamp("now", now)
    if len(chunks) < 2 or len(embeddings) != len(chunks):
        raise InvalidInputError(
            "chunks", len(chunks), f"need two or more chunks, one embedding each ({len(embeddings)})"
        )
    valid = [
        validate_memory(
            memory.fields | {"content": c.text, "embedding": e, "embedding_model": embedding_model},
            dim=int(np.asarray(e).size),
            embedding_model=embedding_model,
        )
        for c, e in zip(chunks, embeddings, strict=True)
    ]
    yield from _start(memory, int(valid[0].embedding.size), embedding_model, actor, now)
    keys = [chunk_key(memory.dedupe_key, c.index) for c in chunks]
    found = yield Sql(FIND_CHUNKED_SQL, {"user_id": user_id, "keys": keys}, "one")
    if found is not None:
        parent = uuid.UUID(found["parent_id"])
        rows = yield Sql(PARENT_CHUNKS_SQL, {"user_id": user_id, "parent_id": str(parent)})
        ids = [r["id"] for r in rows]
        expires = yield from touch(memory, ids, now)
        for mid in ids:
            yield event(
                mid,
                user_id,
                EventType.UPDATED,
                actor,
                now,
                {"reason": "duplicate_add", "parent_id": str(parent)},
            )
        return AddResult(
            ids[0], "duplicate", ids[0], 1.0, parent_id=parent, chunk_ids=tuple(ids), expires_at=expires
        )
    parent = uuid.uuid4()
    ids = []
    for chunk, v, key in zip(chunks, valid, keys, strict=True):
        v.metadata = v.metadata | {
            "chunk": {
                "parent_id": str(parent),
                "index": chunk.index,
                "count": len(chunks),
                "start": chunk.start,
                "end": chunk.end,
                "tokens": chunk.tokens,
            }
        }
        part = PreparedMemory(memory.fields, chunk.text, key, memory.ttl_days)
        ids.append((yield from insert(v, part, actor, now, pinned=v.pinned, supersedes=None)))
    return AddResult(
        ids[0], "created", parent_id=parent, chunk_ids=tuple(ids), expires_at=memory.expires_at(now)
    )


def insert(
    valid: NewMemory,
    memory: PreparedMemory,
    actor: str,
    now: datetime,
    *,
    pinned: bool,
    supersedes: uuid.UUID | None,
    judge: dict[str, Any] | None = None,
) -> Plan[uuid.UUID]:
    """Insert `valid` as a new hot memory with its 'created' event; its id."""
    yield Sql(
        INSERT_SQL,
        {
            "id": valid.id,
            "user_id": valid.user_id,
            "content": valid.content,
            "content_sha256": sha256_hex(valid.content),
            "embedding": valid.embedding,
            "embedding_model": valid.embedding_model,
            "embedding_dim": int(valid.embedding.size),
            "entity_links": valid.entity_links,
            "metadata": Jsonb(valid.metadata),
            "domain": valid.domain,
            "category": valid.category,
            "importance_score": valid.importance_score,
            "now": now,
            "pinned": pinned,
            "dedupe_key": memory.dedupe_key,
            "ttl_days": memory.ttl_days,
            "expires_at": memory.expires_at(now, pinned=pinned),
        },
        "rowcount",
    )
    details: dict[str, Any] = {"category": valid.category}
    if supersedes is not None:
        details["supersedes"] = str(supersedes)
    if memory.ttl_days is not None:
        details["ttl_days"] = memory.ttl_days
    if "chunk" in valid.metadata:
        details["parent_id"] = valid.metadata["chunk"]["parent_id"]
    if judge is not None:
        details["judge"] = judge
    yield event(valid.id, valid.user_id, EventType.CREATED, actor, now, details)
    return valid.id
