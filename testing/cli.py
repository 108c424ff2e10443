"""Running `memory-archive` in-process from a test: the exit status checked, stdout and stderr returned."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memory_lib.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> tuple[str, str]:
    """`memory-archive ARGS`; asserts it exits with `code`, returns (stdout, stderr)."""
    got = main(list(args))
    out, err = capsys.readouterr()
    assert got == code, (args, out, err)
    return out, err


def cli_json(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> dict[str, Any]:
    """The one JSON line `memory-archive ARGS` prints (stdout is not a terminal in tests)."""
    out, _ = run_cli(capsys, *args, code=code)
    (line,) = out.strip().splitlines()
    result: dict[str, Any] = json.loads(line)
    return result
