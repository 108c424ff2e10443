"""Generated memories and their MiniLM embeddings, cached on disk: embedding 100k texts takes minutes.

The cache lives under the state dir (`$MEMORY_ARCHIVE_STATE_DIR/bench-cache`, never in git), keyed by
the text generator's arguments and the model; a file whose texts no longer match is recomputed.
`python -m bench.textcache N` fills it ahead of a run.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

from memory_lib.core.config import default_state_dir

from .common import Text, demo_texts


def cache_dir() -> Path:
    return default_state_dir() / "bench-cache"


def embedded_texts(n: int, *, seed: int, embedder: Any, users: int = 4) -> tuple[list[Text], np.ndarray]:
    """demo_texts(n, seed, users) and their embeddings (float32, n x dim), from the cache when it matches."""
    texts = demo_texts(n, seed=seed, users=users)
    digest = hashlib.sha256("\n".join(t.content for t in texts).encode()).hexdigest()[:16]
    path = cache_dir() / f"{embedder.model.replace('/', '_')}-{n}-{seed}-{users}-{digest}.npy"
    if path.exists():
        vecs = np.load(path)
        if vecs.shape == (len(texts), embedder.dim):
            return texts, vecs
    vecs = (
        np.concatenate(
            [
                np.asarray(embedder.embed([t.content for t in texts[i : i + 2000]]), dtype=np.float32)
                for i in range(0, len(texts), 2000)
            ]
        )
        if texts
        else np.zeros((0, embedder.dim), np.float32)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vecs)
    tmp.replace(path)  # atomic: a killed run leaves no half-written cache
    return texts, vecs


if __name__ == "__main__":
    from .common import local_embedder

    for arg in sys.argv[1:]:
        n, _, seed = arg.partition(":")
        t, v = embedded_texts(int(n.replace("k", "000")), seed=int(seed or 7), embedder=local_embedder())
        print(len(t), v.shape, cache_dir())
