"""The command line against a real database: migrate, stats, archive, restore."""

from __future__ import annotations

import json

import pytest

from memory_lib.cli import main
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.db import connect
from memory_lib.storage.store import insert_memories
from tests.conftest import TEST_DIM
from tests.support.factories import make_memories


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
    assert conn.execute("SELECT count(*) AS n FROM archival_batches").fetchone()["n"] == 0  # nothing written
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
    assert (counts["h"], counts["a"]) == (0, 12)


def test_bad_settings_exit_with_a_message(env, monkeypatch, capsys):
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDING_DIM", "999")
    assert main(["stats"]) == 2
    assert "created with embedding_dim=64, settings have embedding.dim=999" in capsys.readouterr().err
