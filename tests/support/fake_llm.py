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
- `evaluator_decision`: what a search-escalation evaluator prompt (memory_lib.escalation, "You are
  evaluating memory search results") gets back: a dict is sent as its JSON, a string verbatim (malformed
  answers). None: {"sufficient": false, "action": "search_facts"} for a "who is" query, else "return".

No key is checked: tests pass an obviously fake one such as "test-key-not-a-secret".
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

FAKE_API_KEY = "test-key-not-a-secret"
EVALUATOR_MARKER = "You are evaluating memory search results."
DEFAULT_EMBEDDING_DIM = 1536
_SENTENCE = re.compile(r"\S.*?(?:[.!?](?=\s|$)|$)", re.DOTALL)


def _unit_fraction(text: str) -> float:
    """A stable number in [0, 1) for `text`: the same memory is always selected, or never."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def memory_content(prompt: str) -> str:
    """The memory inside a summary prompt (the whole prompt if it has no <memory> block)."""
    # The last block: the instructions before it may mention the tag themselves.
    end = prompt.rfind("</memory>")
    start = prompt.rfind("<memory>", 0, end) if end >= 0 else -1
    return prompt[start + len("<memory>") : end].strip() if start >= 0 else prompt.strip()


def fake_summary(content: str) -> str:
    """What the server answers for a memory: its first two sentences, whitespace collapsed."""
    sentences = [s.strip() for s in _SENTENCE.findall(" ".join(content.split()))]
    return " ".join(sentences[:2])


_PASSAGE = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)


def fake_rerank(prompt: str) -> str:
    """A rerank prompt's answer: passage numbers by words shared with the <question>, most first."""
    question = re.search(r"<question>(.*?)</question>", prompt, re.DOTALL)
    block = re.search(r"<passages>(.*?)</passages>", prompt, re.DOTALL)
    words = set(re.findall(r"\w+", (question.group(1) if question else "").lower()))
    passages = [(int(n), set(re.findall(r"\w+", text.lower()))) for n, text in _PASSAGE.findall(block.group(1) if block else "")]
    ranked = sorted(passages, key=lambda p: (-len(words & p[1]), p[0]))
    return ", ".join(str(n) for n, _ in ranked)


def fake_embedding(text: str, dim: int) -> np.ndarray:
    """The unit float32 vector the server answers for `text`."""
    seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    vector = np.random.default_rng(seed).standard_normal(dim)
    return (vector / np.linalg.norm(vector)).astype(np.float32)


def _word_count(text: str) -> int:
    return len(text.split())


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    body: dict[str, Any]
    status: int
    headers: dict[str, str] = field(default_factory=dict)


class FakeLLMServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.fail_fraction = 0.0
        self.fail_status = 500
        self.fail_when_contains: str | None = None  # persistent failure for contents with this marker
        self.transient_failures = 0
        self.transient_status = 429
        self.empty_summary_fraction = 0.0
        self.summary_override: str | None = None
        self.omit_text_block = False
        self.embedding_dim_override: int | None = None
        self.delay_seconds = 0.0
        self.evaluator_decision: dict[str, Any] | str | None = None
        self.html_responses = 0  # the next N answers are a proxy's HTML error page with status 200
        self.requests: list[RecordedRequest] = []
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
        host, port = self._httpd.server_address[:2]
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
            self.transient_failures = 0
            self.transient_status = 429
            self.empty_summary_fraction = 0.0
            self.summary_override = None
            self.omit_text_block = False
            self.embedding_dim_override = None
            self.delay_seconds = 0.0
            self.evaluator_decision = None
            self.html_responses = 0
            self.requests.clear()
            self._generation += 1

    def count(self, path: str | None = None) -> int:
        """Requests received, on one route ("/v1/messages", "/v1/chat/completions", "/v1/embeddings")."""
        with self._lock:
            return sum(1 for r in self.requests if path is None or r.path == path)

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
                status, payload, headers = server._respond(path, body)
                with server._lock:
                    if generation == server._generation:
                        server.requests.append(
                            RecordedRequest(
                                path, body, status, {k.lower(): v for k, v in self.headers.items()}
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

        return Handler

    def _respond(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        texts = self._request_texts(path, body)
        with self._lock:
            transient = self.transient_failures > 0
            if transient:
                self.transient_failures -= 1
        if transient:
            return self._error(path, self.transient_status, "transient failure injected") + (
                {"retry-after": "0"},
            )
        marker = self.fail_when_contains
        if any(_unit_fraction(t) < self.fail_fraction or (marker and marker in t) for t in texts):
            return self._error(path, self.fail_status, "persistent failure injected") + ({},)
        if path == "/v1/messages":
            return 200, self._anthropic_message(body, texts[0]), {}
        if path == "/v1/chat/completions":
            return 200, self._chat_completion(body, texts[0]), {}
        if path == "/v1/embeddings":
            return 200, self._embeddings(body, texts), {}
        return self._error(path, 404, f"no route {path}") + ({},)

    @staticmethod
    def _request_texts(path: str, body: dict[str, Any]) -> list[str]:
        """The memory contents a request is about: selection for faults goes by these."""
        if path == "/v1/embeddings":
            inputs = body.get("input", [])
            return [inputs] if isinstance(inputs, str) else [str(t) for t in inputs]
        prompt = ""
        for message in body.get("messages", []):
            content = message.get("content", "")
            if isinstance(content, list):
                content = "".join(b.get("text", "") for b in content if isinstance(b, dict))
            prompt += str(content)
        return [memory_content(prompt)]

    def _evaluation(self, prompt: str) -> str:
        if isinstance(self.evaluator_decision, str):
            return self.evaluator_decision
        if self.evaluator_decision is not None:
            return json.dumps(self.evaluator_decision)
        query = re.search(r'^Query: "(.*)"$', prompt, re.MULTILINE)
        who = bool(query and re.search(r"\bwho\b", query.group(1), re.IGNORECASE))
        return json.dumps({"sufficient": not who, "reason": "fake evaluator",
                           "action": "search_facts" if who else "return", "refinedQuery": None})

    def evaluation_requests(self) -> int:
        """Requests that were escalation-evaluator prompts."""
        with self._lock:
            return sum(1 for r in self.requests if EVALUATOR_MARKER in json.dumps(r.body))

    def _summary_for(self, content: str) -> str:
        if EVALUATOR_MARKER in content:
            return self._evaluation(content)
        if "<passages>" in content and self.summary_override is None:  # a rerank request (memory_lib.rerank)
            return fake_rerank(content)
        if self.summary_override is not None:
            return self.summary_override
        if _unit_fraction(content) < self.empty_summary_fraction:
            return ""
        return fake_summary(content)

    def _anthropic_message(self, body: dict[str, Any], content: str) -> dict[str, Any]:
        text = self._summary_for(content)
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
                "input_tokens": _word_count(json.dumps(body["messages"])),
                "output_tokens": _word_count(text),
            },
        }

    def _chat_completion(self, body: dict[str, Any], content: str) -> dict[str, Any]:
        text = self._summary_for(content)
        prompt_tokens = _word_count(json.dumps(body["messages"]))
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
                "completion_tokens": _word_count(text),
                "total_tokens": prompt_tokens + _word_count(text),
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
        tokens = sum(_word_count(t) for t in texts)
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
