"""The write path (seed 004 "Write Path"): normalize, refuse secrets, upsert, supersede.

`add` for one user, in one transaction under a per-user advisory lock:

1. The same normalized text again (dedupe key = sha256 of user_id and the NFKC, whitespace-collapsed,
   casefolded text) is the same memory: its access count and updated_at are bumped, nothing else.
2. Otherwise the nearest live hot memory of that user by cosine; at or above
   `near_duplicate_threshold` (0.92) it is a near-duplicate. The lexical guard compares the content
   words of both texts in order: when they are equal (only case, punctuation or function words
   differ) the new text is merged into the old memory; when a value differs (a number, a name,
   "cortado" -> "flat white") the new text is an update: it is inserted and supersedes the old
   memory (superseded_by + a 'superseded' event). Either way one live memory remains.
3. Otherwise a new memory.

Text that looks like a credential is refused (InvalidInputError on field "content", the secret
itself never echoed) unless the caller passes allow_secrets=True: it is checked before the text is
sent to an embedding API.
"""

from __future__ import annotations

import difflib
import math
import re
import unicodedata
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
from psycopg.types.json import Jsonb

from . import validation
from .config import RetrievalConfig, SecretDetectionConfig
from .errors import InvalidInputError
from .models import NewMemory, sha256_hex, validate_memory
from .search import Plan, Sql, checked_shape_plan, normalize_tags
from .store import MEMORY_COLUMNS

# --------------------------------------------------------------------------- normalization


def normalize_text(text: str) -> str:
    """Unicode NFKC, every run of whitespace one space, no leading or trailing space."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def dedupe_key(user_id: str, normalized: str) -> str:
    """Stable across processes and releases: sha256 of user_id, a unit separator, the casefolded text."""
    return sha256_hex(f"{user_id}\x1f{normalized.casefold()}")


# --------------------------------------------------------------------------- secrets

# Well-known credential formats. Each is specific enough that prose never matches it.
_SECRET_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private key block", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("OpenAI/Anthropic-style API key", re.compile(r"\bsk-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_-]{20,}")),
    ("AWS access key id", re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("Stripe secret key", re.compile(r"\b[rs]k_live_[A-Za-z0-9]{16,}")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("JSON Web Token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
)
# Anything else: a long unbroken token of random-looking characters (base62/base64). Random text
# mixes lower case, upper case and digits and switches between them at most characters; names
# (CamelCase), paths and words switch rarely, hex digests and UUIDs lack upper case.
_TOKEN_CANDIDATE = re.compile(r"[A-Za-z0-9+/=_\-]{8,}")  # looks_random applies the length policy
_DEFAULT_SECRETS = SecretDetectionConfig()


def _char_class(c: str) -> int:
    return 0 if c.islower() else 1 if c.isupper() else 2 if c.isdigit() else 3


def looks_random(token: str, policy: SecretDetectionConfig = _DEFAULT_SECRETS) -> bool:
    classes = [_char_class(c) for c in token]
    if len(token) < policy.min_token_length or not {0, 1, 2} <= set(classes):
        return False
    switches = sum(a != b for a, b in zip(classes, classes[1:], strict=False)) / (len(token) - 1)
    return switches >= policy.min_class_switch_ratio and shannon_entropy(token) >= policy.min_entropy_bits


def shannon_entropy(token: str) -> float:
    """Bits per character of the token's own character distribution."""
    counts = Counter(token)
    n = len(token)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


@dataclass(frozen=True)
class SecretFinding:
    kind: str
    start: int
    end: int

    def redacted(self, text: str) -> str:
        found = text[self.start : self.end]
        return f"{found[:4]}…({len(found)} chars)"


def find_secret(text: str, policy: SecretDetectionConfig = _DEFAULT_SECRETS) -> SecretFinding | None:
    """The first credential-looking span of `text`, or None."""
    for kind, pattern in _SECRET_PATTERNS:
        m = pattern.search(text)
        if m:
            return SecretFinding(kind, m.start(), m.end())
    for m in _TOKEN_CANDIDATE.finditer(text):
        if looks_random(m.group(), policy):
            return SecretFinding("high-entropy token", m.start(), m.end())
    return None


def check_no_secret(field: str, text: str, policy: SecretDetectionConfig = _DEFAULT_SECRETS) -> None:
    finding = find_secret(text, policy)
    if finding is not None:
        raise InvalidInputError(
            field,
            finding.redacted(text),
            f"looks like a secret ({finding.kind}); memories are not a secret store. "
            "Pass allow_secrets=True to store it anyway",
        )


# --------------------------------------------------------------------------- lexical guard

_WORD = re.compile(r"[^\W_]+(?:[.,:/'’-][^\W_]+)*")
# Function words: differences in these alone do not change a fact. Negations are NOT here:
# "likes" -> "does not like" is a changed value.
_FUNCTION_WORDS = frozenset(
    str.split(
        "a an the and or but of to in on at by for with from as is are was were be been being am it its "
        "this that these those he she they them his her their we our you your i me my s do does did has "
        "have had so than then there here about into also just very can will would should could user users"
    )
)


def content_words(text: str) -> list[str]:
    """Casefolded words in order, without function words; numbers keep their punctuation (4,417)."""
    return [w for w in _WORD.findall(normalize_text(text).casefold()) if w not in _FUNCTION_WORDS]


@dataclass(frozen=True)
class LexicalChange:
    removed: tuple[str, ...]  # content words of the old text that the new one drops
    added: tuple[str, ...]  # content words the new text brings

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.added)


def lexical_change(old: str, new: str) -> LexicalChange:
    """What differs in content words, in order: any difference means a changed value."""
    a, b = content_words(old), content_words(new)
    removed: list[str] = []
    added: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op in ("replace", "delete"):
            removed.extend(a[i1:i2])
        if op in ("replace", "insert"):
            added.extend(b[j1:j2])
    return LexicalChange(tuple(removed), tuple(added))


# --------------------------------------------------------------------------- add


@dataclass(frozen=True)
class PreparedMemory:
    """A memory to add, validated except for its embedding (checked against the store in the plan)."""

    fields: dict[str, Any]  # NewMemory fields without the embedding
    content: str
    dedupe_key: str

    @property
    def user_id(self) -> str:
        return self.fields["user_id"]


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
    allow_secrets: bool = False,
    secret_policy: SecretDetectionConfig = _DEFAULT_SECRETS,
) -> PreparedMemory:
    """Normalize and validate everything that does not need the database or the embedder (so bad
    input never reaches the embedding API either). Rules: memory_lib.validation."""
    validation.user(user_id)
    if not isinstance(content, str):
        raise InvalidInputError("content", content, "must be a string")
    validation.storable("content", content)
    text = normalize_text(content)
    if not validation.has_visible_text(text):
        raise InvalidInputError("content", content, "is empty after normalization")
    if not validation.boolean("allow_secrets", allow_secrets):
        check_no_secret("content", text, secret_policy)
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidInputError("metadata", metadata, "must be a mapping (a dict)")
    meta = dict(metadata or {})
    tag_list = normalize_tags(validation.tag_list("tags", tags))
    if "tags" in meta:
        raise InvalidInputError("metadata.tags", meta["tags"], "pass tags with the tags= argument")
    if tag_list:
        meta["tags"] = list(tag_list)
    fields = {
        "user_id": user_id, "content": text, "embedding_model": "pending",
        "entity_links": [] if entity_links is None else entity_links, "metadata": meta, "domain": domain,
        "category": category, "importance_score": importance, "pinned": pinned,
    }  # fmt: skip
    # A placeholder vector: only the embedding is checked later, against the store's shape.
    valid = validation.validated(NewMemory, fields | {"embedding": [0.0]})
    fields = valid.model_dump(include=set(fields))
    return PreparedMemory(fields, text, dedupe_key(user_id, text))


Outcome = Literal["created", "duplicate", "merged", "superseded"]


@dataclass(frozen=True)
class AddResult:
    memory_id: uuid.UUID  # the live memory holding this text now
    outcome: Outcome
    previous_id: uuid.UUID | None = None  # the duplicate, merged-into or superseded memory
    similarity: float | None = None  # cosine to previous_id for near-duplicates
    change: LexicalChange | None = None


BIND_MODEL_SQL = """
    INSERT INTO memory_archive_settings (key, value) VALUES ('embedding_model', %(model)s)
    ON CONFLICT (key) DO NOTHING"""
USER_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended('memory_lib.add:' || %(user_id)s, 0))"
# Rows written by other paths have no dedupe key: match them by the exact content's sha256.
FIND_EXACT_SQL = """
    SELECT id FROM memories
    WHERE user_id = %(user_id)s AND superseded_by IS NULL
      AND (dedupe_key = %(key)s OR (dedupe_key IS NULL AND content_sha256 = %(sha)s))
    ORDER BY created_at LIMIT 1 FOR UPDATE"""
NEAREST_LIVE_SQL = """
    SELECT id, content, pinned, 1 - (embedding <=> %(embedding)s::vector) AS similarity
    FROM memories WHERE user_id = %(user_id)s AND superseded_by IS NULL
    ORDER BY embedding <=> %(embedding)s::vector LIMIT 1"""
TOUCH_SQL = """
    UPDATE memories SET access_count = access_count + 1,
           last_accessed_at = greatest(coalesce(last_accessed_at, %(now)s), %(now)s),
           updated_at = greatest(updated_at, %(now)s)
    WHERE user_id = %(user_id)s AND id = %(id)s"""
INSERT_SQL = f"""
    INSERT INTO memories ({MEMORY_COLUMNS})
    VALUES (%(id)s, %(user_id)s, %(content)s, %(content_sha256)s, %(embedding)s, %(embedding_model)s,
            %(embedding_dim)s, %(entity_links)s, %(metadata)s, %(domain)s, %(category)s, %(importance_score)s,
            0, NULL, %(now)s, %(now)s, %(pinned)s, NULL, %(dedupe_key)s)"""
SUPERSEDE_SQL = """
    UPDATE memories SET superseded_by = %(new_id)s, updated_at = greatest(updated_at, %(now)s)
    WHERE user_id = %(user_id)s AND id = %(old_id)s AND superseded_by IS NULL"""
EVENT_SQL = """
    INSERT INTO memory_events (memory_id, user_id, event_type, actor, occurred_at, details)
    VALUES (%(memory_id)s, %(user_id)s, %(event_type)s, %(actor)s, %(now)s, %(details)s)"""


def event(
    memory_id: uuid.UUID, user_id: str, event_type: str, actor: str, now: datetime, details: dict
) -> Sql:
    return Sql(
        EVENT_SQL,
        {"memory_id": memory_id, "user_id": user_id, "event_type": event_type, "actor": actor, "now": now,
         "details": Jsonb(details)},
        "rowcount",
    )  # fmt: skip


def add_plan(
    memory: PreparedMemory,
    embedding: np.ndarray,
    *,
    embedding_model: str,
    config: RetrievalConfig,
    actor: str,
    now: datetime,
) -> Plan[AddResult]:
    user_id = memory.user_id
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    now = validation.timestamp("now", now)
    shape = yield from checked_shape_plan(int(np.asarray(embedding).size), embedding_model)
    valid = validate_memory(
        memory.fields | {"embedding": embedding, "embedding_model": embedding_model},
        dim=int(shape["dim"]), embedding_model=shape["model"] or embedding_model,
    )  # fmt: skip
    yield Sql(BIND_MODEL_SQL, {"model": embedding_model}, "rowcount")
    # Serialize writers of one user: the duplicate checks and the insert must see the same rows.
    yield Sql(USER_LOCK_SQL, {"user_id": user_id}, "one")

    exact = yield Sql(
        FIND_EXACT_SQL,
        {"user_id": user_id, "key": memory.dedupe_key, "sha": sha256_hex(memory.content)},
        "one",
    )
    if exact is not None:
        yield Sql(TOUCH_SQL, {"user_id": user_id, "id": exact["id"], "now": now}, "rowcount")
        yield event(exact["id"], user_id, "updated", actor, now, {"reason": "duplicate_add"})
        return AddResult(exact["id"], "duplicate", exact["id"], 1.0)

    nearest = yield Sql(NEAREST_LIVE_SQL, {"user_id": user_id, "embedding": valid.embedding}, "one")
    if nearest is not None and float(nearest["similarity"]) >= config.near_duplicate_threshold:
        similarity = float(nearest["similarity"])
        change = lexical_change(nearest["content"], memory.content)
        if not change.changed:
            yield Sql(TOUCH_SQL, {"user_id": user_id, "id": nearest["id"], "now": now}, "rowcount")
            yield event(nearest["id"], user_id, "updated", actor, now,
                        {"reason": "near_duplicate_add", "similarity": round(similarity, 4)})  # fmt: skip
            return AddResult(nearest["id"], "merged", nearest["id"], similarity, change)
        # An update keeps the old memory's pin: the fact it replaces was pinned for a reason.
        new_id = yield from _insert(valid, memory, actor, now, pinned=valid.pinned or nearest["pinned"],
                                    supersedes=nearest["id"])  # fmt: skip
        yield Sql(
            SUPERSEDE_SQL,
            {"user_id": user_id, "old_id": nearest["id"], "new_id": new_id, "now": now},
            "rowcount",
        )
        yield event(nearest["id"], user_id, "superseded", actor, now,
                    {"superseded_by": str(new_id), "similarity": round(similarity, 4),
                     "removed": list(change.removed), "added": list(change.added)})  # fmt: skip
        return AddResult(new_id, "superseded", nearest["id"], similarity, change)

    new_id = yield from _insert(valid, memory, actor, now, pinned=valid.pinned, supersedes=None)
    return AddResult(new_id, "created")


def _insert(
    valid: NewMemory,
    memory: PreparedMemory,
    actor: str,
    now: datetime,
    *,
    pinned: bool,
    supersedes: uuid.UUID | None,
) -> Plan[uuid.UUID]:
    yield Sql(
        INSERT_SQL,
        {"id": valid.id, "user_id": valid.user_id, "content": valid.content,
         "content_sha256": sha256_hex(valid.content), "embedding": valid.embedding,
         "embedding_model": valid.embedding_model, "embedding_dim": int(valid.embedding.size),
         "entity_links": valid.entity_links, "metadata": Jsonb(valid.metadata), "domain": valid.domain,
         "category": valid.category, "importance_score": valid.importance_score, "now": now,
         "pinned": pinned, "dedupe_key": memory.dedupe_key},
        "rowcount",
    )  # fmt: skip
    details: dict[str, Any] = {"category": valid.category}
    if supersedes is not None:
        details["supersedes"] = str(supersedes)
    yield event(valid.id, valid.user_id, "created", actor, now, details)
    return valid.id
