"""`memory-archive`: migrate, inspect, archive, restore, sweep, unsupersede, pause and re-embed from a shell;
search, get, forget and export a user's memories.

Every subcommand runs the same memory_lib code as the Dagster Slow Path (pipeline.run_batch for
`archive`) and prints tables on a terminal, one JSON line on stdout when piped or with --json (`export`:
JSON lines, one a memory); long work shows a progress bar on stderr, on a terminal only (`_Progress`).
`archive`, `restore`, `sweep` and `forget --apply` first run
memory_lib.preflight, as the Dagster resources do: a missing bucket, refused credentials or a malformed
API key is refused before anything is claimed or written. Exit status, one meaning each:

  0  success
  1  the run failed: its gate, nothing archived of what it claimed, archived memories not findable, a failed
     restore, a backup failing its check
  2  bad input or configuration (InvalidInputError, ConfigError incl. PreflightError, SchemaError), fix and rerun
  3  archival is paused
  4  a component is unavailable: database unreachable, object store or LLM outage, a re-embedding flip's
     tables kept locked past --lock-timeout; retry later

Who acted, one rule for every command: each event and pause record a command writes (archive, restore,
unsupersede, pause set, pause clear, the reembed steps) names the actor `cli:<operator>`, the operator being `--operator`,
by default your login name (`_actor` below; docs/reference/cli.md).

Errors are one line on stderr and name this command's flags (`--user-id`, not the library's or Dagster's
`user_id`). Logs go to stderr, quiet by default (`-v` for progress, `-vv` for debug). Every command's
`--help` ends with examples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import hashlib
import json
import logging
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, BinaryIO, NoReturn, cast

import click
import psycopg

from .archival.archive import ArchivalServices
from .archival.claims import Holder, attempt_counts, released_memories
from .archival.integrity import sweep_orphans
from .archival.pipeline import run_batch
from .client import MemoryClient
from .core import validation
from .core.config import Settings
from .core.errors import (
    ConfigError,
    DatabaseConnectionError,
    DeadlineExceeded,
    EmbeddedServerError,
    EmbeddingError,
    IntegrityError,
    InvalidInputError,
    MemoryArchiveError,
    NotFoundError,
    ObjectNotFoundError,
    ObjectStoreError,
    SchemaError,
    SummarizationError,
)
from .core.models import BackupObject
from .core.plans import run_plan
from .core.rows import Conn
from .core.shards import Shard
from .lifecycle import reembedding
from .lifecycle.eligibility import eligible_counts
from .lifecycle.forget import ForgetPreview, forget_memory, forget_user, remaining
from .lifecycle.forget import preview as forget_preview
from .lifecycle.pause import clear_pause, pause_history, pause_status, set_pause
from .lifecycle.promotion import JOINED_FROM, JOINED_ROW, verified_backup
from .lifecycle.reembedding import BY_KIND, Migration
from .lifecycle.restore import RestoreReport, originals_of_archives, restore_archives
from .lifecycle.vector_groups import latest_migration
from .llm.batches import submission_stats
from .llm.embedding import LOCAL_MODEL_NAME, embedder_from_settings
from .preflight import preflight
from .storage.db import (
    DATABASE_REFUSED,
    describe_database,
    migrate_database,
    naming_the_database,
    open_database,
    open_ready_database,
)
from .storage.migrations import check_schema
from .storage.objectstore import ObjectStore, object_store_from_settings
from .storage.packs import read_members
from .storage.space import SHAPE_SQL
from .storage.store import tier_stats
from .write.memory_api import MemoryRecord, get_plan, list_plan, list_query
from .write.unsupersede import unsupersede as unsupersede_memories

EXIT_FAILED, EXIT_INPUT, EXIT_PAUSED, EXIT_UNAVAILABLE = 1, 2, 3, 4

log = logging.getLogger(__name__)

_UNAVAILABLE = (ObjectStoreError, SummarizationError, EmbeddingError, EmbeddedServerError, DeadlineExceeded)


# The library's field names (InvalidInputError.field, also Dagster's config names) as this CLI's flags.
_FLAGS = {
    "user_id": "--user-id",
    "original_ids": "--original-id",
    "all": "--all",
    "shard": "--shard",
    "batch_key": "--batch-key",
    "limit": "--limit",
    "reason": "--reason",
    "actor": "--operator",
    "memory_id": "--memory-id",
    "query": "QUERY",
    "target_model": "--model",
    "target_dim": "--dim",
}


def _login() -> str:
    """The login name, the operator when --operator is not given."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no LOGNAME/USER variable and no passwd entry (some containers)
        return "unknown"


ACTOR_PREFIX = "cli:"
_OPERATOR = click.option(
    "--operator",
    default=_login,
    show_default="your login name",
    help="Who runs this: its events and the pause history record the actor cli:<operator>.",
)


def _actor(operator: str) -> str:
    """The one actor rule of this CLI: every record a command writes names `cli:<operator>`. Checked
    before anything is read or written (a blank --operator is exit 2)."""
    limit = validation.MAX_LABEL_CHARS - len(ACTOR_PREFIX)
    return ACTOR_PREFIX + validation.text("actor", operator, max_chars=limit).strip()


def _examples(*lines: str) -> str:
    """A --help epilog; `\b` keeps click from rewrapping the lines."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def _flag_message(exc: InvalidInputError) -> str:
    """`invalid --user-id ' ': must be ...` for a field this CLI takes as a flag, else the library's text."""
    flag = _FLAGS.get(exc.field.split("[", 1)[0])
    if flag is None:
        return str(exc)
    return str(exc).replace(f"invalid {exc.field}=", f"invalid {flag} ", 1)


def _fail(message: str, code: int = EXIT_INPUT) -> NoReturn:
    click.echo(f"memory-archive: {message}", err=True)
    sys.exit(code)


# --------------------------------------------------------------------------- output
# A table on a terminal, JSON lines when piped (or with --json): scripts read stdout as before. The
# tables use rich when it is installed (the `cli` extra), else plain aligned text; rich is optional.

_MODE = "memory_archive.output"
_PROGRESS = "memory_archive.progress"


def _choose_output(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value:
        return
    mode = "json" if param.name == "as_json" else "table"
    other = ctx.meta.get(_MODE)
    if other is not None and other != mode:
        raise click.UsageError("--json and --table: choose one", ctx)
    ctx.meta[_MODE] = mode


def _output_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--json and --table, on the group and on every command (`memory-archive --json stats` and
    `memory-archive stats --json` are the same)."""
    fn = click.option(
        "--table",
        "as_table",
        is_flag=True,
        expose_value=False,
        callback=_choose_output,
        help="Print tables, even when stdout is not a terminal.",
    )(fn)
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        expose_value=False,
        callback=_choose_output,
        help="Print JSON lines (the default when stdout is not a terminal).",
    )(fn)


def _choose_progress(ctx: click.Context, param: click.Parameter, value: bool | None) -> None:
    if value is not None:
        ctx.meta[_PROGRESS] = value


_PROGRESS_OPTION = click.option(
    "--progress/--no-progress",
    default=None,
    expose_value=False,
    callback=_choose_progress,
    help="Progress bar on stderr (default: when stderr is a terminal; never with JSON output).",
)


def _json_mode() -> bool:
    ctx = click.get_current_context(silent=True)
    chosen = ctx.meta.get(_MODE) if ctx is not None else None
    if chosen is not None:
        return bool(chosen == "json")
    return not sys.stdout.isatty()


def _json_default(value: Any) -> str:
    """JSON of what json cannot write itself: times in ISO 8601 (with the T), the rest as text."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def _emit(payload: dict[str, Any], render: Callable[[dict[str, Any]], None] | None = None) -> None:
    """One JSON line (JSON mode), else `render`'s tables (default: the payload as field | value)."""
    if _json_mode():
        click.echo(json.dumps(payload, default=_json_default))
    elif render is not None:
        render(payload)
    else:
        _show(_fields_table("", payload))


@dataclass
class _Table:
    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]] = field(default_factory=list)
    right: frozenset[int] = frozenset()  # right-aligned (numeric) columns
    note: str | None = None  # a line printed under the table
    wrap: int | None = None  # the one column that wraps (a text); None: any may


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, default=_json_default)
    return str(value)


def _short(text: str | None, limit: int = 100) -> str | None:
    """One line of at most `limit` characters (JSON output keeps the whole text)."""
    if text is None:
        return None
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _flatten(f"{prefix}.{k}" if prefix else str(k), v)
    elif isinstance(value, list) and value and all(not isinstance(v, dict | list) for v in value):
        yield prefix, ", ".join(_cell(v) for v in value)
    else:
        yield prefix, value


def _fields_table(title: str, payload: dict[str, Any]) -> _Table:
    return _Table(title, ("field", "value"), [[k, v] for k, v in _flatten("", payload)])


_MIN_TEXT_WIDTH = 24  # a wrapping text column narrower than this is unreadable: show records instead


def _fits(t: _Table, width: int) -> bool:
    """Whether the table fits `width` columns with its text column at least _MIN_TEXT_WIDTH wide (the
    other columns never wrap: an id folded over two lines cannot be copied)."""
    cells = [[" ".join(_cell(v).split()) for v in row] for row in t.rows]
    need = 3 * len(t.columns) + 1  # borders and padding
    for i, column in enumerate(t.columns):
        longest = max([len(column), *(len(r[i]) for r in cells)])
        need += min(longest, _MIN_TEXT_WIDTH) if i == t.wrap else longest
    return need <= width


def _records(t: _Table, width: int) -> str:
    """The table as one block per row, a `column  value` line each (psql's expanded display): for a
    terminal too narrow for its columns."""
    label = max(len(c) for c in t.columns)
    out = [t.title] if t.title else []
    for n, row in enumerate(t.rows, 1):
        out.append(f"-[ {n} ]" + "-" * max(0, min(width, 60) - 8 - len(str(n))))
        for column, value in zip(t.columns, row, strict=True):
            text = " ".join(_cell(value).split())
            room = max(width - label - 2, 20)
            chunks = [text[i : i + room] for i in range(0, len(text), room)] or [""]
            out.append(f"{column.ljust(label)}  {chunks[0]}")
            out += [f"{' ' * label}  {c}" for c in chunks[1:]]
    if t.note:
        out.append(t.note)
    return "\n".join(out) + "\n"


def _show(*tables: _Table) -> None:
    """Print the tables on stdout: rich when installed, else plain aligned columns; as records, one
    block per row, when the terminal is too narrow for a table's columns."""
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        width = shutil.get_terminal_size().columns
        for t in tables:
            click.echo(_plain(t) if not t.rows or _fits(t, width) else _records(t, width))
        return
    console = Console(highlight=False)
    for t in tables:
        if not t.rows and t.title:
            console.print(Text(f"{t.title}: none"))
            continue
        if not _fits(t, console.width):
            console.print(Text(_records(t, console.width).rstrip("\n")))
            continue
        table = Table(title=Text(t.title) if t.title else None, title_justify="left")
        for i, column in enumerate(t.columns):
            table.add_column(
                Text(column),
                justify="right" if i in t.right else "left",
                overflow="fold",
                no_wrap=t.wrap is not None and i != t.wrap,
            )
        for row in t.rows:
            table.add_row(*(Text(_cell(v)) for v in row))
        console.print(table)
        if t.note:
            console.print(Text(t.note))


def _plain(t: _Table) -> str:
    """The table as aligned text, one line a row (cells on one line: newlines become spaces)."""
    cells = [[" ".join(_cell(v).split()) for v in row] for row in t.rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(t.columns)]

    def line(values: Sequence[str]) -> str:
        padded = (
            v.rjust(w) if i in t.right else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )
        return "  ".join(padded).rstrip()

    if not t.rows and t.title:
        return f"{t.title}: none\n"
    out = [t.title] if t.title else []
    out += [line(t.columns), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    if t.note:
        out.append(t.note)
    return "\n".join(out) + "\n"


class _Progress:
    """A progress bar with rate and ETA on stderr while long work runs: rich's when installed, else one
    plain status line. Shown with table output when stderr is a terminal (or --progress), never with
    JSON output."""

    def __init__(self, label: str, total: int | None, unit: str = "memories"):
        ctx = click.get_current_context(silent=True)
        forced = ctx.meta.get(_PROGRESS) if ctx is not None else None
        self.enabled = not _json_mode() and (sys.stderr.isatty() if forced is None else bool(forced))
        self.label, self.total, self.unit = label, total, unit
        self.started = time.monotonic()
        self._rich: Any = None
        self._task: Any = None
        self._last = ""

    def __enter__(self) -> _Progress:
        if not self.enabled:
            return self
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                ProgressColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.text import Text
        except ImportError:
            return self
        unit = self.unit

        class Rate(ProgressColumn):  # items per second (rich's own speed column counts bytes)
            def render(self, task: Any) -> Text:
                return Text("-" if task.speed is None else f"{task.speed:.1f} {unit}/s")

        self._rich = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            Rate(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._rich.start()
        self._task = self._rich.add_task(self.label, total=self.total)
        return self

    def update(self, completed: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        if total is not None:
            self.total = total
        if self.total is not None and completed > self.total:
            self.total = completed  # more work appeared meanwhile (new eligible memories)
        if self._rich is not None:
            self._rich.update(self._task, completed=completed, total=self.total)
            return
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = completed / elapsed
        parts = [f"{self.label}: {completed}" + (f"/{self.total}" if self.total is not None else "")]
        if self.total:
            parts.append(f"{100 * completed // self.total}%")
        parts.append(f"{rate:.1f} {self.unit}/s")
        if self.total is not None and rate > 0:
            parts.append(f"ETA {int((self.total - completed) / rate)}s")
        line = " ".join(parts)
        if sys.stderr.isatty():  # one line, rewritten in place (padded over a longer previous one)
            click.echo("\r" + line.ljust(len(self._last)), err=True, nl=False)
        else:
            click.echo(line, err=True)
        self._last = line

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.stop()
        elif self.enabled and self._last and sys.stderr.isatty():
            click.echo("", err=True)


@contextmanager
def _connection(ctx: click.Context, *, any_dim: bool = False) -> Iterator[tuple[Settings, Conn]]:
    """A connection to the configured database; only `migrate` changes the schema, the other commands
    refuse a missing or outdated one (SchemaError: run `memory-archive migrate`). `any_dim`: whatever
    embedding dim the database has now (the re-embedding commands, which change it)."""
    settings = _settings(ctx)
    if any_dim:
        with open_database(settings, create=False) as db:
            with naming_the_database(settings):
                check_schema(db.url)
            with db.connect() as conn:
                yield settings, conn
        return
    with open_ready_database(settings) as db, db.connect() as conn:
        yield settings, conn


def exit_code(exc: BaseException) -> int:
    """The exit status of an error that ended a command (see the module docstring). Configuration wins
    over the component it concerns: a missing bucket is an ObjectStoreConfigError, exit 2, not 4."""
    if isinstance(exc, DatabaseConnectionError):
        return EXIT_INPUT if exc.refused else EXIT_UNAVAILABLE
    if isinstance(exc, IntegrityError | ObjectNotFoundError):
        return EXIT_FAILED  # stored data failed its check or is gone: the run failed, nothing shown as valid
    if isinstance(exc, ConfigError | InvalidInputError | SchemaError):
        return EXIT_INPUT
    if isinstance(exc, _UNAVAILABLE):
        return EXIT_UNAVAILABLE
    if isinstance(exc, psycopg.OperationalError):
        return EXIT_INPUT if DATABASE_REFUSED.search(str(exc)) else EXIT_UNAVAILABLE
    return EXIT_INPUT


def _guarded(fn: Callable[..., None]) -> Callable[..., None]:
    """Our own errors and an unreachable database become one line on stderr and the exit status of
    exit_code, never a traceback."""

    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except InvalidInputError as exc:
            _fail(_flag_message(exc), exit_code(exc))
        except MemoryArchiveError as exc:
            _fail(str(exc), exit_code(exc))
        except psycopg.OperationalError as exc:  # not while connecting (DatabaseConnectionError): mid-command
            code = exit_code(exc)
            root = click.get_current_context(silent=True)
            settings = root.find_root().obj if root is not None else None
            where = f" of {describe_database(settings)}" if isinstance(settings, Settings) else ""
            what = (
                f"the database{where} refused these settings"
                if code == EXIT_INPUT
                else f"cannot reach the database{where}"
            )
            _fail(f"{what}: {' '.join(str(exc).split())[:300]}", code)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=_examples(
        "memory-archive migrate                  # create or upgrade the schema first",
        "memory-archive stats                    # tiers, backlog, claims, pause",
        "memory-archive -v archive --limit 100   # one batch, progress on stderr",
        "memory-archive restore --user-id alice",
        "memory-archive pause show",
        'memory-archive search --user-id alice "coffee order"   # archived hits labelled',
        "memory-archive forget --user-id alice   # dry run; --apply erases",
        "memory-archive stats --json             # JSON on a terminal too (the default when piped)",
        "DATABASE_URL=postgresql://me@db/memories memory-archive stats",
    ),
)
@click.option("-v", "--verbose", count=True, help="-v: progress logs, -vv: debug logs (stderr).")
@_output_options
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """memory-archive: lifecycle of an agent memory table (configuration from MEMORY_ARCHIVE_* variables)."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _settings(ctx: click.Context) -> Settings:
    """The settings from the environment, read when a command runs (a bad variable does not break
    `--help`); a bad one ends the command with exit 2."""
    root = ctx.find_root()
    if not isinstance(root.obj, Settings):
        try:
            root.obj = Settings.from_env()
        except (MemoryArchiveError, ValueError) as exc:
            _fail(f"configuration error: {' '.join(str(exc).split())[:500]}")
    return cast(Settings, root.obj)


def _preflight(settings: Settings, *, llm: bool = False) -> None:
    """memory_lib.preflight before a command touches the store (`llm`: it summarizes and embeds); its
    warnings go to stderr, one line each."""
    found = preflight(settings, llm=llm)
    log.info("preflight: %s", found.describe())
    for warning in found.warnings:
        click.echo(f"memory-archive: warning: {warning}", err=True)


@cli.command(
    "migrate",
    epilog=_examples(
        "memory-archive migrate   # DATABASE_URL, else the embedded server under the state dir",
        "DATABASE_URL=postgresql://me@db/memories MEMORY_ARCHIVE_EMBEDDING_DIM=1536 memory-archive migrate",
        "DATABASE_URL=postgresql://me@db/memories MEMORY_ARCHIVE_USER_PARTITIONS=16 memory-archive migrate",
    ),
)
@_PROGRESS_OPTION
@_output_options
@click.pass_context
@_guarded
def migrate_cmd(ctx: click.Context) -> None:
    """Create or upgrade the schema (the only command that changes it; a database keeps its dim)."""
    settings = _settings(ctx)
    with (
        open_database(settings, create=True) as db,
        naming_the_database(settings),
        _Progress("migrate", None, "migrations") as bar,
    ):
        applied = migrate_database(
            db.url, settings.embedding.dim, user_partitions=settings.user_partitions, progress=bar.update
        )
    _emit(
        {"applied": applied},
        lambda p: _show(_Table("Migrations applied", ("migration",), [[m] for m in p["applied"]])),
    )


@cli.command(
    epilog=_examples(
        "memory-archive stats",
        "memory-archive stats | jq .eligible   # the backlog by reason",
    )
)
@_output_options
@click.pass_context
@_guarded
def stats(ctx: click.Context) -> None:
    """Memories per tier, bytes on disk, the eligible backlog, claims (open, failed, released), and LLM
    batch submissions by status (count, oldest age in seconds, memories held; the stalled ones named)."""
    with _connection(ctx) as (settings, conn):
        s = tier_stats(conn)
        _emit(
            {
                "hot": s.hot,
                "archived": s.archived,
                "hot_bytes": s.hot_bytes,
                "archived_bytes": s.archived_bytes,
                "eligible": eligible_counts(conn, settings.archival, datetime.now(UTC)),
                "attempts": attempt_counts(conn),
                "released": [dict(r) for r in released_memories(conn, limit=10)],
                "llm_batches": submission_stats(conn),
                "paused": pause_status(conn).paused,
            },
            _show_stats,
        )


def _size(n: int) -> str:
    """Bytes for people: 1.2 MB (the JSON keeps the exact count)."""
    size, unit = float(n), "B"
    for bigger in ("kB", "MB", "GB", "TB"):
        if size < 1000:
            break
        size, unit = size / 1000, bigger
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def _show_stats(p: dict[str, Any]) -> None:
    batches = p["llm_batches"]
    _show(
        _Table(
            "Memories by tier",
            ("tier", "memories", "bytes"),
            [
                ["hot", p["hot"], _size(p["hot_bytes"])],
                ["archived", p["archived"], _size(p["archived_bytes"])],
            ],
            right=frozenset({1, 2}),
        ),
        _Table(
            "Eligible for archival now",
            ("reason", "memories"),
            sorted(p["eligible"].items()),
            right=frozenset({1}),
        ),
        _Table(
            "Archival claims",
            ("open", "failed", "awaiting takeover", "released, still hot"),
            [[p["attempts"][k] for k in ("open", "failed", "awaiting_takeover", "released")]],
            right=frozenset({0, 1, 2, 3}),
        ),
        *(
            [
                _Table(
                    "Released memories (given up after max attempts)",
                    ("memory", "user", "failed step", "attempts", "error"),
                    [
                        [
                            r["memory_id"],
                            r["user_id"],
                            r["failed_step"],
                            r["attempts"],
                            _short(r["error"], 80),
                        ]
                        for r in p["released"]
                    ],
                )
            ]
            if p["released"]
            else []
        ),
        _Table(
            "LLM batch submissions",
            ("status", "submissions", "oldest age (s)", "memories held"),
            [
                [status, b["submissions"], b["oldest_age_seconds"], b["memories_held"]]
                for status, b in sorted(batches["by_status"].items())
            ],
            right=frozenset({1, 2, 3}),
            note="\n".join(f"stalled: {s}" for s in batches["stalled"]) or None,
        ),
    )
    click.echo(f"Archival paused: {_cell(p['paused'])}")


def _batch_key_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Given, the key must have a visible character: an empty one is refused, never the default (exit 2)."""
    if value is None:
        return None
    try:
        return validation.batch_key("batch_key", value)
    except InvalidInputError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


# archive's table on a terminal: one row a batch.
_ARCHIVE_COLUMNS = (
    "batch_key",
    "claimed",
    "taken_over",
    "archived",
    "failed",
    "gate_passed",
    "ok",
    "problem",
)


@cli.command(
    epilog=_examples(
        "memory-archive archive                          # one batch of archival.batch_size",
        "memory-archive -v archive --limit 100",
        "memory-archive archive --batch-key nightly-2026-01-31   # rerun: takes the batch over",
        "memory-archive archive --shard 0/2 & memory-archive archive --shard 1/2   # two workers",
        "memory-archive archive --until-drained --shard 0/2 & memory-archive archive --until-drained --shard 1/2",
    )
)
@click.option(
    "--batch-key",
    callback=_batch_key_option,
    help="Default: adhoc-<UTC timestamp>. A batch killed mid-run is taken over by the next.",
)
@click.option("--limit", type=click.IntRange(min=0), help="At most this many (default: archival.batch_size).")
@click.option(
    "--shard",
    default="0/1",
    show_default=True,
    help="i/n: only the users of shard i of n (stable hash of user_id); run n of them at once to scale out.",
)
@click.option(
    "--until-drained",
    is_flag=True,
    help="Run batch after batch (a JSON line each) until one claims less than a full batch, or one fails: "
    "a backlog drained by one process per shard.",
)
@_OPERATOR
@_PROGRESS_OPTION
@_output_options
@click.pass_context
@_guarded
def archive(
    ctx: click.Context,
    batch_key: str | None,
    limit: int | None,
    shard: str,
    until_drained: bool,
    operator: str,
) -> None:
    """Archive one batch of eligible memories through the whole pipeline (pause, fidelity, gates, tier
    audit and retrievability probe included)."""
    part = Shard.parse(shard)  # before connecting: bad input writes nothing
    actor = _actor(operator)
    if until_drained and batch_key is not None:
        # Each batch of a drain gets its own key; a drain killed midway is resumed by running it again
        # (its open attempts are taken over at once: the holder's pid is dead).
        _fail(f"--batch-key {batch_key!r}: not with --until-drained, whose batches each get their own key")
    _preflight(_settings(ctx), llm=True)
    rows: list[list[Any]] = []
    with _connection(ctx) as (settings, conn), contextlib.ExitStack() as stack:
        services = ArchivalServices.from_settings(settings)
        full = limit if limit is not None else settings.archival.batch_size
        bar = None
        if until_drained:
            backlog = eligible_counts(conn, settings.archival, datetime.now(UTC), part)
            bar = stack.enter_context(_Progress("archive", sum(backlog.values())))
        done = 0
        while True:
            now = datetime.now(UTC)
            key = batch_key or f"adhoc-{now:%Y%m%dT%H%M%S.%f}{part.batch_suffix()}"
            report = run_batch(
                conn,
                services,
                settings.archival,
                batch_key=key,
                as_of=now,
                actor=actor,
                limit=limit,
                workers=settings.llm.max_concurrency,
                holder=Holder.this_process(f"cli:{key}", track_pid=True),
                shard=part,
                retrieval=settings.retrieval,
            )
            claim = report.claim
            claimed = claim.claimed if claim else 0
            done += report.status.archived + report.status.failed
            if bar is not None:
                bar.update(done)
            line = {
                "batch_key": key,
                "shard": str(part),
                "claimed": claimed,
                "taken_over": claim.taken_over if claim else 0,
                "archived": report.status.archived,
                "failed": report.status.failed,
                "failed_by_step": report.status.failed_by_step,
                "gate_passed": report.gate_passed,
                "ok": report.ok,
                "problem": report.problem,
                "stalled": report.stalled,
                "why": report.why,
            }
            if _json_mode():
                _emit(line)
            rows.append([line[k] for k in _ARCHIVE_COLUMNS])
            if not (until_drained and report.ok and claimed >= max(full, 1)):
                break
    if not _json_mode():
        _show(
            _Table(
                "Archival batches",
                [c.replace("_", " ") for c in _ARCHIVE_COLUMNS],
                rows,
                right=frozenset({1, 2, 3, 4}),
            )
        )
    if report.paused is not None and report.paused.paused and claim is None:
        _fail(report.paused.describe(), EXIT_PAUSED)
    if not report.ok:
        _fail(report.problem or "archival failed", EXIT_FAILED)


@cli.command(
    epilog=_examples(
        "memory-archive restore --original-id 0b7e6a52-3c1d-4f0e-9a51-6f1d2e8c4b90",
        "memory-archive restore --archive-id 5d0c2f4e-8a1b-4c3d-9e7f-1a2b3c4d5e6f   # an id search returned",
        "memory-archive restore --user-id alice               # every archive of alice",
        "memory-archive restore --all --user-id alice         # the same, archival paused first",
        "memory-archive restore --all                         # everything; archival paused first",
    )
)
@click.option("--user-id", help="Only this user's archives.")
@click.option(
    "--original-id",
    type=click.UUID,
    multiple=True,
    help="One memory by its own id, its original_id (repeatable).",
)
@click.option(
    "--archive-id",
    type=click.UUID,
    multiple=True,
    help="One archived memory by its archive id, what search and expand return (repeatable).",
)
@click.option(
    "--all",
    "all_archives",
    is_flag=True,
    help="Every archive (of --user-id when given); pauses archival first.",
)
@_OPERATOR
@_PROGRESS_OPTION
@_output_options
@click.pass_context
@_guarded
def restore(
    ctx: click.Context,
    user_id: str | None,
    original_id: tuple[uuid.UUID, ...],
    archive_id: tuple[uuid.UUID, ...],
    all_archives: bool,
    operator: str,
) -> None:
    """Bring archived memories back to the hot tier, byte-exact, each after verifying its backup.
    Choose what: --all, --user-id, --original-id or --archive-id (repeatable; with --user-id, that user's).
    They stay hot until the archival criteria, counted from the restore, select them again; their backups
    are kept."""
    # The CLI's own words before the library's (whose message names Dagster's config: all=true, ...).
    if not (all_archives or user_id is not None or original_id or archive_id):
        _fail(
            "choose what to restore: --all, --user-id USER, --original-id UUID or --archive-id UUID (repeatable)"
        )
    if all_archives and (original_id or archive_id):
        _fail(
            "--all restores every archive (of --user-id when given): leave out --original-id and --archive-id"
        )
    actor = _actor(operator)
    _preflight(_settings(ctx))
    with _connection(ctx) as (settings, conn):
        services = ArchivalServices.from_settings(settings)
        originals, unknown = (
            originals_of_archives(conn, archive_id, user_id=user_id) if archive_id else ([], [])
        )
        wanted = list(dict.fromkeys([*original_id, *originals]))
        if archive_id and not wanted:  # none of the archive ids names an archive: nothing to restore
            report = RestoreReport()
        else:
            total = len(wanted) if wanted else _archived_count(conn, user_id)
            with _Progress("restore", total) as bar:
                report = restore_archives(
                    conn,
                    services.object_store,
                    actor=actor,
                    all_archives=all_archives and user_id is None,
                    user_id=user_id,
                    original_ids=wanted or None,
                    pause_archival=all_archives,
                    progress=lambda r: bar.update(r.requested),
                )
                bar.update(report.requested)
        report.requested += len(unknown)
        report.not_found += len(unknown)
        report.errors[:0] = unknown
        _emit(
            {
                "requested": report.requested,
                "restored": report.restored,
                "already_hot": report.already_hot,
                "not_found": report.not_found,
                "failed": report.failed,
                "errors": report.errors[:5],
                "archival_paused": report.paused_archival,
            },
            _show_restore,
        )
    if report.failed or report.not_found:
        sys.exit(EXIT_FAILED)


def _archived_count(conn: Conn, user_id: str | None) -> int:
    """How many archives a restore of everything (of `user_id`) has to go through: its progress total."""
    row = conn.execute(
        "SELECT count(*) AS n FROM archived_memories WHERE (%(u)s::text IS NULL OR user_id = %(u)s)",
        {"u": None if user_id is None else validation.user(user_id)},
    ).fetchone()
    return int(row["n"]) if row else 0


def _show_restore(p: dict[str, Any]) -> None:
    counts = ("requested", "restored", "already_hot", "not_found", "failed")
    _show(
        _Table(
            "Restore",
            [c.replace("_", " ") for c in (*counts, "archival_paused")],
            [[*(p[c] for c in counts), p["archival_paused"]]],
            right=frozenset(range(len(counts))),
            note="\n".join(f"error: {e}" for e in p["errors"]) or None,
        )
    )


@cli.command(
    epilog=_examples(
        "memory-archive sweep            # report only",
        "memory-archive sweep --remove   # delete the orphans that are safe to delete",
    )
)
@click.option("--remove", is_flag=True, help="Delete orphans whose memory is hot and unclaimed, or gone.")
@_output_options
@click.pass_context
@_guarded
def sweep(ctx: click.Context, remove: bool) -> None:
    """Report backup objects that no attempt, archive row or restore records (a run killed between put and
    checkpoint). A restore keeps its memory's backup, recorded by its audit event: never an orphan."""
    _preflight(_settings(ctx))
    with _connection(ctx) as (settings, conn):
        store = ArchivalServices.from_settings(settings).object_store
        report = sweep_orphans(conn, store, remove=remove)
        _emit(
            {
                "listed": report.listed,
                "orphans": len(report.orphans),
                "removed": len(report.removed),
                "kept": report.kept,
                "orphan_keys": report.orphans[:20],
            }
        )


@cli.command(
    epilog=_examples(
        "memory-archive unsupersede                         # dry run: list them",
        "memory-archive unsupersede --user-id alice --apply",
    )
)
@click.option("--user-id", help="Only this user's memories.")
@click.option("--apply", is_flag=True, help="Make them live again (default: a dry run that writes nothing).")
@_OPERATOR
@_PROGRESS_OPTION
@_output_options
@click.pass_context
@_guarded
def unsupersede(ctx: click.Context, user_id: str | None, apply: bool, operator: str) -> None:
    """List the memories add's former near-duplicate rule superseded (hidden from search); --apply makes
    them live again, one 'updated' event each, except those whose text a live memory already holds."""
    actor = _actor(operator)
    with _connection(ctx) as (_, conn):
        with _Progress("unsupersede", None, "users") as bar:
            report = unsupersede_memories(
                conn, user_id=user_id, apply=apply, actor=actor, progress=bar.update
            )
        _emit(report.to_json())


# --------------------------------------------------------------------------- a user's memories: search, get,
# forget, export (the right of access and portability, the right to erasure)


_NOT_FOUND = "--user-id {user!r} has no memory with memory id or archive id {id}"


def _id_kind(record: MemoryRecord, given: uuid.UUID) -> str:
    return "archive_id" if record.archive_id == given and record.id != given else "memory_id"


@cli.command(
    epilog=_examples(
        'memory-archive search --user-id alice "what coffee does she like?"',
        'memory-archive search --user-id alice "trip to Lisbon" --limit 5 --json',
        'memory-archive search --user-id alice "old address" --phase2 always   # archived summaries too',
    )
)
@click.option("--user-id", required=True, help="Whose memories (a search never reads another user's).")
@click.argument("query")
@click.option(
    "--limit", type=click.IntRange(min=1, max=1000), help="Hits per tier (default: retrieval settings)."
)
@click.option(
    "--phase2",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Search archived summaries: when the hot hits are weak (auto), always, or never.",
)
@_output_options
@click.pass_context
@_guarded
def search(ctx: click.Context, user_id: str, query: str, limit: int | None, phase2: str) -> None:
    """Search a user's memories as an agent does: hot memories first, archived summaries when needed
    (labelled archived, with their archive id). Read-only: a search here counts as no use."""
    with _connection(ctx) as (settings, conn):
        client = MemoryClient(
            conn,
            embedder=embedder_from_settings(settings.embedding),
            object_store=object_store_from_settings(settings),
            settings=settings,
        )
        result = client.search(user_id, query, limit=limit, phase2=cast(Any, phase2))
    hits = [
        {
            "rank": i,
            "tier": h.source,
            "id": str(h.id),
            "id_kind": "archive_id" if h.provenance.archive_id is not None else "memory_id",
            "memory_id": str(h.provenance.memory_id),
            "archive_id": None if h.provenance.archive_id is None else str(h.provenance.archive_id),
            "score": round(h.scores.final, 6),
            "category": h.provenance.category,
            "created_at": h.provenance.created_at,
            "text": h.text,
            "label": h.label or None,
        }
        for i, h in enumerate(result.hits, 1)
    ]
    payload = {
        "user_id": user_id,
        "query": query,
        "hits": hits,
        "archived_searched": result.phase2_reason is not None,
        "phase2_reason": result.phase2_reason,
    }
    _emit(payload, _show_search)


def _show_search(p: dict[str, Any]) -> None:
    archived = any(h["tier"] == "archived" for h in p["hits"])
    note = (
        "An archived hit shows its summary and archive id: `memory-archive get --user-id USER ID --original` "
        "reads its original from the backup, `memory-archive restore --archive-id ID` brings it back."
        if archived
        else None
    )
    _show(
        _Table(
            f"{len(p['hits'])} hits for {p['query']!r} (user {p['user_id']})",
            ("#", "tier", "id", "score", "category", "created", "text"),
            [
                [
                    h["rank"],
                    "[archived]" if h["tier"] == "archived" else "hot",
                    f"{h['id']} ({h['id_kind'].replace('_', ' ')})",
                    h["score"],
                    h["category"],
                    h["created_at"],
                    _short(h["text"]),
                ]
                for h in p["hits"]
            ],
            right=frozenset({0, 3}),
            note=note,
            wrap=6,
        )
    )


@cli.command(
    epilog=_examples(
        "memory-archive get --user-id alice 0b7e6a52-3c1d-4f0e-9a51-6f1d2e8c4b90",
        "memory-archive get --user-id alice 5d0c2f4e-8a1b-4c3d-9e7f-1a2b3c4d5e6f --original   # an archive id",
    )
)
@click.option("--user-id", required=True, help="Whose memory (another user's id is not found).")
@click.argument("memory_id", metavar="ID", type=click.UUID)
@click.option(
    "--original",
    is_flag=True,
    help="For an archived memory: its original text, read from its backup and verified (counts as no use).",
)
@_output_options
@click.pass_context
@_guarded
def get(ctx: click.Context, user_id: str, memory_id: uuid.UUID, original: bool) -> None:
    """One memory of a user by its memory id or by its archive id (what search and expand return): its
    fields, tier and which kind of id was given."""
    with _connection(ctx) as (settings, conn):
        record = run_plan(conn, get_plan(user_id, memory_id))
        if record is None:
            _fail(_NOT_FOUND.format(user=user_id, id=memory_id), EXIT_FAILED)
        payload = _record_json(record)
        kind = _id_kind(record, memory_id)
        payload["id_kind"] = kind
        if kind == "archive_id":
            payload["note"] = f"that is an archive id; its original (memory id) is {record.id}"
        if original and record.tier == "archived":
            store = object_store_from_settings(settings)
            doc = _originals(conn, store, record.user_id, [record.id])[record.id]
            payload["content"] = doc.content
            payload["content_source"] = "backup"
    _emit(payload, _show_record)


def _record_json(record: MemoryRecord) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(record).items()}


def _show_record(p: dict[str, Any]) -> None:
    fields = {k: v for k, v in p.items() if k not in ("note",)}
    table = _fields_table(f"Memory {p['id']} ({p['tier']})", fields)
    _show(dataclasses.replace(table, note=p.get("note")))


def _originals(
    conn: Conn, store: ObjectStore, user_id: str, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, BackupObject]:
    """The backup documents of these archived memories of `user_id`, each read, checked against its
    row's sha256 and its ids (promotion.verified_backup); nothing is written. A failed read raises."""
    rows = conn.execute(
        f"SELECT {JOINED_ROW} FROM {JOINED_FROM} WHERE a.user_id = %(u)s AND a.original_id = ANY(%(ids)s)",
        {"u": user_id, "ids": list(ids)},
    ).fetchall()
    read = read_members(store, [(r["storage_ref"], r["backup_sha256"]) for r in rows])
    docs = {}
    for row, data in zip(rows, read, strict=True):
        if isinstance(data, BaseException):
            raise data
        docs[row["original_id"]] = verified_backup(row, data, {"dim": None, "model": None})
    return docs


@cli.command(
    epilog=_examples(
        "memory-archive forget --user-id alice                  # dry run: what would be erased",
        "memory-archive forget --user-id alice --apply          # erase everything of alice, then check",
        "memory-archive forget --user-id alice --memory-id 0b7e6a52-3c1d-4f0e-9a51-6f1d2e8c4b90 --apply",
    )
)
@click.option("--user-id", required=True, help="Whose memories.")
@click.option(
    "--memory-id",
    type=click.UUID,
    help="Only this memory (its memory id or archive id) and the earlier versions it superseded.",
)
@click.option("--apply", is_flag=True, help="Erase (default: a dry run that lists what would be erased).")
@_OPERATOR
@_output_options
@click.pass_context
@_guarded
def forget(ctx: click.Context, user_id: str, memory_id: uuid.UUID | None, apply: bool, operator: str) -> None:
    """Erase a user, or one memory, from every tier, table and backup version (the right to erasure;
    the audit log keeps content-free tombstones). A dry run by default; --apply erases, then checks what
    is left: for a user, memory_lib.lifecycle.forget.remaining (exit 1 unless nothing is)."""
    actor = _actor(operator)
    if not apply:
        with _connection(ctx) as (_, conn), _no_such_memory(user_id, memory_id):
            seen = forget_preview(conn, user_id, memory_id)
        _emit(_preview_json(seen, memory_id), _show_preview)
        return
    _preflight(_settings(ctx))
    with _connection(ctx) as (settings, conn), _no_such_memory(user_id, memory_id):
        store = object_store_from_settings(settings)
        if memory_id is None:
            result = forget_user(conn, store, user_id, actor=actor)
            left = remaining(conn, store, user_id)
            check: dict[str, Any] = {
                "clean": left.clean,
                "rows": {t: n for t, n in left.rows.items() if n},
                "unredacted_events": left.unredacted_events,
                "objects": list(left.objects),
                "uncovered_tables": list(left.uncovered_tables),
            }
        else:
            result = forget_memory(conn, store, user_id, memory_id, actor=actor)
            still = [i for i in result.memory_ids if run_plan(conn, get_plan(user_id, i)) is not None]
            check = {"clean": not still, "memories": [str(i) for i in still]}
    payload = {
        "applied": True,
        "user_id": result.user_id,
        "memory_id": result.memory_id,
        "request_id": result.request_id,
        "forgotten": len(result.memory_ids),
        "memory_ids": [str(i) for i in result.memory_ids],
        "object_versions_deleted": result.object_versions_deleted,
        "rows_deleted": result.rows_deleted,
        "resumed": result.resumed,
        "already_forgotten": result.already_forgotten,
        "remaining": check,
    }
    _emit(payload, _show_forgotten)
    if not check["clean"]:
        _fail(
            f"forget of --user-id {user_id!r} left data behind: {json.dumps(check, default=_json_default)}",
            EXIT_FAILED,
        )


@contextmanager
def _no_such_memory(user_id: str, memory_id: uuid.UUID | None) -> Iterator[None]:
    """A memory id the user never had: exit 1 in the words of get (the library's NotFoundError)."""
    try:
        yield
    except NotFoundError:
        if memory_id is None:
            raise
        _fail(_NOT_FOUND.format(user=user_id, id=memory_id), EXIT_FAILED)


def _preview_json(seen: ForgetPreview, given: uuid.UUID | None) -> dict[str, Any]:
    tiers: dict[str, int] = {}
    for item in seen.items:
        tiers[item.tier] = tiers.get(item.tier, 0) + 1
    payload: dict[str, Any] = {
        "applied": False,
        "user_id": seen.user_id,
        "memory_id": seen.memory_id,
        "would_forget": len(seen.items),
        "by_tier": tiers,
        "backup_refs": len(seen.backup_refs),
        "already_forgotten": seen.already_forgotten,
        "memories": [
            {
                "memory_id": str(i.memory_id),
                "tier": i.tier,
                "archive_id": None if i.archive_id is None else str(i.archive_id),
                "created_at": i.created_at,
                "text": _short(i.text, 200),
            }
            for i in seen.items
        ],
    }
    if given is not None and seen.memory_id is not None and seen.memory_id != given:
        payload["note"] = f"that is an archive id; its original (memory id) is {seen.memory_id}"
    return payload


_PREVIEW_ROWS = 50  # a terminal shows this many; --json lists them all


def _show_preview(p: dict[str, Any]) -> None:
    items = p["memories"]
    if p["already_forgotten"]:
        note = "Already forgotten: nothing is left to erase."
    else:
        more = (
            f" (and {len(items) - _PREVIEW_ROWS} more: --json lists them all)"
            if len(items) > _PREVIEW_ROWS
            else ""
        )
        note = (
            f"Dry run{more}: {p['would_forget']} {'memory' if p['would_forget'] == 1 else 'memories'} and the backups that hold them "
            "(with every version) would be erased. Nothing was written: add --apply to erase."
        )
    if p.get("note"):
        note = f"{p['note']}\n{note}"
    _show(
        _Table(
            f"Forget {'memory ' + str(p['memory_id']) if p['memory_id'] else 'every memory'} of {p['user_id']}",
            ("memory id", "tier", "archive id", "created", "text"),
            [
                [i["memory_id"], i["tier"], i["archive_id"], i["created_at"], _short(i["text"], 80)]
                for i in items[:_PREVIEW_ROWS]
            ],
            note=note,
            wrap=4,
        )
    )


def _show_forgotten(p: dict[str, Any]) -> None:
    check = p["remaining"]
    _show(
        _Table(
            f"Forgotten: {p['user_id']}" + (f", memory {p['memory_id']}" if p["memory_id"] else ""),
            ("memories", "object versions deleted", "rows deleted", "already forgotten", "nothing remains"),
            [
                [
                    p["forgotten"],
                    p["object_versions_deleted"],
                    sum(p["rows_deleted"].values()),
                    p["already_forgotten"],
                    check["clean"],
                ]
            ],
            right=frozenset({0, 1, 2}),
            note=None if check["clean"] else f"left behind: {json.dumps(check, default=_json_default)}",
        )
    )


@cli.command(
    epilog=_examples(
        "memory-archive export --user-id alice > alice.jsonl",
        "memory-archive export --user-id alice --output alice.jsonl",
    )
)
@click.option("--user-id", required=True, help="Whose memories (never another user's).")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default="-",
    help="Write the JSONL here (default: stdout); a summary is printed after.",
)
@_PROGRESS_OPTION
@_output_options
@click.pass_context
@_guarded
def export(ctx: click.Context, user_id: str, output: str) -> None:
    """Every memory of a user as JSON lines, one memory a line: hot ones as stored, archived ones with
    their original text read back from their backups (each verified against its sha256), superseded
    versions included. The right of access and portability; nothing is written to the store."""
    user = validation.user(user_id)
    counts = {"hot": 0, "archived": 0}
    with contextlib.ExitStack() as stack:
        sys.stdout.flush()  # bytes go to its buffer below
        sink: BinaryIO = sys.stdout.buffer if output == "-" else stack.enter_context(Path(output).open("wb"))
        settings, conn = stack.enter_context(_connection(ctx))
        store = object_store_from_settings(settings)
        total = _memory_count(conn, user)
        bar = stack.enter_context(_Progress("export", total))
        cursor: str | None = None
        while True:
            page = run_plan(
                conn, list_plan(list_query(user, include_superseded=True, limit=500, cursor=cursor))
            )
            archived = [r.id for r in page.items if r.tier == "archived"]
            docs = _originals(conn, store, user, archived) if archived else {}
            for record in page.items:
                line = _record_json(record)
                if record.tier == "archived":
                    doc = docs[record.id]
                    meta = dict(doc.metadata)
                    tags = meta.pop("tags", [])
                    line |= {"content": doc.content, "metadata": meta, "tags": tags}
                line["content_sha256"] = hashlib.sha256(line["content"].encode()).hexdigest()
                line["content_source"] = "backup" if record.tier == "archived" else "hot"
                sink.write(json.dumps(line, ensure_ascii=False, default=_json_default).encode() + b"\n")
                counts[record.tier] += 1
            bar.update(sum(counts.values()))
            cursor = page.next_cursor
            if cursor is None:
                break
        sink.flush()
    summary = {"user_id": user, "exported": sum(counts.values()), **counts, "output": output}
    if output == "-":
        click.echo(
            f"memory-archive: exported {summary['exported']} memories of {user!r} "
            f"({counts['hot']} hot, {counts['archived']} archived originals from their backups)",
            err=True,
        )
    else:
        _emit(summary)


def _memory_count(conn: Conn, user: str) -> int:
    row = conn.execute(
        """SELECT (SELECT count(*) FROM memories WHERE user_id = %(u)s)
                + (SELECT count(*) FROM archived_memories WHERE user_id = %(u)s) AS n""",
        {"u": user},
    ).fetchone()
    return int(row["n"]) if row else 0


_PAUSE_EXAMPLES = (
    "memory-archive pause show",
    'memory-archive pause set --reason "provider outage" --operator ops',
    'memory-archive pause clear --reason "provider back, gate rerun passed"',
)


@cli.group(epilog=_examples(*_PAUSE_EXAMPLES))
def pause() -> None:
    """Show, set or clear the archival pause (failed gates set it)."""


@pause.command(
    "show", epilog=_examples("memory-archive pause show", "memory-archive pause status   # the same")
)
@_output_options
@click.pass_context
@_guarded
def pause_show(ctx: click.Context) -> None:
    """Is archival paused, by whom and why, and the last changes (`show` and `status` are one command)."""
    with _connection(ctx) as (_, conn):
        state = pause_status(conn)
        _emit({"paused": state.paused, "describe": state.describe(), "history": pause_history(conn, limit=5)})


@pause.command("set", epilog=_examples(_PAUSE_EXAMPLES[1]))
@click.option("--reason", required=True, help="Why (kept in the pause history).")
@_OPERATOR
@_output_options
@click.pass_context
@_guarded
def pause_set(ctx: click.Context, reason: str, operator: str) -> None:
    """Pause archival: every batch and night does nothing until it is cleared."""
    actor = _actor(operator)
    with _connection(ctx) as (_, conn):
        state = set_pause(conn, reason=reason, actor=actor)
        _emit({"paused": state.paused, "describe": state.describe()})


@pause.command("clear", epilog=_examples(_PAUSE_EXAMPLES[2]))
@click.option("--reason", required=True, help="Why it is safe to resume (kept in the pause history).")
@_OPERATOR
@_output_options
@click.pass_context
@_guarded
def pause_clear(ctx: click.Context, reason: str, operator: str) -> None:
    """Resume archival."""
    actor = _actor(operator)
    with _connection(ctx) as (_, conn):
        state = clear_pause(conn, reason=reason, actor=actor)
        _emit({"paused": state.paused, "describe": state.describe()})


# `pause status`, the older name, stays: the same command under both names.
pause.add_command(pause_show, "status")


# --------------------------------------------------------------------------- reembed
# A re-embedding (memory_lib.lifecycle.reembedding) without Dagster: the same library steps as the
# reembedding jobs and asset. These commands open the database whatever embedding.dim the settings
# say (`_connection(any_dim=True)`): a re-embedding changes the dim, and each step must run in either space.

_REEMBED_EXAMPLES = (
    "memory-archive reembed start --model all-MiniLM-L6-v2 --dim 384",
    "memory-archive reembed status",
    "memory-archive reembed backfill               # until nothing is pending; rerun after a kill",
    "memory-archive reembed flip",
    "memory-archive reembed flip-back              # the old space again, lossless",
    "memory-archive reembed drop-old               # after a flip: finished, no flip back",
    "memory-archive reembed abort                  # before a flip: give the migration up",
)


@cli.group(epilog=_examples(*_REEMBED_EXAMPLES))
def reembed() -> None:
    """Change the embedding model or dim without downtime: start, backfill, flip (flip back), drop."""


def _space(conn: Conn) -> dict[str, Any]:
    row = conn.execute(SHAPE_SQL).fetchone()
    dim = None if row is None or row["dim"] is None else int(row["dim"])
    return {"model": None if row is None else row["model"], "dim": dim}


def _migration_json(m: Migration) -> dict[str, Any]:
    return {
        "id": m.id,
        "state": m.state,
        "source": {"model": m.source_model, "dim": m.source_dim},
        "target": {"model": m.target_model, "dim": m.target_dim},
        "secondary_columns": m.suffix if m.open else None,
        "flips": m.flips,
        "started_at": m.started_at,
        "flipped_at": m.flipped_at,
    }


def _next_step(m: Migration | None, pending: int) -> str:
    if m is None or not m.open:
        return "none open: memory-archive reembed start --model M --dim D"
    if pending:
        return "memory-archive reembed backfill"
    if m.state == "running":
        return "memory-archive reembed flip (or abort)"
    model, dim = m.active
    return (
        f"set MEMORY_ARCHIVE_EMBEDDING_DIM={dim} and the embedder of {model!r} everywhere; "
        "then memory-archive reembed drop-old (or flip-back)"
    )


def _reembed_status(conn: Conn) -> dict[str, Any]:
    m = reembedding.active_migration(conn)
    left = reembedding.coverage(conn)
    last = m or latest_migration(conn)
    return {
        "active_space": _space(conn),
        "open": m is not None,
        "migration": None if last is None else _migration_json(last),
        "pending": left,
        "pending_total": sum(left.values()),
        "next": _next_step(m, sum(left.values())),
    }


def _show_reembed(p: dict[str, Any]) -> None:
    m, space = p["migration"], p["active_space"]
    rows: list[list[Any]] = [["active space", f"{space['model']} ({space['dim']}-d)"]]
    if m is not None:
        rows += [
            ["migration", f"{m['id']} ({m['state']}{', open' if p['open'] else ''})"],
            ["source", f"{m['source']['model']} ({m['source']['dim']}-d)"],
            ["target", f"{m['target']['model']} ({m['target']['dim']}-d)"],
            ["flips", m["flips"]],
        ]
    tables = [_Table("Re-embedding", ("field", "value"), rows)]
    if p["open"]:
        tables.append(
            _Table(
                f"Rows without a {m['secondary_columns']} vector",
                ("table", "pending"),
                list(p["pending"].items()),
                right=frozenset({1}),
            )
        )
    _show(*tables)
    click.echo(f"Next: {p['next']}")


@reembed.command(
    "status", epilog=_examples("memory-archive reembed status", "memory-archive reembed status --json")
)
@_output_options
@click.pass_context
@_guarded
def reembed_status(ctx: click.Context) -> None:
    """The active embedding space, the open migration (else the last one) and its pending rows per table."""
    with _connection(ctx, any_dim=True) as (_, conn):
        _emit(_reembed_status(conn), _show_reembed)


def _reembed_step(
    ctx: click.Context, step: Callable[[Conn, str], Migration], operator: str, *, waited: str = "30s"
) -> None:
    """A step of the library (start, flip, flip back, drop, abort) recorded as `cli:<operator>`; then
    the status. `waited`: how long the step waits for the vector tables' locks, for its error."""
    actor = _actor(operator)
    with _connection(ctx, any_dim=True) as (_, conn):
        try:
            step(conn, actor)
        except psycopg.errors.LockNotAvailable:
            _fail(
                f"another transaction kept the vector tables locked past {waited}: nothing changed, retry later",
                EXIT_UNAVAILABLE,
            )
        _emit(_reembed_status(conn), _show_reembed)


@reembed.command(
    "start",
    epilog=_examples(
        _REEMBED_EXAMPLES[0],
        "memory-archive reembed start --model text-embedding-3-large --dim 1024   # OPENAI_API_KEY set",
        "memory-archive reembed start --model hashing-lexical-v1-256 --dim 256",
    ),
)
@click.option(
    "--model",
    required=True,
    help="The target embedder: all-MiniLM-L6-v2 (384), hashing-lexical-v1-<dim>, else an OpenAI(-compatible) "
    "model (OPENAI_API_KEY, MEMORY_ARCHIVE_EMBEDDING_BASE_URL).",
)
@click.option("--dim", type=int, required=True, help="The target's vector dimension.")
@_OPERATOR
@_output_options
@click.pass_context
@_guarded
def reembed_start(ctx: click.Context, model: str, dim: int, operator: str) -> None:
    """Record the migration and add the second vector columns (catalog only, instant); then backfill.
    The target embedder is built and asked for one vector first: a model this setup cannot run, or whose
    vectors are not --dim wide, is refused before anything is written."""
    model = reembedding.check_target(model, dim)  # the library's own rules first: exit 2 naming the flag
    settings = _settings(ctx)
    try:
        embedder = reembedding.embedder_for(model, dim, settings.embedding)
    except InvalidInputError as exc:
        raise InvalidInputError(
            "target_model",
            model,
            f"taken for an OpenAI(-compatible) model, which cannot be used here ({exc}); the built-in ones "
            f"are {LOCAL_MODEL_NAME} and hashing-lexical-v1-<dim>",
        ) from None
    shape = embedder.embed(["memory-archive re-embedding probe"]).shape
    if shape[-1] != dim:
        raise InvalidInputError("target_dim", dim, f"{model!r} makes {shape[-1]}-d vectors")
    _reembed_step(ctx, lambda conn, actor: reembedding.start(conn, model, dim, actor=actor), operator)


@reembed.command(
    "backfill",
    epilog=_examples(
        "memory-archive reembed backfill",
        "memory-archive reembed backfill --limit 10000   # at most this many rows now; run again to go on",
        "memory-archive reembed backfill --shard 0/2 & memory-archive reembed backfill --shard 1/2",
    ),
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Rows embedded and written per transaction: a killed run loses at most this much work.",
)
@click.option(
    "--limit", type=click.IntRange(min=1), help="At most this many rows in this run (default: all pending)."
)
@click.option(
    "--shard",
    default="0/1",
    show_default=True,
    help="i/n: only the rows in hash bucket i of n of their id; run n of them at once to scale out.",
)
@_PROGRESS_OPTION
@_output_options
@click.pass_context
@_guarded
def reembed_backfill(ctx: click.Context, batch_size: int, limit: int | None, shard: str) -> None:
    """Fill the second vectors of every pending row, a batch per transaction, until none is left (the
    target space while running, the old one once flipped, which keeps a flip back lossless). Safe to
    kill and rerun: a row stays pending until its batch commits."""
    part = Shard.parse(shard)  # before connecting: bad input writes nothing
    bucket = None if part.is_all else {"bucket": part.index, "buckets": part.count}
    with _connection(ctx, any_dim=True) as (settings, conn):
        m = reembedding.active_migration(conn)
        if m is None:
            _fail(
                "no re-embedding is open: nothing to backfill (memory-archive reembed start --model M --dim D)"
            )
        model, dim = m.secondary
        embedder = reembedding.embedder_for(model, dim, settings.embedding)

        def left() -> dict[str, int]:
            return {
                BY_KIND[k].table: reembedding.pending(conn, k, **(bucket or {})) for k in reembedding.KINDS
            }

        pending = sum(left().values())
        filled = dict.fromkeys(left(), 0)
        started = time.monotonic()
        done = 0
        with _Progress("re-embed", pending if limit is None else min(limit, pending), "rows") as bar:
            for kind in reembedding.KINDS:
                while limit is None or done < limit:
                    size = batch_size if limit is None else min(batch_size, limit - done)
                    n = reembedding.backfill_batch(conn, embedder, kind, size, **(bucket or {}))
                    if not n:
                        break
                    filled[BY_KIND[kind].table] += n
                    done += n
                    bar.update(done)
        seconds = time.monotonic() - started
        remaining = left()
        everywhere = sum(reembedding.coverage(conn).values())  # other shards' rows too: the next step
    _emit(
        {
            "migration": m.id,
            "state": m.state,
            "secondary_columns": m.suffix,
            "model": model,
            "dim": dim,
            "shard": str(part),
            "filled": done,
            "filled_by_table": filled,
            "pending": remaining,
            "pending_total": sum(remaining.values()),
            "seconds": round(seconds, 2),
            "rows_per_s": round(done / seconds, 1) if seconds > 0 else 0.0,
            "next": _next_step(m, everywhere),
        },
        _show_backfill,
    )


def _show_backfill(p: dict[str, Any]) -> None:
    shard = "" if p["shard"] == "0/1" else f", shard {p['shard']}"
    _show(
        _Table(
            f"Re-embedded into {p['secondary_columns']}: {p['model']} ({p['dim']}-d){shard}",
            ("table", "filled", "pending"),
            [[t, n, p["pending"][t]] for t, n in p["filled_by_table"].items()],
            right=frozenset({1, 2}),
            note=f"{p['filled']} rows in {p['seconds']} s ({p['rows_per_s']} rows/s)",
        )
    )
    click.echo(f"Next: {p['next']}")


def _lock_timeout(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not re.fullmatch(r"[1-9][0-9]*(ms|s|min)", value):
        raise click.BadParameter(f"{value!r}: a duration such as 500ms, 30s or 2min", ctx, param)
    return value


_LOCK_TIMEOUT = click.option(
    "--lock-timeout",
    default="30s",
    show_default=True,
    callback=_lock_timeout,
    help="Give up (nothing changed, exit 4) when another transaction keeps the vector tables locked this long.",
)


@reembed.command(
    "flip", epilog=_examples("memory-archive reembed flip", "memory-archive reembed flip --lock-timeout 2min")
)
@_LOCK_TIMEOUT
@_OPERATOR
@_output_options
@click.pass_context
@_guarded
def reembed_flip(ctx: click.Context, lock_timeout: str, operator: str) -> None:
    """Make the new space active: builds its indexes (CONCURRENTLY), then swaps in one transaction. Refused
    unless every row has its new vector. Then switch every client's embedder to the new model and dim."""
    _reembed_step(
        ctx,
        lambda conn, actor: reembedding.flip(conn, actor=actor, lock_timeout=lock_timeout),
        operator,
        waited=f"--lock-timeout {lock_timeout}",
    )


@reembed.command("flip-back", epilog=_examples("memory-archive reembed flip-back"))
@_LOCK_TIMEOUT
@_OPERATOR
@_output_options
@click.pass_context
@_guarded
def reembed_flip_back(ctx: click.Context, lock_timeout: str, operator: str) -> None:
    """Make the old space active again (kept up to date while flipped); the migration is running again."""
    _reembed_step(
        ctx,
        lambda conn, actor: reembedding.flip_back(conn, actor=actor, lock_timeout=lock_timeout),
        operator,
        waited=f"--lock-timeout {lock_timeout}",
    )


@reembed.command("drop-old", epilog=_examples("memory-archive reembed drop-old"))
@_OPERATOR
@_output_options
@click.pass_context
@_guarded
def reembed_drop_old(ctx: click.Context, operator: str) -> None:
    """After a flip: drop the old space's columns. The migration is finished; no flip back from here."""
    _reembed_step(ctx, lambda conn, actor: reembedding.drop_old(conn, actor=actor), operator)


@reembed.command("abort", epilog=_examples("memory-archive reembed abort"))
@_OPERATOR
@_output_options
@click.pass_context
@_guarded
def reembed_abort(ctx: click.Context, operator: str) -> None:
    """Before a flip: give the migration up and drop its new columns; the active space is untouched."""
    _reembed_step(ctx, lambda conn, actor: reembedding.abort(conn, actor=actor), operator)


@cli.command(
    "mcp",
    epilog=_examples(
        "memory-archive mcp --user-id alice   # stdio: an MCP client launches this command",
        "memory-archive mcp --user-id alice --transport http --port 8765   # http://127.0.0.1:8765/mcp",
        "memory-archive mcp --transport http --auth-server https://auth.example.com "
        "--auth-introspection-url https://auth.example.com/oauth/introspect   # user = token's sub",
    ),
)
@click.option(
    "--user-id",
    envvar="MEMORY_MCP_USER_ID",
    help="The one user whose memories the tools read and write (env MEMORY_MCP_USER_ID); no tool takes a "
    "user. Required unless HTTP requests are authenticated (--auth-introspection-url).",
)
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio (the client launches this command) or streamable HTTP at http://HOST:PORT/mcp.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP only: the address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="HTTP only.")
@click.option(
    "--auth-introspection-url",
    help="HTTP only: require a bearer token, checked at this RFC 7662 introspection endpoint; each "
    "request acts for its token's subject (sub). Client credentials for it: env MEMORY_MCP_AUTH_CLIENT_ID "
    "and MEMORY_MCP_AUTH_CLIENT_SECRET.",
)
@click.option(
    "--auth-server", help="With --auth-introspection-url: the authorization server clients get tokens from."
)
@click.option(
    "--auth-scope", multiple=True, help="With --auth-introspection-url: a scope every token must have."
)
@click.option(
    "--public-url", help="With auth: this server's URL as clients reach it (default http://HOST:PORT/mcp)."
)
@_OPERATOR
@click.pass_context
@_guarded
def mcp_cmd(
    ctx: click.Context,
    user_id: str | None,
    transport: str,
    host: str,
    port: int,
    auth_introspection_url: str | None,
    auth_server: str | None,
    auth_scope: tuple[str, ...],
    public_url: str | None,
    operator: str,
) -> None:
    """Serve the memory tools (add, search, expand, build_context, get, update, delete, forget) to an
    MCP client, for one user (or, over authenticated HTTP, each request's user). Needs the mcp extra."""
    authenticated = auth_introspection_url is not None
    if authenticated and (transport != "http" or auth_server is None or user_id is not None):
        _fail(
            "--auth-introspection-url needs --transport http and --auth-server, and no --user-id (the token names the user)"
        )
    if not authenticated and (auth_server or auth_scope or public_url):
        _fail("--auth-server, --auth-scope and --public-url go with --auth-introspection-url")
    if not authenticated and user_id is None:
        _fail(
            "--user-id is required: the one user whose memories the tools act on (or env MEMORY_MCP_USER_ID)"
        )
    user = validation.user(user_id) if user_id is not None else None  # exit 2 naming --user-id
    actor = _actor(operator)
    try:
        from .integrations import mcp as mcp_server
    except ImportError as exc:
        if not (exc.name or "").startswith("mcp"):
            raise
        _fail("the MCP server needs the mcp extra: pip install 'memory-archive[mcp]'")
    introspection = None
    if auth_introspection_url is not None and auth_server is not None:
        introspection = mcp_server.TokenIntrospection.with_client_from_env(
            auth_server, auth_introspection_url, required_scopes=auth_scope
        )
    elif transport == "http" and host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(
            f"memory-archive: warning: --host {host}: every client that reaches this port acts as user "
            f"{user!r} (add --auth-introspection-url to authenticate requests)",
            err=True,
        )
    mcp_server.run(
        _settings(ctx),
        user,
        transport=transport,
        host=host,
        port=port,
        introspection=introspection,
        public_url=public_url,
        actor=actor,
    )


def main(argv: list[str] | None = None) -> int:
    """The console script: run the command, return its exit code (0 on success)."""
    try:
        cli.main(args=argv, prog_name="memory-archive", standalone_mode=False)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_INPUT)
    except click.exceptions.Abort:
        return EXIT_INPUT
    except click.ClickException as exc:
        exc.show()
        return EXIT_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
