"""Embedders: offline hashing, OpenAI through the real SDK against a local fake API, and the local model."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import openai
import pytest

from memory_lib.core.config import EmbeddingConfig, Settings
from memory_lib.core.errors import EmbeddingError, InvalidInputError
from memory_lib.llm.embedding import HashingEmbedder, OpenAIEmbedder, embedder_from_settings
from testing.fake_answers import fake_embedding
from testing.fake_llm import FAKE_API_KEY, FakeLLMServer

ROOT = Path(__file__).resolve().parents[2]
RELATED = [
    (
        "The user lives in Berlin and works as a night-shift nurse.",
        "User is a nurse in Berlin, working nights.",
    ),
    (
        "Order ORD-4417 for a standing desk was delayed twice.",
        "The standing desk order ORD-4417 got delayed.",
    ),
    ("The user is training for the Lisbon marathon in October.", "Marathon training: Lisbon, October race."),
]
UNRELATED = "Quarterly revenue of the steel plant fell by four percent."


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))  # rows are unit vectors


# -- hashing --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [8, 64, 384, 1536])
def test_hashing_shape_dtype_and_norm(dim: int):
    embedder = HashingEmbedder(dim)
    vectors = embedder.embed([a for a, _ in RELATED] + ["!!!", "x"])
    assert vectors.shape == (5, dim) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert (embedder.model, embedder.kind, embedder.dim) == (f"hashing-lexical-v1-{dim}", "lexical", dim)


def test_hashing_related_texts_are_closer_than_unrelated():
    embedder = HashingEmbedder(1536)
    for a, b in RELATED:
        va, vb, vu = embedder.embed([a, b, UNRELATED])
        assert cosine(va, vb) > cosine(va, vu) + 0.2


def test_hashing_ignores_case_and_punctuation_only():
    embedder = HashingEmbedder(256)
    a, b, c = embedder.embed(["Berlin, Germany!", "berlin germany", "Munich, Germany"])
    np.testing.assert_allclose(a, b)
    assert not np.allclose(a, c)


def test_hashing_is_the_same_in_another_process():
    # Python's hash() of a str changes with PYTHONHASHSEED; the embedder must not.
    text = RELATED[0][0]
    code = (
        "import sys; from memory_lib.llm.embedding import HashingEmbedder; "
        f"sys.stdout.buffer.write(HashingEmbedder(384).embed([{text!r}]).tobytes())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True).stdout
    np.testing.assert_array_equal(
        np.frombuffer(other, dtype=np.float32), HashingEmbedder(384).embed([text])[0]
    )


@pytest.mark.parametrize("texts", [[""], ["ok", "  \n"]])
def test_blank_text_is_refused(texts: list[str]):
    with pytest.raises(InvalidInputError) as raised:
        HashingEmbedder(64).embed(texts)
    assert raised.value.field == "text"


def test_a_bare_string_is_refused_and_no_texts_give_no_rows():
    with pytest.raises(InvalidInputError, match="sequence of strings"):
        HashingEmbedder(64).embed("one string")
    assert HashingEmbedder(64).embed([]).shape == (0, 64)


def test_hashing_refuses_a_bad_dimension():
    with pytest.raises(InvalidInputError, match="dim"):
        HashingEmbedder(0)


# -- OpenAI ---------------------------------------------------------------------------------------------


def make_openai(server: FakeLLMServer, **kwargs) -> OpenAIEmbedder:
    kwargs.setdefault("retry_wait_base", 0.001)
    kwargs.setdefault("retry_wait_max", 0.01)
    return OpenAIEmbedder(FAKE_API_KEY, base_url=server.base_url, **kwargs)


@pytest.mark.parametrize("dim", [1536, 256])
def test_openai_embeddings_in_batches_base64(dim: int, fake_llm: FakeLLMServer):
    texts = [f"memory summary number {i}" for i in range(5)]
    vectors = make_openai(fake_llm, dim=dim, batch_size=2).embed(texts)

    assert vectors.shape == (5, dim) and vectors.dtype == np.float32
    expected = np.stack([fake_embedding(t, dim) for t in texts])
    np.testing.assert_allclose(vectors, expected, rtol=1e-5, atol=1e-6)
    assert [r.body["input"] for r in fake_llm.requests] == [texts[0:2], texts[2:4], texts[4:5]]
    for request in fake_llm.requests:
        assert request.body["encoding_format"] == "base64"  # the SDK's default, decoded by the SDK
        assert request.body["dimensions"] == dim
        assert request.body["model"] == "text-embedding-3-small"


def test_fake_server_also_answers_float_lists(fake_llm: FakeLLMServer):
    client = openai.OpenAI(api_key=FAKE_API_KEY, base_url=fake_llm.openai_base_url, max_retries=0)
    response = client.embeddings.create(
        model="text-embedding-3-small", input=["a", "b"], dimensions=32, encoding_format="float"
    )
    assert [d.index for d in response.data] == [0, 1]
    np.testing.assert_allclose(response.data[1].embedding, fake_embedding("b", 32), rtol=1e-6)


def test_openai_wrong_dimension_is_an_error(fake_llm: FakeLLMServer):
    fake_llm.embedding_dim_override = 1535
    with pytest.raises(EmbeddingError) as raised:
        make_openai(fake_llm, dim=1536).embed(["hello"])
    message = str(raised.value)
    assert "text-embedding-3-small" in message and "1535" in message and "dim=1536" in message
    assert fake_llm.count() == 1


def test_openai_transient_failure_is_retried(fake_llm: FakeLLMServer):
    fake_llm.transient_failures = 2
    fake_llm.transient_status = 429
    vectors = make_openai(fake_llm, dim=64).embed(["hello"])
    np.testing.assert_allclose(vectors[0], fake_embedding("hello", 64), rtol=1e-5)
    assert [r.status for r in fake_llm.requests] == [429, 429, 200]


@pytest.mark.parametrize(("status", "attempts"), [(400, 1), (500, 3)])
def test_openai_failures_become_embedding_errors(status: int, attempts: int, fake_llm: FakeLLMServer):
    fake_llm.fail_fraction = 1.0
    fake_llm.fail_status = status
    embedder = make_openai(fake_llm, dim=64, max_retries=2)
    with pytest.raises(EmbeddingError, match=f"HTTP {status}") as raised:
        embedder.embed(["hello"])
    assert "text-embedding-3-small" in str(raised.value) and FAKE_API_KEY not in str(raised.value)
    assert fake_llm.count() == attempts


# -- provider selection -------------------------------------------------------------------------------


def test_auto_uses_openai_with_a_key_else_hashing(fake_llm: FakeLLMServer):
    cfg = EmbeddingConfig(dim=128, base_url=fake_llm.base_url)
    hashing = embedder_from_settings(cfg)
    assert isinstance(hashing, HashingEmbedder) and hashing.dim == 128
    # OPENAI_API_KEY is the embedder's key as Settings.from_env reads it.
    keyed = Settings.from_env({"OPENAI_API_KEY": FAKE_API_KEY}).embedding
    remote = embedder_from_settings(cfg.model_copy(update={"openai_api_key": keyed.openai_api_key}))
    assert isinstance(remote, OpenAIEmbedder) and remote.dim == 128
    assert remote.embed(["hi"]).shape == (1, 128)
    assert fake_llm.requests[0].body["dimensions"] == 128


def test_explicit_providers():
    with pytest.raises(InvalidInputError, match="OPENAI_API_KEY"):
        embedder_from_settings(EmbeddingConfig(provider="openai"))
    forced = embedder_from_settings(EmbeddingConfig(provider="hashing", dim=32, openai_api_key=FAKE_API_KEY))
    assert isinstance(forced, HashingEmbedder)
    with pytest.raises(InvalidInputError) as raised:
        embedder_from_settings(EmbeddingConfig(provider="local", dim=1536))
    assert raised.value.field == "embedding.dim"


# -- local sentence-transformers model ------------------------------------------------------------------


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is not None, reason="the local extra is installed"
)
def test_local_embedder_without_the_extra_says_how_to_install_it():
    from memory_lib.llm.embedding import LocalEmbedder

    with pytest.raises(ImportError, match=r"memory-archive\[local\]"):
        LocalEmbedder()


def test_local_embedder_paraphrases_are_closer():
    pytest.importorskip("sentence_transformers")
    from memory_lib.llm.embedding import LocalEmbedder

    embedder = LocalEmbedder()
    assert (embedder.model, embedder.dim, embedder.kind) == ("all-MiniLM-L6-v2", 384, "semantic")
    for a, b in RELATED:
        va, vb, vu = embedder.embed([a, b, UNRELATED])
        assert va.shape == (384,) and va.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm([va, vb, vu], axis=1), 1.0, rtol=1e-4)
        assert cosine(va, vb) > cosine(va, vu) + 0.2
