"""Backup fidelity: every backup object of a batch read back and compared with its source, field by
field (the embedding bit for bit), before any original is deleted. A failure sends the memory back
to be backed up again and fails the batch's fidelity gate; nothing is deleted on a failed round trip.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.config import ArchivalCriteria
from ..core.errors import IntegrityError
from ..core.models import BackupObject, sha256_hex, to_float32
from ..core.rows import Conn, Row
from ..core.statuses import AttemptStatus, Step
from ..lifecycle.forget import forgetting
from ..storage import packs
from ..storage.objectstore import ObjectStore
from ..storage.store import fetch_memories
from .archive import StepResult, backup_still_matches, record_failure, return_to_status, run_parallel


@dataclass
class FidelityReport:
    """Every backup object of a batch read back and compared with its source."""

    batch_key: str
    checked: int = 0
    faithful: int = 0
    stale: int = 0  # the hot row changed after its backup: commit backs it up again, nothing is lost
    erased: int = 0  # a forget erased the memory (and its backup) while it was read: not a failure
    bytes_read: int = 0
    seconds: float = 0.0
    failures: dict[uuid.UUID, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures


_BACKUP_FIELDS = (
    "schema_version",
    "original_id",
    "user_id",
    "content",
    "embedding",
    "entity_links",
    "metadata",
    "importance_score",
    "created_at",
    "archived_at",
    "archive_reason",
)


def differences(doc: BackupObject, expected: dict[str, Any]) -> list[str]:
    """Names of the fields of `doc` that differ from `expected` (embedding compared bit for bit)."""
    bad = []
    for name in _BACKUP_FIELDS:
        if name not in expected:
            continue
        got, want = getattr(doc, name), expected[name]
        if name == "embedding":
            same = doc.embedding_array().tobytes() == np.asarray(want, dtype=np.float32).tobytes()
        elif name == "entity_links":
            same = list(got) == list(want or [])
        else:
            same = got == want
        if not same:
            bad.append(name)
    return bad


def verify_backups(
    conn: Conn,
    store: ObjectStore,
    batch_key: str,
    *,
    workers: int = 8,
    deadline: float | None = None,
) -> FidelityReport:
    """Read back every backup object the batch wrote and compare it with its source.

    Source: the live row while the memory is hot (every backup field, the embedding bit for bit),
    else its archive row and the attempt's record (ids, scores, timestamps, reference, sha256 and size).
    """
    started = time.monotonic()
    report = FidelityReport(batch_key)
    attempts = conn.execute(
        """SELECT memory_id, user_id, status, archive_reason, backup_key, backup_ref, backup_sha256,
                  backup_size_bytes, backup_archived_at, backup_row_xmin
           FROM archival_attempts
           WHERE batch_key = %s AND status IN ('backed_up', 'archived') AND backup_key IS NOT NULL
           ORDER BY memory_id""",
        (batch_key,),
    ).fetchall()
    if not attempts:
        return report
    ids = [a["memory_id"] for a in attempts]
    users = sorted({a["user_id"] for a in attempts})
    live = fetch_memories(conn, ids, users=users, with_xmin=True)
    archived = {
        r["original_id"]: r
        for r in conn.execute(
            f"""SELECT a.original_id, a.user_id, a.importance_score, a.original_created_at, a.archived_at,
                       a.archive_reason, {packs.backup_sql("a")}, a.backup_size_bytes
               FROM archived_memories a WHERE a.user_id = ANY(%s) AND a.original_id = ANY(%s)""",
            (users, ids),
        ).fetchall()
    }

    # One read per object: a pack's members are cut from one GET (memory_lib.storage.packs).
    by_key: dict[str, list[Row]] = {}
    for a in attempts:
        by_key.setdefault(a["backup_key"], []).append(a)

    def read_and_check(key: str) -> list[tuple[Row, int, tuple[str, str | None]]]:
        group = by_key[key]
        try:
            data = store.get(key)
        except Exception as exc:
            return [(a, 0, ("failed", f"read failed: {type(exc).__name__}: {exc}"[:300])) for a in group]
        out: list[tuple[Row, int, tuple[str, str | None]]] = []
        for a in group:
            try:
                member = store.locate(a["backup_ref"])[1]
            except Exception as exc:
                out.append((a, 0, ("failed", f"bad ref: {exc}"[:300])))
                continue
            part = data if member is None else data[member[0] : member[0] + member[1]]
            mid = a["memory_id"]
            out.append((a, len(part), _check_one(a, part, live.get(mid), archived.get(mid), store)))
        return out

    for key, outcome in run_parallel(read_and_check, list(by_key), workers, deadline=deadline):
        if isinstance(outcome, BaseException):
            outcome = [
                (a, 0, ("failed", f"read failed: {type(outcome).__name__}: {outcome}"[:300]))
                for a in by_key[key]
            ]
        for attempt, size, (verdict, problem) in outcome:
            report.checked += 1
            mid = attempt["memory_id"]
            report.bytes_read += size
            if verdict == "failed":
                report.failures[mid] = problem or "?"
            elif verdict == "stale":
                report.stale += 1
            else:
                report.faithful += 1
    if report.failures:
        _drop_erased(conn, report, attempts)
    report.seconds = time.monotonic() - started
    return report


def _drop_erased(conn: Conn, report: FidelityReport, attempts: list[Row]) -> None:
    """A forget that began after the attempts were read deletes its user's backups, then its rows
    (memory_lib.lifecycle.forget): a read that failed on such a memory is the erasure, not a bad backup.
    Those leave the failures: the memory's attempt is gone, or an open forget covers it."""
    failed = [a for a in attempts if a["memory_id"] in report.failures]
    users = sorted({a["user_id"] for a in failed})
    present = {
        r["memory_id"]
        for r in conn.execute(
            """SELECT memory_id FROM archival_attempts
               WHERE batch_key = %s AND user_id = ANY(%s) AND memory_id = ANY(%s)""",
            (report.batch_key, users, [a["memory_id"] for a in failed]),
        ).fetchall()
    }
    covered = forgetting(conn, users)
    for a in failed:
        if a["memory_id"] not in present or covered(a["user_id"], a["memory_id"]):
            del report.failures[a["memory_id"]]
            report.erased += 1


def _check_one(
    att: Row,
    data: bytes,
    row: Row | None,
    arch: Row | None,
    store: ObjectStore,
) -> tuple[str, str | None]:
    """("faithful", None), ("stale", None) when the live row changed after its backup (commit backs it
    up again), or ("failed", what differs)."""
    if len(data) != att["backup_size_bytes"]:
        return "failed", f"size {len(data)} != recorded {att['backup_size_bytes']}"
    actual = sha256_hex(data)
    if actual != att["backup_sha256"]:
        return "failed", f"sha256 {actual[:12]}… != recorded {att['backup_sha256'][:12]}…"
    try:
        doc = BackupObject.from_json_bytes(data)
    except IntegrityError as exc:
        return "failed", f"not a backup document: {exc}"
    if row is not None:
        if not backup_still_matches(row, att):
            return "stale", None
        source = BackupObject.from_row(
            row, archived_at=att["backup_archived_at"], archive_reason=att["archive_reason"]
        )
        expected = source.model_dump() | {"embedding": to_float32(row["embedding"])}
        bad = differences(doc, expected)
        if sha256_hex(doc.content) != row["content_sha256"]:
            bad.append("content_sha256")
        return ("failed", f"fields differ from the live row: {', '.join(bad)}") if bad else ("faithful", None)
    if arch is not None:
        expected = {
            "schema_version": 1,
            "original_id": att["memory_id"],
            "user_id": arch["user_id"],
            "importance_score": arch["importance_score"],
            "created_at": arch["original_created_at"],
            "archived_at": arch["archived_at"],
            "archive_reason": arch["archive_reason"],
        }
        bad = differences(doc, expected)
        if (
            arch["backup_sha256"] != att["backup_sha256"]
            or arch["backup_size_bytes"] != att["backup_size_bytes"]
        ):
            bad.append("archive row sha256/size")
        if arch["storage_ref"] != att["backup_ref"]:
            bad.append("archive row storage_ref")
        return (
            ("failed", f"fields differ from the archive row: {', '.join(bad)}") if bad else ("faithful", None)
        )
    return "failed", "memory is neither hot nor archived"


def reset_unfaithful_backups(conn: Conn, report: FidelityReport, criteria: ArchivalCriteria) -> int:
    """Record each failed round trip on its attempt and send still-hot memories back to be backed up again."""
    sent_back = 0
    sink = StepResult(Step.FIDELITY)
    for mid, problem in report.failures.items():
        row = conn.execute(
            "SELECT status, user_id FROM archival_attempts WHERE batch_key = %s AND memory_id = %s",
            (report.batch_key, mid),
        ).fetchone()
        if row is None or row["status"] != "backed_up":
            continue  # an archived memory's backup cannot be rewritten from a source that is gone
        record_failure(
            conn,
            report.batch_key,
            mid,
            Step.FIDELITY,
            IntegrityError("backup", "round trip", problem),
            criteria,
            sink,
            user_id=row["user_id"],
        )
        return_to_status(conn, report.batch_key, mid, AttemptStatus.EMBEDDED, row["user_id"])
        sent_back += 1
    return sent_back
