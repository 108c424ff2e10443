"""The Slow Path library (nights, pause, fidelity, gate, integrity, dry run, restore) against a real embedded Postgres and real object stores (no Dagster)."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, date, datetime, timedelta

import pytest

from memory_lib.archival import archive, dry_run, fidelity, integrity, nights
from memory_lib.archival import gate as gates
from memory_lib.archival.archive import ArchivalServices
from memory_lib.core import models
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.errors import InvalidInputError
from memory_lib.lifecycle import eligibility, pause, restore
from memory_lib.storage.db import connect
from testing.constants import TEST_DIM
from testing.dagster_helpers import END, last_night, load_history, table_fingerprint
from testing.factories import archival_services
from testing.rows import one

CRITERIA = ArchivalCriteria()


@pytest.fixture
def services(local_store):
    return archival_services(local_store)


# --------------------------------------------------------------------------- nights


def test_night_as_of_is_the_end_of_the_night_in_its_zone():
    assert nights.night_as_of(date(2026, 3, 14), "UTC") == datetime(2026, 3, 15, tzinfo=UTC)
    # Lisbon is UTC+1 in summer: midnight there is 23:00 UTC the day before.
    assert nights.night_as_of(date(2026, 7, 1), "Europe/Lisbon") == datetime(2026, 7, 1, 23, tzinfo=UTC)
    # The night before the spring change ends at 00:00 standard time (UTC+0 in Lisbon).
    assert nights.night_as_of(date(2026, 3, 28), "Europe/Lisbon") == datetime(2026, 3, 29, tzinfo=UTC)
    assert nights.batch_key_for(date(2026, 3, 14)) == "night-2026-03-14"


@pytest.mark.parametrize("bad", ["2026-13-01", "yesterday", ""])
def test_bad_partition_key_names_the_field(bad):
    with pytest.raises(InvalidInputError, match="partition_key"):
        nights.parse_night(bad)


def test_unknown_zone_is_refused():
    with pytest.raises(InvalidInputError, match="timezone"):
        nights.night_as_of(date(2026, 1, 1), "Mars/Olympus")


# --------------------------------------------------------------------------- pause


def test_pause_set_clear_and_history(conn):
    assert not pause.pause_status(conn).paused
    state = pause.set_pause(conn, reason="gate failed", actor="check", batch_key="night-2026-01-01")
    assert state.paused and state.reason == "gate failed" and state.batch_key == "night-2026-01-01"
    # A second pause keeps the first cause and adds no event.
    again = pause.set_pause(conn, reason="another", actor="someone")
    assert again.reason == "gate failed"
    cleared = pause.clear_pause(conn, reason="LLM provider fixed", actor="ops")
    assert not cleared.paused
    history = pause.pause_history(conn)
    assert [(h["action"], h["actor"]) for h in history] == [("cleared", "ops"), ("paused", "check")]
    assert not pause.clear_pause(conn, reason="noop", actor="ops").paused
    assert len(pause.pause_history(conn)) == 2


@pytest.mark.parametrize(
    "field,kwargs", [("reason", {"reason": " ", "actor": "a"}), ("actor", {"reason": "r", "actor": ""})]
)
def test_pause_needs_a_reason_and_an_actor(conn, field, kwargs):
    with pytest.raises(InvalidInputError, match=field):
        pause.set_pause(conn, **kwargs)
    assert not pause.pause_status(conn).paused


def test_pause_history_is_append_only(conn):
    pause.set_pause(conn, reason="r", actor="a")
    with pytest.raises(Exception, match="append-only"):
        conn.execute("DELETE FROM archival_pause_events")


def test_paused_night_claims_nothing_and_records_why(conn, services):
    load_history(conn, TEST_DIM)
    pause.set_pause(conn, reason="error rate 9%", actor="check")
    night = last_night()
    report = nights.run_night(conn, services, CRITERIA, night, "UTC")
    assert report.outcomes[0].skipped and "error rate 9%" in report.outcomes[0].skipped
    assert one(conn.execute("SELECT count(*) AS n FROM archival_attempts"))["n"] == 0
    skips = pause.skipped_nights(conn, nights.batch_key_for(night))
    assert [s["step"] for s in skips] == ["claim"] and "error rate 9%" in skips[0]["reason"]


# --------------------------------------------------------------------------- a whole night


def test_run_night_archives_and_is_idempotent(conn, services):
    load_history(conn, TEST_DIM)
    night = last_night()
    before = one(conn.execute("SELECT count(*) AS n FROM memories"))["n"]
    report = nights.run_night(conn, services, CRITERIA, night, "UTC")
    assert report.integrity is not None
    assert report.fidelity is not None and report.gate is not None
    assert report.fidelity.passed and report.gate.passed and report.integrity.passed
    assert report.archived > 0 and report.archived == report.integrity.archived
    after = one(conn.execute("SELECT count(*) AS n FROM memories"))["n"]
    assert before - after == report.archived
    # Every claimed memory was older than min_age_days at the end of the night.
    cutoff = nights.night_as_of(night, "UTC") - timedelta(days=CRITERIA.min_age_days)
    assert (
        one(
            conn.execute(
                "SELECT count(*) AS n FROM archived_memories WHERE original_created_at > %s", (cutoff,)
            )
        )["n"]
        == 0
    )
    again = nights.run_night(conn, services, CRITERIA, night, "UTC")
    assert again.outcomes[0].claim is not None
    assert again.archived == 0 and not again.outcomes[0].claim.newly_claimed
    assert one(conn.execute("SELECT count(*) AS n FROM memories"))["n"] == after


def test_concurrent_nights_never_share_a_memory(databases, services):
    url = databases.new()
    with connect(url) as c:
        load_history(c, TEST_DIM)
    criteria = ArchivalCriteria(batch_size=40)
    batch_nights = [last_night() - timedelta(days=i) for i in range(4)]
    errors: list[BaseException] = []

    def claim(night: date) -> None:
        try:
            with connect(url) as c:
                nights.claim_night(c, night, criteria, "UTC")
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(n,)) for n in batch_nights]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with connect(url) as c:
        rows = c.execute("SELECT batch_key, memory_id FROM archival_attempts").fetchall()
    per_night = {nights.batch_key_for(n): 0 for n in batch_nights}
    for r in rows:
        per_night[r["batch_key"]] += 1
    # Nights overlap in what is eligible: locked rows are skipped, so a night may get fewer, never a duplicate.
    assert len(rows) == len({r["memory_id"] for r in rows}) > 40
    assert all(n <= 40 for n in per_night.values()), per_night
    databases.drop(url)


# --------------------------------------------------------------------------- fidelity


def _backed_up_night(conn, services) -> str:
    load_history(conn, TEST_DIM)
    night = last_night()
    nights.claim_night(conn, night, CRITERIA, "UTC")
    nights.summarize_night(conn, night, services.summarizer, services.embedder, CRITERIA)
    nights.backup_night(conn, night, services.object_store, CRITERIA)
    return nights.batch_key_for(night)


def test_fidelity_passes_for_faithful_backups(conn, services, object_store):
    services = ArchivalServices(services.summarizer, services.embedder, object_store)
    key = _backed_up_night(conn, services)
    report = fidelity.verify_backups(conn, object_store, key)
    n = one(conn.execute("SELECT count(*) AS n FROM archival_attempts WHERE status = 'backed_up'"))["n"]
    assert report.passed and report.checked == report.faithful == n > 0
    assert report.bytes_read > 0


def test_fidelity_catches_a_tampered_object_and_sends_it_back(conn, services, object_store):
    services = ArchivalServices(services.summarizer, services.embedder, object_store)
    key = _backed_up_night(conn, services)
    victim = conn.execute(
        "SELECT memory_id, backup_key FROM archival_attempts WHERE batch_key = %s ORDER BY memory_id LIMIT 1",
        (key,),
    ).fetchone()
    data = bytearray(object_store.get(victim["backup_key"]))
    at = data.index(b'"content":"') + len(b'"content":"')
    data[at : at + 1] = data[at : at + 1].swapcase()  # same size, one letter changed
    changed = bytes(data)
    object_store.put(victim["backup_key"], changed, models.sha256_hex(changed))
    report = fidelity.verify_backups(conn, object_store, key)
    assert list(report.failures) == [victim["memory_id"]]
    assert "sha256" in report.failures[victim["memory_id"]]
    assert fidelity.reset_unfaithful_backups(conn, report, CRITERIA) == 1
    row = conn.execute(
        "SELECT status, failed_step FROM archival_attempts WHERE memory_id = %s", (victim["memory_id"],)
    ).fetchone()
    assert (row["status"], row["failed_step"]) == ("embedded", "fidelity")
    # The next backup step rewrites it, and the round trip passes again.
    nights.backup_night(conn, last_night(), object_store, CRITERIA)
    assert fidelity.verify_backups(conn, object_store, key).passed


def test_a_backup_a_forget_deleted_meanwhile_is_erased_not_unfaithful(conn, services, object_store):
    """Forget deletes a user's backups, then its rows: a night's round trip that reads in between finds
    the object gone. While the forget is open that is the erasure, not a failure that would pause
    archival; without a forget it is a failure. An attempt the forget already deleted is not read."""
    services = ArchivalServices(services.summarizer, services.embedder, object_store)
    key = _backed_up_night(conn, services)
    first, second = conn.execute(
        "SELECT memory_id, user_id, backup_key FROM archival_attempts WHERE batch_key = %s "
        "AND status = 'backed_up' ORDER BY user_id, memory_id",
        (key,),
    ).fetchall()[:2]
    for backup_key in {first["backup_key"], second["backup_key"]}:  # one pack or two
        object_store.delete(backup_key)
    report = fidelity.verify_backups(conn, object_store, key)
    assert {first["memory_id"], second["memory_id"]} <= set(report.failures)  # no forget: failures
    assert report.erased == 0

    conn.execute(
        "INSERT INTO forget_requests (user_id, memory_id, memory_ids, actor) VALUES (%s, %s, %s, 'test')",
        (first["user_id"], first["memory_id"], [first["memory_id"]]),
    )
    conn.execute(
        "DELETE FROM archival_attempts WHERE batch_key = %s AND user_id = %s AND memory_id = %s",
        (key, second["user_id"], second["memory_id"]),
    )
    report = fidelity.verify_backups(conn, object_store, key)
    assert first["memory_id"] not in report.failures and second["memory_id"] not in report.failures
    assert report.erased == 1  # the open forget's; the deleted attempt is no longer the night's to read


def test_a_memory_changed_after_its_backup_is_stale_not_unfaithful(conn, services):
    key = _backed_up_night(conn, services)
    mid = one(conn.execute("SELECT memory_id FROM archival_attempts WHERE batch_key = %s LIMIT 1", (key,)))[
        "memory_id"
    ]
    conn.execute("UPDATE memories SET metadata = metadata || '{\"edited\": true}' WHERE id = %s", (mid,))
    report = fidelity.verify_backups(conn, services.object_store, key)
    assert report.passed and report.stale == 1


def test_a_lossy_serializer_is_caught_field_by_field(conn, services, monkeypatch):
    """Bytes that match their recorded sha256 can still lose data: the round trip compares every field."""
    import memory_lib.core.models as models

    monkeypatch.setattr(
        models, "_float32_json", lambda xs: [round(float(x), 3) for x in xs]
    )  # a lossy serializer bug
    key = _backed_up_night(conn, services)
    report = fidelity.verify_backups(conn, services.object_store, key)
    assert report.checked > 0 and report.stale == 0
    assert len(report.failures) == report.checked
    assert all("embedding" in problem for problem in report.failures.values())


# --------------------------------------------------------------------------- gate and integrity


def test_gate_counts_failures_against_the_threshold(conn, services):
    key = _backed_up_night(conn, services)
    status = archive.batch_status(conn, key)
    assert gates.error_gate(conn, key, CRITERIA).passed
    bad = max(1, int(status.attempted * 0.1))
    conn.execute(
        """UPDATE archival_attempts SET error = 'injected', failed_step = 'summarize', status = 'claimed'
           WHERE memory_id IN (SELECT memory_id FROM archival_attempts WHERE batch_key = %s
                               ORDER BY memory_id LIMIT %s)""",
        (key, bad),
    )
    gate = gates.error_gate(conn, key, CRITERIA)
    assert not gate.passed and gate.status.failed == bad and "above" in gate.describe()
    assert gates.error_gate(conn, key, ArchivalCriteria(max_error_rate=0.5)).passed
    # commit_night re-checks the gate itself: nothing is deleted.
    outcome = nights.commit_night(conn, last_night(), services.object_store, CRITERIA)
    assert outcome.skipped and not outcome.results
    assert one(conn.execute("SELECT count(*) AS n FROM archived_memories"))["n"] == 0


def test_integrity_report_finds_a_memory_in_both_tiers(conn, services):
    load_history(conn, TEST_DIM)
    report = nights.run_night(conn, services, CRITERIA, last_night(), "UTC")
    assert report.integrity is not None
    assert report.integrity.passed
    row = conn.execute("SELECT original_id, user_id FROM archived_memories LIMIT 1").fetchone()
    # A copy back in the hot tier behind the archiver's back.
    conn.execute(
        """INSERT INTO memories (id, user_id, content, content_sha256, embedding, embedding_model, embedding_dim)
           SELECT %s, %s, 'copy', repeat('0', 64), array_fill(0.1, ARRAY[%s])::vector, 'x', %s""",
        (row["original_id"], row["user_id"], TEST_DIM, TEST_DIM),
    )
    bad = integrity.integrity_report(conn, [report.batch_key])
    assert not bad.passed and bad.both_tiers == 1


# --------------------------------------------------------------------------- dry run


def test_dry_run_writes_nothing(conn, services):
    load_history(conn, TEST_DIM)
    before = table_fingerprint(conn)
    report = dry_run.dry_run(conn, services, CRITERIA, as_of=END, sample_size=20, scratch_token="t1")
    assert table_fingerprint(conn) == before
    assert sum(report.eligible_by_reason.values()) == report.projection.eligible > 20
    assert len(report.samples) == 20 and all(s.summary for s in report.samples)
    assert report.round_trip.written == report.round_trip.faithful == report.round_trip.deleted == 20
    assert list(services.object_store.list("dry-run/")) == []
    assert report.projection.nights_needed == -(-report.projection.eligible // CRITERIA.batch_size)
    assert report.projection.bytes > 0 and report.projection.seconds > 0


def test_dry_run_sample_is_eligible_and_spread(conn, services):
    load_history(conn, TEST_DIM)
    rows = eligibility.sample_eligible(conn, CRITERIA, END, 30)
    eligible = {r["id"] for r in eligibility.select_eligible(conn, CRITERIA, END, 10_000)}
    assert {r["id"] for r in rows} <= eligible
    assert len({r["user_id"] for r in rows}) > 1


# --------------------------------------------------------------------------- rollback


def test_restore_archives_is_byte_exact_idempotent_and_selective(conn, services):
    load_history(conn, TEST_DIM)
    eligible = [r["id"] for r in eligibility.select_eligible(conn, CRITERIA, END, 10_000)]
    original = integrity.exact_rows(conn, eligible)
    report = nights.run_night(conn, services, CRITERIA, last_night(), "UTC")
    archived = [
        r["original_id"] for r in conn.execute("SELECT original_id FROM archived_memories").fetchall()
    ]
    assert report.archived == len(archived) > 3
    some = archived[:2]
    first = restore.restore_archives(
        conn, services.object_store, actor="t", original_ids=[str(i) for i in some]
    )
    assert (first.requested, first.restored, first.failed) == (2, 2, 0)
    again = restore.restore_archives(conn, services.object_store, actor="t", original_ids=some)
    assert (again.restored, again.already_hot) == (0, 2)
    user = one(conn.execute("SELECT user_id FROM archived_memories LIMIT 1"))["user_id"]
    mine = restore.restore_archives(conn, services.object_store, actor="t", user_id=user)
    assert (
        mine.restored > 0
        and one(conn.execute("SELECT count(*) AS n FROM archived_memories WHERE user_id = %s", (user,)))["n"]
        == 0
    )
    rest = restore.restore_archives(conn, services.object_store, actor="t", all_archives=True, chunk_size=7)
    assert rest.restored + mine.restored + first.restored == len(archived) and rest.failed == 0
    restored = integrity.exact_rows(conn, archived)
    assert restored == {k: original[k] for k in archived}


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({}, "selection"),
        ({"all_archives": True, "user_id": "u"}, "all"),
        ({"original_ids": ["nope"]}, "original_ids[0]"),
        ({"user_id": " "}, "user_id"),
    ],
)
def test_restore_selection_is_validated(conn, local_store, kwargs, field):
    with pytest.raises(InvalidInputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        restore.restore_archives(conn, local_store, actor="t", **kwargs)


def test_unknown_original_id_is_reported_not_raised(conn, local_store):
    report = restore.restore_archives(conn, local_store, actor="t", original_ids=[uuid.uuid4()])
    assert (report.requested, report.not_found, report.restored) == (1, 1, 0)


def test_orphaned_backups_lists_objects_without_a_record(conn, services):
    key = _backed_up_night(conn, services)
    store = services.object_store
    assert integrity.orphaned_backups(conn, store) == []
    stray = store.key_for(uuid.uuid4())
    store.put(stray, b"{}", models.sha256_hex(b"{}"))
    assert integrity.orphaned_backups(conn, store) == [stray]
    assert key
