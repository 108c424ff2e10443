"""The retrievability gate: a night's archived memories must be findable by their own most specific sentence."""

from __future__ import annotations

import uuid
from datetime import timedelta

import dagster as dg
import pytest

from memory_assets.defs.slow_path import assets
from memory_assets.defs.slow_path.retrievability import archive_retrievable
from memory_assets.resources import (
    ArchivalCriteriaResource,
    DatabaseResource,
    EmbedderResource,
    ObjectStoreResource,
    SummarizerResource,
)
from memory_lib.archival import nights
from memory_lib.archival.retrievability import first_sentence, probe_night
from memory_lib.core.errors import InvalidInputError
from memory_lib.lifecycle import pause
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.packs import ref_sql
from testing.backups import ARCHIVE_REFS_SQL, edit_content
from testing.constants import TEST_DIM
from testing.dagster_helpers import END, last_night, load_history, metadata_value
from testing.rows import one

NIGHT = last_night()
DEFS = [
    assets.archival_candidates,
    assets.memory_summaries,
    assets.archive_backups,
    assets.archive_rows,
    archive_retrievable,
]


@pytest.fixture
def store_resource(tmp_path):
    return ObjectStoreResource(kind="local", local_root=str(tmp_path / "objects"), prefix="test")


def _resources(db_url, store_resource):
    return {
        "database": DatabaseResource(database_url=db_url),
        "object_store": store_resource,
        "summarizer": SummarizerResource(provider="extractive"),
        "embedder": EmbedderResource(provider="hashing", dim=TEST_DIM),
        "archival": ArchivalCriteriaResource(batch_size=40),
    }


def _materialize(db_url, store_resource, night=NIGHT):
    return dg.materialize(
        DEFS,
        partition_key=night.isoformat(),
        resources=_resources(db_url, store_resource),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def _check(result) -> dg.AssetCheckEvaluation:
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == "archive_retrievable"]
    return evaluation


def _empty_the_summaries(conn, *, fingerprints: bool = True) -> int:
    """What a broken summarizer would leave: no summary text, one meaningless vector for all of them;
    fingerprints=False: and no lexical fingerprint of the originals either (rows archived without it)."""
    conn.execute("ALTER TABLE archived_memories DROP CONSTRAINT IF EXISTS archived_memories_summary_check")
    [vec] = HashingEmbedder(TEST_DIM).embed(["(no summary)"])
    lexemes = "lexemes" if fingerprints else "NULL"
    return conn.execute(
        f"UPDATE archived_memories SET summary = '', summary_embedding = %s::vector::halfvec, lexemes = {lexemes}",
        (vec,),
    ).rowcount


def test_first_sentence_is_verbatim_and_bounded():
    assert first_sentence("Paid 84 EUR for electricity. Then went home.") == "Paid 84 EUR for electricity."
    assert first_sentence("no end mark here") == "no end mark here"
    long = "word " * 200
    assert len(first_sentence(long)) <= 300 and long.startswith(first_sentence(long))


def test_probe_finds_a_nights_archived_memories_and_misses_them_without_summaries(
    conn, db_url, store_resource
):
    load_history(conn, TEST_DIM)
    assert _materialize(db_url, store_resource).success
    key = nights.batch_key_for(NIGHT)
    store, embedder = store_resource.get_store(), HashingEmbedder(TEST_DIM)
    good = probe_night(conn, embedder, store, key, now=END)
    assert good.archived > 0 and good.sampled == min(good.archived, 50)
    assert good.share_found is not None and good.share_found >= 0.9 and good.passed, good.missed

    # Summaries emptied after the fact: the fingerprints hold only what the summaries lacked, and without
    # them too nothing carries the memories: the probe misses them.
    assert _empty_the_summaries(conn, fingerprints=False) == good.archived
    bad = probe_night(conn, embedder, store, key, now=END)
    assert bad.share_found is not None and bad.share_found < 0.9
    assert bad.sampled == good.sampled and not bad.passed
    assert len(bad.missed) == bad.sampled - bad.found
    assert "floor 90%" in bad.describe()

    nothing = probe_night(conn, embedder, store, "night-1999-01-01", now=END)
    assert (nothing.sampled, nothing.share_found, nothing.passed) == (0, None, True)
    with pytest.raises(InvalidInputError, match="batch_key"):
        probe_night(conn, embedder, store, " ")


def test_an_unreadable_backup_is_a_miss_not_a_crashed_probe(conn, db_url, store_resource):
    load_history(conn, TEST_DIM)
    assert _materialize(db_url, store_resource).success
    key = nights.batch_key_for(NIGHT)
    store, embedder = store_resource.get_store(), HashingEmbedder(TEST_DIM)
    before = probe_night(conn, embedder, store, key, now=END, sample_size=5)
    assert before.sampled == 5 and not before.missed
    # The probe samples in a fixed order: damage the first sampled memory's backup (a member of a pack:
    # its neighbours stay readable).
    gone = conn.execute(
        f"{ARCHIVE_REFS_SQL} WHERE a.metadata ->> 'batch_key' = %s ORDER BY md5(a.original_id::text), a.original_id LIMIT 1",
        (key,),
    ).fetchone()
    edit_content(store, gone["storage_ref"])
    after = probe_night(conn, embedder, store, key, now=END, sample_size=5)
    assert after.sampled == 5 and after.missed == [gone["original_id"]] and after.found == 4


def test_dagster_check_passes_then_fails_and_blocks_later_nights_when_summaries_are_empty(
    conn, db_url, store_resource
):
    load_history(conn, TEST_DIM)
    first = _materialize(db_url, store_resource)
    assert first.success
    check = _check(first)
    assert check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert check.partition == NIGHT.isoformat() and metadata_value(check, "sampled") > 0
    assert metadata_value(check, "share_found") >= 0.9

    _empty_the_summaries(conn, fingerprints=False)
    again = _materialize(db_url, store_resource)  # the same night: no new work, the check runs again
    failed = _check(again)
    assert failed.description is not None
    assert not failed.passed and failed.severity == dg.AssetCheckSeverity.ERROR
    assert failed.partition == NIGHT.isoformat() and nights.batch_key_for(NIGHT) in failed.description
    assert metadata_value(failed, "share_found") < 0.9
    state = pause.pause_status(conn)
    assert state.reason is not None
    assert state.paused and nights.batch_key_for(NIGHT) in state.reason

    archived_before = one(conn.execute("SELECT count(*) AS n FROM archived_memories"))["n"]
    later = _materialize(db_url, store_resource, night=NIGHT + timedelta(days=1))
    assert later is not None
    archived_after = one(conn.execute("SELECT count(*) AS n FROM archived_memories"))["n"]
    assert archived_after == archived_before  # paused: the next night archives nothing
    assert pause.skipped_nights(conn, nights.batch_key_for(NIGHT + timedelta(days=1)))


class _RecordingStore:
    """The object store, recording which backups the probe read (its sample)."""

    def __init__(self, store):
        self.store, self.read = store, []

    def read_ref(self, ref: str, sha256: str) -> bytes:
        self.read.append(ref)
        return self.store.read_ref(ref, sha256)


def _supersede_archived(conn, key: str, *, first: int | None = None) -> set[str]:
    """Mark the night's archive rows as superseded originals (the `first` in the probe's sample order, or
    all); returns their storage refs."""
    # The rows first, then one UPDATE each with its id as a parameter: a distributed UPDATE takes no
    # volatile function (gen_random_uuid) and no multi-shard subquery with a LIMIT (Citus).
    picked = conn.execute(
        """SELECT user_id, original_id FROM archived_memories WHERE metadata ->> 'batch_key' = %s
           ORDER BY md5(original_id::text), original_id LIMIT %s""",
        (key, first),
    ).fetchall()
    refs = set()
    for p in picked:
        row = conn.execute(
            f"""UPDATE archived_memories a SET original_superseded_by = %s
               WHERE a.user_id = %s AND a.original_id = %s RETURNING {ref_sql("a")} AS storage_ref""",
            (uuid.uuid4(), p["user_id"], p["original_id"]),
        ).fetchone()
        refs.add(row["storage_ref"])
    return refs


def test_probe_never_samples_superseded_archive_rows(conn, db_url, store_resource):
    load_history(conn, TEST_DIM)
    assert _materialize(db_url, store_resource).success
    key = nights.batch_key_for(NIGHT)
    embedder = HashingEmbedder(TEST_DIM)
    total = one(
        conn.execute(
            "SELECT count(*) AS n FROM archived_memories WHERE metadata ->> 'batch_key' = %s", (key,)
        )
    )["n"]
    assert total > 8

    # A mixed night: the first rows of the sample order are superseded; the probe skips them, so the
    # same sample size reaches further, and the count says how many search can return.
    hidden = _supersede_archived(conn, key, first=4)
    store = _RecordingStore(store_resource.get_store())
    mixed = probe_night(conn, embedder, store, key, now=END, sample_size=total)
    assert (mixed.archived, mixed.sampled) == (total - 4, total - 4) and mixed.passed, mixed.missed
    assert len(store.read) == total - 4 and not hidden & set(store.read)
    small = probe_night(conn, embedder, store, key, now=END, sample_size=3)
    assert small.archived == total - 4 and small.sampled == 3

    # Superseded rows only: nothing to probe, the night passes.
    _supersede_archived(conn, key)
    store = _RecordingStore(store_resource.get_store())
    only = probe_night(conn, embedder, store, key, now=END)
    assert (only.archived, only.sampled, only.found, only.share_found, only.passed) == (0, 0, 0, None, True)
    assert store.read == [] and "nothing searchable" in only.describe()
