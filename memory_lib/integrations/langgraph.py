"""A LangGraph store (`langgraph.store.base.BaseStore`) over the memory client: `pip install
'memory-archive[langgraph]'`. Import it only where LangGraph is installed: nothing else imports it.

The mapping (docs/how-to/langgraph.md has the table of differences from LangGraph's InMemoryStore):

* **user**: every namespace belongs to one user_id, the store's fixed `user_id`, or the label at
  `user_position` of each namespace (`("memories", "alice")` with user_position=1 is alice's). Every
  call names that user, so nothing a store does reads or writes another user's memories; a search or a
  listing that does not name the user (a prefix too short, a wildcard at its position) is refused.
* **item**: one live memory of that user. Its metadata holds the namespace, the key and the value
  (`metadata["langgraph"]`), so get returns the value exactly as put; its text, which search matches
  and embeds, is derived from the value (the `index` fields, like InMemoryStore, or the whole value as
  JSON) plus an identity token, so two items never merge on the write path (near-duplicates).
* **tags**: `lg:store` on every item, `lg:item:<digest of namespace and key>` (how get finds an item),
  and one `lg:ns:<position>:<label, base32>` per namespace label other than the user's (how search and
  list_namespaces select a prefix: tags are case-insensitive, base32 keeps a label's case). A label
  is at most 56 bytes in UTF-8 (a tag is at most 100 characters).
* **put** of a new key adds a memory; of a key whose text changed, adds the new version superseding
  the old one (history is kept, `client.history`); of the same text, updates the value in place. An
  archived item is restored first. **delete** (put of None) forgets the item and its versions.
* **search** with a query is the client's two-phase search restricted to the prefix's tags: archived
  items are found, labelled (`item.tier == "archived"`, `item.archive_id`) and their value read from
  the backup (an expansion, which counts as a use). Without a query, the prefix's items newest first.
* **TTL** (minutes) becomes the memory's `ttl_days` (rounded up to whole days): when it expires the
  nightly run archives the item, it is not deleted, and get and search still return it. Reads do not
  refresh it (`refresh_ttl` is ignored); a put with a TTL renews it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, cast

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
    tokenize_path,
    validate_op_namespace,
)

from ..client import AsyncMemoryClient, MemoryClient, SearchFilters
from ..core import validation
from ..core.errors import InvalidInputError, MemoryArchiveError
from ..write.chunking import token_spans
from ..write.memory_api import MemoryRecord
from ..write.write_path import normalize_text

__all__ = ["MemoryArchiveStore", "StoredItem", "StoredSearchItem"]

STORE_TAG = "lg:store"
META_KEY = "langgraph"
MAX_LABEL_BYTES = 56  # base32 of 56 bytes is 90 characters: "lg:ns:NN:" + that fits a 100-character tag
PAGE = 1000  # list() page size, its maximum
MINUTES_PER_DAY = 24 * 60


class StoredItem(Item):
    """An Item with where it lives: `tier` ("hot" or "archived"), `memory_id`, `archive_id`."""

    __slots__ = ("tier", "memory_id", "archive_id")

    def __init__(self, *, tier: str, memory_id: uuid.UUID, archive_id: uuid.UUID | None, **item: Any):
        super().__init__(**item)
        self.tier, self.memory_id, self.archive_id = tier, memory_id, archive_id


class StoredSearchItem(SearchItem):
    """A SearchItem with the same labels as StoredItem; archived hits have tier "archived"."""

    __slots__ = ("tier", "memory_id", "archive_id")

    def __init__(self, *, tier: str, memory_id: uuid.UUID, archive_id: uuid.UUID | None, **item: Any):
        super().__init__(**item)
        self.tier, self.memory_id, self.archive_id = tier, memory_id, archive_id


# --------------------------------------------------------------------------- one body, two drivers

# A step asks the driver to call one client method: (name, args, kwargs); the driver sends back its result.
Call = tuple[str, tuple[Any, ...], dict[str, Any]]
Steps = Generator[Call, Any, Any]


def _call(method: str, *args: Any, **kwargs: Any) -> Steps:
    return (yield (method, args, kwargs))


def _drive(client: MemoryClient, steps: Steps) -> Any:
    try:
        method, args, kwargs = next(steps)
        while True:
            method, args, kwargs = steps.send(getattr(client, method)(*args, **kwargs))
    except StopIteration as done:
        return done.value


async def _adrive(client: AsyncMemoryClient, steps: Steps) -> Any:
    try:
        method, args, kwargs = next(steps)
        while True:
            method, args, kwargs = steps.send(await getattr(client, method)(*args, **kwargs))
    except StopIteration as done:
        return done.value


# --------------------------------------------------------------------------- the mapping


def _label_tag(position: int, label: str) -> str:
    return f"lg:ns:{position}:" + base64.b32encode(label.encode()).decode().rstrip("=").lower()


def _parse_label_tag(tag: str) -> tuple[int, str] | None:
    if not tag.startswith("lg:ns:"):
        return None
    position, _, text = tag[6:].partition(":")
    raw = text.upper() + "=" * (-len(text) % 8)
    return int(position), base64.b32decode(raw).decode()


def _item_digest(namespace: tuple[str, ...], key: str) -> str:
    """The item's identity (namespace and key) as hex: its tag and its text's token are made of it."""
    return hashlib.sha256(json.dumps([list(namespace), key], ensure_ascii=False).encode()).hexdigest()


def _item_tag(namespace: tuple[str, ...], key: str) -> str:
    return f"lg:item:{_item_digest(namespace, key)[:40]}"


def _identity_token(namespace: tuple[str, ...], key: str) -> str:
    """A word only this item's text holds, with digits: the write path never merges two items."""
    return f"lg{int(_item_digest(namespace, key)[:13], 16)}"


def _compare(value: Any, wanted: Any) -> bool:
    """InMemoryStore's filter rule: equality, nested objects, and $eq $ne $gt $gte $lt $lte."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_operator(value, op, arg) for op, arg in wanted.items())
        return isinstance(value, dict) and all(_compare(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(wanted)
            and all(_compare(a, b) for a, b in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _operator(value: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return bool(value == arg)
    if op == "$ne":
        return bool(value != arg)
    comparisons: dict[str, Callable[[float, float], bool]] = {
        "$gt": float.__gt__,
        "$gte": float.__ge__,
        "$lt": float.__lt__,
        "$lte": float.__le__,
    }
    if op not in comparisons:
        raise InvalidInputError("filter", op, "is not an operator: use $eq, $ne, $gt, $gte, $lt or $lte")
    if value is None:
        return False
    return comparisons[op](float(value), float(arg))


def _matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    else:
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    return all(p == "*" or n == p for n, p in pairs)


# --------------------------------------------------------------------------- the store


class MemoryArchiveStore(BaseStore):
    """A LangGraph BaseStore whose items are memories (module docstring: the mapping).

    `client` (MemoryClient) serves `batch`, `aclient` (AsyncMemoryClient) serves `abatch`; with only a
    sync client, `abatch` runs `batch` in a worker thread; with only an async client, `batch` is
    refused (use the async methods). The clients' write judge should be off (`write.judge="off"`, the
    state rule off, their defaults without an LLM key): an LLM merging an item into another memory is
    refused as an error after the fact.

    Exactly one of `user_id` (every namespace is this user's) and `user_position` (the namespace label
    at this position is the user_id). `index`: the value fields whose text is searched (LangGraph's
    path syntax; default: the whole value as JSON); a put's own `index` overrides it, `index=False`
    searches the key only. `max_text_tokens` bounds that text (WordPiece tokens; below the embedder's
    limit and chunking.max_tokens, so an item is one memory). `search_options`: extra keywords for
    `client.search` (e.g. `{"phase2": "always"}`). `ttl`: LangGraph's TTLConfig (its `default_ttl` in
    minutes; sweeping and refresh on read do not apply: expiry archives).
    """

    supports_ttl = True

    def __init__(
        self,
        client: MemoryClient | None = None,
        *,
        aclient: AsyncMemoryClient | None = None,
        user_id: str | None = None,
        user_position: int | None = None,
        index: Sequence[str] | None = None,
        category: str = "semantic",
        importance: float = 0.5,
        max_text_tokens: int = 200,
        search_options: Mapping[str, Any] | None = None,
        ttl: TTLConfig | None = None,
        allow_secrets: bool = False,
    ) -> None:
        if client is None and aclient is None:
            raise InvalidInputError(
                "client", None, "give a MemoryClient (client=) or an AsyncMemoryClient (aclient=)"
            )
        if (user_id is None) == (user_position is None):
            raise InvalidInputError(
                "user_id", user_id, "give exactly one of user_id (a fixed user) and user_position"
            )
        if user_position is not None and (
            not isinstance(user_position, int) or isinstance(user_position, bool) or user_position < 0
        ):
            raise InvalidInputError("user_position", user_position, "must be an integer >= 0")
        if not isinstance(max_text_tokens, int) or max_text_tokens < 8:
            raise InvalidInputError("max_text_tokens", max_text_tokens, "must be an integer >= 8")
        options = dict(search_options or {})
        for name in ("filters", "limit", "archived_limit"):
            if name in options:
                raise InvalidInputError(f"search_options.{name}", options[name], "is set by the store")
        self.client, self.aclient = client, aclient
        self.user_id = None if user_id is None else validation.user(user_id)
        self.user_position = user_position
        self.index: list[tuple[str, Any]] | None = (
            None if index is None else [(p, tokenize_path(p)) for p in index]
        )
        self.category, self.importance = category, importance
        self.max_text_tokens = max_text_tokens
        self.search_options = options
        self.ttl_config = ttl
        self.allow_secrets = allow_secrets

    # -- typed gets: the same calls as BaseStore's, whose items carry their tier (search's are StoredSearchItem)

    def get(
        self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None
    ) -> StoredItem | None:
        return cast(StoredItem | None, super().get(namespace, key, refresh_ttl=refresh_ttl))

    async def aget(
        self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None
    ) -> StoredItem | None:
        return cast(StoredItem | None, await super().aget(namespace, key, refresh_ttl=refresh_ttl))

    # -- batch

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        if self.client is None:
            raise InvalidInputError(
                "client",
                None,
                "this store has only an async client: use its async methods (aget, asearch, ...)",
            )
        client = self.client
        n = len(ops := list(ops))
        return [_drive(client, steps) for steps in self._plan(ops)][:n]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        if self.aclient is None:
            return await asyncio.to_thread(self.batch, list(ops))
        n = len(ops := list(ops))
        return [await _adrive(self.aclient, steps) for steps in self._plan(ops)][:n]

    def _plan(self, ops: Iterable[Op]) -> list[Steps]:
        """InMemoryStore's batch order: reads see the store as it was before the batch's puts, which run
        last, one per (namespace, key) (the last wins). Every put is checked before anything runs; a
        read is checked when it runs, before any put."""
        ops = list(ops)
        reads: list[Steps] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        slots: list[int | None] = []
        for op in ops:
            validate_op_namespace(op)
            if isinstance(op, GetOp):
                reads.append(self._get(op))
            elif isinstance(op, SearchOp):
                reads.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                reads.append(self._list_namespaces(op))
            elif isinstance(op, PutOp):
                self._check_put(op)
                puts[(tuple(op.namespace), op.key)] = op
                slots.append(None)
                continue
            else:
                raise InvalidInputError("op", op, "is not a GetOp, PutOp, SearchOp or ListNamespacesOp")
            slots.append(len(reads) - 1)
        return self._ordered(slots, reads, list(puts.values()))

    def _check_put(self, op: PutOp) -> None:
        """What a put would be refused for, before any op of the batch runs."""
        self._user(tuple(op.namespace))
        if "*" in op.namespace:
            raise InvalidNamespaceError(
                f"namespace {tuple(op.namespace)!r}: '*' matches labels, it is not one"
            )
        self._label_tags(op.namespace)
        self._ttl_days(op.ttl)
        if op.value is not None and not isinstance(op.value, Mapping):
            raise InvalidInputError("value", op.value, "must be a mapping (a dict) or None to delete")

    def _ordered(self, slots: list[int | None], reads: list[Steps], puts: list[PutOp]) -> list[Steps]:
        """One step list per op, in the ops' order (a put's result is None), then the puts' writes."""

        def none() -> Steps:
            return None
            yield  # a generator that returns at once

        def write(op: PutOp) -> Steps:
            yield from self._put(op)
            return None

        return [reads[i] if i is not None else none() for i in slots] + [write(op) for op in puts]

    # -- the mapping

    def _user(self, namespace: tuple[str, ...]) -> str:
        if self.user_id is not None:
            return self.user_id
        position = self.user_position or 0
        if len(namespace) <= position or namespace[position] == "*":
            raise InvalidNamespaceError(
                f"namespace {namespace!r} does not name a user: this store reads the user_id from the "
                f"label at position {position}, so every namespace, prefix and listing must give it"
            )
        return validation.user(namespace[position])

    def _label_tags(self, namespace: Sequence[str]) -> list[str]:
        tags = []
        for position, label in enumerate(namespace):
            if position == self.user_position or label == "*":
                continue
            if len(label.encode()) > MAX_LABEL_BYTES:
                raise InvalidInputError(
                    "namespace",
                    label,
                    f"a namespace label is at most {MAX_LABEL_BYTES} bytes in UTF-8 in this store",
                )
            tags.append(_label_tag(position, label))
        return tags

    def _namespace_of(self, record: MemoryRecord) -> tuple[str, ...]:
        """An item's namespace from its tags: an archived record has no metadata, but keeps its tags."""
        labels = dict(p for p in map(_parse_label_tag, record.tags) if p is not None)
        if self.user_position is not None:
            labels[self.user_position] = record.user_id
        return tuple(labels[i] for i in range(max(labels) + 1)) if labels else ()

    def _text(self, op: PutOp, value: Mapping[str, Any]) -> str:
        if op.index is False:
            texts = [op.key]
        else:
            paths: list[tuple[str, Any]] = (
                [(p, tokenize_path(p)) for p in op.index] if op.index else self.index or [("$", "$")]
            )
            texts = [t for _, path in paths for t in get_text_at_path(value, path)]
        text = "\n".join(t for t in texts if t.strip()) or op.key
        spans = token_spans(text)
        if len(spans) > self.max_text_tokens:
            text = text[: spans[self.max_text_tokens - 1][1]]
        return f"{text}\n[{_identity_token(tuple(op.namespace), op.key)}]"

    def _ttl_days(self, ttl: float | None) -> int | None:
        if ttl is None:
            return None
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0 or math.isinf(ttl):
            raise InvalidInputError("ttl", ttl, "must be a positive number of minutes, or None")
        return max(1, math.ceil(ttl / MINUTES_PER_DAY))

    # -- reading

    def _versions(self, user: str, namespace: tuple[str, ...], key: str) -> Steps:
        """The item's records, the live one first (newest first): several only after a race of two
        first puts, or when a memory outside the store superseded it."""
        tag = [_item_tag(namespace, key)]
        page = yield from _call("list", user, tags=tag, limit=PAGE)
        found = list(page.items)
        if not found:
            page = yield from _call("list", user, tags=tag, limit=PAGE, include_superseded=True)
            found = list(page.items)
        return found

    def _meta(self, user: str, record: MemoryRecord) -> Steps:
        """The item's langgraph metadata: the hot row's, or the archived original's (an expansion)."""
        if record.tier == "hot":
            meta = record.metadata.get(META_KEY)
        else:
            assert record.archive_id is not None
            expansion = yield from _call("expand", user, record.archive_id)
            meta = expansion.original.metadata.get(META_KEY)
        if not isinstance(meta, dict):
            raise MemoryArchiveError(f"memory {record.id} has the store's tags but no {META_KEY!r} metadata")
        return meta

    def _item(
        self,
        record: MemoryRecord,
        meta: dict[str, Any],
        cls: type[StoredItem | StoredSearchItem],
        **extra: Any,
    ) -> Any:
        return cls(
            tier=record.tier,
            memory_id=record.id,
            archive_id=record.archive_id,
            namespace=tuple(meta["namespace"]),
            key=meta["key"],
            value=meta["value"],
            created_at=datetime.fromisoformat(meta["created_at"]),
            updated_at=record.updated_at,
            **extra,
        )

    def _get(self, op: GetOp) -> Steps:
        user = self._user(op.namespace)
        versions = yield from self._versions(user, tuple(op.namespace), op.key)
        if not versions:
            return None
        meta = yield from self._meta(user, versions[0])
        return self._item(versions[0], meta, StoredItem)

    def _search(self, op: SearchOp) -> Steps:
        user = self._user(op.namespace_prefix)
        tags = [STORE_TAG, *self._label_tags(op.namespace_prefix)]
        if op.limit < 0 or op.offset < 0:
            raise InvalidInputError("limit", (op.limit, op.offset), "limit and offset must be >= 0")
        wanted = op.offset + op.limit
        out: list[StoredSearchItem] = []
        skipped = 0

        def take(record: MemoryRecord, meta: dict[str, Any] | None, score: float | None) -> Steps:
            """Add the record if it passes the filter; False when the page is full."""
            nonlocal skipped
            if meta is None and not op.filter and skipped < op.offset:
                skipped += 1  # skipped unread: an archived one is not expanded for nothing
                return True
            meta = meta or (yield from self._meta(user, record))
            if tuple(meta["namespace"])[: len(op.namespace_prefix)] != tuple(op.namespace_prefix):
                return True
            if op.filter and not all(_compare(meta["value"].get(k), v) for k, v in op.filter.items()):
                return True
            if skipped < op.offset:
                skipped += 1
                return True
            out.append(self._item(record, meta, StoredSearchItem, score=score))
            return len(out) < op.limit

        if op.limit == 0:
            return out
        if op.query:
            # Hits come ranked; with a filter, more candidates than the page (the filter runs on values).
            n = min(PAGE, wanted * (4 if op.filter else 1))
            result = yield from _call(
                "search",
                user,
                op.query,
                filters=SearchFilters(required_tags=tags),
                limit=n,
                archived_limit=n,
                **self.search_options,
            )
            seen: set[uuid.UUID] = set()
            for hit in result.hits:
                memory_id = hit.provenance.memory_id
                if memory_id in seen:
                    continue
                seen.add(memory_id)
                record = yield from _call("get", user, hit.id)
                if record is None:  # forgotten meanwhile
                    continue
                more = yield from take(record, None, float(hit.scores.final))
                if not more:
                    break
            return out
        cursor = None
        while True:
            page = yield from _call("list", user, tags=tags, limit=PAGE, cursor=cursor)
            for record in page.items:
                more = yield from take(record, None, None)
                if not more:
                    return out
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    def _list_namespaces(self, op: ListNamespacesOp) -> Steps:
        conditions = tuple(op.match_conditions or ())
        prefixes = [c.path for c in conditions if c.match_type == "prefix"]
        if self.user_id is not None:
            user = self.user_id
        elif prefixes:
            user = self._user(tuple(prefixes[0]))
        else:
            user = self._user(())  # refused: which user's namespaces?
        tags = [STORE_TAG, *(t for p in prefixes for t in self._label_tags(tuple(p)))]
        namespaces: set[tuple[str, ...]] = set()
        cursor = None
        while True:
            page = yield from _call("list", user, tags=tags, limit=PAGE, cursor=cursor)
            namespaces.update(self._namespace_of(r) for r in page.items)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        chosen = [ns for ns in namespaces if all(_matches(c, ns) for c in conditions)]
        if op.max_depth is not None:
            chosen = list({ns[: op.max_depth] for ns in chosen})
        return sorted(chosen)[op.offset : op.offset + op.limit]

    # -- writing

    def _put(self, op: PutOp) -> Steps:
        namespace, key = tuple(op.namespace), op.key
        user = self._user(namespace)
        versions = yield from self._versions(user, namespace, key)
        if op.value is None:
            for record in versions:  # the live one and any stray first version; forget takes the chain
                yield from _call("forget", user, record.id)
            return None
        value = dict(op.value)
        text = self._text(op, value)
        ttl_days = self._ttl_days(op.ttl)
        now = datetime.now(UTC)
        live = versions[0] if versions else None
        if live is not None and live.tier == "archived":
            yield from _call("restore", user, original_id=live.id)
            live = yield from _call("get", user, live.id)
        old_meta = None if live is None else live.metadata.get(META_KEY)
        created = old_meta["created_at"] if isinstance(old_meta, dict) else now.isoformat()
        meta = {META_KEY: {"namespace": list(namespace), "key": key, "value": value, "created_at": created}}
        tags = [STORE_TAG, _item_tag(namespace, key), *self._label_tags(namespace)]
        if live is not None and live.content == normalize_text(text):
            if old_meta != meta[META_KEY]:
                yield from _call("update", user, live.id, metadata=meta)
            if ttl_days is not None:  # the same text again renews the expiry
                yield from _call("add", user, text, ttl_days=ttl_days, tags=tags, metadata=meta)
            return None
        added = yield from _call(
            "add",
            user,
            text,
            category=self.category,
            importance=self.importance,
            tags=tags,
            metadata=meta,
            ttl_days=ttl_days,
            supersedes=None if live is None else live.id,
            allow_secrets=self.allow_secrets,
        )
        expected: Literal["created", "superseded"] = "created" if live is None else "superseded"
        if added.outcome != expected or (live is not None and added.previous_id != live.id):
            raise MemoryArchiveError(
                f"the write path {added.outcome} item {key!r} of namespace {namespace!r} into memory "
                f"{added.previous_id} ({added.reason}): turn the client's write judge off (write.judge='off', "
                "write.state_rule=false) for a store"
            )
        return None
