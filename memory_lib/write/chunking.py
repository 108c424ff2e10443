"""Normalize & chunk: long texts become chunks of at most 512 tokens with 20-30 tokens of overlap.

Tokens are WordPiece tokens of all-MiniLM-L6-v2's (BERT uncased) vocabulary, counted by Hugging Face
`tokenizers` from the vocabulary shipped in memory_lib/data (Apache-2.0, from the model's package):
offline, deterministic, and exactly the local embedder's tokens. Other embedders' tokenizers differ a
little (OpenAI's BPE counts English within ~10% of it), far below their own limits (8,191 tokens).

Invariants:
* A text of at most `max_tokens` tokens is one memory, unchanged (no chunk metadata).
* Otherwise every chunk has at most `max_tokens` tokens (the embedder's own limit when smaller:
  all-MiniLM-L6-v2 reads 256 tokens, 254 without its two special tokens), consecutive chunks share
  between `overlap - 5` and `overlap + 5` tokens, chunks start and end on word boundaries when a
  word boundary lies within 5 tokens, and the chunks cover the whole text: `join_chunks` of them
  (by their character offsets) is the text again.
* Chunks of one text share a parent id (metadata.chunk.parent_id, memory_lib.write.write_path), are
  searched as memories and returned once per parent (memory_lib.retrieval.search).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..core.errors import InvalidInputError

SEED_MAX_TOKENS = 512
SEED_OVERLAP_TOKENS = 25  # 20-30 recommended
_SLACK = 5  # how far a boundary may move to land between words


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    start: int  # character offsets in the (normalized) parent text, [start, end)
    end: int
    tokens: int  # WordPiece tokens of this chunk


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Any:
    from tokenizers import BertWordPieceTokenizer

    vocab = resources.files("memory_lib") / "data" / "wordpiece_vocab.txt"
    with resources.as_file(vocab) as path:
        return BertWordPieceTokenizer(str(path), lowercase=True)


def token_spans(text: str) -> list[tuple[int, int, int | None]]:
    """(start, end, word index) of every WordPiece token of `text`, without special tokens."""
    enc = _tokenizer().encode(text, add_special_tokens=False)
    return [(s, e, w) for (s, e), w in zip(enc.offsets, enc.word_ids, strict=True)]


def count_tokens(text: str) -> int:
    return len(token_spans(text))


def chunk_limits(max_tokens: int, overlap: int, embedder_max_tokens: int | None) -> tuple[int, int]:
    """The chunk size for an embedder (its own limit when smaller) and the overlap (checked)."""
    size = max_tokens if embedder_max_tokens is None else min(max_tokens, embedder_max_tokens)
    if overlap < 0 or overlap + _SLACK >= size // 2:
        raise InvalidInputError(
            "chunking.overlap_tokens", overlap, f"must be >= 0 and well below half of {size}"
        )
    return size, overlap


def split(text: str, *, max_tokens: int = SEED_MAX_TOKENS, overlap: int = SEED_OVERLAP_TOKENS) -> list[Chunk]:
    """The chunks of `text` (one chunk, the text itself, when it fits)."""
    spans = token_spans(text)
    n = len(spans)
    if n <= max_tokens:
        return [Chunk(0, text, 0, len(text), n)]

    def word_start(i: int) -> bool:  # token i begins a word (or is the end)
        return i >= n or i == 0 or spans[i][2] is None or spans[i][2] != spans[i - 1][2]

    def boundary(target: int, low: int, high: int) -> int:
        """The word boundary nearest `target` within [low, high], or `target` when there is none."""
        for delta in range(_SLACK + 1):
            for i in (target - delta, target + delta):
                if low <= i <= high and word_start(i):
                    return i
        return target

    chunks: list[Chunk] = []
    start = 0
    while True:
        end = min(start + max_tokens, n)
        if end < n:
            end = boundary(end, end - _SLACK, end)  # never longer than max_tokens
        s_char, e_char = spans[start][0], spans[end - 1][1]
        chunks.append(Chunk(len(chunks), text[s_char:e_char], s_char, e_char, end - start))
        if end >= n:
            break
        nxt = boundary(end - overlap, end - overlap - _SLACK, end - overlap + _SLACK)
        start = max(nxt, start + 1)
    # Leading/trailing text without tokens (spaces, punctuation the tokenizer drops) stays covered.
    first, last = chunks[0], chunks[-1]
    chunks[0] = Chunk(0, text[: first.end], 0, first.end, first.tokens)
    chunks[-1] = Chunk(last.index, text[last.start :], last.start, len(text), last.tokens)
    if len(chunks) == 1:
        return [Chunk(0, text, 0, len(text), n)]
    return chunks


def join_chunks(chunks: Sequence[tuple[int, int, str]]) -> str:
    """The parent text from its chunks' (start, end, text), in any order: overlaps written once."""
    out: list[str] = []
    pos = 0
    for start, end, text in sorted(chunks):
        if start > pos:
            raise InvalidInputError("chunks", (start, pos), "leave a gap: a chunk of the parent is missing")
        out.append(text[pos - start :])
        pos = max(pos, end)
    return "".join(out)
