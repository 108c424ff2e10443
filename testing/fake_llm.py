"""A local stand-in for the Anthropic and OpenAI HTTP APIs, for tests through the real SDKs.

Routes: Anthropic `POST /v1/messages` (a prompt with a <passages> block is a rerank request: the
answer lists the passage numbers by words shared with its <question>); OpenAI `POST /v1/chat/completions` and `POST /v1/embeddings`
(also without the `/v1` prefix, so one base URL serves both SDKs). Answers are deterministic functions
of the request text. Faults are switched on by setting attributes at any time:

- `fail_fraction` / `fail_status`: requests whose memory content hashes into the fraction always fail
  (a persistent, per-memory failure).
- `transient_failures` / `transient_status`: the next N requests fail (with `retry-after: 0`), then
  requests succeed again.
- `empty_summary_fraction`: selected contents get an empty summary text.
- `summary_override`, `omit_text_block`, `embedding_dim_override`: malformed answers.
- `delay_seconds`: sleep before answering (client timeouts).
- `batch_create_status` / `batch_create_creates` / `batch_create_delay_seconds`: batch creates refused
  (401: a bad key), failing after the batch was made (a 500 after create), or answered late.
- `evaluator_decision`: what a search-escalation evaluator prompt (memory_lib.retrieval.escalation, "You are
  evaluating memory search results") gets back: a dict is sent as its JSON, a string verbatim (malformed
  answers). None: {"sufficient": false, "action": "search_facts"} for a "who is" query, else "return".
- `judge_decision`: what a write-judge prompt (memory_lib.write.write_judge) gets back, the same way; None: a
  rule standing in for a model (see `_judgement`).

No key is checked: tests pass an obviously fake one such as "test-key-not-a-secret".
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import Message
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from memory_lib.write.near_duplicates import content_words, state_change
from memory_lib.write.write_judge import JUDGE_MARKER  # the prompt the write judge sends

from .fake_answers import (
    MESSAGE_OVERHEAD_TOKENS,
    count_tokens,
    fake_domain,
    fake_embedding,
    fake_entities,
    fake_rerank,
    fake_summary,
    memory_content,
    prompt_of,
    request_texts,
    unit_fraction,
    wants_json,
    word_count,
)

FAKE_API_KEY = "test-key-not-a-secret"
EVALUATOR_MARKER = "You are evaluating memory search results."
DEFAULT_EMBEDDING_DIM = 1536


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    body: dict[str, Any]
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict[str, Any] | None = None  # the `usage` the answer reported (None for errors)


class FakeLLMServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.fail_fraction = 0.0
        self.fail_status = 500
        self.fail_when_contains: str | None = None  # persistent failure for contents with this marker
        self.transient_failures = 0
        self.transient_status = 429
        self.empty_summary_fraction = 0.0
        self.summary_override: str | None = None
        self.raw_output_override: str | None = None  # the answer's text as is, JSON or not
        self.malformed_json_when_contains: str | None = None  # contents with this marker get broken JSON
        self.malformed_json_fraction = 0.0
        self.omit_text_block = False
        self.embedding_dim_override: int | None = None
        self.delay_seconds = 0.0
        self.evaluator_decision: dict[str, Any] | str | None = None
        self.judge_decision: dict[str, Any] | str | None = None  # write-judge answers (see _judgement)
        self.html_responses = 0  # the next N answers are a proxy's HTML error page with status 200
        self.requests: list[RecordedRequest] = []
        # Batch APIs (Anthropic Message Batches, OpenAI Batch API + files). See batch_post/batch_get.
        self.batch_polls_before_end = 1  # retrieves answering "in progress" before a batch has ended
        self.batch_outcome = "ended"  # of batches created from now on: "ended", "expired" or "canceled"
        self.hold_batches = False  # batches stay in progress (a run that stops waiting)
        self.batch_error_when_contains: str | None = None  # these memories' results are errored
        # Batch creates answered with this HTTP status (401: a bad key); `batch_create_creates` makes the
        # batch first (a 500 after create); `batch_create_delay_seconds` answers a create late (timeouts).
        self.batch_create_status: int | None = None
        self.batch_create_creates = False
        self.batch_create_delay_seconds = 0.0
        self.batch_results_usage: list[tuple[str, dict[str, Any]]] = []  # (provider, usage) of results served
        self._batches: dict[str, dict[str, Any]] = {}
        self._files: dict[str, bytes] = {}
        self._generation = 0  # bumped by reset(): late answers to an earlier test are not recorded
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # a handler still sleeping in `delay_seconds` must not block close
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> FakeLLMServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-llm", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """Root URL: right for the Anthropic SDK, and accepted by the OpenAI SDK here too."""
        host, port = cast(tuple[str, int], self._httpd.server_address[:2])
        return f"http://{host}:{port}"

    @property
    def openai_base_url(self) -> str:
        """The OpenAI SDK's usual form, with the /v1 prefix."""
        return self.base_url + "/v1"

    # -- inspection --------------------------------------------------------------------------------

    def reset(self) -> None:
        """Back to a healthy server with no recorded requests."""
        with self._lock:
            self.fail_fraction = 0.0
            self.fail_status = 500
            self.fail_when_contains = None
            self.transient_failures = 0
            self.transient_status = 429
            self.empty_summary_fraction = 0.0
            self.summary_override = None
            self.raw_output_override = None
            self.malformed_json_when_contains = None
            self.malformed_json_fraction = 0.0
            self.omit_text_block = False
            self.embedding_dim_override = None
            self.delay_seconds = 0.0
            self.evaluator_decision = None
            self.judge_decision = None
            self.html_responses = 0
            self.batch_polls_before_end = 1
            self.batch_outcome = "ended"
            self.hold_batches = False
            self.batch_error_when_contains = None
            self.batch_create_status = None
            self.batch_create_creates = False
            self.batch_create_delay_seconds = 0.0
            self.batch_results_usage.clear()
            self._batches.clear()
            self._files.clear()
            self.requests.clear()
            self._generation += 1

    def count(self, path: str | None = None) -> int:
        """Requests received, on one route ("/v1/messages", "/v1/chat/completions", "/v1/embeddings")."""
        with self._lock:
            return sum(1 for r in self.requests if path is None or r.path == path)

    def batch_creates(self) -> int:
        """Batches created (Anthropic and OpenAI): a resubmission shows here."""
        return self.count("/v1/messages/batches") + self.count("/v1/batches")

    # -- batch APIs --------------------------------------------------------------------------------

    @staticmethod
    def is_batch_route(path: str) -> bool:
        return path.startswith(("/v1/messages/batches", "/v1/batches", "/v1/files"))

    def batch_post(
        self, path: str, body: dict[str, Any], raw: bytes, content_type: str
    ) -> tuple[int, bytes, str]:
        now = time.time()
        if path == "/v1/files":
            message = BytesParser().parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
            parts = cast(list[Message], message.get_payload())
            data = cast(bytes, next(p.get_payload(decode=True) for p in parts if p.get_filename()))
            file_id = f"file-fake{next(self._ids):06d}"
            self._files[file_id] = data
            return self._json(
                {
                    "id": file_id,
                    "object": "file",
                    "bytes": len(data),
                    "created_at": int(now),
                    "filename": "batch.jsonl",
                    "purpose": "batch",
                    "status": "processed",
                }
            )
        if path == "/v1/messages/batches":
            requests = [(r["custom_id"], r["params"]) for r in body["requests"]]
            kind, batch_id = "anthropic", f"msgbatch_fake{next(self._ids):06d}"
        elif path == "/v1/batches":
            lines = self._files[body["input_file_id"]].decode().splitlines()
            requests = [(r["custom_id"], r["body"]) for r in map(json.loads, filter(None, lines))]
            kind, batch_id = "openai", f"batch_fake{next(self._ids):06d}"
        else:
            return 404, b'{"error": "no route"}', "application/json"
        fault = self._batch_create_fault(path)
        if fault is not None and not self.batch_create_creates:
            return fault
        with self._lock:
            self._batches[batch_id] = {
                "id": batch_id,
                "kind": kind,
                "requests": requests,
                "created_at": now,
                "polls": 0,
                "outcome": self.batch_outcome,
                "results": None,
                "metadata": body.get("metadata") or {},
                "input_file_id": body.get("input_file_id"),
            }
        if self.batch_create_delay_seconds > 0:
            time.sleep(self.batch_create_delay_seconds)
        return fault or self._json(self._batch_object(self._batches[batch_id], poll=False))

    def _batch_create_fault(self, path: str) -> tuple[int, bytes, str] | None:
        status = self.batch_create_status
        if status is None:
            return None
        message = "invalid x-api-key" if status == 401 else "batch create failure injected"
        _, payload = self._error("/v1/messages" if path.startswith("/v1/messages") else path, status, message)
        return status, json.dumps(payload).encode(), "application/json"

    def batches_created(self) -> int:
        """Batches that exist at the fake provider (a refused create makes none)."""
        with self._lock:
            return len(self._batches)

    def batch_get(self, path: str) -> tuple[int, bytes, str]:
        parts = path.strip("/").split(
            "/"
        )  # v1 messages batches ID [results] | v1 batches ID | v1 files ID content
        if path in ("/v1/messages/batches", "/v1/batches"):
            kind = "anthropic" if path.startswith("/v1/messages") else "openai"
            newest = sorted(
                (b for b in self._batches.values() if b["kind"] == kind), key=lambda b: -b["created_at"]
            )
            data = [self._batch_object(b, poll=False) for b in newest]
            page: dict[str, Any] = {
                "data": data,
                "has_more": False,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }
            if kind == "openai":
                page["object"] = "list"
            return self._json(page)
        if parts[:2] == ["v1", "files"] and len(parts) == 4:
            return 200, self._files[parts[2]], "application/jsonl"
        batch_id = parts[3] if parts[1] == "messages" else parts[2]
        batch = self._batches.get(batch_id)
        if batch is None:
            return (
                404,
                b'{"type": "error", "error": {"type": "not_found_error", "message": "no batch"}}',
                "application/json",
            )
        if parts[-1] == "results":
            lines = [json.dumps(r) for r in self._results(batch)]
            return 200, ("\n".join(lines) + "\n").encode(), "application/binary"
        return self._json(self._batch_object(batch, poll=True))

    @staticmethod
    def _json(payload: dict[str, Any]) -> tuple[int, bytes, str]:
        return 200, json.dumps(payload).encode(), "application/json"

    def _ended(self, batch: dict[str, Any], poll: bool) -> bool:
        with self._lock:
            if self.hold_batches:
                return False
            if poll and batch["results"] is None:
                batch["polls"] += 1
            return batch["results"] is not None or batch["polls"] > self.batch_polls_before_end

    def _results(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """Each request's result, computed once: an expired or canceled batch answered the first half."""
        if batch["results"] is not None:
            return batch["results"]
        out = []
        cut = len(batch["requests"]) // 2 if batch["outcome"] != "ended" else len(batch["requests"])
        for i, (custom_id, params) in enumerate(batch["requests"]):
            content = request_texts("/v1/messages", params)[0]
            marker = self.batch_error_when_contains
            if i >= cut:
                out.append(self._result_line(batch, custom_id, batch["outcome"], None))
            elif (marker and marker in content) or unit_fraction(content) < self.fail_fraction:
                out.append(self._result_line(batch, custom_id, "errored", None))
            else:
                answer = (
                    self._anthropic_message(params, content)
                    if batch["kind"] == "anthropic"
                    else self._chat_completion(params, content)
                )
                self.batch_results_usage.append((batch["kind"], answer["usage"]))
                out.append(self._result_line(batch, custom_id, "succeeded", answer))
        batch["results"] = out
        return out

    @staticmethod
    def _result_line(
        batch: dict[str, Any], custom_id: str, kind: str, answer: dict[str, Any] | None
    ) -> dict[str, Any]:
        if batch["kind"] == "anthropic":
            result: dict[str, Any] = {"type": kind}
            if kind == "succeeded":
                result["message"] = answer
            elif kind == "errored":
                result["error"] = {
                    "type": "error",
                    "error": {"type": "api_error", "message": "injected batch error"},
                }
            return {"custom_id": custom_id, "result": result}
        if kind == "succeeded":
            return {
                "id": f"batch_req_{custom_id}",
                "custom_id": custom_id,
                "error": None,
                "response": {"status_code": 200, "request_id": custom_id, "body": answer},
            }
        if kind == "errored":
            return {
                "id": f"batch_req_{custom_id}",
                "custom_id": custom_id,
                "error": None,
                "response": {
                    "status_code": 500,
                    "request_id": custom_id,
                    "body": {"error": {"message": "injected batch error", "type": "server_error"}},
                },
            }
        code = "batch_expired" if kind == "expired" else "batch_cancelled"
        return {
            "id": f"batch_req_{custom_id}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": f"request {kind} with its batch"},
        }

    def _batch_object(self, batch: dict[str, Any], *, poll: bool) -> dict[str, Any]:
        ended = self._ended(batch, poll)
        results = self._results(batch) if ended else []
        n = len(batch["requests"])
        created = datetime.fromtimestamp(batch["created_at"], UTC)
        if batch["kind"] == "anthropic":
            kinds = Counter(r["result"]["type"] for r in results)
            return {
                "id": batch["id"],
                "type": "message_batch",
                "processing_status": "ended" if ended else "in_progress",
                "request_counts": {
                    "processing": 0 if ended else n,
                    "succeeded": kinds["succeeded"],
                    "errored": kinds["errored"],
                    "canceled": kinds["canceled"],
                    "expired": kinds["expired"],
                },
                "ended_at": datetime.now(UTC).isoformat() if ended else None,
                "created_at": created.isoformat(),
                "expires_at": (created + timedelta(hours=24)).isoformat(),
                "cancel_initiated_at": None,
                "archived_at": None,
                "results_url": f"{self.base_url}/v1/messages/batches/{batch['id']}/results"
                if ended
                else None,
            }
        ok = [r for r in results if r.get("response") and r["response"]["status_code"] == 200]
        bad = [r for r in results if r not in ok]
        status = (
            {"ended": "completed", "expired": "expired", "canceled": "cancelled"}[batch["outcome"]]
            if ended
            else "in_progress"
        )
        out_id = err_id = None
        if ended:
            out_id, err_id = f"file-out-{batch['id']}", f"file-err-{batch['id']}" if bad else None
            self._files[out_id] = "".join(json.dumps(r) + "\n" for r in ok).encode()
            if err_id:
                self._files[err_id] = "".join(json.dumps(r) + "\n" for r in bad).encode()
        return {
            "id": batch["id"],
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "errors": None,
            "input_file_id": batch["input_file_id"],
            "completion_window": "24h",
            "status": status,
            "output_file_id": out_id,
            "error_file_id": err_id,
            "created_at": int(batch["created_at"]),
            "request_counts": {"total": n, "completed": len(ok), "failed": len(bad)},
            "metadata": batch["metadata"],
        }

    # -- request handling --------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: without TCP_NODELAY, Nagle + delayed ACK add ~40 ms each.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {}
                path = self.path.split("?", 1)[0]
                if not path.startswith("/v1/"):
                    path = "/v1" + path
                generation = server._generation
                if server.is_batch_route(path):
                    with server._lock:
                        server.requests.append(RecordedRequest(path, body, 200))
                    status, data, ctype = server.batch_post(
                        path, body, raw, self.headers.get("content-type", "")
                    )
                    self._send(status, data, ctype)
                    return
                status, payload, headers = server._respond(path, body)
                with server._lock:
                    if generation == server._generation:
                        server.requests.append(
                            RecordedRequest(
                                path,
                                body,
                                status,
                                {k.lower(): v for k, v in self.headers.items()},
                                payload.get("usage") if status == 200 else None,
                            )
                        )
                if server.delay_seconds > 0:
                    time.sleep(server.delay_seconds)
                data = json.dumps(payload).encode("utf-8")
                content_type = "application/json"
                with server._lock:
                    if server.html_responses > 0:
                        server.html_responses -= 1
                        status, content_type, headers = 200, "text/html; charset=utf-8", {}
                        data = b"<html><body><h1>502 Bad Gateway</h1>proxy error</body></html>"
                try:
                    self.send_response(status)
                    self.send_header("content-type", content_type)
                    self.send_header("content-length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if not path.startswith("/v1/"):
                    path = "/v1" + path
                with server._lock:
                    server.requests.append(RecordedRequest("GET " + path, {}, 200))
                status, data, ctype = server.batch_get(path)
                self._send(status, data, ctype)

            def _send(self, status: int, data: bytes, content_type: str) -> None:
                try:
                    self.send_response(status)
                    self.send_header("content-type", content_type)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        return Handler

    def _respond(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        texts = request_texts(path, body)
        with self._lock:
            transient = self.transient_failures > 0
            if transient:
                self.transient_failures -= 1
        if transient:
            return self._error(path, self.transient_status, "transient failure injected") + (
                {"retry-after": "0"},
            )
        marker = self.fail_when_contains
        if any(unit_fraction(t) < self.fail_fraction or (marker and marker in t) for t in texts):
            return self._error(path, self.fail_status, "persistent failure injected") + ({},)
        if path == "/v1/messages":
            return 200, self._anthropic_message(body, texts[0]), {}
        if path == "/v1/chat/completions":
            return 200, self._chat_completion(body, texts[0]), {}
        if path == "/v1/embeddings":
            return 200, self._embeddings(body, texts), {}
        return self._error(path, 404, f"no route {path}") + ({},)

    def _evaluation(self, prompt: str) -> str:
        if isinstance(self.evaluator_decision, str):
            return self.evaluator_decision
        if self.evaluator_decision is not None:
            return json.dumps(self.evaluator_decision)
        query = re.search(r'^Query: "(.*)"$', prompt, re.MULTILINE)
        who = bool(query and re.search(r"\bwho\b", query.group(1), re.IGNORECASE))
        return json.dumps(
            {
                "sufficient": not who,
                "reason": "fake evaluator",
                "action": "search_facts" if who else "return",
                "refinedQuery": None,
            }
        )

    def evaluation_requests(self) -> int:
        """Requests that were escalation-evaluator prompts."""
        with self._lock:
            return sum(1 for r in self.requests if EVALUATOR_MARKER in json.dumps(r.body))

    def _judgement(self, prompt: str) -> str:
        """A write-judge prompt (memory_lib.write.write_judge): `judge_decision` when set (a dict as its JSON, a
        string verbatim), else a rule standing in for a model: 'duplicate' of a stored memory with the same
        words, 'updates' one whose state the new text changes (memory_lib.write.near_duplicates.state_change),
        else 'new'."""
        if isinstance(self.judge_decision, str):
            return self.judge_decision
        if self.judge_decision is not None:
            return json.dumps(self.judge_decision)
        stored = re.findall(r"^\[(\d+)\] <stored>(.*)</stored>$", prompt, re.MULTILINE)
        new = memory_content(prompt)
        for number, text in stored:
            if content_words(text) == content_words(new):
                return json.dumps({"decision": "duplicate", "target": int(number), "reason": "same words"})
        for number, text in stored:
            if state_change(text, new) is not None:
                return json.dumps({"decision": "updates", "target": int(number), "reason": "state changed"})
        return json.dumps({"decision": "new", "target": None, "reason": "another memory"})

    def judge_requests(self) -> int:
        """Requests that were write-judge prompts."""
        with self._lock:
            return sum(1 for r in self.requests if JUDGE_MARKER in json.dumps(r.body))

    def _summary_for(self, content: str) -> str:
        if EVALUATOR_MARKER in content:
            return self._evaluation(content)
        if (
            "<passages>" in content and self.summary_override is None
        ):  # a rerank request (memory_lib.retrieval.rerank)
            return fake_rerank(content)
        if self.summary_override is not None:
            return self.summary_override
        if unit_fraction(content) < self.empty_summary_fraction:
            return ""
        return fake_summary(content)

    def _answer_for(self, body: dict[str, Any], content: str) -> str:
        """The model's text: the summary JSON when the prompt asks for it, else the plain summary."""
        if self.raw_output_override is not None:
            return self.raw_output_override
        prompt = prompt_of(body)
        if JUDGE_MARKER in prompt:
            return self._judgement(prompt)
        summary = self._summary_for(content)
        if not wants_json(prompt_of(body)):
            return summary
        answer = json.dumps(
            {"summary": summary, "entities": fake_entities(content), "domain": fake_domain(content)}
        )
        marker = self.malformed_json_when_contains
        if (marker and marker in content) or unit_fraction("json:" + content) < self.malformed_json_fraction:
            return answer[: len(answer) // 2]  # cut mid-object: not JSON
        return answer

    def input_tokens_for(self, body: dict[str, Any]) -> int:
        return count_tokens(prompt_of(body)) + MESSAGE_OVERHEAD_TOKENS * len(body.get("messages", []))

    def _anthropic_message(self, body: dict[str, Any], content: str) -> dict[str, Any]:
        text = self._answer_for(body, content)
        blocks = [] if self.omit_text_block else [{"type": "text", "text": text}]
        return {
            "id": f"msg_fake_{next(self._ids):06d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-fake"),
            "content": blocks,
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.input_tokens_for(body),
                "output_tokens": count_tokens(text),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }

    def _chat_completion(self, body: dict[str, Any], content: str) -> dict[str, Any]:
        text = self._answer_for(body, content)
        prompt_tokens = self.input_tokens_for(body)
        return {
            "id": f"chatcmpl-fake{next(self._ids):06d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "gpt-fake"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": count_tokens(text),
                "total_tokens": prompt_tokens + count_tokens(text),
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        }

    def _embeddings(self, body: dict[str, Any], texts: list[str]) -> dict[str, Any]:
        dim = int(body.get("dimensions") or DEFAULT_EMBEDDING_DIM)
        if self.embedding_dim_override is not None:
            dim = self.embedding_dim_override
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(texts):
            vector = fake_embedding(text, dim)
            encoded: Any = (
                base64.b64encode(vector.tobytes()).decode("ascii") if as_base64 else vector.tolist()
            )
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(word_count(t) for t in texts)
        return {
            "object": "list",
            "data": data,
            "model": body.get("model", "text-embedding-fake"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    @staticmethod
    def _error(path: str, status: int, message: str) -> tuple[int, dict[str, Any]]:
        if path == "/v1/messages":
            kind = {
                400: "invalid_request_error",
                401: "authentication_error",
                429: "rate_limit_error",
                529: "overloaded_error",
            }.get(status, "api_error")
            return status, {"type": "error", "error": {"type": kind, "message": message}}
        kind = {400: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
        return status, {"error": {"message": message, "type": kind, "param": None, "code": None}}
