"""The demo's consolidation section (memory_assets.demo._consolidation), run on the tests' small demo
history: it builds digests and facts and prints one "who is …?" answer from facts whose every source is
shown with its id and its tier. The full `make demo` takes minutes; this is the
function it calls, on real Postgres after a real archival night."""

from __future__ import annotations

import re
import uuid

from memory_assets.demo import _consolidation
from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria
from memory_lib.lifecycle.restore import restore_archive
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer
from tests.conftest import TEST_DIM
from tests.support.dagster_helpers import END

EMB = HashingEmbedder(TEST_DIM)
_SOURCE = re.compile(
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}) \((hot|archived|missing)\)"
)


def _tier(conn, user: str, memory_id: uuid.UUID) -> str:
    if conn.execute("SELECT 1 FROM memories WHERE user_id = %s AND id = %s", (user, memory_id)).fetchone():
        return "hot"
    if conn.execute(
        "SELECT 1 FROM archived_memories WHERE user_id = %s AND original_id = %s", (user, memory_id)
    ).fetchone():
        return "archived"
    return "missing"


def test_the_demo_answers_who_is_from_facts_with_each_sources_id_and_tier(conn, history, local_store, capsys):
    services = ArchivalServices(ExtractiveSummarizer(), EMB, local_store)
    assert run_batch(conn, services, ArchivalCriteria(), batch_key="n1", as_of=END, actor="test").gate_passed
    assert _consolidation(conn, EMB, "UTC") is True  # checks green
    first = capsys.readouterr().out
    who = re.search(
        r"^who is (.+)\? \((\S+), answered from facts, with their sources\)$", first, re.MULTILINE
    )
    assert who, first
    name, user = who.group(1), who.group(2)
    # A source printed as archived goes back to hot memory (restore): the next run prints it as hot.
    fact, archived_source = next(
        (line[: line.index(" (from ")], uuid.UUID(i))
        for line in first.splitlines()
        if line.startswith("  - ")
        for i, t in _SOURCE.findall(line)
        if t == "archived"
    )
    restore_archive(conn, local_store, user_id=user, original_id=archived_source, actor="test")

    assert _consolidation(conn, EMB, "UTC") is True  # the month is rebuilt for the restore: still fresh
    out = capsys.readouterr().out
    lines = out[out.index(f"who is {name}?") :].splitlines()[1:]
    facts = [line for line in lines if line.startswith("  - ")]
    assert facts and any(f"has manager {name} (" in x for x in facts), out
    shown = [(uuid.UUID(i), t) for line in facts for i, t in _SOURCE.findall(line)]
    assert shown, out
    for memory_id, tier in shown:  # every printed source: a memory of this user, with its tier as stored
        assert tier == _tier(conn, user, memory_id) != "missing"
    assert {t for _, t in shown} <= {"hot", "archived"}
    line = next(x for x in facts if x.startswith(f"{fact} (from "))
    assert dict(_SOURCE.findall(line))[str(archived_source)] == "hot"
    subject_predicate_object = fact.removeprefix("  - ")
    ids = conn.execute(
        """SELECT array_agg(DISTINCT s) AS ids FROM memory_facts, unnest(source_memory_ids) AS s
           WHERE user_id = %s AND subject || ' ' || predicate || ' ' || object = %s""",
        (user, subject_predicate_object),
    ).fetchone()["ids"]
    counts = re.search(r"(\d+) sources?, (\d+) archived", line)
    assert counts and int(counts.group(1)) == len(ids) and archived_source in ids
    assert int(counts.group(2)) == sum(_tier(conn, user, i) == "archived" for i in ids)
