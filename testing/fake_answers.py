"""The fake LLM server's answers (testing.fake_llm): deterministic functions of the request text, so a
test can compute what the server says (a summary, entities, a domain, a rerank, an embedding, tokens)."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import numpy as np

_SENTENCE = re.compile(r"\S.*?(?:[.!?](?=\s|$)|$)", re.DOTALL)


def unit_fraction(text: str) -> float:
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
    passages = [
        (int(n), set(re.findall(r"\w+", text.lower())))
        for n, text in _PASSAGE.findall(block.group(1) if block else "")
    ]
    ranked = sorted(passages, key=lambda p: (-len(words & p[1]), p[0]))
    return ", ".join(str(n) for n, _ in ranked)


def fake_embedding(text: str, dim: int) -> np.ndarray:
    """The unit float32 vector the server answers for `text`."""
    seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    vector = np.random.default_rng(seed).standard_normal(dim)
    return (vector / np.linalg.norm(vector)).astype(np.float32)


def word_count(text: str) -> int:
    return len(text.split())


def count_tokens(text: str) -> int:
    """Tokens as a BPE tokenizer counts English text: about one per 4 characters (Anthropic and OpenAI
    both quote ~4 chars/token). Computed from the text, so usage grows with prompt and answer."""
    return max(1, math.ceil(len(text) / 4))


MESSAGE_OVERHEAD_TOKENS = 7  # role markers and message framing, as the providers bill them


_NAME = re.compile(r"[A-Z][\w'’]*(?: (?:of |de )?[A-Z][\w'’]*)*")


_WITH_DIGIT = re.compile(r"[$€£]?[\w-]*\d[\w,./-]*")


_NOT_NAMES = frozenset(
    [
        "I",
        "The",
        "A",
        "An",
        "She",
        "He",
        "Her",
        "His",
        "They",
        "Their",
        "We",
        "Our",
        "It",
        "My",
        "You",
        "Your",
        "This",
        "That",
        "Then",
        "And",
        "But",
        "So",
    ]
)


_MONTH_NAMES = frozenset(
    [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ]
)


def fake_entities(content: str) -> list[list[str]]:
    """[name, type] pairs for a memory: capitalized names and tokens with digits, as a model would list them."""
    found: dict[str, str] = {}
    for m in _NAME.finditer(content):
        words = [w for w in m.group().split() if w not in _NOT_NAMES]
        name = " ".join(words)
        if name and name not in _MONTH_NAMES:
            found.setdefault(name, "person" if len(words) <= 2 else "organization")
    for m in _WITH_DIGIT.finditer(content):
        token = m.group().rstrip(".,-/")
        kind = "amount" if token[:1] in "$€£" else "identifier" if any(c.isalpha() for c in token) else "date"
        found.setdefault(token, kind)
    return [[n, t] for n, t in list(found.items())[:8]]


def fake_domain(content: str) -> str:
    words = set(re.findall(r"[a-z]+", content.lower()))
    for domain, cues in (
        ("work", {"work", "project", "meeting", "team", "client", "deadline", "office"}),
        ("family", {"mom", "dad", "kids", "son", "daughter", "wife", "husband", "family"}),
        ("logistics", {"flight", "order", "delivery", "booking", "hotel", "train"}),
    ):
        if words & cues:
            return domain
    return "personal"


def wants_json(prompt: str) -> bool:
    """memory_lib's summary prompt asks for one JSON object with these keys."""
    return '"summary"' in prompt and '"entities"' in prompt


def prompt_of(body: dict[str, Any]) -> str:
    """A chat request's text: every message's content (text blocks joined), in order."""
    prompt = ""
    for message in body.get("messages", []):
        content = message.get("content", "")
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content if isinstance(b, dict))
        prompt += str(content)
    return prompt


def request_texts(path: str, body: dict[str, Any]) -> list[str]:
    """The memory contents a request is about: selection for faults goes by these."""
    if path == "/v1/embeddings":
        inputs = body.get("input", [])
        return [inputs] if isinstance(inputs, str) else [str(t) for t in inputs]
    return [memory_content(prompt_of(body))]
