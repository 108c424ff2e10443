"""An MCP server over AsyncMemoryClient: `memory-archive mcp` (docs/how-to/mcp.md).

The tools act for one user, fixed when the server is built (`--user-id`), or, on streamable HTTP with
the SDK's bearer-token auth, the authenticated subject of each request; no tool takes a user id, so a
model can never choose whose memories it reads or erases. Every tool goes through the public client,
whose calls are all scoped to that user (a memory id of another user is simply not found).

Failures a model can correct (a bad argument, an unknown id) come back as MCP tool errors naming the
field and the value; nothing else of the library's internals reaches the model.

Imports the `mcp` extra at module level: only `memory-archive mcp` (and an application that wants
this server) imports this module.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Annotated, Any, Literal, ParamSpec, TypeVar
from urllib.parse import urlsplit

import httpx2  # the mcp SDK's HTTP client
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import Field

from ..client import AsyncMemoryClient
from ..core import validation
from ..core.config import Settings
from ..core.errors import InvalidInputError, MemoryArchiveError, NotFoundError
from ..lifecycle.forget import ForgetPreview, ForgetResult, Leftovers, preview, remaining, retained_tables
from ..llm.embedding import embedder_from_settings
from ..retrieval.types import SearchHit
from ..storage.db import connect, open_ready_database
from ..storage.objectstore import ObjectStore, object_store_from_settings
from ..write import memory_api as api
from ..write.memory_api import MemoryRecord

log = logging.getLogger(__name__)

SERVER_NAME = "memory-archive"
ACTOR = "mcp"  # the actor the audit events of this server's writes name (the CLI passes cli:<operator>)
MAX_LIMIT = 50
MAX_LISTED = 50  # memories a forget dry run lists by name (it counts them all)

INSTRUCTIONS = """Long-term memory of one user, kept in Postgres. Memories are never silently lost:
old, unimportant ones are archived (a summary stays searchable, the exact original is kept in object
storage). Use `search` before answering about the user's past, preferences or earlier work; hits
labelled archived carry a summary only: call `expand` with their archive_id for the exact original.
`add` what is worth remembering. `build_context` packs the relevant memories into a token budget.
`forget` erases for good and is a dry run unless confirm=true: show the user the dry run and confirm
only when they ask for it."""

P = ParamSpec("P")
R = TypeVar("R")

# Input types: pydantic checks them (an error names the field and the value); their descriptions are
# what the model reads in the tool's input schema.
Id = Annotated[str, Field(description="A memory id or an archive id, as search, add or get returned it.")]
Tags = Annotated[list[str] | None, Field(description="Labels, e.g. ['work', 'project-atlas'].")]
# The library's categories (memory_lib.core.models.CATEGORIES; a test keeps them equal).
Category = Annotated[
    Literal["core", "episodic", "semantic", "procedural"],
    Field(
        description="core: identity-level facts (never archived); episodic: events; semantic: facts "
        "and preferences; procedural: how-tos."
    ),
]
Importance = Annotated[float, Field(ge=0.0, le=1.0, description="0 (trivia) to 1 (essential).")]


@dataclass(frozen=True)
class Identity:
    """Whose memories the tools act on: a fixed user, or each request's authenticated subject."""

    user_id: str | None = None  # None: from the bearer token of each request (HTTP with auth)

    def current(self) -> str:
        if self.user_id is not None:
            return self.user_id
        token = get_access_token()
        if token is None or not token.subject:
            raise ToolError("this request carries no authenticated user (a bearer token with a subject)")
        try:
            return validation.user(token.subject)
        except InvalidInputError as exc:
            raise ToolError(f"the authenticated subject is not a usable user id: {exc.reason}") from None


def _tool_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """The library's errors a model can act on become tool errors with their message (field and value,
    or which id was not found); anything else stays a crash, which the SDK reports without details."""

    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except ToolError:
            raise
        except (InvalidInputError, NotFoundError) as exc:
            raise ToolError(str(exc)) from exc
        except MemoryArchiveError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc

    return run


def _uuid(field: str, value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value.strip())
    except (ValueError, AttributeError):
        raise ToolError(
            f"invalid {field}={value!r}: must be a UUID (a memory id or archive id that add, search or get returned)"
        ) from None


def _given(value: Any) -> Any:
    """A tool argument left out (None) as the client's "not given" (None there is a value)."""
    return api.UNSET if value is None else value


def plain(value: Any) -> Any:
    """JSON-ready: ids and times as strings, tuples as lists."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    return value


def hit_json(hit: SearchHit) -> dict[str, Any]:
    """A search hit as the model sees it: which tier, which id to pass on and what kind of id it is."""
    p = hit.provenance
    archived = hit.source == "archived"
    out: dict[str, Any] = {
        "id": hit.id,
        "id_kind": "archive_id" if archived else "memory_id",
        "tier": hit.source,
        "archived": archived,
        "label": hit.label,
        "text": hit.text,
        "memory_id": p.memory_id,
        "archive_id": p.archive_id,
        "created_at": p.created_at,
        "category": p.category,
        "domain": p.domain,
        "tags": p.tags,
        "score": round(hit.scores.final, 4),
    }
    if archived:
        out["archived_at"] = p.archived_at
        out["note"] = "text is a summary: call expand with this archive_id for the exact original"
    if hit.linked_from is not None:
        out["linked_from"] = hit.linked_from
    return plain(out)


def record_json(record: MemoryRecord) -> dict[str, Any]:
    out = {
        "memory_id": record.id,
        "tier": record.tier,
        "archived": record.tier == "archived",
        "content": record.content,
        "summary": record.summary,
        "archive_id": record.archive_id,
        "category": record.category,
        "domain": record.domain,
        "tags": record.tags,
        "metadata": record.metadata,
        "importance": record.importance,
        "pinned": record.pinned,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "archived_at": record.archived_at,
        "superseded_by": record.superseded_by,
        "supersedes": record.supersedes,
        "expires_at": record.expires_at,
    }
    if record.tier == "archived":
        out["note"] = "archived: content is in the backup; call expand with archive_id for the exact original"
    return plain(out)


def leftovers_json(left: Leftovers) -> dict[str, Any]:
    return {
        "rows": {table: n for table, n in sorted(left.rows.items()) if n},
        "unredacted_audit_events": left.unredacted_events,
        "backup_object_versions": len(left.objects),
        "clean": left.clean,
    }


def forget_json(result: ForgetResult) -> dict[str, Any]:
    return plain(
        {
            "erased": True,
            "request_id": result.request_id,
            "memory_ids": result.memory_ids,
            "rows_deleted": {t: n for t, n in result.rows_deleted.items() if n},
            "object_versions_deleted": result.object_versions_deleted,
            "already_forgotten": result.already_forgotten,
        }
    )


class StoredOfUser:
    """What is stored of a user, read on a connection of its own (blocking: run in a worker thread)."""

    def __init__(self, url: str, store: ObjectStore):
        self.url = url
        self.store = store

    def remaining(self, user_id: str) -> Leftovers:
        """forget's own check (memory_lib.lifecycle.forget.remaining): after an erasure, what is left."""
        with connect(self.url) as conn:
            return remaining(conn, self.store, user_id)

    def preview(self, user_id: str, memory_id: uuid.UUID | None) -> ForgetPreview:
        """forget's own dry run (memory_lib.lifecycle.forget.preview): what it would erase now."""
        with connect(self.url) as conn:
            return preview(conn, user_id, memory_id)


def preview_json(seen: ForgetPreview) -> dict[str, Any]:
    by_tier: dict[str, int] = {}
    for item in seen.items:
        by_tier[item.tier] = by_tier.get(item.tier, 0) + 1
    return plain(
        {
            "memories": len(seen.items),
            "by_tier": by_tier,
            "backup_objects": len(seen.backup_refs),
            "already_forgotten": seen.already_forgotten,
            "listed": [
                {
                    "memory_id": i.memory_id,
                    "tier": i.tier,
                    "archive_id": i.archive_id,
                    "text": (i.text or "")[:200],
                }
                for i in seen.items[:MAX_LISTED]
            ],
        }
    )


class MemoryTools:
    """The tools, over one client; `stored` reads what is stored of a user for forget."""

    def __init__(self, client: AsyncMemoryClient, identity: Identity, stored: StoredOfUser):
        self.client = client
        self.identity = identity
        self.stored = stored

    async def add(
        self,
        content: Annotated[str, Field(min_length=1, description="The text to remember, self-contained.")],
        category: Category = "episodic",
        importance: Importance = 0.5,
        tags: Tags = None,
        domain: Annotated[str | None, Field(description="A broad area, e.g. 'work' or 'travel'.")] = None,
        pinned: Annotated[bool, Field(description="True: never archived.")] = False,
        ttl_days: Annotated[
            int | None, Field(ge=0, description="Archive after this many days (0: a pinned fact).")
        ] = None,
        supersedes: Annotated[
            str | None, Field(description="The memory id this new text replaces (it stays in history).")
        ] = None,
    ) -> dict[str, Any]:
        """Remember something about the user. Returns the memory_id and the outcome: created, duplicate
        (the same text was already stored), merged (a restatement of a live memory) or superseded (it
        replaced `supersedes` or an outdated memory; previous_id names it)."""
        user = self.identity.current()
        result = await self.client.add(
            user,
            content,
            category=category,
            importance=importance,
            tags=tags,
            domain=domain,
            pinned=pinned,
            ttl_days=ttl_days,
            supersedes=_uuid("supersedes", supersedes) if supersedes is not None else None,
        )
        return plain(
            {
                "memory_id": result.memory_id,
                "outcome": result.outcome,
                "previous_id": result.previous_id,
                "reason": result.reason,
                "chunk_ids": result.chunk_ids,
                "expires_at": result.expires_at,
            }
        )

    async def search(
        self,
        query: Annotated[str, Field(min_length=1, max_length=validation.MAX_QUERY_CHARS)],
        limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description="Hits at most.")] = 10,
        archived: Annotated[
            Literal["auto", "always", "never"],
            Field(
                description="Search the archive too: auto (when the hot tier has too little), always, never."
            ),
        ] = "auto",
        tags: Annotated[list[str] | None, Field(description="Prefer memories with these tags.")] = None,
    ) -> dict[str, Any]:
        """Find the user's memories relevant to `query`, best first. Each hit has `id` and `id_kind`:
        a hot hit's id is its memory_id (its full text is `text`); an archived hit is labelled
        archived, its `text` is a summary and its id is an archive_id: call `expand` with it for the
        exact original."""
        user = self.identity.current()
        result = await self.client.search(user, query, limit=limit, phase2=archived, tags=tags)
        out: dict[str, Any] = {
            "hits": [hit_json(h) for h in result.hits],
            "archive_searched": result.phase2_reason is not None,
        }
        if result.consolidated:
            out["digests_and_facts"] = [
                plain({"kind": c.kind, "id": c.id, "text": c.text, "score": round(c.score, 4)})
                for c in result.consolidated
            ]
        return out

    async def expand(
        self,
        archive_id: Annotated[
            str,
            Field(
                description="The archive_id of an archived hit (a memory id of an archived memory works too)."
            ),
        ],
    ) -> dict[str, Any]:
        """The exact original text of an archived memory, verified against its backup. Expanding a
        memory often brings it back to the hot tier (`promoted`)."""
        user = self.identity.current()
        given = _uuid("archive_id", archive_id)
        record = await self.client.get(user, given)
        if record is None:
            raise ToolError(f"no memory or archive {given} of this user")
        if record.tier != "archived" or record.archive_id is None:
            raise ToolError(
                f"{given} is a hot memory (memory_id), not archived: its full text is in get or search"
            )
        expansion = await self.client.expand(user, record.archive_id)
        return plain(
            {
                "memory_id": expansion.memory_id,
                "archive_id": expansion.archive_id,
                "given_id_kind": "archive_id" if given == expansion.archive_id else "memory_id",
                "content": expansion.content,
                "promoted": expansion.promoted,
            }
        )

    async def build_context(
        self,
        query: Annotated[str, Field(min_length=1, max_length=validation.MAX_QUERY_CHARS)],
        max_tokens: Annotated[
            int | None, Field(ge=1, le=1_000_000, description="Token budget (default: the server's).")
        ] = None,
        recent_turns: Annotated[
            list[dict[str, str]] | None,
            Field(
                description="The latest conversation turns, [{'role': 'user', 'content': '...'}], oldest first."
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Memories relevant to `query` (and the recent turns, if given) packed into a token budget, as
        one text ready for a prompt; archived memories appear as labelled summaries."""
        user = self.identity.current()
        context = await self.client.build_context(user, query, recent_turns or (), max_tokens=max_tokens)
        return plain(
            {
                "context": context.render(),
                "tokens": context.total_tokens,
                "tokens_by_part": context.tokens_by_part,
                "blocks": len(context.blocks),
                "dropped_for_budget": context.dropped_for_budget,
            }
        )

    async def get(self, memory_id: Id) -> dict[str, Any]:
        """One memory by its memory id or archive id: its text (hot) or summary and archive_id (archived),
        tags, importance, times and its versions (supersedes / superseded_by)."""
        user = self.identity.current()
        given = _uuid("memory_id", memory_id)
        record = await self.client.get(user, given)
        if record is None:
            raise ToolError(f"no memory {given} of this user")
        return record_json(record) | {
            "given_id_kind": "archive_id" if given == record.archive_id else "memory_id"
        }

    async def update(
        self,
        memory_id: Id,
        content: Annotated[
            str | None,
            Field(min_length=1, description="New text: stored as a new version that supersedes this one."),
        ] = None,
        category: Category | None = None,
        importance: Importance | None = None,
        tags: Annotated[list[str] | None, Field(description="Replaces the tags.")] = None,
        pinned: bool | None = None,
    ) -> dict[str, Any]:
        """Change a live hot memory: new `content` makes a new version (memory_id in the result) that
        supersedes it; the other fields change in place. Leave out what stays. An archived memory
        cannot be updated: expand it first (or add a new memory)."""
        user = self.identity.current()
        given = _uuid("memory_id", memory_id)
        result = await self.client.update(
            user,
            given,
            _given(content),
            category=_given(category),
            importance=_given(importance),
            tags=_given(tags),
            pinned=_given(pinned),
        )
        return plain(
            {
                "memory_id": result.memory_id,
                "outcome": result.outcome,
                "previous_id": result.previous_id,
                "changed": result.changed,
            }
        )

    async def delete(self, memory_id: Id) -> dict[str, Any]:
        """Erase one memory now, in every tier and backup, with the earlier versions it superseded (the
        audit log keeps a content-free tombstone). Cannot be undone; `forget` shows a dry run first."""
        user = self.identity.current()
        given = _uuid("memory_id", memory_id)
        if await self.client.get(user, given) is None:
            raise ToolError(f"no memory {given} of this user")
        return forget_json(await self.client.delete(user, given))

    async def forget(
        self,
        memory_id: Annotated[
            str | None, Field(description="One memory to forget; leave out to forget everything of the user.")
        ] = None,
        confirm: Annotated[
            bool, Field(description="false (default): a dry run that erases nothing; true: erase.")
        ] = False,
    ) -> dict[str, Any]:
        """Right to erasure. Without confirm: a dry run that says what would be erased and writes
        nothing. With confirm=true: erases one memory (and the versions it superseded), or every
        memory of the user, from every tier, table and backup, then reports what is still stored."""
        user = self.identity.current()
        if memory_id is not None:
            return await self._forget_one(user, _uuid("memory_id", memory_id), confirm)
        if not confirm:
            seen = await asyncio.to_thread(self.stored.preview, user, None)
            left = await asyncio.to_thread(self.stored.remaining, user)
            return {
                "dry_run": True,
                "would_erase": {"scope": "every memory of this user", "rows": leftovers_json(left)["rows"]}
                | preview_json(seen),
                "kept_without_content": sorted(retained_tables()),
                "to_erase": "call forget again with confirm=true",
            }
        result = await self.client.forget_user(user)
        left = await asyncio.to_thread(self.stored.remaining, user)
        return forget_json(result) | {"remaining": leftovers_json(left)}

    async def _forget_one(self, user: str, given: uuid.UUID, confirm: bool) -> dict[str, Any]:
        record = await self.client.get(user, given)
        if record is None:
            raise ToolError(f"no memory {given} of this user")
        if not confirm:
            seen = await asyncio.to_thread(self.stored.preview, user, given)
            earlier = [i.memory_id for i in seen.items if i.memory_id != seen.memory_id]
            return plain(
                {
                    "dry_run": True,
                    "would_erase": {"memory_id": seen.memory_id, "earlier_versions": earlier}
                    | preview_json(seen),
                    "to_erase": "call forget again with this memory_id and confirm=true",
                }
            )
        result = await self.client.forget(user, given)
        return forget_json(result) | {"still_found": await self.client.get(user, given) is not None}


# name -> (title, annotations)
_TOOLS: dict[str, tuple[str, ToolAnnotations]] = {
    "add": ("Remember", ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)),
    "search": ("Search memories", ToolAnnotations(read_only_hint=True)),
    "expand": ("Expand an archived memory", ToolAnnotations(read_only_hint=False, destructive_hint=False)),
    "build_context": ("Build a prompt context", ToolAnnotations(read_only_hint=True)),
    "get": ("Get a memory", ToolAnnotations(read_only_hint=True)),
    "update": ("Update a memory", ToolAnnotations(read_only_hint=False, destructive_hint=False)),
    "delete": ("Delete a memory", ToolAnnotations(read_only_hint=False, destructive_hint=True)),
    "forget": ("Forget (right to erasure)", ToolAnnotations(read_only_hint=False, destructive_hint=True)),
}


def create_server(
    client: AsyncMemoryClient,
    *,
    user_id: str | None,
    stored: StoredOfUser,
    auth: AuthSettings | None = None,
    token_verifier: TokenVerifier | None = None,
) -> MCPServer:
    """The MCP server over `client` for `user_id`; or, with `auth` and `token_verifier` (streamable
    HTTP), for each request's authenticated subject (user_id must then be None)."""
    if (auth is None) != (token_verifier is None):
        raise ValueError("auth and token_verifier go together")
    if auth is None:
        identity = Identity(validation.user(user_id))
    elif user_id is not None:
        raise ValueError("with auth, the user is each request's authenticated subject: leave user_id out")
    else:
        identity = Identity(None)
    server = MCPServer(
        SERVER_NAME,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        auth=auth,
        token_verifier=token_verifier,
    )
    tools = MemoryTools(client, identity, stored)
    for name, (title, hints) in _TOOLS.items():
        server.add_tool(_tool_errors(getattr(tools, name)), name=name, title=title, annotations=hints)
    return server


Transport = Literal["stdio", "http"]


@dataclass(frozen=True)
class TokenIntrospection:
    """Bearer-token auth for streamable HTTP through the authorization server's RFC 7662 introspection
    endpoint: an active token's `sub` is the user of that request. `issuer` is advertised to clients
    (OAuth protected-resource metadata); a token whose `aud` is given must name this server's URL."""

    issuer: str
    introspection_url: str
    client_id: str | None = None  # credentials for the introspection endpoint, when it wants them
    client_secret: str | None = None
    required_scopes: tuple[str, ...] = ()

    @classmethod
    def with_client_from_env(
        cls, issuer: str, introspection_url: str, *, required_scopes: Sequence[str] = ()
    ) -> TokenIntrospection:
        """The introspection client's credentials from MEMORY_MCP_AUTH_CLIENT_ID and
        MEMORY_MCP_AUTH_CLIENT_SECRET (never a flag: a command line is visible to every local user)."""
        return cls(
            issuer,
            introspection_url,
            os.environ.get("MEMORY_MCP_AUTH_CLIENT_ID") or None,
            os.environ.get("MEMORY_MCP_AUTH_CLIENT_SECRET") or None,
            tuple(required_scopes),
        )


class IntrospectionVerifier:
    """The SDK's TokenVerifier over RFC 7662 introspection."""

    def __init__(self, config: TokenIntrospection, resource_url: str):
        self.config = config
        self.resource_url = resource_url.rstrip("/")

    async def verify_token(self, token: str) -> AccessToken | None:
        c = self.config
        try:
            async with httpx2.AsyncClient(timeout=10.0) as http:
                if c.client_id:
                    response = await http.post(
                        c.introspection_url, data={"token": token}, auth=(c.client_id, c.client_secret or "")
                    )
                else:
                    response = await http.post(c.introspection_url, data={"token": token})
        except httpx2.HTTPError as exc:
            log.warning("token introspection at %s failed: %s", c.introspection_url, exc)
            return None
        if response.status_code != 200:
            log.warning("token introspection at %s answered %s", c.introspection_url, response.status_code)
            return None
        doc = response.json()
        if not isinstance(doc, dict) or doc.get("active") is not True or not doc.get("sub"):
            return None
        audience = doc.get("aud")
        audiences = (
            [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
        )
        if audiences and self.resource_url not in [str(a).rstrip("/") for a in audiences]:
            return None
        return AccessToken(
            token=token,
            client_id=str(doc.get("client_id") or "unknown"),
            scopes=str(doc.get("scope") or "").split(),
            expires_at=doc.get("exp") if isinstance(doc.get("exp"), int) else None,
            subject=str(doc["sub"]),
            claims={"iss": doc.get("iss") or c.issuer},
        )


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _host_checks(host: str, public_url: str | None) -> TransportSecuritySettings | None:
    """On loopback the SDK accepts loopback Host and Origin headers only (DNS rebinding protection); a
    reverse proxy in front forwards the public name, which `public_url` adds. None: the SDK's default."""
    if public_url is None or host not in _LOOPBACK:
        return None
    public = urlsplit(public_url)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", public.netloc],
        allowed_origins=[
            "http://127.0.0.1:*",
            "http://localhost:*",
            "http://[::1]:*",
            f"{public.scheme}://{public.netloc}",
        ],
    )


async def serve(
    settings: Settings,
    user_id: str | None,
    *,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    introspection: TokenIntrospection | None = None,
    public_url: str | None = None,
    actor: str = ACTOR,
) -> None:
    """Open the configured database, embedder and object store and serve until the client goes away
    (stdio) or the process is stopped (http). With `introspection` (http only) each request's user is
    its bearer token's subject and `user_id` must be None."""
    if introspection is not None and (transport != "http" or user_id is not None):
        raise ValueError("token introspection is for the http transport, without a fixed user_id")
    user = validation.user(user_id) if introspection is None else None  # before anything is opened
    auth: AuthSettings | None = None
    verifier: IntrospectionVerifier | None = None
    if introspection is not None:
        resource = public_url or f"http://{host}:{port}/mcp"
        auth = AuthSettings(
            issuer_url=introspection.issuer,  # pydantic parses the URL
            resource_server_url=resource,
            required_scopes=list(introspection.required_scopes) or None,
            validate_token_resource=False,  # the verifier checks `aud` itself
        )
        verifier = IntrospectionVerifier(introspection, resource)
    db = open_ready_database(settings)
    try:
        store = object_store_from_settings(settings)
        embedder = embedder_from_settings(settings.embedding)
        client = await AsyncMemoryClient.connect(
            db.url, embedder=embedder, object_store=store, settings=settings, actor=actor
        )
        async with client:
            server = create_server(
                client, user_id=user, stored=StoredOfUser(db.url, store), auth=auth, token_verifier=verifier
            )
            if transport == "stdio":
                await server.run_stdio_async()
            else:
                await server.run_streamable_http_async(
                    host=host, port=port, transport_security=_host_checks(host, public_url)
                )
    finally:
        db.close()


def run(settings: Settings, user_id: str | None, **options: Any) -> None:
    asyncio.run(serve(settings, user_id, **options))


__all__: Sequence[str] = (
    "create_server",
    "serve",
    "run",
    "MemoryTools",
    "Identity",
    "TokenIntrospection",
    "IntrospectionVerifier",
    "INSTRUCTIONS",
)
