"""`memory-archive unsupersede` and memory_lib.write.unsupersede: memories hidden by add's former near-duplicate
rule (a 'superseded' event without a reason) are listed, made live again with an audit event, and never
those superseded on purpose (update), another user's, or one whose text a live memory already holds."""

from __future__ import annotations

import getpass
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from psycopg.types.json import Jsonb

from memory_lib.archival.pipeline import run_batch
from memory_lib.cli import main
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, Settings
from memory_lib.core.errors import InvalidInputError
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.write.unsupersede import find_hidden, unsupersede
from testing.constants import TEST_DIM
from testing.factories import archival_services

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)


@pytest.fixture
def client(conn, local_store):
    return MemoryClient(
        conn, embedder=HashingEmbedder(TEST_DIM), object_store=local_store, settings=Settings(), actor="test"
    )


def _hide(conn, user: str, old: uuid.UUID, new: uuid.UUID) -> None:
    """What add's former rule left: superseded_by set and a 'superseded' event with no reason."""
    assert (
        conn.execute(
            "UPDATE memories SET superseded_by = %s WHERE user_id = %s AND id = %s", (new, user, old)
        ).rowcount
        == 1
    )
    conn.execute(
        """INSERT INTO memory_events (memory_id, user_id, event_type, actor, occurred_at, details)
           VALUES (%s, %s, 'superseded', 'memory_lib.client', %s, %s)""",
        (
            old,
            user,
            NOW,
            Jsonb({"superseded_by": str(new), "similarity": 0.91, "removed": ["3"], "added": ["5"]}),
        ),
    )


def _superseded_by(conn, memory_id: uuid.UUID) -> uuid.UUID | None:
    row = conn.execute(
        """SELECT superseded_by AS s FROM memories WHERE id = %(id)s
           UNION ALL SELECT original_superseded_by FROM archived_memories WHERE original_id = %(id)s""",
        {"id": memory_id},
    ).fetchone()
    return row["s"]


def _events(conn) -> int:
    return conn.execute("SELECT count(*) AS n FROM memory_events").fetchone()["n"]


def _found(client, user: str, query: str, **kw) -> set[uuid.UUID]:
    return {h.provenance.memory_id for h in client.search(user, query, limit=5, now=NOW, **kw)}


def test_unsupersede_lists_then_makes_live_the_memories_the_former_rule_hid(conn, client, local_store):
    # Archived: a superseded memory goes at the next night (as_of before the others were written).
    dentist = client.add("u1", "Dentist appointment with Dr Okafor", importance=0.1, now=OLD).memory_id
    birthday = client.add("u1", "Sister's birthday is on 12 March", now=NOW).memory_id
    _hide(conn, "u1", dentist, birthday)
    services = archival_services(local_store)
    assert run_batch(
        conn, services, ArchivalCriteria(), batch_key="night-1", as_of=OLD + timedelta(days=100), actor="test"
    ).gate_passed
    assert client.get("u1", dentist).tier == "archived" and _superseded_by(conn, dentist) == birthday

    car = client.add("u1", "Parks the car on level 3 of the Ribeira garage", now=NOW).memory_id
    _hide(conn, "u1", car, birthday)
    ferry = client.add("u1", "Takes the 7:40 ferry to Cacilhas", now=NOW).memory_id
    client.update("u1", ferry, "Takes the 8:10 ferry to Cacilhas", now=NOW)  # on purpose: stays superseded
    locker = client.add("u1", "Gym locker is number 42", now=NOW + timedelta(seconds=30)).memory_id
    _hide(conn, "u1", locker, birthday)
    # The same text again, live: the hidden copy stays hidden.
    again = client.add("u1", "Gym locker is number 42", now=NOW + timedelta(minutes=1)).memory_id
    assert again != locker and client.get("u1", again).superseded_by is None
    theirs = client.add("u2", "Parks the car on level 3 of the Ribeira garage", now=NOW).memory_id
    _hide(conn, "u2", theirs, client.add("u2", "Brother's birthday is on 2 July", now=NOW).memory_id)
    assert car not in _found(client, "u1", "car level 3 Ribeira garage", phase2="never")
    assert dentist not in _found(client, "u1", "Dentist appointment Dr Okafor", phase2="always")

    assert [h.memory_id for h in find_hidden(conn, "u1")] == [dentist, car, locker]  # oldest first
    events = _events(conn)
    dry = unsupersede(conn)
    assert not dry.applied and _events(conn) == events and _superseded_by(conn, car) == birthday
    out = dry.to_json()
    assert (out["applied"], out["unsuperseded"], out["would_unsupersede"], out["kept"]) == (False, 0, 3, 1)
    assert out["by_user"]["u1"] == {
        "unsupersede": 2,
        "hot": [str(car)],
        "archived": [str(dentist)],
        "kept": {str(locker): f"kept: same text as {again}"},
    }
    assert out["by_user"]["u2"]["hot"] == [str(theirs)]
    assert set(unsupersede(conn, user_id="u2").to_json()["by_user"]) == {"u2"}

    applied = unsupersede(conn, user_id="u1", apply=True, actor="ops", now=NOW + timedelta(hours=1))
    assert (applied.applied, applied.live_again, applied.kept) == (True, 2, 1)
    assert _superseded_by(conn, car) is None and _superseded_by(conn, dentist) is None
    assert _superseded_by(conn, locker) == birthday  # kept: same text as a live one
    assert _superseded_by(conn, theirs) is not None  # another user's: untouched
    assert client.get("u1", ferry).superseded_by is not None
    assert _events(conn) == events + 2
    expected = {"reason": "unsupersede", "was_superseded_by": str(birthday)}
    [event] = [e for e in client.history("u1", car) if e.event_type == "updated"]
    assert (event.actor, event.details) == ("ops", expected)
    assert client.history("u1", dentist)[-1].details == expected
    assert car in _found(client, "u1", "car level 3 Ribeira garage", phase2="never")
    assert dentist in _found(client, "u1", "Dentist appointment Dr Okafor", phase2="always")
    assert client.get("u1", birthday).supersedes == locker  # the kept one only: the others left the chain

    second = unsupersede(conn, user_id="u1", apply=True)
    assert (second.live_again, second.kept, _events(conn)) == (0, 1, events + 2)
    assert second.to_json()["unsuperseded"] == 0
    with pytest.raises(InvalidInputError) as e:
        unsupersede(conn, user_id=" ")
    assert e.value.field == "user_id"


def test_the_cli_dry_run_by_default_one_user_then_apply(cli_env, conn, client, capsys):
    def run(*args: str) -> dict:
        assert main(["unsupersede", *args]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    keep = client.add("u1", "Badminton on Tuesdays at the Alvalade club", now=NOW).memory_id
    live = client.add("u1", "Pays 84 EUR a month for electricity", now=NOW).memory_id
    _hide(conn, "u1", keep, live)
    code = client.add("u2", "The shed padlock code is 1234", now=NOW).memory_id
    other = client.add("u2", "Brother's birthday is on 2 July", now=NOW).memory_id
    _hide(conn, "u2", code, other)
    copy = client.add("u2", "The shed padlock code is 1234", now=NOW + timedelta(minutes=1)).memory_id
    _hide(conn, "u2", copy, other)  # two hidden copies of one text: the older one comes back

    events = _events(conn)
    only = run("--user-id", "u2")
    assert (only["applied"], only["would_unsupersede"], list(only["by_user"])) == (False, 1, ["u2"])
    assert only["by_user"]["u2"]["hot"] == [str(code)]
    assert only["by_user"]["u2"]["kept"] == {str(copy): f"kept: same text as {code}"}
    assert run()["would_unsupersede"] == 2 and _events(conn) == events  # both users; a dry run writes nothing

    applied = run("--apply", "--user-id", "u2")
    assert (applied["unsuperseded"], applied["kept"], list(applied["by_user"])) == (1, 1, ["u2"])
    assert _superseded_by(conn, code) is None and _superseded_by(conn, keep) == live
    assert run("--apply", "--operator", "ops")["unsuperseded"] == 1 and _superseded_by(conn, keep) is None
    assert run("--apply")["unsuperseded"] == 0 and _events(conn) == events + 2
    # The CLI's one actor rule: cli:<operator>, by default the login name.
    written = conn.execute("SELECT actor FROM memory_events ORDER BY id DESC LIMIT 2").fetchall()
    assert [r["actor"] for r in written] == ["cli:ops", f"cli:{getpass.getuser()}"]
