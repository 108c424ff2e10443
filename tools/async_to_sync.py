#!/usr/bin/env python
"""Generate MemoryClient from the hand-written AsyncMemoryClient (as psycopg's tools/async_to_sync.py).

    python tools/async_to_sync.py           # rewrite memory_lib/client/sync_client.py
    python tools/async_to_sync.py --check   # exit 1 when it differs from what this would write

A token transform, so comments (`# type: ignore`, `# noqa`) survive: `async def`/`async with`/`async for`
lose `async`, `await` goes, and the names in NAMES become their sync twins (in strings and comments too);
the module docstring is replaced. The output is then import-sorted and formatted by ruff. Whatever the
async side does that has no mechanical twin lives in a helper pair whose names NAMES maps
(memory_lib/client/pools.py: open_pool_async -> open_pool).
"""

from __future__ import annotations

import argparse
import difflib
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path("memory_lib/client/async_client.py")
TARGET = Path("memory_lib/client/sync_client.py")
HEADER = f"# generated from {SOURCE} by tools/async_to_sync.py; do not edit.\n"
DOCSTRING = f'''"""MemoryClient, the memory API agents use, blocking.

Generated from AsyncMemoryClient ({SOURCE}) by tools/async_to_sync.py: edit that
file and run the tool. Every method drives one flow of memory_lib.client.flows, so both clients run the
same SQL and the same control flow and return the same results."""'''

NAMES = {
    "AsyncMemoryClient": "MemoryClient",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncConnection": "Connection",
    "AsyncConn": "Conn",
    "AsyncIterator": "Iterator",
    "AsyncExitStack": "ExitStack",
    "asynccontextmanager": "contextmanager",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "aclose": "close",
    "push_async_callback": "callback",
    "enter_async_context": "enter_context",
    "drive_async": "drive",
    "run_forget_async": "run_forget",
    "fill_async": "fill",
    "open_pool_async": "open_pool",
    "open_ready_database_async": "open_ready_database",
}
_WORD = re.compile(r"\b(" + "|".join(sorted(NAMES, key=len, reverse=True)) + r")\b")


def _offsets(source: str) -> list[int]:
    """The offset of each line's start (tokenize gives (row, col) positions)."""
    starts, n = [0, 0], 0
    for line in source.splitlines(keepends=True):
        n += len(line)
        starts.append(n)
    return starts


def to_sync(source: str) -> str:
    """The sync twin of `source`, before formatting."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    lines = _offsets(source)
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) in offsets, in order
    docstring_done = False
    for i, tok in enumerate(tokens):
        start, end = lines[tok.start[0]] + tok.start[1], lines[tok.end[0]] + tok.end[1]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else tok
        if tok.type == tokenize.STRING and not docstring_done:
            edits.append((start, end, DOCSTRING))
        elif tok.type == tokenize.NAME and (
            tok.string == "await" or (tok.string == "async" and nxt.string in ("def", "with", "for"))
        ):
            edits.append((start, lines[nxt.start[0]] + nxt.start[1], ""))  # the keyword and its space
        elif tok.type in (tokenize.NAME, tokenize.STRING, tokenize.COMMENT):
            new = _WORD.sub(lambda m: NAMES[m.group(1)], tok.string)
            if new != tok.string:
                edits.append((start, end, new))
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENCODING):
            docstring_done = True
    out, at = [], 0
    for start, end, new in edits:
        out.append(source[at:start] + new)
        at = end
    out.append(source[at:])
    return HEADER + "".join(out)


def _ruff(args: list[str], code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET), "-"],
        input=code,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        sys.exit(f"ruff {' '.join(args)} failed on the generated code:\n{done.stderr}{done.stdout}")
    return done.stdout


def generate() -> str:
    """The formatted sync module: imports sorted (ruff's isort), then ruff format."""
    code = to_sync((ROOT / SOURCE).read_text(encoding="utf-8"))
    code = _ruff(["check", "--select", "I", "--fix", "--exit-zero", "--quiet"], code)
    return _ruff(["format", "--quiet"], code)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the generated file is out of date")
    opts = parser.parse_args()
    code, target = generate(), ROOT / TARGET
    current = target.read_text(encoding="utf-8") if target.exists() else ""
    if opts.check:
        if code == current:
            return 0
        diff = difflib.unified_diff(current.splitlines(True), code.splitlines(True), str(TARGET), "generated")
        sys.stderr.writelines(diff)
        print(f"{TARGET} is out of date: run `python tools/async_to_sync.py`", file=sys.stderr)
        return 1
    if code != current:
        target.write_text(code, encoding="utf-8")
        print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
