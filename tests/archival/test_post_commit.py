"""One post-commit stage (memory_lib.archival.post_commit) for the CLI, a library night and Dagster: the
gate after commit, the tier audit, the stall diagnosis and the retrievability probe, each with its pause.

The probe fails here because search is configured to return no archived hit (retrieval.archived_limit
0): a night's archive rows then cannot be found by their own most specific sentence, whoever runs the night.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from memory_assets.defs.slow_path.retrievability import archive_retrievable
from memory_assets.resources import ObjectStoreResource
from memory_lib.archival import nights, retrievability
from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.post_commit import RETRIEVABILITY_CHECK
from memory_lib.cli import main
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig
from memory_lib.lifecycle import pause
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer
from memory_lib.storage.db import connect
from memory_lib.storage.objectstore import LocalObjectStore
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.dagster_helpers import last_night
from testing.factories import make_memories
from testing.slow_path import SLOW_PATH_DEFS, materialize, materialized, resources

NOT_FINDABLE = "archived memories are not findable, archival paused"


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _archived(conn) -> int:
    return conn.execute("SELECT count(*) AS n FROM archived_memories").fetchone()["n"]


def test_a_cli_archive_pauses_on_a_failed_retrievability_probe(cli_env, monkeypatch, capsys):
    conn = connect(cli_env)
    now = datetime.now(UTC)  # the CLI archives as of now
    memories = make_memories(12, dim=TEST_DIM, age_days=400, now=now)
    insert_memories(conn, memories, actor="test")
    monkeypatch.setenv("MEMORY_ARCHIVE_RETRIEVAL__ARCHIVED_LIMIT", "0")

    assert main(["archive", "--limit", "5"]) == 1  # exit 1: the run failed
    out = _json(capsys)
    key = out["batch_key"]
    # The commit ran (the gates before it passed), then the probe found none of the night's rows.
    assert (out["claimed"], out["archived"], out["gate_passed"], out["ok"]) == (5, 5, True, False)
    kept = retrievability.recorded(conn, key)
    assert kept is not None and kept.sampled == 5 and not kept.passed
    assert out["problem"] == f"{kept.describe()}: {NOT_FINDABLE}"
    state = pause.pause_status(conn)
    assert state.paused and state.batch_key == key and state.details == {"check": RETRIEVABILITY_CHECK}
    assert state.reason == kept.describe() and state.actor is not None and state.actor.startswith("cli:")

    # Paused: the next run claims nothing and says why (exit 3).
    assert main(["archive", "--limit", "5"]) == 3
    assert _json(capsys)["claimed"] == 0 and _archived(conn) == 5

    # The same run with the default retrieval settings finds them: the gate passes, no pause.
    monkeypatch.delenv("MEMORY_ARCHIVE_RETRIEVAL__ARCHIVED_LIMIT")
    pause.clear_pause(conn, reason="test", actor="test")
    assert main(["archive", "--limit", "5"]) == 0
    again = _json(capsys)
    assert (again["archived"], again["ok"], again["problem"]) == (5, True, None)
    found = retrievability.recorded(conn, again["batch_key"])
    assert found is not None and found.passed and found.found == found.sampled == 5
    assert not pause.pause_status(conn).paused


def _night_paused_as_recorded(conn, key: str) -> retrievability.NightRetrievability:
    """The night's probe result kept on its batch, failed, and the pause it set: the same for every caller."""
    kept = retrievability.recorded(conn, key)
    assert kept is not None and kept.sampled > 0 and not kept.passed
    state = pause.pause_status(conn)
    assert state.paused and state.details == {"check": RETRIEVABILITY_CHECK}
    assert (state.reason, state.actor, state.batch_key) == (kept.describe(), nights.ACTOR, key)
    return kept


def test_a_library_night_pauses_on_a_failed_retrievability_probe(conn, history, tmp_path):
    night = last_night()
    services = ArchivalServices(
        summarizer=ExtractiveSummarizer(),
        embedder=HashingEmbedder(TEST_DIM),
        object_store=LocalObjectStore(tmp_path / "objects", "test"),
    )
    report = nights.run_night(
        conn, services, ArchivalCriteria(), night, "UTC", retrieval=RetrievalConfig(archived_limit=0)
    )
    assert report.archived > 0 and report.gate_passed and not report.ok
    kept = _night_paused_as_recorded(conn, nights.batch_key_for(night))
    assert report.retrievability is not None and report.retrievability.describe() == kept.describe()
    assert report.problem == f"{kept.describe()}: {NOT_FINDABLE}"


def test_a_dagster_night_pauses_on_a_failed_retrievability_probe(
    db_url, conn, history, tmp_path, monkeypatch
):
    monkeypatch.setenv("MEMORY_ARCHIVE_RETRIEVAL__ARCHIVED_LIMIT", "0")
    night = last_night()
    store = ObjectStoreResource(kind="local", local_root=str(tmp_path / "objects"), prefix="test")
    result = materialize(resources(db_url, store), night=night, defs=[*SLOW_PATH_DEFS, archive_retrievable])
    meta = materialized(result)["archive_rows"]
    assert meta["archived"] > 0 and meta["retrievable_share"] < 0.9  # the asset archived, then probed
    kept = _night_paused_as_recorded(conn, nights.batch_key_for(night))
    [check] = [e for e in result.get_asset_check_evaluations() if e.check_name == "archive_retrievable"]
    assert not check.passed and check.description.startswith(kept.describe())
