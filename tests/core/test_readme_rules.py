"""memory_lib/README.md is the map a newcomer reads first: its layer table is the import-linter `layers`
contract, and every file its rule table names exists."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "memory_lib" / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(title)
    nxt = README.find("\n## ", start + len(title))
    return README[start : nxt if nxt != -1 else len(README)]


def test_the_layer_table_is_the_layers_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    expected = [
        sorted(p.strip().removeprefix("memory_lib.") for p in line.split("|")) for line in contract["layers"]
    ]
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", _section("## Layers"), re.M)
    assert [int(n) for n, _ in rows] == list(range(len(expected), 0, -1)), "layers numbered top down"
    table = [sorted(re.sub(r"[`/]", "", p).strip() for p in cell.split(",")) for _, cell in rows]
    assert table == expected


def test_every_file_the_rule_table_names_exists() -> None:
    rules = _section("## Where each rule lives")
    cells = [
        line.rsplit("|", 2)[1] for line in rules.splitlines() if line.startswith("| ") and "---" not in line
    ]
    named = [m for cell in cells[1:] for m in re.findall(r"`([\w./-]+\.(?:py|sql|md))`", cell)]
    assert len(named) > 40
    missing = []
    for name in named:
        candidates = [ROOT / "memory_lib" / name, ROOT / name]
        if not any(c.exists() for c in candidates):
            missing.append(name)
    assert missing == []
