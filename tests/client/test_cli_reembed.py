"""`memory-archive reembed` against a real database: a re-embedding (hashing TEST_DIM -> hashing 96-d)
started, backfilled (partly, then resumed), flipped, searched in the new space, flipped back, aborted or
finished, all from the command line; bad input refused before anything is written."""

from __future__ import annotations

import json

import pytest

from memory_lib.core.errors import EmbeddingMismatchError
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.db import connect
from testing.cli import cli_json, run_cli
from testing.constants import TEST_DIM
from testing.factories import make_client
from testing.rows import one

TARGET = HashingEmbedder(96)
OLD = HashingEmbedder(TEST_DIM)
TEXTS = [
    "Prefers a cortado in the morning and never drinks oat milk.",
    "Jonas is allergic to peanuts; avoid satay when he visits.",
    "The quarterly board meeting moved to the large conference room.",
    "Started training for the Berlin half marathon with three runs a week.",
    "The cat needs her kidney medication twice a day with food.",
    "Sold the old road bike to a neighbour for 300 euros.",
    "Booked a table at Casa Lumi for our anniversary dinner on 14 June.",
]

# Each test changes the schema (columns, the dim); its database is never reused. Every command runs in
# cli_env, the environment of a `memory-archive` command on the test's database.
pytestmark = [pytest.mark.schema_changing, pytest.mark.usefixtures("cli_env")]


@pytest.fixture
def memories(conn, local_store) -> int:
    """alice's and bob's memories, embedded by the hashing embedder of TEST_DIM; returns how many."""
    client = make_client(conn, local_store, embedder=OLD)
    for i, text in enumerate(TEXTS):
        client.add("alice" if i % 2 == 0 else "bob", text)
    return len(TEXTS)


def _setting(conn, key: str) -> str:
    return one(conn.execute("SELECT value FROM memory_archive_settings WHERE key = %s", (key,)))["value"]


def _columns(conn) -> set[str]:
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'memories'::regclass AND attnum > 0 AND NOT attisdropped"
    ).fetchall()
    return {r["attname"] for r in rows}


def _found(conn, store, embedder, user: str, text: str) -> bool:
    hits = make_client(conn, store, embedder=embedder).search(user, text, limit=3)
    first = next(iter(hits), None)
    return first is not None and first.text == text


def test_bad_input_is_refused_naming_the_value_and_writes_nothing(conn, memories, capsys):
    before = _columns(conn)
    _, err = run_cli(capsys, "reembed", "start", "--model", TARGET.model, "--dim", "0", code=2)
    assert "--dim 0" in err, err
    _, err = run_cli(capsys, "reembed", "start", "--model", "hashing-lexical-v1-999", "--dim", "96", code=2)
    assert "--model 'hashing-lexical-v1-999'" in err and "'hashing-lexical-v1-96'" in err, err
    # Any other name is an OpenAI model: without OPENAI_API_KEY (cli_env has none) it cannot be used.
    _, err = run_cli(capsys, "reembed", "start", "--model", "no-such-model", "--dim", "64", code=2)
    assert "--model 'no-such-model'" in err and "OPENAI_API_KEY" in err, err
    _, err = run_cli(capsys, "reembed", "start", "--model", OLD.model, "--dim", str(TEST_DIM), code=2)
    assert f"--model {OLD.model!r}: is already the active space" in err, err
    _, err = run_cli(
        capsys, "reembed", "start", "--model", TARGET.model, "--dim", "96", "--operator", " ", code=2
    )
    assert "--operator" in err, err
    assert one(conn.execute("SELECT count(*) AS n FROM embedding_migrations"))["n"] == 0
    assert _columns(conn) == before
    for step in ("backfill", "flip", "flip-back", "drop-old", "abort"):
        _, err = run_cli(capsys, "reembed", step, code=2)
        assert "no " in err and "re-embedding" in err, (step, err)
    _, err = run_cli(capsys, "reembed", "flip", "--lock-timeout", "soon", code=2)
    assert "'soon'" in err, err
    status = cli_json(capsys, "reembed", "status")
    assert status["open"] is False and status["migration"] is None and status["pending_total"] == 0
    assert status["active_space"] == {"model": OLD.model, "dim": TEST_DIM}


def test_start_backfill_resumed_flip_search_flip_back_abort(conn, memories, local_store, capsys, monkeypatch):
    started = cli_json(
        capsys, "reembed", "start", "--model", TARGET.model, "--dim", "96", "--operator", "ops"
    )
    assert started["open"] is True and started["migration"]["state"] == "running"
    assert started["migration"]["target"] == {"model": TARGET.model, "dim": 96}
    assert started["pending"] == {
        "memories": memories,
        "archived_memories": 0,
        "memory_digests": 0,
        "memory_facts": 0,
    }
    assert started["next"] == "memory-archive reembed backfill"
    assert one(conn.execute("SELECT started_by FROM embedding_migrations"))["started_by"] == "cli:ops"
    assert cli_json(capsys, "reembed", "status") == started

    _, err = run_cli(capsys, "reembed", "flip", code=2)
    assert f"memories: {memories}" in err and "memory-archive reembed backfill" in err, err

    # A bounded run stops after --limit rows (as a killed run stops after its last committed batch) ...
    monkeypatch.setenv("COLUMNS", "200")
    out, err = run_cli(
        capsys, "reembed", "backfill", "--limit", "3", "--batch-size", "2", "--table", "--progress"
    )
    assert "re-embed" in err and "3/3" in err and "rows/s" in err, err
    assert "Re-embedded into _next" in out and "memories" in out
    done = one(conn.execute("SELECT count(*) AS n FROM memories WHERE embedding_model_next IS NOT NULL"))["n"]
    assert done == 3
    # ... and the next run goes on with the rows still pending: no progress with JSON output.
    # Two workers, each on its hash bucket of the row ids (--shard i/n); no progress with JSON output.
    out, err = run_cli(
        capsys, "reembed", "backfill", "--shard", "0/2", "--batch-size", "2", "--json", "--progress"
    )
    assert err == ""
    first = json.loads(out)
    assert first["shard"] == "0/2" and first["pending_total"] == 0  # its own bucket is done
    second = cli_json(capsys, "reembed", "backfill", "--shard", "1/2", "--batch-size", "2")
    assert first["filled"] + second["filled"] == memories - 3
    assert first["filled_by_table"]["memories"] + second["filled_by_table"]["memories"] == memories - 3
    assert second["pending_total"] == 0 and second["model"] == TARGET.model
    assert second["next"] == "memory-archive reembed flip (or abort)"
    _, err = run_cli(capsys, "reembed", "backfill", "--shard", "2/2", code=2)
    assert "--shard '2/2'" in err, err
    assert cli_json(capsys, "reembed", "backfill")["filled"] == 0  # nothing left: a rerun is a no-op

    # A transaction holding a vector table: the flip gives up after --lock-timeout, nothing changed.
    other = connect(conn.info.dsn)
    with other.transaction():
        other.execute("LOCK TABLE memory_facts IN ACCESS SHARE MODE")
        _, err = run_cli(capsys, "reembed", "flip", "--lock-timeout", "200ms", code=4)
    other.close()
    assert "--lock-timeout" in err and "nothing changed" in err, err
    assert cli_json(capsys, "reembed", "status")["migration"]["state"] == "running"

    flipped = cli_json(capsys, "reembed", "flip")
    assert flipped["migration"]["state"] == "flipped" and flipped["active_space"] == {
        "model": TARGET.model,
        "dim": 96,
    }
    assert "MEMORY_ARCHIVE_EMBEDDING_DIM=96" in flipped["next"]
    assert (_setting(conn, "embedding_model"), _setting(conn, "embedding_dim")) == (TARGET.model, "96")
    assert _found(conn, local_store, TARGET, "alice", TEXTS[0])
    with pytest.raises(EmbeddingMismatchError):
        make_client(conn, local_store, embedder=OLD).search("alice", TEXTS[0])
    # The command line's own search, its settings switched to the new space as `next` says.
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDING_DIM", "96")
    hits = cli_json(capsys, "search", "--user-id", "alice", TEXTS[2])["hits"]
    assert hits and hits[0]["text"] == TEXTS[2], hits

    _, err = run_cli(capsys, "reembed", "abort", code=2)  # abort is for a running migration
    assert "is flipped: abort needs it running" in err, err
    back = cli_json(capsys, "reembed", "flip-back")
    assert back["migration"]["state"] == "running" and back["active_space"] == {
        "model": OLD.model,
        "dim": TEST_DIM,
    }
    assert _found(conn, local_store, OLD, "bob", TEXTS[1])
    _, err = run_cli(capsys, "reembed", "drop-old", code=2)  # nothing old to drop before a flip
    assert "is running: drop the old vectors needs it flipped" in err, err

    aborted = cli_json(capsys, "reembed", "abort", "--operator", "ops")
    assert aborted["open"] is False and aborted["migration"]["state"] == "aborted"
    assert "embedding_next" not in _columns(conn) and "embedding_prev" not in _columns(conn)
    assert one(conn.execute("SELECT finished_by FROM embedding_migrations"))["finished_by"] == "cli:ops"
    assert _found(conn, local_store, OLD, "bob", TEXTS[1])


def test_flip_then_drop_old_finishes_and_a_table_on_a_terminal(
    conn, memories, local_store, capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "200")
    out, _ = run_cli(capsys, "reembed", "start", "--model", TARGET.model, "--dim", "96", "--table")
    assert "Rows without a _next vector" in out and "Next: memory-archive reembed backfill" in out, out
    out, err = run_cli(capsys, "reembed", "backfill", "--table")
    assert err == ""  # stderr is not a terminal here and --progress was not given
    assert f"{memories} rows in" in out
    cli_json(capsys, "reembed", "flip")
    # A memory written by a client of the new space meanwhile: the old space stays pending for it
    # unless dual-written; the backfill fills it with the old embedder, so a flip back stays lossless.
    make_client(conn, local_store, embedder=TARGET).add("alice", "Renewed the car insurance in May.")
    assert cli_json(capsys, "reembed", "backfill")["pending_total"] == 0
    finished = cli_json(capsys, "reembed", "drop-old")
    assert finished["open"] is False and finished["migration"]["state"] == "finished"
    assert finished["migration"]["flips"] == 1 and finished["active_space"]["dim"] == 96
    assert "embedding_prev" not in _columns(conn)
    _, err = run_cli(capsys, "reembed", "flip-back", code=2)
    assert "no flipped re-embedding" in err, err
    assert _found(conn, local_store, TARGET, "alice", "Renewed the car insurance in May.")
    out, _ = run_cli(capsys, "reembed", "status", "--table")
    assert "hashing-lexical-v1-96 (96-d)" in out and "finished" in out, out
