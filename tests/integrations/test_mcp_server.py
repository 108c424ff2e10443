"""`memory-archive mcp` end to end: the real command spawned over stdio (and streamable HTTP, with and
without token auth), driven by the MCP SDK's own client, on the test's database with the offline
embedder and summarizer and a local object store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, get_args
from urllib.parse import parse_qs

import pytest

import memory_lib.integrations
from memory_lib import MemoryClient, Settings
from memory_lib.cli import main
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.models import CATEGORIES
from memory_lib.core.rows import Conn
from memory_lib.lifecycle.forget import remaining, user_id_tables
from memory_lib.storage.db import connect
from memory_lib.storage.objectstore import object_store_from_settings
from testing.factories import archive_cleanly

mcp_client = pytest.importorskip("mcp.client")
import httpx2  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Byte-exact round trip through add, archive and expand (text add stores as given: NFKC-stable, single spaces).
ORIGINAL = "Kenji Sato booked a flight to Kyoto on 14 March 2026, seat 12A ☕ — café «Ōsaka», code QX-4417."

Call = Callable[..., Awaitable[dict[str, Any]]]


def _env() -> dict[str, str]:
    """The test's settings (cli_env), and this worktree's code."""
    env = {k: v for k, v in os.environ.items() if k.startswith("MEMORY_ARCHIVE_") or k == "DATABASE_URL"}
    return env | {"PYTHONPATH": str(ROOT)}


def _server(user: str) -> StdioServerParameters:
    """`memory-archive mcp --user-id USER` over stdio."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "memory_lib.cli", "mcp", "--user-id", user, "--operator", "mcp-test"],
        env=_env(),
        cwd=str(ROOT),
    )


@asynccontextmanager
async def _session(user: str) -> AsyncIterator[tuple[Call, Call]]:
    """(call, fail): call a tool and return its structured result, or expect a tool error and return
    its text."""
    async with mcp_client.Client(_server(user), read_timeout_seconds=120) as client:

        async def call(name: str, **arguments: Any) -> dict[str, Any]:
            result = await client.call_tool(name, arguments)
            assert not result.is_error, (name, arguments, result.content)
            assert isinstance(result.structured_content, dict)
            return result.structured_content

        async def fail(name: str, **arguments: Any) -> dict[str, Any]:
            result = await client.call_tool(name, arguments)
            assert result.is_error, (name, arguments, result.structured_content)
            return {"text": " ".join(c.text for c in result.content if c.type == "text")}

        yield call, fail


def _files(objects: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(objects)), p.stat().st_size) for p in objects.rglob("*") if p.is_file())


def _state(conn: Conn, user: str, objects: Path) -> dict[str, Any]:
    """What is stored of `user`: rows per table (audit tables included), the memories, and the backup
    files named by the user's memory ids."""
    rows = {
        t: conn.execute(f"SELECT count(*) AS n FROM {t} WHERE user_id = %s", (user,)).fetchone()
        for t in user_id_tables(conn)
    }
    contents = conn.execute(
        "SELECT id, content, importance_score, metadata, updated_at FROM memories WHERE user_id = %s ORDER BY id",
        (user,),
    ).fetchall()
    ids = {str(r["id"]) for r in conn.execute("SELECT id FROM memories WHERE user_id = %s", (user,))}
    ids |= {
        str(r["original_id"])
        for r in conn.execute("SELECT original_id FROM archived_memories WHERE user_id = %s", (user,))
    }
    files = [f for f in _files(objects) if any(i in f[0] for i in ids)]
    return {"rows": {t: r["n"] for t, r in rows.items() if r}, "memories": contents, "files": files}


@pytest.fixture
def settings(cli_env: str) -> Settings:
    return Settings.from_env()


def test_add_then_find_it_archived_and_expand_it_byte_exact_and_nothing_of_another_user(settings, tmp_path):
    conn = connect(settings.database_url.get_secret_value())
    store = object_store_from_settings(settings)
    with MemoryClient.from_settings(settings) as library:
        bob_hot = library.add("bob", "Bob's locker code is 2291, gym on Elm Street", importance=0.9).memory_id
        bob_old = library.add("bob", "Bob's flight to Kyoto is on 2 May, seat 3C", importance=0.1).memory_id

    async def scenario() -> tuple[uuid.UUID, uuid.UUID]:
        async with _session("alice") as (call, fail):
            added = await call("add", content=ORIGINAL, importance=0.1, tags=["travel"])
            assert added["outcome"] == "created"
            memory_id = uuid.UUID(added["memory_id"])
            events = conn.execute(
                "SELECT actor FROM memory_events WHERE user_id = 'alice' AND memory_id = %s", (memory_id,)
            ).fetchall()
            assert [e["actor"] for e in events] == ["cli:mcp-test"]  # the CLI's one actor rule
            found = await call("search", query="flight to Kyoto seat", archived="never")
            assert [h["memory_id"] for h in found["hits"]] == [str(memory_id)]
            assert (
                found["hits"][0] | {"archived": False, "id_kind": "memory_id", "text": ORIGINAL}
                == found["hits"][0]
            )

            # The archival pipeline moves both users' old memories to the archive.
            report = archive_cleanly(
                conn, store, as_of=datetime.now(UTC), criteria=ArchivalCriteria(min_age_days=0)
            )
            assert report.status.archived == 2

            found = await call("search", query="flight to Kyoto seat", archived="always")
            hit = next(h for h in found["hits"] if h["memory_id"] == str(memory_id))
            archive_id = uuid.UUID(hit["id"])
            assert (hit["archived"], hit["tier"], hit["id_kind"], hit["label"]) == (
                True,
                "archived",
                "archive_id",
                "[archived]",
            )
            assert hit["archive_id"] == str(archive_id) and "expand" in hit["note"]
            assert {h["memory_id"] for h in found["hits"]} == {str(memory_id)}  # never bob's Kyoto flight
            expanded = await call("expand", archive_id=str(archive_id))
            assert expanded["content"] == ORIGINAL
            assert (expanded["memory_id"], expanded["given_id_kind"]) == (str(memory_id), "archive_id")
            record = await call("get", memory_id=str(archive_id))
            assert (record["memory_id"], record["given_id_kind"]) == (str(memory_id), "archive_id")

            # Bob's ids, hot and archived, are not found for alice, by any tool.
            bob_archive = conn.execute(
                "SELECT id FROM archived_memories WHERE user_id = 'bob' AND original_id = %s", (bob_old,)
            ).fetchone()
            assert bob_archive is not None
            before = _state(conn, "bob", tmp_path / "objects")
            for other in (bob_hot, bob_old, bob_archive["id"]):
                for name, extra in (
                    ("get", {}),
                    ("expand", {}),
                    ("update", {"importance": 1.0}),
                    ("delete", {}),
                    ("forget", {"confirm": True}),
                ):
                    key = "archive_id" if name == "expand" else "memory_id"
                    refused = await fail(name, **{key: str(other)}, **extra)
                    assert str(other) in refused["text"] and "no memory" in refused["text"], refused
            seen = await call("search", query="Bob locker code gym Elm Street", archived="always")
            assert all(h["memory_id"] == str(memory_id) for h in seen["hits"])
            context = await call("build_context", query="Bob locker code Kyoto flight")
            assert "2291" not in context["context"] and "3C" not in context["context"]
            assert _state(conn, "bob", tmp_path / "objects") == before
            return memory_id, archive_id

    memory_id, archive_id = asyncio.run(scenario())
    row = conn.execute("SELECT user_id FROM archived_memories WHERE id = %s", (archive_id,)).fetchone()
    assert row is not None and row["user_id"] == "alice"


def test_forget_is_a_dry_run_until_confirmed_and_bad_arguments_are_tool_errors(settings, tmp_path):
    conn = connect(settings.database_url.get_secret_value())
    store = object_store_from_settings(settings)
    objects = tmp_path / "objects"
    with MemoryClient.from_settings(settings) as library:
        library.add("bob", "Bob prefers window seats", importance=0.1)

    async def scenario() -> None:
        async with _session("alice") as (call, fail):
            keep = uuid.UUID(
                (await call("add", content="Alice's dentist is Dr. Okafor, Tuesdays", importance=0.1))[
                    "memory_id"
                ]
            )
            first = uuid.UUID(
                (await call("add", content="Alice runs 5 km on Sundays", importance=0.9))["memory_id"]
            )
            second = await call("update", memory_id=str(first), content="Alice runs 10 km on Sundays")
            assert (second["outcome"], second["previous_id"]) == ("superseded", str(first))
            newest = uuid.UUID(second["memory_id"])
            # Archived: the unimportant memory and the superseded version.
            archive_cleanly(conn, store, as_of=datetime.now(UTC), criteria=ArchivalCriteria(min_age_days=0))
            archived = conn.execute(
                "SELECT original_id FROM archived_memories WHERE user_id = 'alice'"
            ).fetchall()
            assert {r["original_id"] for r in archived} == {keep, first}

            # Arguments the model got wrong: tool errors naming the field and the value.
            for name, arguments, words in (
                ("search", {"query": "runs", "limit": 500}, ("limit", "500")),
                ("get", {"memory_id": "not-a-uuid"}, ("memory_id", "not-a-uuid")),
                ("add", {"content": "x", "importance": 2}, ("importance", "2")),
                ("add", {"content": "x", "category": "gossip"}, ("category", "gossip")),
                ("expand", {"archive_id": str(newest)}, (str(newest), "hot")),
                ("add", {"content": "   "}, ("content", "empty")),  # the library's own check
                (
                    "build_context",
                    {"query": "runs", "recent_turns": [{"speaker": "x"}]},
                    ("recent_turns[0]",),
                ),
            ):
                text = (await fail(name, **arguments))["text"]
                assert all(w in text for w in words), (name, text)

            before = _state(conn, "alice", objects)
            every_file = _files(objects)
            bob_before = _state(conn, "bob", objects)
            one = await call("forget", memory_id=str(newest))
            assert one["dry_run"] is True
            assert one["would_erase"]["memory_id"] == str(newest)
            assert one["would_erase"]["earlier_versions"] == [str(first)]
            listed = {m["memory_id"] for m in one["would_erase"]["listed"]}
            everything = await call("forget")
            assert everything["dry_run"] is True
            assert everything["would_erase"]["rows"]["memories"] == 1
            assert everything["would_erase"]["rows"]["archived_memories"] == 2
            assert everything["would_erase"]["by_tier"] == {"hot": 1, "archived": 2}
            assert everything["would_erase"]["backup_objects"] >= 1
            assert _state(conn, "alice", objects) == before  # a dry run writes nothing
            assert _files(objects) == every_file

            erased = await call("forget", memory_id=str(newest), confirm=True)
            assert set(erased["memory_ids"]) == {str(newest), str(first)} == listed  # what the dry run said
            assert erased["still_found"] is False
            assert "no memory" in (await fail("get", memory_id=str(first)))["text"]
            assert (await call("get", memory_id=str(keep)))["archived"] is True

            erased = await call("forget", confirm=True)
            assert erased["erased"] is True and str(keep) in erased["memory_ids"]
            assert erased["remaining"] == {
                "rows": {},
                "unredacted_audit_events": 0,
                "backup_object_versions": 0,
                "clean": True,
            }
            assert (await call("search", query="dentist runs Sundays", archived="always"))["hits"] == []
            assert _state(conn, "bob", objects) == bob_before

    asyncio.run(scenario())
    assert remaining(conn, store, "alice").clean
    assert not remaining(conn, store, "bob").clean


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _http_server(log: Path, *options: str) -> Iterator[str]:
    """`memory-archive mcp --transport http` as a process of its own; yields its URL once it accepts
    connections, stops it (SIGTERM, then SIGKILL) at the end."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "memory_lib.cli",
        "mcp",
        *options,
        "--transport",
        "http",
        "--port",
        str(port),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            env=os.environ | _env(),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        for _ in range(600):  # until it listens (or exits): at most about a minute
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_over_streamable_http_the_configured_user_adds_and_finds(settings, tmp_path):
    with MemoryClient.from_settings(settings) as library:
        library.add("bob", "Bob keeps bees on the roof", importance=0.9)

    async def scenario(url: str) -> None:
        async with mcp_client.Client(url, read_timeout_seconds=120) as client:
            added = await client.call_tool("add", {"content": "Alice keeps chickens in the garden"})
            assert not added.is_error, added.content
            found = await client.call_tool("search", {"query": "who keeps animals", "archived": "never"})
            assert found.structured_content is not None
            texts = [h["text"] for h in found.structured_content["hits"]]
            assert texts == ["Alice keeps chickens in the garden"]

    with _http_server(tmp_path / "server.log", "--user-id", "alice") as url:
        asyncio.run(scenario(url))


def test_the_command_refuses_a_missing_user_and_auth_flags_that_do_not_fit(cli_env, monkeypatch, capsys):
    cases = [
        (["mcp"], "--user-id is required"),
        (["mcp", "--user-id", " "], "invalid --user-id ' '"),
        (
            ["mcp", "--user-id", "alice", "--auth-server", "https://auth.example.com"],
            "go with --auth-introspection-url",
        ),
        (
            ["mcp", "--auth-introspection-url", "https://a/introspect", "--auth-server", "https://a"],
            "--transport http",
        ),
        (
            ["mcp", "--transport", "http", "--user-id", "alice", "--auth-introspection-url", "https://a/i"],
            "no --user-id",
        ),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("memory-archive: ") and message in err, (args, err)
    monkeypatch.setenv("MEMORY_MCP_USER_ID", "  ")  # the variable is the flag's
    assert main(["mcp"]) == 2 and "invalid --user-id '  '" in capsys.readouterr().err


def test_an_unmigrated_database_is_refused_before_serving(cli_env, empty_database, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", empty_database)
    assert main(["mcp", "--user-id", "alice"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memory-archive: ") and "memory-archive migrate" in err, err


def test_the_category_choices_are_the_librarys():
    from memory_lib.integrations.mcp import Category

    assert set(get_args(get_args(Category)[0])) == set(CATEGORIES)


def test_without_the_mcp_extra_the_command_says_how_to_install_it(cli_env, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")] + ["mcp"]:
        monkeypatch.setitem(sys.modules, name, None)  # `import mcp...` fails as if not installed
    monkeypatch.delitem(sys.modules, "memory_lib.integrations.mcp", raising=False)
    monkeypatch.delattr(memory_lib.integrations, "mcp", raising=False)
    assert main(["mcp", "--user-id", "alice"]) == 2
    assert capsys.readouterr().err.strip() == (
        "memory-archive: the MCP server needs the mcp extra: pip install 'memory-archive[mcp]'"
    )


class _Introspection(BaseHTTPRequestHandler):
    """An authorization server's RFC 7662 introspection endpoint: tok-USER is active for USER."""

    def do_POST(self) -> None:
        form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        token = form.get("token", [""])[0]
        doc: dict[str, Any] = {"active": False}
        if token in ("tok-alice", "tok-bob"):
            doc = {"active": True, "sub": token.removeprefix("tok-"), "client_id": "agent", "scope": "memory"}
        elif token == "tok-unscoped":  # without the scope the server requires
            doc = {"active": True, "sub": "alice", "client_id": "agent", "scope": "profile"}
        elif token == "tok-elsewhere":  # issued for another server
            doc = {
                "active": True,
                "sub": "alice",
                "client_id": "agent",
                "scope": "memory",
                "aud": "https://other/mcp",
            }
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_over_authenticated_http_each_request_acts_for_its_tokens_user_only(settings, tmp_path):
    auth = ThreadingHTTPServer(("127.0.0.1", 0), _Introspection)
    threading.Thread(target=auth.serve_forever, daemon=True).start()
    issuer = f"http://127.0.0.1:{auth.server_address[1]}"
    conn = connect(settings.database_url.get_secret_value())

    def as_user(url: str, token: str) -> Any:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
        return mcp_client.Client(streamable_http_client(url, http_client=http), read_timeout_seconds=120)

    async def scenario(url: str) -> None:
        async with as_user(url, "tok-alice") as alice:
            added = await alice.call_tool("add", {"content": "Alice's bike lock code is 7731"})
            assert not added.is_error, added.content
            alice_id = added.structured_content["memory_id"]
        async with as_user(url, "tok-bob") as bob:
            found = await bob.call_tool("search", {"query": "bike lock code", "archived": "always"})
            assert found.structured_content == {"hits": [], "archive_searched": True}
            refused = await bob.call_tool("get", {"memory_id": alice_id})
            assert refused.is_error and "no memory" in refused.content[0].text
            assert not (await bob.call_tool("add", {"content": "Bob's bike is blue"})).is_error
        async with httpx2.AsyncClient(timeout=60) as http:
            # Behind a reverse proxy: the public name is accepted as Host, any other name refused.
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            for name, refused in (("memory.test", False), ("rebound.test", True)):
                headers = {"Host": name, "Authorization": "Bearer tok-alice"}
                answer = await http.post(url, json=ping, headers=headers)
                assert (answer.status_code == 421) == refused, (name, answer.status_code, answer.text)
            for headers in (
                {},
                {"Authorization": "Bearer tok-nobody"},
                {"Authorization": "Bearer tok-elsewhere"},
            ):
                answer = await http.post(
                    url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=headers
                )
                assert answer.status_code == 401, (headers, answer.text)
            answer = await http.post(url, json=ping, headers={"Authorization": "Bearer tok-unscoped"})
            assert answer.status_code == 403, answer.text
            # A client that supports MCP authorization finds the authorization server from the 401.
            assert "resource_metadata=" in answer.headers["www-authenticate"]
            metadata = await http.get(url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp"))
            assert metadata.json()["authorization_servers"] == [issuer]
            assert metadata.json()["resource"] == "http://memory.test/mcp"

    try:
        with _http_server(
            tmp_path / "server.log",
            "--auth-server",
            issuer,
            "--auth-introspection-url",
            f"{issuer}/introspect",
            "--public-url",
            "http://memory.test/mcp",
            "--auth-scope",
            "memory",
        ) as url:
            asyncio.run(scenario(url))
    finally:
        auth.shutdown()
    rows = conn.execute("SELECT user_id, content FROM memories ORDER BY user_id").fetchall()
    assert [(r["user_id"], r["content"]) for r in rows] == [
        ("alice", "Alice's bike lock code is 7731"),
        ("bob", "Bob's bike is blue"),
    ]
