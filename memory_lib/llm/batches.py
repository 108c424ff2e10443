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
   adopted. Not found: the create never reached the provider, and only then is it submitted, unless
   the intent is older than LOOKUP_WINDOW: then it is marked 'failed' and its memories released (the
   summarize step summarizes them synchronously), so no intent holds memories for ever.
A create that fails is one of two kinds (`not_created`). The provider definitely has no batch (it
answered 4xx: a bad key 401, no permission 403, a refused request 400/413/429; the connection was
refused or the host not found, before any byte was sent; or OpenAI's file upload failed): the intent
is marked 'failed' with why, and its memories are released to synchronous summaries in the same run.
It may have one (a timeout, a 5xx, a connection lost mid-request): the intent stays 'submitting' with
the error recorded, for the next run to look up as in 3. Such a create is not retried by the
summarizer's retries either, which could otherwise create a second batch.
Results are applied per memory (custom_id = memory id): a succeeded result is summarized and
checkpointed, an errored one is that memory's failure (retried by the next run), a canceled or
expired one (or every memory of a batch that expired or was canceled without results) is summarized
synchronously in the same step. Ledger rows of batch results are keyed by (provider batch, memory):
collecting the same results twice after a crash records them once.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..core.errors import SummarizationError
from ..core.rows import Conn, server_now
from ..core.statuses import OPEN_STATUSES
from .client import LLMClient

log = logging.getLogger(__name__)

# Anthropic: ended. OpenAI: completed, failed, expired, cancelled.
_ENDED = {"ended", "completed", "failed", "expired", "cancelled"}
# How far back a 'submitting' intent looks for a batch the provider may have created for it.
_ADOPT_SKEW = timedelta(minutes=5)
# How long a 'submitting' intent whose batch the provider's recent list does not show is submitted
# again; older, it is released. A run of the same night (a retry) resubmits; the next night releases.
LOOKUP_WINDOW = timedelta(hours=12)
# Providers end a batch within 24 h (Anthropic's expiry, OpenAI's completion window): one submitted
# longer ago than this and still not collected is stalled.
SUBMITTED_STALLS_AFTER = timedelta(hours=26)


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
    """One provider's batch endpoints, through the summarizer's LLM client: its SDK client, rate limit
    and retries."""

    def __init__(self, summarizer: Any):
        # An LLM summarizer (supports_batches); its requests and answers are the sync path's.
        self.llm: LLMClient = summarizer.llm
        self.kind = self.llm.kind
        self.client = self.llm.client

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        return self.llm.call(fn, what)

    # -- submit ----------------------------------------------------------------------------------

    def create(self, submission_key: str, requests: list[tuple[uuid.UUID, dict[str, Any]]]) -> str:
        """The provider's batch id. Raises SummarizationError; `not_created(exc)` tells whether the
        provider definitely has no batch for it."""
        if self.kind == "anthropic":
            batch = self._call(
                "batch create",
                _once_if_ambiguous(
                    lambda: self.client.messages.batches.create(
                        requests=[{"custom_id": str(mid), "params": params} for mid, params in requests]
                    )
                ),
            )
            return batch.id
        lines = "".join(
            json.dumps(
                {"custom_id": str(mid), "method": "POST", "url": "/v1/chat/completions", "body": params}
            )
            + "\n"
            for mid, params in requests
        )
        data = lines.encode("utf-8")
        try:
            uploaded = self._call(
                "batch file upload",
                lambda: self.client.files.create(
                    file=(f"{submission_key}.jsonl", io.BytesIO(data)), purpose="batch"
                ),
            )
        except SummarizationError as exc:
            raise NotCreated(str(exc)) from exc  # no batch without its input file
        batch = self._call(
            "batch create",
            _once_if_ambiguous(
                lambda: self.client.batches.create(
                    input_file_id=uploaded.id,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                    metadata={"submission_key": submission_key[:512]},
                )
            ),
        )
        return batch.id

    # -- poll ------------------------------------------------------------------------------------

    def _file_text(self, file_id: str) -> str:
        return self.client.files.content(file_id).text

    def _normalize(self, b: Any) -> ProviderBatch:
        if self.kind == "anthropic":
            counts = b.request_counts
            total = counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
            status = "ended" if b.processing_status == "ended" else "in_progress"
            return ProviderBatch(b.id, status, b.created_at, total, {})
        status = {
            "completed": "ended",
            "expired": "expired",
            "cancelled": "canceled",
            "failed": "failed",
        }.get(b.status, "in_progress")
        total = b.request_counts.total if b.request_counts else 0
        created = datetime.fromtimestamp(b.created_at, UTC)
        return ProviderBatch(b.id, status, created, total, dict(b.metadata or {}))

    def retrieve(self, batch_id: str) -> ProviderBatch:
        if self.kind == "anthropic":
            return self._normalize(
                self._call("batch retrieve", lambda: self.client.messages.batches.retrieve(batch_id))
            )
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
            for r in self._call(
                "batch results", lambda: list(self.client.messages.batches.results(batch_id))
            ):
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
            text = self._call("batch results", functools.partial(self._file_text, file_id))
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
                kind = (
                    "expired"
                    if code == "batch_expired"
                    else "canceled"
                    if code == "batch_cancelled"
                    else "errored"
                )
                message = err.get("message") if isinstance(err, dict) else str(err)
                yield ItemResult(mid, kind, None, f"batch request {kind}: {message}")


class NotCreated(SummarizationError):
    """A submission failed before the provider could create its batch."""


class OutcomeUnknown(Exception):
    """A create that failed after its request may have reached the provider. Not retryable (no status,
    not a connection error): a retry could create a second batch. The original is its __cause__."""

    def __init__(self, exc: BaseException):
        status = getattr(exc, "status_code", None)
        super().__init__(f"{f'HTTP {status} ' if isinstance(status, int) else ''}{type(exc).__name__}: {exc}")


def _once_if_ambiguous(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return fn()
        except Exception as exc:
            if not not_created(exc):
                raise OutcomeUnknown(exc) from exc
            raise

    return run


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < 10:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)


def not_created(exc: BaseException) -> bool:
    """Whether a failed `BatchClient.create` definitely left no batch at the provider (see the module
    docstring); False when it may have created one."""
    chain = list(_chain(exc))
    if any(isinstance(e, NotCreated) for e in chain):
        return True
    if any(isinstance(e, (TimeoutError, OutcomeUnknown)) or "Timeout" in type(e).__name__ for e in chain):
        return False  # the request may have been read (a connect timeout too: not worth the distinction)
    for e in chain:
        status = getattr(e, "status_code", None)
        if isinstance(status, int):
            return 400 <= status < 500  # refused; a 5xx or a 2xx that did not parse may have created it
    # Refused or not resolved before any byte was sent (the SDKs' APIConnectionError wraps httpx's
    # ConnectError, which wraps ConnectionRefusedError / socket.gaierror). A reset mid-request is not.
    return any(
        isinstance(e, (ConnectionRefusedError, socket.gaierror)) or type(e).__name__ == "ConnectError"
        for e in chain
    )


def describe_submit_failure(exc: BaseException) -> str:
    """Why a create failed, in words an operator can act on, with the provider's error."""
    if not not_created(exc):
        what = "outcome unknown (the provider may have created the batch; the next run looks it up)"
    elif any(isinstance(getattr(e, "status_code", None), int) for e in _chain(exc)):
        what = "the provider rejected the submission"
    else:
        what = "the submission did not reach the provider"
    return f"{what}: {' '.join(str(exc).split())}"[:500]


def supports_batches(summarizer: Any) -> bool:
    """A summarizer over an LLM client (memory_lib.llm.summarize.LLMSummarizer); the offline one has none."""
    return isinstance(getattr(summarizer, "llm", None), LLMClient)


def submission_key(batch_key: str, memory_ids: list[uuid.UUID]) -> str:
    digest = hashlib.sha256("\n".join(sorted(str(m) for m in memory_ids)).encode()).hexdigest()[:16]
    return f"{batch_key}:{digest}"


# --------------------------------------------------------------------------- the submission's state


def record_intent(
    conn: Conn, batch_key: str, key: str, provider: str, model: str, memory_ids: list[uuid.UUID]
) -> None:
    """Step 1: the submission row and each memory's pointer to it, in one transaction. The same
    memories submitted again after a create the provider refused ('failed', no provider batch) are a
    new intent: its time and error start over."""
    with conn.transaction():
        conn.execute(
            # The time comes in VALUES (EXCLUDED.created_at): Citus refuses now() in DO UPDATE SET.
            """INSERT INTO llm_batches (submission_key, batch_key, provider, model, memory_ids, created_at)
               VALUES (%s, %s, %s, %s, %s, now())
               ON CONFLICT (submission_key) DO UPDATE
                 SET status = 'submitting', error = NULL, created_at = EXCLUDED.created_at, ended_at = NULL
                 WHERE llm_batches.status = 'failed' AND llm_batches.provider_batch_id IS NULL""",
            (key, batch_key, provider, model, memory_ids),
        )
        conn.execute(
            """UPDATE archival_attempts SET llm_submission = %s, updated_at = now()
               WHERE batch_key = %s AND memory_id = ANY(%s) AND status = 'claimed'""",
            (key, batch_key, memory_ids),
        )


def record_submitted(conn: Conn, key: str, provider_batch_id: str) -> None:
    """Step 2's end: the provider's id on the submission."""
    conn.execute(
        """UPDATE llm_batches SET provider_batch_id = %s, status = 'submitted', submitted_at = now(), error = NULL
           WHERE submission_key = %s AND provider_batch_id IS NULL""",
        (provider_batch_id, key),
    )


def adopt_or_forget(conn: Conn, api: BatchClient, sub: dict[str, Any]) -> str | None:
    """A 'submitting' row (crash during submit): the provider's batch made for it, if one exists."""
    known = {
        r["provider_batch_id"]
        for r in conn.execute(
            "SELECT provider_batch_id FROM llm_batches WHERE provider_batch_id IS NOT NULL"
        ).fetchall()
    }
    since = sub["created_at"] - _ADOPT_SKEW
    for b in api.recent():
        if b.id in known:
            continue
        if b.metadata.get("submission_key") == sub["submission_key"][:512] or (
            api.kind == "anthropic" and b.created_at >= since and b.total == len(sub["memory_ids"])
        ):
            record_submitted(conn, sub["submission_key"], b.id)
            log.warning(
                "adopted provider batch %s for submission %s after a crash", b.id, sub["submission_key"]
            )
            return b.id
    return None


def past_lookup_window(sub: dict[str, Any], now: datetime | None = None) -> bool:
    """Whether a 'submitting' intent is older than LOOKUP_WINDOW (it is then released, not resubmitted)."""
    return (now or datetime.now(UTC)) - sub["created_at"] > LOOKUP_WINDOW


def open_submissions(conn: Conn, keys: set[str]) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT * FROM llm_batches WHERE submission_key = ANY(%s) ORDER BY created_at", (list(keys),)
    ).fetchall()


def mark(conn: Conn, key: str, status: str, error: str | None = None) -> None:
    stamp = {
        "ended": "ended_at",
        "collected": "collected_at",
        "expired": "ended_at",
        "canceled": "ended_at",
        "failed": "ended_at",
    }.get(status)
    now = server_now(conn) if stamp else None  # a parameter: Citus refuses now() inside COALESCE
    conn.execute(
        f"""UPDATE llm_batches SET status = %(status)s, error = coalesce(%(error)s, error)
                {f", {stamp} = coalesce({stamp}, %(now)s)" if stamp else ""}
            WHERE submission_key = %(key)s""",
        {"status": status, "error": error, "now": now, "key": key},
    )


def release_memories(conn: Conn, key: str, memory_ids: list[uuid.UUID]) -> None:
    """These memories no longer wait in submission `key`."""
    conn.execute(
        "UPDATE archival_attempts SET llm_submission = NULL WHERE llm_submission = %s AND memory_id = ANY(%s)",
        (key, memory_ids),
    )


# --------------------------------------------------------------------------- what is stalled

# A 'submitting' intent this old without an error is a run that died while submitting.
_SUBMITTING_STALLS_AFTER = timedelta(minutes=15)


@dataclass(frozen=True)
class Held:
    """The memories of open archival attempts that still wait in one submission."""

    submission_key: str
    status: str
    since: datetime  # the intent's time
    age_seconds: float
    memories: int
    provider_batch_id: str | None
    error: str | None

    @property
    def stalled(self) -> bool:
        """Waiting on a failure, not on the provider's work: a create left without a batch (its error
        recorded, or a run died while submitting), or a batch older than the providers' 24 h."""
        if self.status == "submitting":
            return self.error is not None or self.age_seconds > _SUBMITTING_STALLS_AFTER.total_seconds()
        if self.status in ("submitted", "ended"):
            return self.age_seconds > SUBMITTED_STALLS_AFTER.total_seconds()
        return False  # done with yet still pointed at (a run died between two writes): the next run releases

    def describe(self) -> str:
        text = (
            f"{self.memories} memories held by LLM batch {self.submission_key} in status '{self.status}' "
            f"since {self.since.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
        )
        if self.error:
            return f"{text}: {self.error}"
        if self.status == "submitting" and self.stalled:
            return f"{text}: a run stopped while submitting it; the next run looks it up"
        if self.provider_batch_id and self.status in ("submitted", "ended"):
            return f"{text} (provider batch {self.provider_batch_id}" + (
                ", past the providers' 24 h)" if self.stalled else ", still running)"
            )
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "submission_key": self.submission_key,
            "status": self.status,
            "since": self.since,
            "age_seconds": round(self.age_seconds),
            "memories": self.memories,
            "provider_batch_id": self.provider_batch_id,
            "error": self.error,
            "stalled": self.stalled,
        }


def held_submissions(conn: Conn, batch_key: str | None = None, limit: int = 20) -> list[Held]:
    """Submissions that open attempts (of `batch_key`, or of any batch) still wait in, oldest first."""
    rows = conn.execute(
        """SELECT b.submission_key, b.status, b.created_at, b.provider_batch_id, b.error,
                  extract(epoch FROM now() - b.created_at)::float8 AS age, count(*) AS n
           FROM archival_attempts a JOIN llm_batches b ON b.submission_key = a.llm_submission
           WHERE a.status = ANY(%(open)s) AND (%(batch)s::text IS NULL OR a.batch_key = %(batch)s)
           GROUP BY b.submission_key ORDER BY b.created_at, b.submission_key LIMIT %(limit)s""",
        {"open": list(OPEN_STATUSES), "batch": batch_key, "limit": limit},
    ).fetchall()
    return [
        Held(
            r["submission_key"],
            r["status"],
            r["created_at"],
            r["age"],
            r["n"],
            r["provider_batch_id"],
            r["error"],
        )
        for r in rows
    ]


def refused_submissions(
    conn: Conn, memory_ids: list[uuid.UUID], since: datetime, limit: int = 3
) -> list[dict[str, Any]]:
    """Submissions of these memories that failed since `since` (the provider refused them, or had no
    batch for them), newest first, with why."""
    return conn.execute(
        """SELECT submission_key, cardinality(memory_ids) AS memories, ended_at, error FROM llm_batches
           WHERE status = 'failed' AND provider_batch_id IS NULL AND ended_at >= %s AND memory_ids && %s
           ORDER BY ended_at DESC LIMIT %s""",
        (since, memory_ids, limit),
    ).fetchall()


def submission_stats(conn: Conn) -> dict[str, Any]:
    """LLM batch submissions by status (how many, the oldest's time and age in seconds, the memories
    open attempts still wait in them for), and the submissions holding memories, oldest first."""
    rows = conn.execute(
        """WITH h AS (SELECT llm_submission AS key, count(*) AS n FROM archival_attempts
                      WHERE llm_submission IS NOT NULL AND status = ANY(%s) GROUP BY 1)
           SELECT b.status, count(*) AS submissions, min(b.created_at) AS oldest_since,
                  round(extract(epoch FROM now() - min(b.created_at)))::bigint AS oldest_age_seconds,
                  coalesce(sum(h.n), 0)::bigint AS memories_held
           FROM llm_batches b LEFT JOIN h ON h.key = b.submission_key GROUP BY 1 ORDER BY 1""",
        (list(OPEN_STATUSES),),
    ).fetchall()
    holding = held_submissions(conn)
    fields = ("submissions", "oldest_since", "oldest_age_seconds", "memories_held")
    return {
        "by_status": {r["status"]: {k: r[k] for k in fields} for r in rows},
        "holding": [h.as_dict() for h in holding],
        "stalled": [h.describe() for h in holding if h.stalled],
    }


def wait_deadline(poll_started: float, wait_seconds: float, step_deadline: float) -> float:
    return min(poll_started + wait_seconds, step_deadline)


def sleep_until_next_poll(
    poll_seconds: float, deadline: float, sleep: Callable[[float], None] = time.sleep
) -> bool:
    """Sleep one poll interval (not past the deadline); False when the deadline has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    sleep(min(poll_seconds, left))
    return True


def describe_failure(kind: str, error: str | None) -> SummarizationError:
    return SummarizationError(error or f"batch request {kind}")
