"""Re-embedding migrations (memory_lib.lifecycle.reembedding, sql/017) against the embedded Postgres:
the hashing embedder (TEST_DIM) to the local MiniLM model (384-d) over hot and archived rows, with searches
running all along; flip, flip back, drop."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime

import numpy as np
import pytest

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, Settings
from memory_lib.core.errors import EmbeddingMismatchError, InvalidInputError
from memory_lib.lifecycle import reembedding, restore
from memory_lib.lifecycle.reembedding import ReembeddingError
from memory_lib.llm.embedding import LOCAL_MODEL_DIM, LOCAL_MODEL_NAME, HashingEmbedder, LocalEmbedder
from memory_lib.storage.db import check_schema, connect, migrate_database
from testing.backups import ARCHIVE_REFS_SQL
from testing.constants import TEST_DIM
from testing.dagster_helpers import metadata_value
from testing.factories import archival_services, make_client
from testing.rows import one

ADDED = datetime(2025, 1, 10, 12, 0, tzinfo=UTC)
ARCHIVED = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
OLD = [  # archived by the night of ARCHIVED
    "Booked a table at Casa Lumi for our anniversary dinner on 14 June.",
    "The dentist appointment for the root canal is on Tuesday morning.",
    "Paid the plumber 240 euros to fix the leaking kitchen sink.",
    "Maya's daughter starts violin lessons at the music school in September.",
    "Renewed the car insurance with a higher deductible to lower the premium.",
    "The hiking trip to the Dolomites is planned for the second week of August.",
]
RECENT = [  # stay hot
    "Prefers a cortado in the morning and never drinks oat milk.",
    "Jonas is allergic to peanuts; avoid satay when he visits.",
    "The quarterly board meeting moved to the large conference room.",
    "Started training for the Berlin half marathon with three runs a week.",
    "The cat needs her kidney medication twice a day with food.",
    "Sold the old road bike to a neighbour for 300 euros.",
]
# (question, a word of the memory it should find): paraphrases the semantic model finds with few shared words.
QUESTIONS = [
    ("what coffee does the user like?", "cortado"),
    ("any food allergies among friends?", "peanuts"),
    ("which restaurant for the wedding anniversary?", "Casa Lumi"),
    ("when is the mountain holiday?", "Dolomites"),
]


# A re-embedding changes the schema (columns, the dimension, the migrations' checksums).
pytestmark = pytest.mark.schema_changing


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    return LocalEmbedder()


def _hits(client: MemoryClient, question: str) -> list[uuid.UUID]:
    result = client.search("u1", question, limit=4, phase2="always", now=NOW)
    return [h.id for h in result]


def _text_of(conn, hit_id: uuid.UUID) -> str:
    row = conn.execute(
        """SELECT content AS t FROM memories WHERE id = %(i)s
           UNION ALL SELECT summary FROM archived_memories WHERE id = %(i)s OR original_id = %(i)s""",
        {"i": hit_id},
    ).fetchone()
    return row["t"]


def _history(conn, store) -> None:
    old = make_client(conn, store, embedder=HashingEmbedder(TEST_DIM))
    for text in OLD:
        old.add("u1", text, importance=0.1, now=ADDED)
    services = archival_services(store)
    report = run_batch(
        conn,
        services,
        ArchivalCriteria(),
        batch_key=f"night-{uuid.uuid4().hex[:8]}",
        as_of=ARCHIVED,
        actor="test",
    )
    assert report.gate_passed and report.status.failed == 0
    for text in RECENT:
        old.add("u1", text, importance=0.5, now=NOW)
    # A consolidated fact and digest (sql/016) in the old space: phase 3 searches them too.
    vec = HashingEmbedder(TEST_DIM).embed(["user likes cortado", "June 2025 digest"])
    conn.execute(
        """INSERT INTO memory_facts (user_id, kind, subject, predicate, object, valid_from, source_memory_ids,
                                     extractor, embedding, embedding_model)
           VALUES ('u1', 'preference', 'user', 'likes', 'cortado', %s, %s, 'test', %s, %s)""",
        (NOW, [uuid.uuid4()], vec[0], HashingEmbedder(TEST_DIM).model),
    )
    conn.execute(
        """INSERT INTO memory_digests (user_id, level, period_start, period_end, summary, embedding, embedding_model,
                                       source_memory_ids, source_fingerprint, summarizer_kind, summary_model)
           VALUES ('u1', 2, '2025-06-01', '2025-07-01', 'June 2025 digest', %s, %s, '{}', 'fp', 'test', 'test')""",
        (vec[1], HashingEmbedder(TEST_DIM).model),
    )


class Searcher(threading.Thread):
    """Searches continuously on its own connection, with the old embedder and, when the database says the
    space is another, the new one. Any other error is collected; so is every result, with its space."""

    def __init__(self, url: str, store, local: LocalEmbedder):
        super().__init__(daemon=True)
        self.conn = connect(url)
        self.clients = {
            TEST_DIM: make_client(self.conn, store, embedder=HashingEmbedder(TEST_DIM)),
            LOCAL_MODEL_DIM: make_client(self.conn, store, embedder=local),
        }
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.results: list[tuple[int, str, list[uuid.UUID]]] = []
        self.mismatches = 0

    def run(self) -> None:
        try:
            i = 0
            while not self.stop.is_set():
                question = QUESTIONS[i % len(QUESTIONS)][0]
                i += 1
                # A search in the inactive space fails loudly (EmbeddingMismatchError); then the other space
                # is asked (a flip and a flip back in between can make that fail too: try again).
                for attempt in range(6):
                    dim = (TEST_DIM, LOCAL_MODEL_DIM)[attempt % 2]
                    try:
                        self.results.append((dim, question, _hits(self.clients[dim], question)))
                        break
                    except EmbeddingMismatchError:
                        self.mismatches += 1
                else:
                    raise AssertionError(f"no space answered {question!r} in 6 tries")
        except BaseException as exc:  # noqa: BLE001 - collected for the test to report
            self.errors.append(exc)
        finally:
            self.conn.close()


def _columns(conn, table: str) -> set[str]:
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
        (table,),
    ).fetchall()
    return {r["attname"] for r in rows}


class Crash(RuntimeError):
    pass


class CrashingEmbedder:
    """The local model's identity, but it dies after the rows are claimed: a killed backfill batch."""

    def __init__(self, inner: LocalEmbedder):
        self.model, self.dim, self.kind, self.max_tokens = (
            inner.model,
            inner.dim,
            inner.kind,
            inner.max_tokens,
        )

    def embed(self, texts):
        raise Crash("killed mid-batch")


def test_hashing_to_local_with_searches_running_flip_and_flip_back(db_url, local_store, local):
    conn = connect(db_url)
    old_client = make_client(conn, local_store, embedder=HashingEmbedder(TEST_DIM))
    new_client = make_client(conn, local_store, embedder=local)
    _history(conn, local_store)
    n_hot = one(conn.execute("SELECT count(*) AS n FROM memories"))["n"]
    n_arch = one(conn.execute("SELECT count(*) AS n FROM archived_memories"))["n"]
    assert n_hot == len(RECENT) and n_arch == len(OLD)
    baseline = {q: _hits(old_client, q) for q, _ in QUESTIONS}
    assert all(baseline.values())

    searcher = Searcher(db_url, local_store, local)
    searcher.start()
    try:
        m = reembedding.start(conn, LOCAL_MODEL_NAME, LOCAL_MODEL_DIM, actor="test")
        assert (m.state, m.suffix, m.secondary) == ("running", "_next", (LOCAL_MODEL_NAME, LOCAL_MODEL_DIM))
        with pytest.raises(ReembeddingError, match="already|is running"):
            reembedding.start(conn, LOCAL_MODEL_NAME, LOCAL_MODEL_DIM, actor="test")
        cov = reembedding.coverage(conn)
        assert cov == {"memories": n_hot, "archived_memories": n_arch, "memory_digests": 1, "memory_facts": 1}
        with pytest.raises(ReembeddingError, match=rf"memories: {n_hot}.*archived_memories: {n_arch}"):
            reembedding.flip(conn, actor="test")

        # A write during the migration fills both spaces (dual write).
        added = old_client.add("u1", "Bought a new espresso grinder for the kitchen.", now=NOW)
        row = conn.execute(
            "SELECT embedding, embedding_next, embedding_model_next, embedding_dim_next FROM memories "
            "WHERE id = %s",
            (added.memory_id,),
        ).fetchone()
        assert row is not None
        assert (
            row["embedding_model_next"] == LOCAL_MODEL_NAME and row["embedding_dim_next"] == LOCAL_MODEL_DIM
        )
        np.testing.assert_allclose(
            row["embedding_next"].to_numpy(),
            local.embed(["Bought a new espresso grinder for the kitchen."])[0],
            atol=1e-6,
        )
        assert row["embedding"].to_numpy().size == TEST_DIM
        conn.execute("DELETE FROM memories WHERE id = %s", (added.memory_id,))  # keep the baseline comparable

        # A killed batch writes nothing; its re-run completes.
        with pytest.raises(Crash):
            reembedding.backfill_batch(conn, CrashingEmbedder(local), "hot", limit=4)
        assert reembedding.pending(conn, "hot") == n_hot
        with pytest.raises(EmbeddingMismatchError, match="hashing"):
            reembedding.backfill_batch(conn, HashingEmbedder(TEST_DIM), "hot")

        # The backfill, in batches of 2, while the searcher runs; the check fails until the end.
        for kind in reembedding.KINDS:
            while reembedding.backfill_batch(conn, local, kind, limit=2):
                assert sum(reembedding.coverage(conn).values()) > 0 or kind == "facts"
        assert reembedding.coverage(conn) == {
            "memories": 0,
            "archived_memories": 0,
            "memory_digests": 0,
            "memory_facts": 0,
        }
        stub_bits = one(
            conn.execute(
                "SELECT count(*) AS n FROM archived_memories WHERE bit_length(summary_bits_next) = %s",
                (LOCAL_MODEL_DIM,),
            )
        )["n"]
        assert stub_bits == n_arch
        # Before the flip, old-space searches are exactly what they were.
        for q, _ in QUESTIONS:
            assert _hits(old_client, q) == baseline[q]

        flipped = reembedding.flip(conn, actor="test")
        assert flipped.state == "flipped" and flipped.flips == 1
        # The archive's new bits index is built as migration 027 builds it.
        options = conn.execute(
            """SELECT c.reloptions FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
               WHERE i.indrelid = 'archived_memories'::regclass AND a.attname = 'summary_bits'"""
        ).fetchall()
        assert [r["reloptions"] for r in options] == [["m=12", "ef_construction=64"]]
        for q, expected in QUESTIONS:
            texts = [_text_of(conn, h) for h in _hits(new_client, q)]
            assert any(expected in t for t in texts[:2]), (q, texts)
        with pytest.raises(EmbeddingMismatchError) as err:
            _hits(old_client, QUESTIONS[0][0])
        assert "hashing-lexical-v1-64" in str(err.value) and LOCAL_MODEL_NAME in str(err.value)
        assert "384-d" in str(err.value) and f"{TEST_DIM}-d" in str(err.value)
        with pytest.raises(EmbeddingMismatchError, match=LOCAL_MODEL_NAME):
            old_client.add("u1", "A write in the old space after the flip.", now=NOW)
        # The schema is the one a 384-d database has: migrate and the clients' check accept it.
        assert migrate_database(db_url, TEST_DIM) == []
        assert check_schema(db_url, embedding_dim=LOCAL_MODEL_DIM) == LOCAL_MODEL_DIM

        # Flipped: writes keep the old space up to date too (dual write into _prev), so flip back loses nothing.
        late = new_client.add("u1", "Booked a pottery class for Saturday afternoon.", now=NOW)
        prev = conn.execute(
            "SELECT embedding_prev, embedding_model_prev FROM memories WHERE id = %s", (late.memory_id,)
        ).fetchone()
        assert prev is not None
        assert prev["embedding_model_prev"] == HashingEmbedder(TEST_DIM).model
        assert reembedding.coverage(conn)["memories"] == 0

        back = reembedding.flip_back(conn, actor="test")
        assert back.state == "running" and back.flips == 2
        assert _hits(old_client, "pottery class on Saturday")[0] == late.memory_id
        for q, _ in QUESTIONS:
            assert _hits(old_client, q) == baseline[q]
        with pytest.raises(EmbeddingMismatchError, match="hashing-lexical-v1-64"):
            _hits(new_client, QUESTIONS[0][0])

        reembedding.flip(conn, actor="test")
        assert _hits(new_client, "pottery class on Saturday")[0] == late.memory_id
    finally:
        searcher.stop.set()
        searcher.join(60)
    assert not searcher.errors, searcher.errors
    assert len(searcher.results) >= 10, len(searcher.results)  # searches ran all along
    spaces = {dim for dim, _, _ in searcher.results}
    assert spaces == {TEST_DIM, LOCAL_MODEL_DIM}, spaces
    for dim, q, hits in searcher.results:
        if dim == TEST_DIM and "pottery" not in q:
            assert hits == baseline[q]

    done = reembedding.drop_old(conn, actor="test")
    assert done.state == "finished"
    assert not {c for c in _columns(conn, "memories") if c.endswith(("_prev", "_next"))}
    assert not {c for c in _columns(conn, "archived_memories") if c.endswith(("_prev", "_next"))}
    with pytest.raises(ReembeddingError, match="no flipped re-embedding"):
        reembedding.flip_back(conn, actor="test")
    for q, expected in QUESTIONS:
        assert any(expected in _text_of(conn, h) for h in _hits(new_client, q)[:2])
    conn.close()


# --------------------------------------------------------------------------- Dagster


def test_dagster_backfill_partitions_check_and_flip_jobs(db_url, local_store):
    """Hashing TEST_DIM -> hashing 96-d (fast): the partitions fill everything, the check fails before and
    passes after, the jobs flip, flip back and drop; a flip without coverage fails naming the tables."""
    import dagster as dg

    from memory_assets.defs.reembedding import assets, jobs
    from memory_assets.resources import DatabaseResource

    conn = connect(db_url)
    _history(conn, local_store)
    target = HashingEmbedder(96)
    res = {"database": DatabaseResource(database_url=db_url)}
    defs = dg.Definitions(
        assets=[assets.reembedding],
        asset_checks=[assets.reembedding_coverage],
        jobs=[
            jobs.reembedding_start,
            jobs.reembedding_flip,
            jobs.reembedding_flip_back,
            jobs.reembedding_drop_old,
        ],
        resources=res,
    )
    instance = dg.DagsterInstance.ephemeral()

    def run_job(name: str, config: dict | None = None):
        return defs.resolve_job_def(name).execute_in_process(
            run_config={"ops": config or {}}, instance=instance, raise_on_error=False
        )

    started = run_job(
        "reembedding_start",
        {"start_reembedding": {"config": {"target_model": target.model, "target_dim": 96}}},
    )
    assert started.success
    refused = run_job("reembedding_flip")
    assert not refused.success
    failure = next(e for e in refused.all_events if e.event_type_value == "STEP_FAILURE")
    assert "memories: " in failure.event_specific_data.error.message
    assert "archived_memories: " in failure.event_specific_data.error.message

    keys = assets.partitions.get_partition_keys()
    assert len(keys) == len(lib_kinds()) * assets.BUCKETS
    done = 0
    for i, key in enumerate(keys):  # in order: hot-0 .. facts-3
        result = dg.materialize(
            [assets.reembedding, assets.reembedding_coverage],
            partition_key=key,
            resources=res,
            instance=instance,
            raise_on_error=False,
        )
        (mat,) = result.asset_materializations_for_node("reembedding")
        assert metadata_value(mat, "remaining") == 0
        assert {"rows_done", "rows_per_s", "seconds"} <= set(mat.metadata)
        done += metadata_value(mat, "rows_done")
        assert result.success  # a slice done while others are pending is a warning, not a failed run
        (check,) = result.get_asset_check_evaluations()
        uncovered = sum(reembedding.coverage(conn).values())
        assert check.passed == (uncovered == 0) and metadata_value(check, "uncovered") == uncovered
        if i == 0:
            assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert done == len(RECENT) + len(OLD) + 2 and check.passed
    assert reembedding.coverage(conn) == {t: 0 for t in reembedding.coverage(conn)}

    assert run_job("reembedding_flip").success
    assert (
        one(conn.execute("SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'"))["value"]
        == "96"
    )
    assert _hits(make_client(conn, local_store, embedder=target), "what coffee does the user like?")
    assert run_job("reembedding_flip_back").success
    assert _hits(
        make_client(conn, local_store, embedder=HashingEmbedder(TEST_DIM)), "what coffee does the user like?"
    )
    assert run_job("reembedding_flip").success
    assert run_job("reembedding_drop_old").success
    assert reembedding.active_migration(conn) is None
    state = conn.execute("SELECT state, flips FROM embedding_migrations").fetchone()
    assert state is not None
    assert (state["state"], state["flips"]) == ("finished", 3)
    conn.close()


def lib_kinds() -> tuple[str, ...]:
    return reembedding.KINDS


# --------------------------------------------------------------------------- restores after a flip


def _flipped_to(conn, target: HashingEmbedder) -> None:
    reembedding.start(conn, target.model, target.dim, actor="test")
    for kind in reembedding.KINDS:
        while reembedding.backfill_batch(conn, target, kind, limit=50):
            pass
    reembedding.flip(conn, actor="test")


def test_restore_after_a_flip_reembeds_the_text_and_keeps_the_backup(db_url, local_store):
    conn = connect(db_url)
    _history(conn, local_store)
    old, new = HashingEmbedder(TEST_DIM), HashingEmbedder(96)
    arch = conn.execute(f"{ARCHIVE_REFS_SQL} ORDER BY a.id").fetchall()
    backups = [local_store.read_ref(a["storage_ref"], a["backup_sha256"]) for a in arch]
    # Before the flip a restore reuses the backup's vector, as ever.
    make_client(conn, local_store, embedder=old).restore("u1", original_id=arch[0]["original_id"])
    first = conn.execute(
        "SELECT content, embedding FROM memories WHERE id = %s", (arch[0]["original_id"],)
    ).fetchone()
    assert first is not None
    np.testing.assert_array_equal(first["embedding"].to_numpy(), old.embed([first["content"]])[0])
    _flipped_to(conn, new)

    with pytest.raises(EmbeddingMismatchError, match="hashing-lexical-v1-96"):
        make_client(conn, local_store, embedder=old).restore("u1", original_id=arch[1]["original_id"])
    report = restore.restore_archives(
        conn, local_store, actor="test", original_ids=[arch[1]["original_id"]], pause_archival=False
    )
    assert report.failed == 1 and "pass that embedder" in report.errors[0]
    assert (
        one(conn.execute("SELECT count(*) AS n FROM memories WHERE id = %s", (arch[1]["original_id"],)))["n"]
        == 0
    )

    outcome = make_client(conn, local_store, embedder=new).restore("u1", original_id=arch[1]["original_id"])
    assert outcome.restored
    row = conn.execute(
        """SELECT content, embedding, embedding_model, embedding_dim, embedding_prev, embedding_model_prev
                          FROM memories WHERE id = %s""",
        (arch[1]["original_id"],),
    ).fetchone()
    assert row is not None
    assert (row["embedding_model"], row["embedding_dim"]) == (new.model, 96)
    np.testing.assert_allclose(row["embedding"].to_numpy(), new.embed([row["content"]])[0], atol=1e-6)
    # A restore during the flipped state also fills the old space (dual write): flip back stays lossless.
    assert row["embedding_model_prev"] == old.model
    np.testing.assert_allclose(row["embedding_prev"].to_numpy(), old.embed([row["content"]])[0], atol=1e-6)
    report = restore.restore_archives(
        conn,
        local_store,
        actor="test",
        original_ids=[arch[2]["original_id"]],
        pause_archival=False,
        embedder=new,
    )
    assert report.restored == 1
    # The backups are untouched: still the old model's vectors, byte for byte.
    assert [local_store.read_ref(a["storage_ref"], a["backup_sha256"]) for a in arch] == backups
    conn.close()


# --------------------------------------------------------------------------- invariants and refusals


def test_a_changed_vector_clears_its_second_one_and_bad_requests_are_refused(db_url, local_store):
    conn = connect(db_url)
    client = make_client(conn, local_store, embedder=HashingEmbedder(TEST_DIM))
    added = client.add("u1", "Prefers window seats on long flights.", now=NOW)
    model = HashingEmbedder(TEST_DIM).model
    conn.execute("DELETE FROM memory_archive_settings WHERE key = 'embedding_model'")  # as before any write
    with pytest.raises(ReembeddingError, match="no embedding model"):
        reembedding.start(conn, "hashing-lexical-v1-96", 96, actor="test")
    conn.execute("INSERT INTO memory_archive_settings (key, value) VALUES ('embedding_model', %s)", (model,))
    for dim in (0, 2001, "96", True):
        with pytest.raises(InvalidInputError, match="target_dim"):
            reembedding.start(conn, "hashing-lexical-v1-96", dim, actor="test")  # type: ignore[arg-type]  # the wrong type is the input under test
    with pytest.raises(InvalidInputError, match="makes 384-d"):
        reembedding.start(conn, LOCAL_MODEL_NAME, 512, actor="test")
    with pytest.raises(InvalidInputError, match="hashing-lexical-v1-128"):
        reembedding.start(conn, "hashing-lexical-v1-96", 128, actor="test")
    with pytest.raises(InvalidInputError, match="already the active space"):
        reembedding.start(conn, HashingEmbedder(TEST_DIM).model, TEST_DIM, actor="test")
    assert reembedding.active_migration(conn) is None  # nothing was written by the refusals

    target = HashingEmbedder(96)
    reembedding.start(conn, target.model, 96, actor="test")
    assert reembedding.backfill_batch(conn, target, "hot") == 1
    covered = "SELECT embedding_next IS NOT NULL AS has, embedding_model_next FROM memories WHERE id = %s"
    assert one(conn.execute(covered, (added.memory_id,)))["has"]
    # A write that changes the active vector without the second one (any writer, even raw SQL) clears it:
    # the second vector never describes old content, and the row is pending again.
    new_vec = HashingEmbedder(TEST_DIM).embed(["Prefers aisle seats now."])[0]
    conn.execute(
        "UPDATE memories SET content = 'Prefers aisle seats now.', embedding = %s WHERE id = %s",
        (new_vec, added.memory_id),
    )
    assert conn.execute(covered, (added.memory_id,)).fetchone() == {
        "has": False,
        "embedding_model_next": None,
    }
    assert reembedding.pending(conn, "hot") == 1
    # Other changes keep it.
    reembedding.backfill_batch(conn, target, "hot")
    conn.execute("UPDATE memories SET importance_score = 0.9 WHERE id = %s", (added.memory_id,))
    assert one(conn.execute(covered, (added.memory_id,)))["has"]

    with pytest.raises(InvalidInputError, match="kind"):
        reembedding.backfill_batch(conn, target, "warm")  # type: ignore[arg-type]
    with pytest.raises(ReembeddingError, match="needs it flipped"):
        reembedding.drop_old(conn, actor="test")
    aborted = reembedding.abort(conn, actor="test")
    assert aborted.state == "aborted"
    assert not {c for c in _columns(conn, "memories") if c.endswith("_next")}
    assert client.search("u1", "aisle seats", limit=1, now=NOW).hits  # the active space is untouched
    conn.close()


def test_both_clients_dual_write_adds_updates_and_restores(db_url, local_store):
    import asyncio

    import psycopg
    from pgvector.psycopg import register_vector_async
    from psycopg.rows import dict_row

    from memory_lib.client import AsyncMemoryClient

    conn = connect(db_url)
    old, target = HashingEmbedder(TEST_DIM), HashingEmbedder(96)
    sync_client = make_client(conn, local_store, embedder=old)
    kept = sync_client.add("u1", "Waters the fern every Sunday.", now=NOW)
    reembedding.start(conn, target.model, 96, actor="test")
    filled = "SELECT content, embedding_next, embedding_model_next FROM memories WHERE id = %s"

    def assert_filled(memory_id):
        row = conn.execute(filled, (memory_id,)).fetchone()
        assert row is not None
        assert row["embedding_model_next"] == target.model, row
        np.testing.assert_allclose(
            row["embedding_next"].to_numpy(), target.embed([row["content"]])[0], atol=1e-6
        )

    # A client learns of the migration on its next look at the database (cached 10 s): a new one at once.
    sync_client = make_client(conn, local_store, embedder=old)
    updated = sync_client.update("u1", kept.memory_id, "Waters the fern every Saturday.", now=NOW)
    assert updated.outcome == "superseded"
    assert_filled(updated.memory_id)

    async def scenario():
        aconn = await psycopg.AsyncConnection.connect(db_url, autocommit=True, row_factory=dict_row)
        await register_vector_async(aconn)
        try:
            client = AsyncMemoryClient(
                aconn, embedder=old, object_store=local_store, settings=Settings(), actor="t"
            )
            added = await client.add("u1", "Keeps the spare key under the blue pot.", now=NOW)
            again = await client.update(
                "u1", added.memory_id, "Keeps the spare key with the neighbour.", now=NOW
            )
            return added, again
        finally:
            await aconn.close()

    added, again = asyncio.run(scenario())
    assert_filled(added.memory_id)
    assert_filled(again.memory_id)
    assert reembedding.pending(conn, "hot") == 1  # only the superseded version written before the start
    conn.close()


def test_a_prepared_statement_made_stale_by_the_migration_fails_once_then_works(db_url, local_store):
    import psycopg

    from memory_lib.core.plans import Sql, run_plan

    conn, other = connect(db_url), connect(db_url)
    added = make_client(conn, local_store, embedder=HashingEmbedder(TEST_DIM)).add(
        "u1", "Likes green tea.", now=NOW
    )

    def read():
        row = yield Sql("SELECT * FROM memories WHERE id = %(id)s", {"id": added.memory_id}, "one")
        return row

    for _ in range(6):  # psycopg prepares it after 5 runs
        assert run_plan(other, read())["content"] == "Likes green tea."
    reembedding.start(conn, "hashing-lexical-v1-96", 96, actor="test")  # adds columns: SELECT * changes
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="cached plan must not change result type"):
        run_plan(other, read())
    assert "embedding_next" in run_plan(other, read())  # deallocated: the next run plans it again
    conn.close()
    other.close()
