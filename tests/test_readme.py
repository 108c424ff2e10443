"""The README's library example runs as written, against a real database."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


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
    assert "Prefers a cortado" in out  # the search found the memory it just wrote
    assert "'recent_turns'" in out or "recent_turns" in out
