"""The shipped migrations' comments as they were before migration checksums left comments out.

Until then the runner recorded sha256 of a migration's whole rendered text, comments included. A database
migrated so still holds those checksums; `migrate` accepts one when it is the whole-text checksum of the
migration as it first shipped, and records the comment-free checksum in its place (once). Comments fixed
since are rewritten back here to rebuild that first text: each pair is (the text today, the text as first
shipped), and the current side must stay in the file word for word (tests/storage/test_migration_checksums.py
checks it). Editing a comment named here again means updating the pair's first element, never its second.
"""

from __future__ import annotations

# version -> ((text in the file today, text as first shipped), ...)
FIRST_SHIPPED_COMMENTS: dict[int, tuple[tuple[str, str], ...]] = {
    2: (
        (
            "-- sha256 of (user_id, normalized text), set by the write path (memory_lib.write). NULL for rows\n-- written by other paths (bulk loads, restores): the write path also matches those by content_sha256.\n",
            "-- sha256 of (user_id, normalized text), set by memory_lib.write_path. NULL for rows written by other\n-- paths (bulk loads, restores): the write path also matches those by content_sha256.\n",
        ),
    ),
    4: (
        (
            "-- Liveness of archival claims: no memory stays claimed forever.\n",
            "-- Liveness of archival claims (issue: no memory stays claimed forever).\n",
        ),
    ),
    7: (
        (
            "-- estimates the cosine from the Hamming distance (memory_lib.retrieval.sql); the exact float32 embedding of\n",
            "-- estimates the cosine from the Hamming distance (memory_lib.search); the exact float32 embedding of\n",
        ),
    ),
    8: (
        (
            "-- The retention score of each hot memory (memory_lib.lifecycle.retention) and the superseded rule.\n",
            "-- Issue 12: the retention score of each hot memory (memory_lib.retention) and the superseded rule.\n",
        ),
    ),
    10: (
        (
            "-- (memory_lib.archival.integrity.audit_batch): the archive row, its 'archived' audit event and the\n-- backup object hold what they recorded, and each kept 0.7 KB of Postgres per archived memory. The\n-- batch keeps how many it archived, so batch_status and the night's totals still count them.\n",
            "-- (integrity.audit_batch): the archive row, its 'archived' audit event and the backup object hold\n-- what they recorded, and each kept 0.7 KB of Postgres per archived memory. The batch keeps how many\n-- it archived, so batch_status and the night's totals still count them.\n",
        ),
    ),
    11: (
        (
            "-- (memory_lib.lifecycle.stubs). stubbed_at is the end of the night it became a stub; NULL for a\n-- searchable row.\n",
            "-- (memory_lib.stubs). stubbed_at is the end of the night it became a stub; NULL for a searchable row.\n",
        ),
        (
            "-- Stubs, the third tier. An archive row not expanded for stub_after_days keeps its\n",
            "-- Issue 12: stubs (seed 001's third tier). An archive row not expanded for stub_after_days keeps its\n",
        ),
    ),
    12: (
        (
            "-- archived one, found without a scan (memory_lib.retrieval.associations).\n",
            "-- archived one, found without a scan (memory_lib.associations).\n",
        ),
        (
            "-- re-promotion rule (memory_lib.lifecycle.promotion) counts these with the 'expanded' events in its window.\n",
            "-- re-promotion rule (memory_lib.promotion) counts these with the 'expanded' events in its window.\n",
        ),
        (
            "-- search is a range scan of that index (memory_lib.retrieval.warm), no new index.\n",
            "-- search is a range scan of that index (memory_lib.warm), no new index.\n",
        ),
        (
            "-- Reactivation through associations, and the warm tier in time.\n",
            "-- Issue 12 items 4 and 5 (seeds 001 and 003): reactivation through associations, the warm tier in time.\n",
        ),
    ),
    13: (
        (
            "-- Chunks of one long text carry their parent in metadata.chunk (memory_lib.write.chunking), so the backup\n",
            "-- Chunks of one long text carry their parent in metadata.chunk (memory_lib.chunking), so the backup\n",
        ),
        (
            "-- Expired memories are found without a scan (memory_lib.lifecycle.eligibility).\n",
            "-- Expired memories are found without a scan (memory_lib.eligibility).\n",
        ),
        (
            "-- The archive reasons, once (memory_lib.core.statuses.ArchiveReason;\n-- tests/archival/test_liveness.py compares).\n",
            "-- The archive reasons, once (memory_lib.statuses.ArchiveReason; tests/test_liveness.py compares).\n",
        ),
        (
            "-- The write path and its lifecycle: TTL per memory, the archive reasons as a checked vocabulary, and\n-- the indexes of the memory filters.\n",
            '-- Issue 16, seed 004 "Write Path" and "Retention & Lifecycle": TTL per memory, the archive reasons\n-- as a checked vocabulary, and the indexes of seed 004\'s filters.\n',
        ),
        (
            "-- The filters' index: btree (user_id, type, ts_seen desc).",
            "-- Seed 004: btree (user_id, type, ts_seen desc).",
        ),
    ),
    14: (
        (
            "-- Forget (right to erasure) and the memory API's audit events.\n",
            "-- Issue 14: forget (right to erasure) and the memory API's audit events.\n",
        ),
        ("(each costs bytes on every row).\n", "(each costs bytes on every row, issue 11).\n"),
    ),
    15: (
        (
            "-- pruned after commit. Tokens are the provider's `usage`, normalized (memory_lib.core.pricing): the four\n",
            "-- pruned after commit. Tokens are the provider's `usage`, normalized (memory_lib.pricing): the four\n",
        ),
        ("-- LLM cost from real usage.\n", "-- LLM cost from real usage (issue 15).\n"),
    ),
    16: (
        (
            "    -- Added by the builders (memory_lib.consolidation.facts): the month (period_start of the memories'\n    -- month) the fact was extracted from, so one month's facts are rebuilt alone; and whether the\n    -- predicate holds one value at a time (lives in, manager): only those form validity chains.\n",
            "    -- Added by the builders (memory_lib.facts): the month (period_start of the memories' month) the fact\n    -- was extracted from, so one month's facts are rebuilt alone; and whether the predicate holds one\n    -- value at a time (lives in, manager): only those form validity chains.\n",
        ),
        (
            "-- Consolidation above the per-memory summary: digests and facts.\n",
            "-- Issue 13: consolidation above the per-memory summary (seeds 002 and 003).\n",
        ),
        (
            "    -- a digest's shape: keyTopics, keyPeople, emotionalHighlights, ...\n",
            "    -- seed 003's shape: keyTopics, keyPeople, emotionalHighlights, ...\n",
        ),
    ),
    17: (
        (
            "-- added when a re-embedding starts (memory_lib.lifecycle), not here: their dimension is the\n-- target's, known only then.\n",
            "-- added by memory_lib.reembedding.start, not here: their dimension is the target's, known only then.\n",
        ),
        (
            "-- Changing the embedder (model and/or dimension): dual-write, backfill, flip.\n",
            "-- Issue 14 item 3 (seed 004: dual-write, backfill, flip): changing the embedder (model and/or dimension).\n",
        ),
    ),
    19: (
        (
            "-- of the batch's users and deletes them (memory_lib.archival.integrity.purge_unrecorded_packs). A first run\n",
            "-- of the batch's users and deletes them (memory_lib.integrity.purge_unrecorded_packs). A first run\n",
        ),
    ),
}


def as_first_shipped(version: int, text: str) -> str:
    """The migration file `text` (version `version`) with its comments as they first shipped."""
    for today, first in FIRST_SHIPPED_COMMENTS.get(version, ()):
        text = text.replace(today, first, 1)
    return text
