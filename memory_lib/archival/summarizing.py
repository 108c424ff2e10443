"""The summarize step of the archival pipeline: each claimed memory's summary and key entities, by
the summarizer directly or through a provider's batch API, checkpointed per memory with its cost
(memory_lib.archival.archive runs the steps in order)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from psycopg.types.json import Jsonb

from ..core.config import ArchivalCriteria
from ..core.errors import (
    NotFoundError,
    SummarizationError,
)
from ..core.rows import Conn, Row
from ..core.statuses import AttemptStatus, Step
from ..llm import batches
from ..llm.ledger import LedgerEntry, record_usage
from ..llm.summarize import (
    PaidSummarizationError,
    Summarizer,
    Summary,
    SummaryInput,
    check_summary_text,
    extract_key_entities,
)
from .claims import renew_lease
from .steps import Checkpoints, StepResult, pending_attempts, run_parallel, start_step

log = logging.getLogger("memory_lib.archival.archive")


def summarize_batch(
    conn: Conn,
    batch_key: str,
    summarizer: Summarizer,
    criteria: ArchivalCriteria,
    *,
    workers: int = 4,
) -> StepResult:
    """Summarize every claimed memory of the batch that has no summary yet: synchronously, or through
    the provider's batch API when more than the summarizer's `batch_threshold` are to do or some
    already wait in a provider batch (memory_lib.llm.batches; see _summarize_via_batches).

    Every paid answer goes to the LLM ledger (memory_lib.llm.ledger) before the checkpoints it belongs
    to are written. Entities are the model's own when it gave them (one call, summary and entities),
    else extract_key_entities' (the offline summarizer).
    """
    result = StepResult(Step.SUMMARIZE)
    started = time.monotonic()
    deadline = start_step(conn, batch_key, criteria)
    claimed = pending_attempts(conn, batch_key, AttemptStatus.CLAIMED)
    originals = _summary_inputs(conn, claimed)
    ledger = _LedgerBuffer(conn, batch_key)
    checkpoints = summary_checkpoints(
        conn, batch_key, criteria, result, ledger, {a["memory_id"]: a["user_id"] for a in claimed}
    )
    todo = [a for a in claimed if a["llm_submission"] is None]
    waiting = [a for a in claimed if a["llm_submission"] is not None]
    threshold = getattr(summarizer, "batch_threshold", 0)
    if batches.supports_batches(summarizer) and (waiting or (threshold and len(todo) > threshold)):
        submit = todo if threshold and len(todo) > threshold else []
        todo = [] if submit else todo
        todo += _summarize_via_batches(
            conn,
            batch_key,
            summarizer,
            criteria,
            submit,
            waiting,
            originals,
            ledger,
            checkpoints,
            result,
            deadline,
        )

    def run(attempt: Row):
        row = originals.get(attempt["memory_id"])
        if row is None:
            raise NotFoundError(f"memory {attempt['memory_id']} no longer exists")
        item = SummaryInput(row["content"], row["created_at"], row["domain"], row["category"])
        try:
            summary = summarizer.summarize(item)
        except PaidSummarizationError as exc:
            ledger.add(attempt, exc.spent, "failed")
            raise
        return accept_summary(summary, row, attempt, ledger)

    for attempt, outcome in run_parallel(run, todo, workers, deadline=deadline):
        checkpoints.add(attempt["memory_id"], outcome)
    checkpoints.flush()
    result.seconds = time.monotonic() - started
    return result


def _summary_inputs(conn: Conn, claimed: Sequence[Row]) -> dict[uuid.UUID, Row]:
    """The hot rows a summary is made from, by id: only the columns it reads (the embeddings, most of
    a row's bytes, are not needed until the backup step)."""
    rows = conn.execute(
        """SELECT id, user_id, content, created_at, domain, category FROM memories
           WHERE user_id = ANY(%s) AND id = ANY(%s)""",
        (sorted({r["user_id"] for r in claimed}), [r["memory_id"] for r in claimed]),
    ).fetchall()
    return {r["id"]: r for r in rows}


def _summarize_via_batches(
    conn: Conn,
    batch_key: str,
    summarizer: Any,
    criteria: ArchivalCriteria,
    submit: list[Row],
    waiting: list[Row],
    originals: dict[uuid.UUID, Row],
    ledger: _LedgerBuffer,
    checkpoints: Checkpoints,
    result: StepResult,
    step_deadline_at: float,
) -> list[Row]:
    """Submit `submit` as one provider batch, poll it and the submissions `waiting` memories are in,
    apply what ended (memory_lib.llm.batches). Returns the attempts to summarize synchronously instead
    (their batch expired or was canceled, the provider refused it, or showed none for it past
    batches.LOOKUP_WINDOW: memory_lib.llm.batches says which failures are which); memories of a batch
    still running when the wait ends stay claimed with their submission, counted in result.waiting."""
    api = batches.BatchClient(summarizer)
    by_key: dict[str, dict[uuid.UUID, Row]] = {}
    for a in waiting:
        by_key.setdefault(a["llm_submission"], {})[a["memory_id"]] = a
    fallback: list[Row] = []

    def requests_for(attempts: list[Row]) -> list[tuple[uuid.UUID, Row]]:
        out = []
        for a in attempts:
            row = originals.get(a["memory_id"])
            try:
                if row is None:
                    raise NotFoundError(f"memory {a['memory_id']} no longer exists")
                item = SummaryInput(row["content"], row["created_at"], row["domain"], row["category"])
                if not item.content.strip():
                    raise SummarizationError("memory content is empty: nothing to summarize")
                out.append((a["memory_id"], summarizer.request_params(item)))
            except Exception as exc:
                checkpoints.add(a["memory_id"], exc)
        return out

    sent_now: set[str] = set()

    def release(key: str, why: str) -> None:
        """The provider has no batch for `key`: its memories are summarized one by one instead."""
        batches.mark(conn, key, "failed", why)
        batches.release_memories(conn, key, list(by_key[key]))
        fallback.extend(by_key.pop(key).values())

    def send(key: str, attempts: list[Row]) -> None:
        sent_now.add(key)
        try:
            batches.record_submitted(conn, key, api.create(key, requests_for(attempts)))
        except SummarizationError as exc:
            why = batches.describe_submit_failure(exc)
            if not batches.not_created(exc):
                # The batch may exist (a timeout, a 5xx). Left 'submitting' with why: the next run
                # adopts it or, when the provider has none, submits (released past LOOKUP_WINDOW).
                batches.mark(conn, key, "submitting", why)
                log.warning("submission %s: %s; left for the next run", key, why)
                return
            log.warning("submission %s: %s; its memories are summarized synchronously", key, why)
            release(key, why)

    if submit:
        ids = [a["memory_id"] for a in submit]
        key = batches.submission_key(batch_key, ids)
        batches.record_intent(conn, batch_key, key, summarizer.kind, summarizer.model, ids)
        by_key[key] = {a["memory_id"]: a for a in submit}
        send(key, submit)

    subs = {s["submission_key"]: s for s in batches.open_submissions(conn, set(by_key))}
    for key, sub in list(subs.items()):
        unresolved = sub["status"] == "submitting" and sub["provider_batch_id"] is None
        if not (unresolved and key in by_key and key not in sent_now):
            continue
        lookup_failed = None
        try:
            if batches.adopt_or_forget(conn, api, sub) is not None:
                continue
        except SummarizationError as exc:  # cannot tell whether the provider has it
            lookup_failed = f"looking its batch up at the provider failed: {' '.join(str(exc).split())}"
        if batches.past_lookup_window(sub):  # bounded: released, whether or not the provider answered
            hours = batches.LOOKUP_WINDOW.total_seconds() / 3600
            release(
                key,
                f"{'the provider shows no batch for it' if lookup_failed is None else lookup_failed} "
                f"{hours:g} h after it was submitted (last error: {sub['error'] or 'none recorded'})"[:500],
            )
        elif lookup_failed is not None:  # left for the next run
            batches.mark(conn, key, "submitting", lookup_failed[:500])
            log.warning("submission %s: %s", key, lookup_failed)
        else:
            send(key, list(by_key[key].values()))  # the provider has no batch for it: never submitted
    subs = {s["submission_key"]: s for s in batches.open_submissions(conn, set(by_key))}

    wait_until = batches.wait_deadline(
        time.monotonic(), getattr(summarizer, "batch_wait_seconds", 0.0), step_deadline_at
    )
    for key, sub in subs.items():
        if sub["status"] in ("collected", "failed", "expired", "canceled") and key in by_key:
            # Done with, yet memories still point at it (a crash between its last two writes).
            batches.release_memories(conn, key, list(by_key[key]))
            fallback.extend(by_key.pop(key).values())
    pending = {
        k: s
        for k, s in subs.items()
        if s["provider_batch_id"] and s["status"] in ("submitted", "ended") and k in by_key
    }
    for key in set(by_key) - set(pending):  # no provider batch: a submit without an answer, left for later
        result.waiting += len(by_key[key])
    while pending:
        for key, sub in list(pending.items()):
            pb = api.retrieve(sub["provider_batch_id"])
            if pb.status == "in_progress":
                continue
            del pending[key]
            fallback.extend(
                _collect(conn, api, summarizer, sub, pb.status, by_key[key], originals, ledger, checkpoints)
            )
        if pending:
            renew_lease(conn, batch_key, criteria)
            if not batches.sleep_until_next_poll(getattr(summarizer, "batch_poll_seconds", 30.0), wait_until):
                break
    for key in pending:
        result.waiting += len(by_key[key])
    return fallback


def _collect(
    conn: Conn,
    api: batches.BatchClient,
    summarizer: Any,
    sub: Row,
    status: str,
    attempts: dict[uuid.UUID, Row],
    originals: dict[uuid.UUID, Row],
    ledger: _LedgerBuffer,
    checkpoints: Checkpoints,
) -> list[Row]:
    """Apply an ended provider batch's results to the memories still waiting in it; return those to
    summarize synchronously (canceled or expired, or missing from the results)."""
    key, provider_id = sub["submission_key"], sub["provider_batch_id"]
    batches.mark(conn, key, "ended")
    results = [] if status == "failed" else list(api.results(provider_id))
    fallback: list[Row] = []
    seen: set[uuid.UUID] = set()
    for r in results:
        attempt = attempts.get(r.memory_id)
        if attempt is None or r.memory_id in seen:
            continue  # not ours any more (applied by an earlier collect, or moved on)
        seen.add(r.memory_id)
        if r.kind in ("canceled", "expired"):
            fallback.append(attempt)
            continue
        if r.kind != "succeeded":
            checkpoints.add(r.memory_id, batches.describe_failure(r.kind, r.error))
            continue
        request_id = f"{provider_id}:{r.memory_id}"
        try:
            summary = replace(summarizer.parse_response(r.response, mode="batch"), request_id=request_id)
        except PaidSummarizationError as exc:
            ledger.add(attempt, replace(exc.spent, request_id=request_id), "failed")
            checkpoints.add(r.memory_id, exc)
            continue
        row = originals.get(r.memory_id)
        try:
            if row is None:
                raise NotFoundError(f"memory {r.memory_id} no longer exists")
            outcome: Any = accept_summary(summary, row, attempt, ledger)
        except Exception as exc:
            outcome = exc
        checkpoints.add(r.memory_id, outcome)
    fallback.extend(a for mid, a in attempts.items() if mid not in seen)
    checkpoints.flush()  # ledger first (before_flush), then the summaries
    batches.release_memories(conn, key, list(attempts))
    kinds = {r.kind for r in results}
    # Anthropic reports an expired or canceled batch as "ended" with expired/canceled results.
    final = {"expired": "expired", "canceled": "canceled", "failed": "failed"}.get(
        status, "expired" if "expired" in kinds else "canceled" if "canceled" in kinds else "collected"
    )
    batches.mark(conn, key, final)
    if fallback:
        log.warning(
            "provider batch %s (%s): %d memories summarized synchronously instead",
            provider_id,
            status,
            len(fallback),
        )
    return fallback


class _LedgerBuffer:
    """Ledger rows of one step, collected from worker threads and written before each checkpoint flush."""

    def __init__(self, conn: Conn, batch_key: str):
        self.conn, self.batch_key = conn, batch_key
        self._entries: list[LedgerEntry] = []
        self._lock = threading.Lock()

    def add(self, attempt: Row, spent: Summary, outcome: str) -> None:
        if spent.kind == "extractive-offline":
            return  # no provider, no bill
        entry = LedgerEntry(spent, outcome, self.batch_key, attempt["memory_id"], attempt["user_id"])
        with self._lock:
            self._entries.append(entry)

    def flush(self) -> None:
        with self._lock:
            entries, self._entries = self._entries, []
        record_usage(self.conn, entries)


def accept_summary(
    summary: Summary, row: Row, attempt: Row, ledger: _LedgerBuffer
) -> tuple[Summary, list[str]]:
    """Check a summary against its memory and ledger it: the checkpoint's outcome, or raise for this memory."""
    try:
        # A NUL, a lone surrogate, a refusal or text unrelated to the memory fails this memory only.
        check_summary_text(summary.text, row["content"], source=f"{summary.kind}:{summary.model}")
    except SummarizationError:
        ledger.add(attempt, summary, "failed")
        raise
    ledger.add(attempt, summary, "ok")
    entities = summary.entity_names if summary.entities is not None else extract_key_entities(row["content"])
    return summary, entities


def summary_checkpoints(
    conn: Conn,
    batch_key: str,
    criteria: ArchivalCriteria,
    result: StepResult,
    ledger: _LedgerBuffer,
    users: Mapping[uuid.UUID, str],
) -> Checkpoints:
    """Checkpoints of accepted summaries (claimed -> summarized), the ledger written before each set."""

    def params(mid: uuid.UUID, outcome: Any) -> tuple[Any, ...]:
        summary, entities = outcome
        typed = None if summary.entities is None else Jsonb([[e.name, e.type] for e in summary.entities])
        return (
            summary.text,
            summary.model,
            summary.kind,
            entities,
            typed,
            summary.domain_guess,
            summary.input_tokens,
            summary.output_tokens,
            summary.cost_usd,
            batch_key,
            mid,
        )

    def saved(outcome: Any) -> None:
        summary = outcome[0]
        result.input_tokens += summary.input_tokens
        result.output_tokens += summary.output_tokens
        result.cost_usd += summary.cost_usd

    return Checkpoints(
        conn,
        batch_key,
        Step.SUMMARIZE,
        """UPDATE archival_attempts
           SET status = 'summarized', summary = %s, summary_model = %s, summarizer_kind = %s,
               key_entities = %s, summary_entities = %s, domain_guess = %s, input_tokens = %s,
               output_tokens = %s, cost_usd = %s, llm_submission = NULL,
               error = NULL, failed_step = NULL, updated_at = now()
           WHERE batch_key = %s AND memory_id = %s AND status = 'claimed' AND user_id = %s""",
        params,
        criteria,
        result,
        saved,
        before_flush=ledger.flush,
        users=users,
    )
