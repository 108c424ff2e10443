"""The README's library example runs as written, against a real database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_library_example_runs(monkeypatch, db_url, tmp_path, capsys):
    text = README.read_text()
    section = text[text.index("## The library") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDING_DIM", "64")
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDER", "hashing")
    monkeypatch.setenv("MEMORY_ARCHIVE_LOCAL_ROOT", str(tmp_path / "objects"))
    for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "superseded" in out and "Prefers a flat white" in out  # the update, found by the search
    assert "Prefers a cortado" not in out
    assert "'recent_turns'" in out or "recent_turns" in out


def test_memory_api_example_runs(db_url, local_store, capsys):
    """The "Memory API" snippet as written, with `memory` and `user` as the library example makes them."""
    from memory_lib.client import MemoryClient
    from memory_lib.core.config import Settings
    from memory_lib.llm.embedding import HashingEmbedder
    from memory_lib.storage.db import connect

    text = README.read_text()
    section = text[text.index("### Memory API") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    with connect(db_url) as conn:
        memory = MemoryClient(
            conn, embedder=HashingEmbedder(64), object_store=local_store, settings=Settings()
        )
        exec(compile(code, "README.md", "exec"), {"memory": memory, "user": "user-42"})
        assert capsys.readouterr().out.strip() == "['created', 'superseded']"
        rows = conn.execute("SELECT content, superseded_by IS NULL AS live FROM memories").fetchall()
        assert rows == []  # delete forgets the memory and the versions it superseded


@pytest.mark.slow
def test_library_example_against_the_demo_data(tmp_path):
    """The README's "against the demo data" steps: a (small) demo, its demo.env loaded, the example run
    from another folder reads the demo's database, archived summaries and objects included."""
    import os
    import subprocess
    import sys

    text = README.read_text()
    section = text[text.index("### The library against the demo data") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    assert "make demo" in block and ". .state/demo.env" in block
    code = re.search(r"<<'PY'\n(.*?)\nPY\n", block, re.S).group(1)

    root = README.parent
    state = tmp_path / "state"
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMORY_ARCHIVE_")
        and k not in ("DATABASE_URL", "DAGSTER_HOME", "ANTHROPIC_API_KEY", "OPENAI_API_KEY")
    }
    base |= {"PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    demo = subprocess.run(
        [sys.executable, "-m", "memory_assets.demo", "--days", "100", "--users", "1", "--per-day", "5,5"],
        cwd=root,
        env=base | {"MEMORY_ARCHIVE_STATE_DIR": str(state)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    demo_env = dict(
        line.split("=", 1)
        for line in (state / "demo.env").read_text().splitlines()
        if line and line[0] != "#"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=elsewhere,
        env=base | demo_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any("[archived]" in line for line in lines), out.stdout
    assert any(line.startswith("expanded: Ada asked for a synonym") for line in lines), out.stdout
    assert list(elsewhere.iterdir()) == []
