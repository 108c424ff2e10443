"""`memory-archive`: migrate, inspect, archive, restore, sweep, unsupersede and pause from a shell.

Every subcommand runs the same memory_lib code as the Dagster Slow Path (pipeline.run_batch for
`archive`) and prints one JSON line on stdout. `archive`, `restore` and `sweep` first run
memory_lib.preflight, as the Dagster resources do: a missing bucket, refused credentials or a malformed
API key is refused before anything is claimed or written. Exit status, one meaning each:

  0  success
  1  the run failed: its gate, nothing archived of what it claimed, archived memories not findable, a failed
     restore, a backup failing its check
  2  bad input or configuration (InvalidInputError, ConfigError incl. PreflightError, SchemaError), fix and rerun
  3  archival is paused
  4  a component is unavailable: database unreachable, object store or LLM outage; retry later

Who acted, one rule for every command: each event and pause record a command writes (archive, restore,
unsupersede, pause set, pause clear) names the actor `cli:<operator>`, the operator being `--operator`,
by default your login name (`_actor` below; docs/reference/cli.md).

Errors are one line on stderr and name this command's flags (`--user-id`, not the library's or Dagster's
`user_id`). Logs go to stderr, quiet by default (`-v` for progress, `-vv` for debug). Every command's
`--help` ends with examples.
"""

from __future__ import annotations

import getpass
import json
import logging
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn, cast

import click
import psycopg

from .archival.archive import ArchivalServices
from .archival.claims import Holder, attempt_counts, released_memories
from .archival.integrity import sweep_orphans
from .archival.pipeline import run_batch
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
    ObjectNotFoundError,
    ObjectStoreError,
    SchemaError,
    SummarizationError,
)
from .core.rows import Conn
from .core.shards import Shard
from .lifecycle.eligibility import eligible_counts
from .lifecycle.pause import clear_pause, pause_history, pause_status, set_pause
from .lifecycle.restore import RestoreReport, originals_of_archives, restore_archives
from .llm.batches import submission_stats
from .preflight import preflight
from .storage.db import (
    DATABASE_REFUSED,
    describe_database,
    migrate_database,
    naming_the_database,
    open_database,
    open_ready_database,
)
from .storage.store import tier_stats
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


def _emit(payload: dict[str, Any]) -> None:
    click.echo(json.dumps(payload, default=str))


def _fail(message: str, code: int = EXIT_INPUT) -> NoReturn:
    click.echo(f"memory-archive: {message}", err=True)
    sys.exit(code)


@contextmanager
def _connection(ctx: click.Context) -> Iterator[tuple[Settings, Conn]]:
    """A connection to the configured database; only `migrate` changes the schema, the other commands
    refuse a missing or outdated one (SchemaError: run `memory-archive migrate`)."""
    settings = _settings(ctx)
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
        "DATABASE_URL=postgresql://me@db/memories memory-archive stats",
    ),
)
@click.option("-v", "--verbose", count=True, help="-v: progress logs, -vv: debug logs (stderr).")
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
@click.pass_context
@_guarded
def migrate_cmd(ctx: click.Context) -> None:
    """Create or upgrade the schema (the only command that changes it; a database keeps its dim)."""
    settings = _settings(ctx)
    with open_database(settings, create=True) as db, naming_the_database(settings):
        _emit(
            {
                "applied": migrate_database(
                    db.url, settings.embedding.dim, user_partitions=settings.user_partitions
                )
            }
        )


@cli.command(
    epilog=_examples(
        "memory-archive stats",
        "memory-archive stats | jq .eligible   # the backlog by reason",
    )
)
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
            }
        )


def _batch_key_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Given, the key must have a visible character: an empty one is refused, never the default (exit 2)."""
    if value is None:
        return None
    try:
        return validation.batch_key("batch_key", value)
    except InvalidInputError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


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
    with _connection(ctx) as (settings, conn):
        services = ArchivalServices.from_settings(settings)
        full = limit if limit is not None else settings.archival.batch_size
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
            _emit(
                {
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
            )
            if not (until_drained and report.ok and claimed >= max(full, 1)):
                break
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
            report = restore_archives(
                conn,
                services.object_store,
                actor=actor,
                all_archives=all_archives and user_id is None,
                user_id=user_id,
                original_ids=wanted or None,
                pause_archival=all_archives,
            )
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
            }
        )
    if report.failed or report.not_found:
        sys.exit(EXIT_FAILED)


@cli.command(
    epilog=_examples(
        "memory-archive sweep            # report only",
        "memory-archive sweep --remove   # delete the orphans that are safe to delete",
    )
)
@click.option("--remove", is_flag=True, help="Delete orphans whose memory is hot and unclaimed, or gone.")
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
@click.pass_context
@_guarded
def unsupersede(ctx: click.Context, user_id: str | None, apply: bool, operator: str) -> None:
    """List the memories add's former near-duplicate rule superseded (hidden from search); --apply makes
    them live again, one 'updated' event each, except those whose text a live memory already holds."""
    actor = _actor(operator)
    with _connection(ctx) as (_, conn):
        report = unsupersede_memories(conn, user_id=user_id, apply=apply, actor=actor)
        _emit(report.to_json())


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
