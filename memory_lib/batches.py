"""Summaries of a backlog through the providers' batch APIs (half the list price).

Anthropic Message Batches (`client.messages.batches.create/retrieve/results/list`) or the OpenAI
Batch API (`client.files.create` + `client.batches.create/retrieve/list`, results as JSONL files).
archive.summarize_batch comes here when an archival batch holds more than `llm.batch_threshold`
memories without a summary, or when some of them already wait in a provider batch.

Why the summarize stage polls (with a bounded wait) rather than a Dagster sensor: the embed, backup,
gate and commit stages of the same run need the summaries, and one code path then serves the CLI,
the Dagster Slow Path and the bench alike. The wait is bounded (`llm.batch_wait_seconds`, and the
step deadline); a batch still running after it keeps its memories claimed with their submission
recorded, and the next run of the night (or the next night, after a takeover) polls it again instead
of submitting anew. The lease of the archival batch is renewed at every poll.

Crash safety (no memory is submitted twice):
1. the submission's intent is written first, in one transaction: an llm_batches row with a
   deterministic key (the archival batch and a hash of its memory ids) in status 'submitting', and
   the key on each memory's attempt (archival_attempts.llm_submission);
2. then the provider is asked to create the batch; then its id is recorded ('submitted');
3. a run that finds a 'submitting' row (a crash between 1 and 2's end) first looks the provider's
   recent batches up: OpenAI by `metadata.submission_key`; Anthropic (whose batches carry no metadata)
   by creation time after the intent and the same request count, not yet recorded by any row. Found:
   adopted. Not found: the create never reached the provider, and only then is it submitted.
Results are applied per memory (custom_id = memory id): a succeeded result is summarized and
checkpointed, an errored one is that memory's failure (retried by the next run), a canceled or
expired one (or every memory of a batch that expired or was canceled without results) is summarized
synchronously in the same step. Ledger rows of batch results are keyed by (provider batch, memory):
collecting the same results twice after a crash records them once.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from .errors import SummarizationError

log = logging.getLogger(__name__)

# Anthropic: ended. OpenAI: completed, failed, expired, cancelled.
_ENDED = {"ended", "completed", "failed", "expired", "cancelled"}
# How far back a 'submitting' intent looks for a batch the provider may have created for it.
_ADOPT_SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class ItemResult:
    """One memory's result in a provider batch."""

    memory_id: uuid.UUID
    kind: str  # "succeeded", "errored", "canceled" or "expired"
    response: Any = None  # the provider's message / chat completion, when succeeded
    error: str | None = None


@dataclass(frozen=True)
class ProviderBatch:
    id: str
    status: str  # normalized: "in_progress", "ended", "expired", "canceled", "failed"
    created_at: datetime
    total: int
    metadata: dict[str, str]


class BatchClient:
    """One provider's batch endpoints, through its SDK and the summarizer's retries."""

    def __init__(self, summarizer: Any):
        self.summarizer = summarizer
        self.kind = summarizer.kind
        self.client = summarizer.client

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        return self.summarizer.call(fn, what)

    # -- submit ----------------------------------------------------------------------------------

    def create(self, submission_key: str, requests: list[tuple[uuid.UUID, dict[str, Any]]]) -> str:
        if self.kind == "anthropic":
            batch = self._call("batch create", lambda: self.client.messages.batches.create(
                requests=[{"custom_id": str(mid), "params": params} for mid, params in requests]))  # fmt: skip
            return batch.id
        lines = "".join(
            json.dumps({"custom_id": str(mid), "method": "POST", "url": "/v1/chat/completions", "body": params}) + "\n"
            for mid, params in requests
        )
        data = lines.encode("utf-8")
        uploaded = self._call("batch file upload", lambda: self.client.files.create(
            file=(f"{submission_key}.jsonl", io.BytesIO(data)), purpose="batch"))  # fmt: skip
        batch = self._call("batch create", lambda: self.client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
            metadata={"submission_key": submission_key[:512]}))  # fmt: skip
        return batch.id

    # -- poll ------------------------------------------------------------------------------------

    def _normalize(self, b: Any) -> ProviderBatch:
        if self.kind == "anthropic":
            counts = b.request_counts
            total = counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
            status = "ended" if b.processing_status == "ended" else "in_progress"
            return ProviderBatch(b.id, status, b.created_at, total, {})
        status = {"completed": "ended", "expired": "expired", "cancelled": "canceled", "failed": "failed"}.get(
            b.status, "in_progress")  # fmt: skip
        total = b.request_counts.total if b.request_counts else 0
        created = datetime.fromtimestamp(b.created_at, UTC)
        return ProviderBatch(b.id, status, created, total, dict(b.metadata or {}))

    def retrieve(self, batch_id: str) -> ProviderBatch:
        if self.kind == "anthropic":
            return self._normalize(self._call("batch retrieve", lambda: self.client.messages.batches.retrieve(batch_id)))
        return self._normalize(self._call("batch retrieve", lambda: self.client.batches.retrieve(batch_id)))

    def recent(self, limit: int = 100) -> list[ProviderBatch]:
        """The provider's most recent batches (one page: enough for the minutes a crash spans)."""
        if self.kind == "anthropic":
            page = self._call("batch list", lambda: self.client.messages.batches.list(limit=limit))
        else:
            page = self._call("batch list", lambda: self.client.batches.list(limit=limit))
        return [self._normalize(b) for b in page.data]

    # -- results ---------------------------------------------------------------------------------

    def results(self, batch_id: str) -> Iterator[ItemResult]:
        if self.kind == "anthropic":
            for r in self._call("batch results", lambda: list(self.client.messages.batches.results(batch_id))):
                kind = r.result.type
                error = None
                if kind == "errored":
                    err = getattr(r.result, "error", None)
                    error = f"batch request errored: {getattr(getattr(err, 'error', err), 'message', err)}"
                yield ItemResult(uuid.UUID(r.custom_id), kind, getattr(r.result, "message", None), error)
            return
        from openai.types.chat import ChatCompletion

        batch = self._call("batch retrieve", lambda: self.client.batches.retrieve(batch_id))
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            text = self._call("batch results", lambda f=file_id: self.client.files.content(f).text)
            for line in text.splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                mid = uuid.UUID(row["custom_id"])
                response = row.get("response") or {}
                if response.get("status_code") == 200 and not row.get("error"):
                    yield ItemResult(mid, "succeeded", ChatCompletion.model_validate(response["body"]))
                    continue
                err = row.get("error") or (response.get("body") or {}).get("error") or {}
                code = err.get("code") if isinstance(err, dict) else None
                kind = "expired" if code == "batch_expired" else "canceled" if code == "batch_cancelled" else "errored"
                message = err.get("message") if isinstance(err, dict) else str(err)
                yield ItemResult(mid, kind, None, f"batch request {kind}: {message}")


def supports_batches(summarizer: Any) -> bool:
    return getattr(summarizer, "kind", None) in ("anthropic", "openai") and hasattr(summarizer, "client")


def submission_key(batch_key: str, memory_ids: list[uuid.UUID]) -> str:
    digest = hashlib.sha256("\n".join(sorted(str(m) for m in memory_ids)).encode()).hexdigest()[:16]
    return f"{batch_key}:{digest}"


# --------------------------------------------------------------------------- the submission's state


def record_intent(conn: psycopg.Connection, batch_key: str, key: str, provider: str, model: str,
                  memory_ids: list[uuid.UUID]) -> None:  # fmt: skip
    """Step 1: the submission row and each memory's pointer to it, in one transaction."""
    with conn.transaction():
        conn.execute(
            """INSERT INTO llm_batches (submission_key, batch_key, provider, model, memory_ids)
               VALUES (%s, %s, %s, %s, %s) ON CONFLICT (submission_key) DO NOTHING""",
            (key, batch_key, provider, model, memory_ids),
        )
        conn.execute(
            """UPDATE archival_attempts SET llm_submission = %s, updated_at = now()
               WHERE batch_key = %s AND memory_id = ANY(%s) AND status = 'claimed'""",
            (key, batch_key, memory_ids),
        )


def record_submitted(conn: psycopg.Connection, key: str, provider_batch_id: str) -> None:
    """Step 2's end: the provider's id on the submission."""
    conn.execute(
        """UPDATE llm_batches SET provider_batch_id = %s, status = 'submitted', submitted_at = now()
           WHERE submission_key = %s AND provider_batch_id IS NULL""",
        (provider_batch_id, key),
    )


def adopt_or_forget(conn: psycopg.Connection, api: BatchClient, sub: dict[str, Any]) -> str | None:
    """A 'submitting' row (crash during submit): the provider's batch made for it, if one exists."""
    known = {r["provider_batch_id"] for r in conn.execute(
        "SELECT provider_batch_id FROM llm_batches WHERE provider_batch_id IS NOT NULL").fetchall()}  # fmt: skip
    since = sub["created_at"] - _ADOPT_SKEW
    for b in api.recent():
        if b.id in known:
            continue
        if b.metadata.get("submission_key") == sub["submission_key"][:512] or (
            api.kind == "anthropic" and b.created_at >= since and b.total == len(sub["memory_ids"])
        ):
            record_submitted(conn, sub["submission_key"], b.id)
            log.warning("adopted provider batch %s for submission %s after a crash", b.id, sub["submission_key"])
            return b.id
    return None


def open_submissions(conn: psycopg.Connection, keys: set[str]) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT * FROM llm_batches WHERE submission_key = ANY(%s) ORDER BY created_at", (list(keys),)
    ).fetchall()


def mark(conn: psycopg.Connection, key: str, status: str, error: str | None = None) -> None:
    stamp = {"ended": "ended_at", "collected": "collected_at", "expired": "ended_at", "canceled": "ended_at",
             "failed": "ended_at"}.get(status)  # fmt: skip
    conn.execute(
        f"""UPDATE llm_batches SET status = %s, error = coalesce(%s, error)
                {f', {stamp} = coalesce({stamp}, now())' if stamp else ''}
            WHERE submission_key = %s""",
        (status, error, key),
    )


def release_memories(conn: psycopg.Connection, key: str, memory_ids: list[uuid.UUID]) -> None:
    """These memories no longer wait in submission `key`."""
    conn.execute(
        "UPDATE archival_attempts SET llm_submission = NULL WHERE llm_submission = %s AND memory_id = ANY(%s)",
        (key, memory_ids),
    )


def wait_deadline(poll_started: float, wait_seconds: float, step_deadline: float) -> float:
    return min(poll_started + wait_seconds, step_deadline)


def sleep_until_next_poll(poll_seconds: float, deadline: float, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Sleep one poll interval (not past the deadline); False when the deadline has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    sleep(min(poll_seconds, left))
    return True


def describe_failure(kind: str, error: str | None) -> SummarizationError:
    return SummarizationError(error or f"batch request {kind}")
