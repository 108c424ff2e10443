"""The command line for people, against a real database: tables on a terminal and JSON lines when piped
(or with --json), progress bars only on a terminal, and search, get, forget and export."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import UTC, datetime

import pytest

from memory_lib.storage.migrations import load_migrations
from memory_lib.storage.store import insert_memories
from testing.cli import cli_json, run_cli
from testing.constants import TEST_DIM
from testing.factories import make_memories
from testing.rows import one

# Every command runs in cli_env: the environment of a `memory-archive` command on the test's database.
pytestmark = pytest.mark.usefixtures("cli_env")


# Texts a byte-exact export must give back as stored: accents, emoji, tabs, newlines, edge spaces.
TEXTS = [
    "Café order {i}: a cortado ☕ before 10 am,\n\twith oat milk — never soy.  ",
    'Kenji booked flight QX{i} to Kyoto (seat 12A)\r\nconfirmation: "ok" \\ done',
    "  Budget for the Lisbon offsite {i}: EUR 4\u202f200, approved 2 May 2025 ✓",
]


def _memories(conn, n: int, *, seed: int = 0, age_days: float = 400) -> dict[uuid.UUID, dict]:
    """n memories of alice and bob in turn, with TEXTS; returns them by id."""
    rows = make_memories(n, dim=TEST_DIM, age_days=age_days, now=datetime.now(UTC), seed=seed)
    for i, row in enumerate(rows):
        row["content"] = TEXTS[i % len(TEXTS)].format(i=1000 + i + 100 * seed)
    insert_memories(conn, rows, actor="test")
    return {r["id"]: r for r in rows}


def _counts(conn) -> dict[str, int]:
    tables = ("memories", "archived_memories", "forget_requests", "memory_events", "archival_attempts")
    return {t: one(conn.execute(f"SELECT count(*) AS n FROM {t}"))["n"] for t in tables}


def _archive_alices(conn, capsys, memories: dict[uuid.UUID, dict]) -> dict[uuid.UUID, uuid.UUID]:
    """Archive every memory (`archive`), then restore bob's: alice has only archives. Returns alice's
    original_id -> archive id."""
    assert cli_json(capsys, "archive", "--limit", str(len(memories)))["archived"] == len(memories)
    assert cli_json(capsys, "restore", "--user-id", "bob")["restored"] > 0
    rows = conn.execute("SELECT original_id, id FROM archived_memories WHERE user_id = 'alice'").fetchall()
    return {r["original_id"]: r["id"] for r in rows}


def test_json_when_piped_or_asked_and_a_table_on_a_terminal(conn, capsys, monkeypatch):
    """stdout is not a terminal here: every command prints its JSON line as before, --json the same;
    --table (as a terminal gets) prints tables, on the group or the command; both at once is refused."""
    _memories(conn, 6)
    piped = cli_json(capsys, "stats")
    assert (piped["hot"], piped["archived"], piped["eligible"]) == (6, 0, {"stale_low_importance": 6})
    assert cli_json(capsys, "stats", "--json") == cli_json(capsys, "--json", "stats") == piped
    monkeypatch.setenv("COLUMNS", "200")
    for args in (["--table", "stats"], ["stats", "--table"]):
        out, _ = run_cli(capsys, *args)
        assert "Memories by tier" in out and "Eligible for archival now" in out, out
        assert "stale_low_importance" in out and "Archival paused: no" in out
        with pytest.raises(json.JSONDecodeError):
            json.loads(out.splitlines()[0])
    _, err = run_cli(capsys, "stats", "--json", "--table", code=2)
    assert "--json and --table: choose one" in err


def test_without_rich_the_tables_and_progress_are_plain_text(conn, capsys, monkeypatch):
    """The core install has no rich: the same tables as aligned text and the progress as a plain
    status line (rate and ETA), so the CLI never requires the extra."""
    for name in ("rich", "rich.console", "rich.table", "rich.text", "rich.progress"):
        monkeypatch.setitem(sys.modules, name, None)
    _memories(conn, 6)
    out, _ = run_cli(capsys, "--table", "stats")
    lines = out.splitlines()
    i = lines.index("Memories by tier")
    assert lines[i + 1].split() == ["tier", "memories", "bytes"]
    assert set(lines[i + 2]) == {"-", " "}
    assert lines[i + 3].split()[:2] == ["hot", "6"] and lines[i + 4].split()[:2] == ["archived", "0"]
    monkeypatch.setenv("MEMORY_ARCHIVE_ARCHIVAL__BATCH_SIZE", "4")
    out, err = run_cli(capsys, "archive", "--until-drained", "--table", "--progress")
    assert "Archival batches" in out
    progress = err.strip().splitlines()
    assert progress[-1].startswith("archive: 6/6 100% ") and "memories/s ETA 0s" in progress[-1], err


def test_progress_only_on_a_terminal_never_with_json(conn, capsys, monkeypatch):
    """A drain shows a progress bar on stderr with table output on a terminal (--progress stands in for
    the terminal here); piped, or with --json, stderr stays empty and stdout has only JSON lines."""
    _memories(conn, 10)
    monkeypatch.setenv("MEMORY_ARCHIVE_ARCHIVAL__BATCH_SIZE", "4")
    out, err = run_cli(capsys, "archive", "--limit", "4")
    assert err == "" and [json.loads(x)["archived"] for x in out.splitlines()] == [4]
    out, err = run_cli(capsys, "archive", "--until-drained", "--json", "--progress")
    assert err == "" and [json.loads(x)["archived"] for x in out.splitlines()] == [4, 2]
    out, err = run_cli(capsys, "restore", "--user-id", "alice")
    assert err == "" and json.loads(out)["restored"] == 5
    _memories(conn, 10, seed=1)  # restored ones stay hot: ten new ones to archive
    monkeypatch.setenv("COLUMNS", "200")
    out, err = run_cli(capsys, "archive", "--until-drained", "--table", "--progress")
    assert "archive" in err and "10/10" in err and "100%" in err and "memories/s" in err, err
    assert "Archival batches" in out
    out, err = run_cli(capsys, "restore", "--all", "--table", "--progress")
    assert "restore" in err and "15/15" in err, err
    assert "Restore" in out and "requested" in out
    shipped = len(load_migrations(embedding_dim=TEST_DIM))
    out, err = run_cli(capsys, "migrate", "--table", "--progress")
    assert "migrate" in err and f"{shipped}/{shipped}" in err and "Migrations applied: none" in out, err
    out, err = run_cli(capsys, "unsupersede", "--table", "--progress")
    assert "unsupersede" in err and "0/0" in err, err  # no user has memories the former rule hid
    for args in (["migrate"], ["unsupersede"], ["restore", "--all", "--no-progress", "--table"]):
        assert run_cli(capsys, *args)[1] == ""


def test_search_labels_archived_hits_and_get_names_the_kind_of_id(conn, capsys, monkeypatch):
    memories = _memories(conn, 6)
    archives = _archive_alices(conn, capsys, memories)
    cafe = next(i for i, r in memories.items() if r["user_id"] == "alice" and r["content"].startswith("Café"))
    found = cli_json(capsys, "search", "--user-id", "alice", "cortado oat milk", "--phase2", "always")
    archived = [h for h in found["hits"] if h["tier"] == "archived"]
    assert archived and found["archived_searched"] is True
    hit = next(h for h in archived if h["memory_id"] == str(cafe))
    assert (hit["id"], hit["id_kind"], hit["archive_id"]) == (str(archives[cafe]), "archive_id", hit["id"])
    assert hit["label"] == "[archived]"
    bob = cli_json(
        capsys, "search", "--user-id", "bob", "cortado oat milk", "--phase2", "always", "--limit", "1"
    )
    assert len([h for h in bob["hits"] if h["tier"] == "hot"]) == 1
    assert all(h["memory_id"] not in {str(i) for i in archives} for h in bob["hits"])
    monkeypatch.setenv("COLUMNS", "250")
    out, _ = run_cli(
        capsys, "--table", "search", "--user-id", "alice", "cortado oat milk", "--phase2", "always"
    )
    assert f"{archives[cafe]} (archive id)" in out and "[archived]" in out
    assert "restore --archive-id" in out
    # Too narrow a terminal for the columns: a block per hit, every id whole on its line.
    monkeypatch.setenv("COLUMNS", "70")
    out, _ = run_cli(
        capsys, "--table", "search", "--user-id", "alice", "cortado oat milk", "--phase2", "always"
    )
    assert "-[ 1 ]" in out and f"{archives[cafe]} (archive id)" in out
    assert all(len(line) <= 70 for line in out.splitlines()), out

    # get: by archive id (named as such, with its original), --original from the backup, by memory id.
    got = cli_json(capsys, "get", "--user-id", "alice", str(archives[cafe]))
    assert (got["id"], got["tier"], got["id_kind"], got["content"]) == (
        str(cafe),
        "archived",
        "archive_id",
        None,
    )
    assert got["note"] == f"that is an archive id; its original (memory id) is {cafe}"
    got = cli_json(capsys, "get", "--user-id", "alice", str(cafe), "--original")
    assert (got["id_kind"], got["content_source"]) == ("memory_id", "backup")
    assert got["content"] == memories[cafe]["content"] and "note" not in got
    hot = next(i for i, r in memories.items() if r["user_id"] == "bob")
    got = cli_json(capsys, "get", "--user-id", "bob", str(hot))
    assert (got["tier"], got["content"], got["id_kind"]) == ("hot", memories[hot]["content"], "memory_id")
    # Another user's ids, either kind, are not found for this user.
    for other in (str(hot), str(uuid.uuid4())):
        _, err = run_cli(capsys, "get", "--user-id", "alice", other, code=1)
        assert (
            err == f"memory-archive: --user-id 'alice' has no memory with memory id or archive id {other}\n"
        )
    _, err = run_cli(capsys, "get", "--user-id", "bob", str(archives[cafe]), code=1)
    assert str(archives[cafe]) in err
    # The id search returned restores it; given as --original-id it is named for what it is.
    named = cli_json(capsys, "restore", "--original-id", hit["id"], code=1)
    assert named["errors"][0].startswith(f"original_id={hit['id']}: that is an archive id")
    assert cli_json(capsys, "restore", "--archive-id", hit["id"])["restored"] == 1
    got = cli_json(capsys, "get", "--user-id", "alice", str(cafe))
    assert (got["tier"], got["content"]) == ("hot", memories[cafe]["content"])


def test_forget_is_a_dry_run_until_apply_then_nothing_of_the_user_remains(conn, capsys, monkeypatch):
    memories = _memories(conn, 8)
    archives = _archive_alices(conn, capsys, memories)
    alice = {i for i, r in memories.items() if r["user_id"] == "alice"}
    before = _counts(conn)
    seen = cli_json(capsys, "forget", "--user-id", "alice")
    assert (seen["applied"], seen["would_forget"], seen["by_tier"]) == (False, 4, {"archived": 4})
    assert {m["memory_id"] for m in seen["memories"]} == {str(i) for i in alice}
    assert {m["archive_id"] for m in seen["memories"]} == {str(a) for a in archives.values()}
    monkeypatch.setenv("COLUMNS", "200")
    out, _ = run_cli(capsys, "--table", "forget", "--user-id", "alice")
    assert "Nothing was written: add --apply to erase." in out
    assert _counts(conn) == before  # the dry runs wrote nothing

    # One memory by its archive id: named as such, then erased; bob's memories stay.
    one_id = sorted(alice)[0]
    seen = cli_json(capsys, "forget", "--user-id", "alice", "--memory-id", str(archives[one_id]))
    assert (seen["memory_id"], seen["would_forget"]) == (str(one_id), 1)
    assert seen["note"] == f"that is an archive id; its original (memory id) is {one_id}"
    done = cli_json(capsys, "forget", "--user-id", "alice", "--memory-id", str(one_id), "--apply")
    assert (done["forgotten"], done["memory_ids"], done["remaining"]) == (
        1,
        [str(one_id)],
        {"clean": True, "memories": []},
    )
    _, err = run_cli(capsys, "get", "--user-id", "alice", str(one_id), code=1)

    done = cli_json(capsys, "forget", "--user-id", "alice", "--apply", "--operator", "dpo")
    assert (done["applied"], done["forgotten"], done["already_forgotten"]) == (True, 3, False)
    assert done["remaining"] == {
        "clean": True,
        "rows": {},
        "unredacted_events": 0,
        "objects": [],
        "uncovered_tables": [],
    }
    assert one(conn.execute("SELECT count(*) AS n FROM memories WHERE user_id = 'alice'"))["n"] == 0
    assert one(conn.execute("SELECT count(*) AS n FROM archived_memories WHERE user_id = 'alice'"))["n"] == 0
    assert one(conn.execute("SELECT count(*) AS n FROM memories WHERE user_id = 'bob'"))["n"] == 4
    actors = conn.execute(
        "SELECT DISTINCT actor FROM memory_events WHERE event_type = 'forgotten'"
    ).fetchall()
    assert {a["actor"] for a in actors} == {f"cli:{__import__('getpass').getuser()}", "cli:dpo"}
    again = cli_json(capsys, "forget", "--user-id", "alice")
    assert (again["already_forgotten"], again["would_forget"]) == (True, 0)
    unknown = uuid.uuid4()
    for apply in ([], ["--apply"]):
        _, err = run_cli(capsys, "forget", "--user-id", "bob", "--memory-id", str(unknown), *apply, code=1)
        assert (
            err == f"memory-archive: --user-id 'bob' has no memory with memory id or archive id {unknown}\n"
        )


def test_export_gives_hot_and_archived_originals_byte_exact_and_only_the_users(conn, capsys, tmp_path):
    memories = _memories(conn, 9)
    archives = _archive_alices(conn, capsys, memories)
    mine = _memories(conn, 4, seed=1, age_days=1)  # hot ones of alice too (and bob's)
    alice = {i: r for i, r in {**memories, **mine}.items() if r["user_id"] == "alice"}
    out, err = run_cli(capsys, "export", "--user-id", "alice")
    lines = [json.loads(x) for x in out.splitlines()]
    assert {uuid.UUID(x["id"]) for x in lines} == set(alice) and len(lines) == len(alice)
    assert {x["user_id"] for x in lines} == {"alice"}
    # Times in ISO 8601, as other tools read them.
    assert all(datetime.fromisoformat(x["created_at"]).isoformat() == x["created_at"] for x in lines)
    for x in lines:
        original = alice[uuid.UUID(x["id"])]
        assert x["content"] == original["content"]  # byte-exact, edge spaces, \r\n and all
        archived = uuid.UUID(x["id"]) in archives
        assert (x["tier"], x["content_source"]) == (("archived", "backup") if archived else ("hot", "hot"))
        assert x["metadata"] == original["metadata"]
    assert "exported 7 memories of 'alice' (2 hot, 5 archived originals from their backups)" in err
    target = tmp_path / "alice.jsonl"
    summary = cli_json(capsys, "export", "--user-id", "alice", "--output", str(target))
    assert (summary["exported"], summary["hot"], summary["archived"]) == (7, 2, 5)
    assert sorted(target.read_bytes().decode().splitlines()) == sorted(out.splitlines())
    _, err = run_cli(capsys, "export", "--user-id", "carol")
    assert "exported 0 memories of 'carol'" in err
