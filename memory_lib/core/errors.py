"""Errors memory_lib raises. Each message names the field or object and the offending value."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import psycopg


class MemoryArchiveError(Exception):
    """Base class for every error memory_lib raises on purpose."""


class InvalidInputError(MemoryArchiveError, ValueError):
    """Input that would corrupt the store: nothing has been written."""

    def __init__(self, field: str, value: object, reason: str):
        self.field = field
        self.value = value
        self.reason = reason
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"invalid {field}={shown}: {reason}")


class UnknownParameterError(InvalidInputError, TypeError):
    """A keyword argument the method does not take: the message names the parameter and the public
    method (never an internal one). Also a TypeError, what Python raises for an unknown keyword."""

    def __init__(self, method: str, name: str, value: object, known: Iterable[str]):
        self.method = method
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(name, value, f"{method}() has no parameter {name!r}{hint}")


class EmbeddingMismatchError(InvalidInputError):
    """A vector whose dimension or model differs from what the store was created with."""


def embedding_mismatch_reason(active_model: str | None, active_dim: int, model: str, dim: int) -> str:
    """One wording for every embedding-space mismatch (query, write, archive run): both models, both dims."""
    return (
        f"the embedder is {model!r} ({dim}-d) but this database's active embedding space is {active_model!r} "
        f"({active_dim}-d): configure that embedder (after a re-embedding flip, the new one)"
    )


class SchemaError(MemoryArchiveError):
    """The database schema is missing, half-applied or made for other settings."""


class ObjectStoreError(MemoryArchiveError):
    """Object storage failed to store or return an object."""


class ObjectNotFoundError(ObjectStoreError, KeyError):
    def __init__(self, key: str):
        self.key = key
        super().__init__(f"object not found: {key}")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


class IntegrityError(MemoryArchiveError):
    """Stored bytes do not match the recorded sha256 or size: never returned as if valid."""

    def __init__(self, what: str, expected: str, actual: str):
        self.what = what
        self.expected = expected
        self.actual = actual
        super().__init__(f"integrity check failed for {what}: expected {expected}, got {actual}")


class SummarizationError(MemoryArchiveError):
    """The summarizer failed or returned an unusable summary for one memory."""


class EmbeddingError(MemoryArchiveError):
    """The embedder failed for one input."""


class NotFoundError(MemoryArchiveError, LookupError):
    """No such memory or archive for this user."""


class DeadlineExceeded(MemoryArchiveError, TimeoutError):
    """A step ran out of its time budget (step_deadline_seconds): the work left is failed, not hung."""


class ConfigError(MemoryArchiveError, ValueError):
    """A setting from the environment (or passed in code) is unknown or invalid; the one-line message
    names the variable and the value (a password in DATABASE_URL is masked)."""

    def __init__(self, message: str, *, variable: str | None = None, value: object = None):
        self.variable = variable
        self.value = value
        super().__init__(message)


class DatabaseConnectionError(MemoryArchiveError, psycopg.OperationalError):
    """The database a setting names could not be connected to. The message names the setting
    (DATABASE_URL) with its host, port and dbname, never the password, then the server's or libpq's
    reason. `refused`: the server answered and refused these settings (password, role, database, pg_hba
    rule: fix them); otherwise it could not be reached (retry later). Also a psycopg.OperationalError,
    what a failed connection raised before."""

    def __init__(self, message: str, *, setting: str, target: dict[str, str], refused: bool):
        self.setting = setting
        self.target = target  # host, port, dbname: what was given of them
        self.refused = refused
        super().__init__(message)


class PreflightError(ConfigError):
    """A check run before any work (memory_lib.preflight) refused the configuration: a missing bucket,
    credentials the store refuses, an unwritable local root, an API key of the wrong shape. Nothing was
    read or written. The message never carries a secret."""


class ObjectStoreConfigError(PreflightError, ObjectStoreError):
    """The object store refuses this configuration (no such bucket, credentials refused): a setting to fix,
    not an outage to wait out."""


class EmbeddedServerError(MemoryArchiveError):
    """The embedded Postgres did not start after its retries. The message carries pg_ctl's own output
    (exit code, stdout, stderr) of each attempt and the data dir's state: PG_VERSION, postmaster.pid and
    whether its pid is alive, and the tail of the server log when there is one."""


# What the server needs for each extension the migrations create, when it does not offer it at all.
_EXTENSION_PACKAGES = {
    "vector": "pgvector (>= 0.7) installed on the server (e.g. the postgresql-<major>-pgvector package)",
    "btree_gin": "the Postgres contrib extensions installed on the server (e.g. the postgresql-contrib package)",
}
_MANAGED = "on a managed Postgres (RDS, Cloud SQL, Azure, Supabase, Neon) enable the {name} extension"


class MissingExtensionError(SchemaError):
    """An extension the schema needs is not in the database and this role cannot create it: either the
    server does not offer it at all (pg_available_extensions), or it does and the role lacks the privilege.
    Nothing has been written."""

    def __init__(self, extension: str, database: str, role: str, *, available: bool):
        self.extension = extension
        self.database = database
        self.role = role
        self.available = available
        name = "pgvector" if extension == "vector" else extension
        managed = _MANAGED.format(name=name)
        if available:
            message = (
                f'{name} is not installed in database "{database}" and role "{role}" may not create it: ask a '
                f'superuser to run CREATE EXTENSION {extension}; in database "{database}" (then run '
                f"`memory-archive migrate` again); {managed}"
            )
        else:
            needs = _EXTENSION_PACKAGES.get(extension, f"the {extension} extension installed on the server")
            message = (
                f'{name} is not available on the Postgres server of database "{database}" (no {extension} in '
                f"pg_available_extensions): the server needs {needs}, then run `memory-archive migrate` again; "
                f"{managed}"
            )
        super().__init__(message)
