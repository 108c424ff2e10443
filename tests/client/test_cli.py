"""The command line against a real database: migrate, stats, archive, restore, pause; its errors and
the actor it records."""

from __future__ import annotations

import getpass
import json
import logging
import socket
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from memory_lib import MemoryClient, Settings, errors
from memory_lib.cli import main
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.db import connect
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.factories import make_memories
from testing.rows import one


@pytest.fixture
def env(cli_env):
    return cli_env


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_archive_and_restore_from_the_shell(env, capsys):
    conn = connect(env)
    # Old enough for the real clock's "now": the CLI archives as of today.
    insert_memories(
        conn,
        make_memories(
            12,
            dim=TEST_DIM,
            age_days=400,
            embedding_model=HashingEmbedder(TEST_DIM).model,
            now=__import__("datetime").datetime.now(__import__("datetime").UTC),
        ),
        actor="test",
    )
    assert main(["migrate"]) == 0 and _json(capsys) == {"applied": []}
    assert main(["stats"]) == 0
    assert _json(capsys)["eligible"] == {"stale_low_importance": 12}
    assert main(["archive", "--limit", "5"]) == 0
    out = _json(capsys)
    assert {k: out[k] for k in ("claimed", "archived", "failed", "gate_passed", "ok", "problem")} == {
        "claimed": 5,
        "archived": 5,
        "failed": 0,
        "gate_passed": True,
        "ok": True,
        "problem": None,
    }
    assert (out["stalled"], out["why"]) == (False, None)
    assert main(["restore", "--all", "--user-id", "alice"]) == 0
    restored = _json(capsys)
    assert restored["restored"] == restored["requested"] > 0
    counts = conn.execute(
        "SELECT (SELECT count(*) FROM memories) h, (SELECT count(*) FROM archived_memories) a"
    ).fetchone()
    assert counts is not None
    assert counts["h"] + counts["a"] == 12 and counts["a"] == 5 - restored["restored"]


def test_archive_until_drained_runs_batches_until_one_is_not_full(env, monkeypatch, capsys):
    """A drain: batch after batch, each with its own key and JSON line, until a batch claims less than a
    full batch; every eligible memory ends archived, once. A fixed --batch-key is refused first."""
    conn = connect(env)
    now = __import__("datetime").datetime.now(__import__("datetime").UTC)
    memories = make_memories(
        12, dim=TEST_DIM, age_days=400, embedding_model=HashingEmbedder(TEST_DIM).model, now=now
    )
    insert_memories(conn, memories, actor="test")
    monkeypatch.setenv("MEMORY_ARCHIVE_ARCHIVAL__BATCH_SIZE", "5")
    assert main(["archive", "--until-drained", "--batch-key", "fixed"]) == 2
    err = capsys.readouterr().err
    assert "--batch-key 'fixed'" in err and "--until-drained" in err
    assert one(conn.execute("SELECT count(*) AS n FROM archival_batches"))["n"] == 0  # nothing written
    assert main(["archive", "--until-drained"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [(r["claimed"], r["archived"], r["ok"]) for r in lines] == [
        (5, 5, True),
        (5, 5, True),
        (2, 2, True),
    ]
    assert len({r["batch_key"] for r in lines}) == 3
    counts = conn.execute(
        "SELECT (SELECT count(*) FROM memories) h, (SELECT count(DISTINCT original_id) FROM archived_memories) a"
    ).fetchone()
    assert counts is not None
    assert (counts["h"], counts["a"]) == (0, 12)


def test_bad_settings_exit_with_a_message(env, monkeypatch, capsys):
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDING_DIM", "999")
    assert main(["stats"]) == 2
    assert "created with embedding_dim=64, settings have embedding.dim=999" in capsys.readouterr().err


def _archived(conn, n: int, capsys, *, seed: int = 0) -> None:
    """n old memories (alice and bob in turn), archived by `memory-archive archive`."""
    memories = make_memories(n, dim=TEST_DIM, age_days=400, now=datetime.now(UTC), seed=seed)
    insert_memories(conn, memories, actor="test")
    assert main(["archive", "--limit", str(n)]) == 0
    assert _json(capsys)["archived"] == n


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_database_names_the_setting_host_port_and_dbname(env, monkeypatch, capsys):
    port = _closed_port()
    url = f"postgresql://archiver:s3cret-pw@127.0.0.1:{port}/memdb?connect_timeout=2"
    monkeypatch.setenv("DATABASE_URL", url)
    where = f"DATABASE_URL (host=127.0.0.1 port={port} dbname=memdb)"
    for command in (["stats"], ["migrate"], ["pause", "show"]):
        assert main(command) == 4, command
        err = capsys.readouterr().err
        assert f"cannot reach the database of {where}: " in err, err
        assert "s3cret-pw" not in err and len(err.strip().splitlines()) == 1
    with pytest.raises(errors.DatabaseConnectionError) as info:
        MemoryClient.from_settings(Settings.from_env())
    assert (info.value.setting, info.value.refused) == ("DATABASE_URL", False)
    assert info.value.target == {"host": "127.0.0.1", "port": str(port), "dbname": "memdb"}
    assert isinstance(info.value, psycopg.OperationalError)  # what a failed connection raised before
    assert "s3cret-pw" not in str(info.value) and where in str(info.value)


def test_a_database_that_refuses_the_settings_names_them(env, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", make_conninfo(env, dbname="no_such_db"))
    assert main(["stats"]) == 2
    err = capsys.readouterr().err
    assert (
        "the database of DATABASE_URL (host=" in err and "dbname=no_such_db) refused these settings: " in err
    )
    assert 'database "no_such_db" does not exist' in err


def test_restore_names_an_archive_id_given_as_an_original_id_and_takes_it_as_archive_id(env, capsys):
    conn = connect(env)
    _archived(conn, 4, capsys)
    arch = conn.execute(
        "SELECT id, original_id, user_id FROM archived_memories WHERE user_id = 'alice' ORDER BY id LIMIT 1"
    ).fetchone()
    assert arch is not None

    def archived() -> int:
        return one(conn.execute("SELECT count(*) AS n FROM archived_memories"))["n"]

    # An archive id (what search and expand return) given as --original-id: said so, with its original.
    assert main(["restore", "--original-id", str(arch["id"])]) == 1
    out = _json(capsys)
    assert (out["requested"], out["restored"], out["not_found"]) == (1, 0, 1)
    assert out["errors"] == [
        f"original_id={arch['id']}: that is an archive id (what search and expand return), not an "
        f"original_id; its original_id is {arch['original_id']}"
    ]
    assert archived() == 4
    # Of another user: not found for that user, and never "every archive of bob".
    assert main(["restore", "--user-id", "bob", "--archive-id", str(arch["id"])]) == 1
    out = _json(capsys)
    assert (out["restored"], out["not_found"]) == (0, 1)
    assert out["errors"] == [
        f"archive_id={arch['id']}: no archived memory has this archive id for user_id='bob' "
        "(restored, or never archived)"
    ]
    assert archived() == 4
    # --archive-id restores it.
    assert main(["restore", "--archive-id", str(arch["id"])]) == 0
    out = _json(capsys)
    assert (out["requested"], out["restored"], out["not_found"], out["errors"]) == (1, 1, 0, [])
    assert archived() == 3
    hot = conn.execute("SELECT user_id FROM memories WHERE id = %s", (arch["original_id"],)).fetchone()
    assert hot == {"user_id": "alice"}
    # A memory's own id given as --archive-id: said so; an unknown id: said so.
    unknown = uuid.uuid4()
    assert main(["restore", "--archive-id", str(arch["original_id"]), "--archive-id", str(unknown)]) == 1
    out = _json(capsys)
    assert (out["requested"], out["restored"], out["not_found"]) == (2, 0, 2)
    assert out["errors"] == [
        f"archive_id={arch['original_id']}: that is a memory's original_id, not an archive id: restore it "
        "by original_id",
        f"archive_id={unknown}: no archived memory has this archive id (restored, or never archived)",
    ]
    assert archived() == 3
    assert main(["restore", "--all", "--archive-id", str(unknown)]) == 2
    assert "--archive-id" in capsys.readouterr().err


def test_pause_set_and_clear_log_at_info(env, capsys, caplog):
    caplog.set_level(logging.DEBUG, logger="memory_lib")
    assert main(["pause", "set", "--reason", "storage migration", "--operator", "ops"]) == 0
    assert main(["pause", "clear", "--reason", "migration done", "--operator", "ops"]) == 0
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "memory_lib.lifecycle.pause"]
    assert logged == [
        ("INFO", "archival paused by cli:ops: storage migration"),
        ("INFO", "archival pause cleared by cli:ops: migration done"),
    ]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_every_command_records_one_actor_cli_and_the_operator(env, capsys):
    """archive, restore --all (and the pause it sets), pause clear, restore --operator: cli:<login> by
    default, cli:<--operator> when given, in memory_events and the pause history alike; a blank
    --operator is refused naming the flag."""
    conn = connect(env)
    by_login = f"cli:{getpass.getuser()}"
    _archived(conn, 4, capsys)
    assert main(["restore", "--all"]) == 0
    assert _json(capsys)["archival_paused"] is True
    assert main(["pause", "show"]) == 0
    assert f"archival paused by {by_login} at " in _json(capsys)["describe"]
    assert main(["pause", "clear", "--reason", "rollback done"]) == 0
    _archived(conn, 2, capsys, seed=1)
    assert main(["restore", "--user-id", "alice", "--operator", "ops"]) == 0
    events = conn.execute(
        "SELECT event_type, actor, count(*) AS n FROM memory_events WHERE actor <> 'test'"
        " GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    assert {(e["event_type"], e["actor"], e["n"]) for e in events} == {
        ("archived", by_login, 6),
        ("restored", by_login, 4),
        ("restored", "cli:ops", 1),
    }
    pauses = conn.execute("SELECT action, actor FROM archival_pause_events ORDER BY id").fetchall()
    assert [(p["action"], p["actor"]) for p in pauses] == [("paused", by_login), ("cleared", by_login)]
    assert main(["pause", "set", "--reason", "outage", "--operator", "\u200b"]) == 2
    assert "invalid --operator '\\u200b'" in capsys.readouterr().err
