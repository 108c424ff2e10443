"""Scale-out by user shards: concurrent runs of one night, each over its own users, against one embedded
Postgres and one SeaweedFS: disjoint work, every eligible memory archived exactly once, one verified
object each; two runs of the same shard are still exactly once; bad shard input writes nothing."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from memory_assets.defs.slow_path.partitions import SHARD_TAG
from memory_assets.resources import ObjectStoreResource
from memory_lib.archival import nights
from memory_lib.cli import main
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.errors import InvalidInputError
from memory_lib.core.shards import ALL, Shard
from memory_lib.lifecycle import eligibility
from memory_lib.storage.db import connect
from memory_lib.storage.objectstore import S3ObjectStore
from memory_lib.storage.packs import backup_sql
from testing.constants import TEST_DIM
from testing.dagster_helpers import last_night, load_history, metadata_value, table_fingerprint
from testing.factories import archival_services
from testing.slow_path import SLOW_PATH_DEFS, resources

NIGHT = last_night()
CRITERIA = ArchivalCriteria()
# Four users: their shards of 2 are fixed by the hash (checked below to be two users each side).
USERS = 4


def _concurrently(*jobs: Callable[[], Any]) -> list[Any]:
    """Run the jobs in threads started together; re-raise the first error."""
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = jobs[i]()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def bucket(seaweed):
    """A versioned bucket: a backup written twice would show as two versions of its key."""
    name = f"sh-{os.urandom(6).hex()}"
    seaweed.create_bucket(name)
    seaweed.client().put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


def _eligible_ids(conn, shard: Shard = ALL) -> set:
    return {
        r["id"]
        for r in eligibility.select_eligible(conn, CRITERIA, nights.night_as_of(NIGHT, "UTC"), 10_000, shard)
    }


def _shard_ids(conn, shard: Shard) -> set:
    """The hot memories of the shard's users, by the hash written out here (not the library's SQL)."""
    rows = conn.execute(
        "SELECT id FROM memories WHERE mod(hashtextextended(user_id, 0) & 9223372036854775807, %s) = %s",
        (shard.count, shard.index),
    ).fetchall()
    return {r["id"] for r in rows}


def _users_of(conn, ids: set) -> set:
    return {
        r["user_id"]
        for r in conn.execute("SELECT DISTINCT user_id FROM memories WHERE id = ANY(%s)", (list(ids),))
    }


def _assert_exactly_once(conn, store: S3ObjectStore, before_hot: set, eligible: set) -> list[dict]:
    """Every eligible memory archived once (hot xor archived), nothing else touched, one verified object each."""
    archived = conn.execute(
        f"SELECT a.original_id, {backup_sql('a')}, a.metadata FROM archived_memories a"
    ).fetchall()
    ids = [r["original_id"] for r in archived]
    assert len(ids) == len(set(ids))
    assert set(ids) == eligible
    hot = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
    assert hot.isdisjoint(ids) and hot | set(ids) == before_hot
    versions = store.client.list_object_versions(Bucket=store.bucket, Prefix=store.prefix + "/")
    keys = [v["Key"] for v in versions.get("Versions", [])]
    assert not versions.get("IsTruncated") and not versions.get("DeleteMarkers")
    # Each object (a lone backup or a user's pack: memory_lib.storage.packs) written once, and each one a row points to.
    assert len(keys) == len(set(keys)) and set(keys) == {
        store.key_from_ref(r["storage_ref"]) for r in archived
    }
    for r in archived:
        store.read_ref(r["storage_ref"], r["backup_sha256"])
    events = conn.execute("SELECT memory_id FROM memory_events WHERE event_type = 'archived'").fetchall()
    assert sorted(e["memory_id"] for e in events) == sorted(ids)
    return archived


# --------------------------------------------------------------------------- the shard itself


@pytest.mark.parametrize(
    "text,field",
    [
        ("3/2", "shard"),
        ("-1/2", "shard"),
        ("0/0", "shard"),
        ("1", "shard"),
        ("a/b", "shard"),
        ("2/2", "shard"),
    ],
)
def test_bad_shard_text_names_the_field_and_value(text, field):
    with pytest.raises(InvalidInputError, match=field) as err:
        Shard.parse(text)
    assert repr(text) in str(err.value)


def test_shard_values_are_checked_and_named():
    assert Shard.parse(" 1/4 ") == Shard(1, 4) and str(Shard(1, 4)) == "1/4"
    with pytest.raises(InvalidInputError, match="shard_index"):
        Shard(2, 2)
    with pytest.raises(InvalidInputError, match="shard_count"):
        Shard(0, 0)
    assert nights.batch_key_for(NIGHT) == f"night-{NIGHT}"
    assert nights.batch_key_for(NIGHT, Shard(1, 4)) == f"night-{NIGHT}-shard-1of4"


def test_shards_split_users_not_memories_and_cover_everyone(conn):
    load_history(conn, TEST_DIM, users=USERS)
    everyone = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
    assert len(_users_of(conn, everyone)) == USERS
    for n in (2, 3, 5):
        parts = [_shard_ids(conn, Shard(i, n)) for i in range(n)]
        assert sum(len(p) for p in parts) == len(everyone) and set().union(*parts) == everyone
        owners = [_users_of(conn, p) for p in parts]  # a user's memories are all in one shard
        assert sum(len(o) for o in owners) == USERS
    # The eligibility SQL agrees with the hash, and both shards of 2 have users (so the tests below split work).
    halves = [_eligible_ids(conn, Shard(i, 2)) for i in range(2)]
    assert all(halves) and halves[0].isdisjoint(halves[1]) and halves[0] | halves[1] == _eligible_ids(conn)
    assert all(h <= _shard_ids(conn, Shard(i, 2)) for i, h in enumerate(halves))
    as_of = nights.night_as_of(NIGHT, "UTC")
    assert sum(eligibility.eligible_counts(conn, CRITERIA, as_of, Shard(1, 2)).values()) == len(halves[1])


# --------------------------------------------------------------------------- library: run_night per shard


def _run_night(url: str, bucket: str, seaweed, shard: Shard):
    store = S3ObjectStore(seaweed.client(), bucket, prefix="test")
    services = archival_services(store)
    with connect(url) as c:
        return nights.run_night(c, services, CRITERIA, NIGHT, "UTC", shard=shard)


@pytest.mark.parametrize(
    "shards", [(Shard(0, 2), Shard(1, 2)), (Shard(1, 2), Shard(1, 2))], ids=["0+1of2", "1+1of2"]
)
def test_concurrent_shard_nights_archive_each_memory_once(db_url, conn, seaweed, bucket, shards):
    load_history(conn, TEST_DIM, users=USERS)
    before_hot = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
    by_shard = {s: _eligible_ids(conn, s) for s in set(shards)}
    eligible = set().union(*by_shard.values())
    every_eligible = _eligible_ids(conn)
    reports = _concurrently(*(lambda s=s: _run_night(db_url, bucket, seaweed, s) for s in shards))
    assert all(r.ok for r in reports), [r.problem for r in reports]
    store = S3ObjectStore(seaweed.client(), bucket, prefix="test")
    archived = _assert_exactly_once(conn, store, before_hot, eligible)
    by_batch: dict[str, set] = {}
    for r in archived:
        by_batch.setdefault(r["metadata"]["batch_key"], set()).add(r["original_id"])
    # Each shard's batch holds exactly its users' eligible memories; the same shard twice shares one batch.
    assert by_batch == {nights.batch_key_for(NIGHT, s): ids for s, ids in by_shard.items()}
    if shards[0] != shards[1]:  # disjoint, and together every memory eligible before the runs
        assert by_shard[shards[0]].isdisjoint(by_shard[shards[1]]) and eligible == every_eligible
        assert _eligible_ids(conn) == set()
    else:  # the other shard's users were not touched
        assert _eligible_ids(conn) == every_eligible - eligible != set()
    assert sum(r.archived for r in reports) == len(eligible)  # a second run of a shard found nothing left
    totals = nights.night_totals(conn, NIGHT)
    assert totals["archived"] == totals["claimed"] == len(eligible) and totals["open"] == 0


# --------------------------------------------------------------------------- the command line


def test_cli_shard_archives_only_its_users_and_refuses_bad_values(cli_env, capsys):
    conn = connect(cli_env)
    load_history(
        conn, TEST_DIM, users=USERS, end=__import__("datetime").datetime.now(__import__("datetime").UTC)
    )
    before = table_fingerprint(conn)
    for bad in ("3/2", "-1/2", "0/0"):
        assert main(["archive", "--shard", bad]) == 2
        err = capsys.readouterr().err
        assert "shard" in err and repr(bad) in err, err
    assert table_fingerprint(conn) == before
    mine = _shard_ids(conn, Shard(1, 2))
    assert main(["archive", "--shard", "1/2"]) == 0
    out = __import__("json").loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["shard"] == "1/2" and out["batch_key"].endswith("-shard-1of2") and out["archived"] > 0
    archived = {
        r["original_id"] for r in conn.execute("SELECT original_id FROM archived_memories").fetchall()
    }
    assert len(archived) == out["archived"] and archived <= mine
    conn.close()


# --------------------------------------------------------------------------- Dagster: two shard runs at once


def _materialize(db_url: str, store: ObjectStoreResource, tags: dict[str, str]):
    with dg.DagsterInstance.ephemeral() as instance:  # closed in the thread that made it
        return dg.materialize(
            SLOW_PATH_DEFS,
            partition_key=NIGHT.isoformat(),
            resources=resources(db_url, store),
            instance=instance,
            raise_on_error=False,
            tags=tags,
        )


def _s3_resource(seaweed, bucket: str) -> ObjectStoreResource:
    s3 = S3Resource(
        endpoint_url=seaweed.endpoint_url,
        region_name=seaweed.region,
        aws_access_key_id=seaweed.access_key,
        aws_secret_access_key=seaweed.secret_key,
    )
    return ObjectStoreResource(kind="s3", bucket=bucket, prefix="test", s3=s3)


def _night_meta(result, asset: str) -> dict:
    return next(
        {k: v.value for k, v in e.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
        if e.asset_key.path[-1] == asset
    )


def test_two_concurrent_dagster_shard_runs_archive_disjoint_sets(db_url, conn, seaweed, bucket):
    load_history(conn, TEST_DIM, users=USERS)
    before_hot = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
    eligible = _eligible_ids(conn)
    store = _s3_resource(seaweed, bucket)
    results = _concurrently(
        *(lambda i=i: _materialize(db_url, store, {SHARD_TAG: f"{i}/2"}) for i in range(2))
    )
    assert all(r.success for r in results)
    s3 = store.get_store()
    assert isinstance(s3, S3ObjectStore)
    archived = _assert_exactly_once(conn, s3, before_hot, eligible)
    per_shard = {}
    for i, result in enumerate(results):
        key = nights.batch_key_for(NIGHT, Shard(i, 2))
        mine = {r["original_id"] for r in archived if r["metadata"]["batch_key"] == key}
        rows = _night_meta(result, "archive_rows")
        # The shard's own numbers, labelled with the shard; the night's totals labelled as such.
        assert rows["shard"] == f"{i}/2" and rows["archived"] == rows["archived_total"] == len(mine) > 0
        assert rows["night_all_shards_archived"] >= rows["archived"]
        assert _night_meta(result, "archival_candidates")["claimed"] == len(mine)
        checks = {
            e.check_name: (e.passed, metadata_value(e, "shard")) for e in result.get_asset_check_evaluations()
        }
        assert checks["tiers_consistent"] == (True, f"{i}/2") and checks["error_rate_gate"] == (
            True,
            f"{i}/2",
        )
        per_shard[i] = mine
    assert per_shard[0].isdisjoint(per_shard[1]) and per_shard[0] | per_shard[1] == eligible
    assert nights.night_totals(conn, NIGHT)["archived"] == len(eligible)


def test_a_bad_shard_tag_fails_naming_it_and_writes_nothing(db_url, conn, tmp_path):
    load_history(conn, TEST_DIM, users=USERS)
    before = table_fingerprint(conn)
    store = ObjectStoreResource(kind="local", local_root=str(tmp_path / "objects"), prefix="test")
    for bad in ("3/2", "-1/2", "0/0"):
        result = _materialize(db_url, store, {SHARD_TAG: bad})
        assert not result.success
        failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
        message = str(failure.event_specific_data.error.message)
        assert SHARD_TAG in message and repr(bad) in message, message
    assert table_fingerprint(conn) == before
    assert not (tmp_path / "objects").exists() or not any((tmp_path / "objects").rglob("*.json"))
